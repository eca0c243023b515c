"""Where a workload's working directory may be (``workDir``): an absolute, normalised path that is
not a root or system directory of a posix or Windows guest.

Its own module because these are static rules of their own, carried into the CRD as CEL
(``crdrules.py``) from the patterns here, and read by admission (a Windows path for a posix
workload): mounting a work volume at a system directory breaks the guest or hands it host state.
"""

from __future__ import annotations

import re
from typing import Final

from .base import CONTROL_OR_INVISIBLE

#: A path that starts with a drive letter (``C:``): absolute on Windows, never relative.
DRIVE_LETTER_PATTERN: Final = r"^[A-Za-z]:"

#: Directories of a posix guest a workDir may not be at or under: the kernel's and the runtime's
#: (mounting a work volume there breaks the guest or hands it host state), the programs' and the
#: libraries' (a work volume mounted there hides the shell and the loader: the pod never starts),
#: and the root.
POSIX_SYSTEM_DIRS: Final[tuple[str, ...]] = (
    "proc",
    "sys",
    "dev",
    "etc",
    "boot",
    "run",
    "var/run",
    "bin",
    "sbin",
    "lib",
    "lib32",
    "lib64",
    "libx32",
    "usr/bin",
    "usr/sbin",
    "usr/lib",
    "usr/lib32",
    "usr/lib64",
    "usr/libx32",
    "usr/libexec",
    "usr/local/bin",
    "usr/local/sbin",
    "usr/local/lib",
)
#: Directories a workDir may not be exactly (what is under them is the workload's to use:
#: ``/usr/src/app``), because a volume mounted there hides every system directory inside.
POSIX_SYSTEM_PARENT_DIRS: Final[tuple[str, ...]] = ("usr", "usr/local", "var")
#: Top directories of a Windows guest a workDir may not be at or under (case-insensitive), and the
#: drive root.
WINDOWS_SYSTEM_DIRS: Final[tuple[str, ...]] = (
    "windows",
    "program files",
    "program files (x86)",
    "programdata",
    "system volume information",
    "$recycle.bin",
    "recovery",
)
#: workDir at or under a posix system directory, exactly a parent of some, or the root itself.
POSIX_SYSTEM_WORK_DIR_PATTERN: Final = (
    r"^/(("
    + "|".join(re.escape(d) for d in POSIX_SYSTEM_DIRS)
    + r")?(/|$)|("
    + "|".join(re.escape(d) for d in POSIX_SYSTEM_PARENT_DIRS)
    + r")/?$)"
)
#: workDir at or under a Windows system directory, or a drive root (any case, either separator).
WINDOWS_SYSTEM_WORK_DIR_PATTERN: Final = (
    r"(?i)^[a-z]:[\\/]("
    + "|".join(re.escape(d).replace("\\ ", " ") for d in WINDOWS_SYSTEM_DIRS)
    + r")?([\\/]|$)"
)
#: A '.' or '..' segment, or an empty one ('//'): a workDir is compared as written, so it must be
#: normalised (``/w/../etc`` is ``/etc``).
UNNORMALISED_WORK_DIR_PATTERN: Final = r"([\\/]\.\.?([\\/]|$)|[\\/][\\/])"
#: Windows spellings that name another directory than they seem to: a ':' after the drive (an
#: alternate stream), an 8.3 short name (``PROGRA~1``), a segment ending in '.' or ' ' (dropped).
WINDOWS_ALIAS_WORK_DIR_PATTERN: Final = r"^[A-Za-z]:(.*:|.*~[0-9]|.*[. ]([\\/]|$))"


def work_dir_problem(value: str) -> str | None:
    """Why ``value`` may not be a workDir, or None. Static rules, carried into the CRD as CEL."""
    if re.search(UNNORMALISED_WORK_DIR_PATTERN, value):
        return f"workDir {value!r} must be a normalised path: no empty, '.' or '..' segments"
    if re.search(WINDOWS_ALIAS_WORK_DIR_PATTERN, value):
        return (
            f"workDir {value!r} uses a Windows spelling that names another directory (a ':' "
            "after the drive, a short name like PROGRA~1, or a segment ending in '.' or ' ')"
        )
    if re.search(POSIX_SYSTEM_WORK_DIR_PATTERN, value) or re.search(
        WINDOWS_SYSTEM_WORK_DIR_PATTERN, value
    ):
        return (
            f"workDir {value!r} is a root or system directory (/, /proc, /sys, /dev, /etc, /boot, "
            r"/run, /var/run, /bin, /lib, /usr/bin, /usr, C:\, C:\Windows, C:\Program Files, "
            "...); use a directory of the workload's own, e.g. /workspace"
        )
    return None


def check_work_dir(value: str) -> str:
    """``value`` as a workDir, or ValueError naming the rule it breaks (absolute; no control or
    invisible characters; :func:`work_dir_problem`)."""
    if not (value.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", value)):
        raise ValueError(f"workDir {value!r} must be an absolute path")
    if CONTROL_OR_INVISIBLE.search(value):
        raise ValueError(
            "workDir must not contain control characters or invisible formatting characters "
            "(bidirectional controls, zero-width characters)"
        )
    problem = work_dir_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value
