"""Where a host-tool run lives in the sandbox, and which names a caller's files may not take.

One run lives in ``<work dir>/.host-tools/<run id>/`` as two sibling directories: ``work/`` (the
program's working directory, where a caller's files land and artifacts stay) and ``transport/``
(the launcher, program, shim, output, pid file, exit marker and ``calls/``). See
:mod:`sandbox_operator.client.hosttools.channel` for why they are apart.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from sandbox_operator.client.errors import PathRefused
from sandbox_operator.client.hosttools.errors import HostToolFileNameReserved
from sandbox_operator.client.paths import collision_key, confine
from sandbox_operator.client.sandbox import Sandbox

#: Every run's directory sits under this one, inside the sandbox's work dir.
HOST_TOOLS_DIRECTORY: Final = ".host-tools"
WORK_DIRECTORY: Final = "work"
TRANSPORT_DIRECTORY: Final = "transport"

#: The module name the program imports (``import sandbox_host_tools``), and its file.
SHIM_MODULE: Final = "sandbox_host_tools"
SHIM_FILE: Final = f"{SHIM_MODULE}.py"

#: The transport's own files besides the launcher (which the host writes), by the key the
#: launcher's configuration names each with: the launcher writes the shim and the program,
#: the program's output and pid, the exit marker, and the calls directory the shim uses.
TRANSPORT_FILES: Final = {
    "shim_file": SHIM_FILE,
    "program_file": "program.py",
    "stdout": "stdout",
    "stderr": "stderr",
    "pid": "pid",
    "exit": "exit",
    "calls": "calls",
}
LAUNCHER_FILE: Final = "launcher.py"

#: Top-level names a caller's ``files`` may not use (compared case-folded): the transport's own
#: file names and the shim module's name. ``work/`` is not on the program's import path, so these
#: are refused to keep a run unambiguous to read, not because a collision could reach the
#: transport; any ``sandbox_host_tools.*`` (``.pyc``, an extension module) is refused as well.
RESERVED_NAMES: Final = frozenset(
    {SHIM_MODULE, LAUNCHER_FILE, "__pycache__", *TRANSPORT_FILES.values()}
)

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


@dataclass(frozen=True)
class GuestRunLayout:
    """Where one run's files live. ``root``, ``work`` and ``transport`` are relative to the
    sandbox's work dir (what :class:`Sandbox` file methods take); the ``*_path`` properties are
    the same directories as absolute paths inside the sandbox (what a guest process sees)."""

    run_id: str
    sandbox_work_dir: str
    root: str
    work: str
    transport: str

    def _absolute(self, relative: str) -> str:
        return f"{self.sandbox_work_dir}/{relative}"

    @property
    def root_path(self) -> str:
        return self._absolute(self.root)

    @property
    def work_path(self) -> str:
        return self._absolute(self.work)

    @property
    def transport_path(self) -> str:
        return self._absolute(self.transport)

    def transport_file(self, name: str) -> str:
        """A transport file's path relative to the sandbox work dir."""
        return f"{self.transport}/{name}"

    def request(self, sequence: int) -> str:
        return self.transport_file(f"{TRANSPORT_FILES['calls']}/{sequence}.req")

    def response(self, sequence: int) -> str:
        return self.transport_file(f"{TRANSPORT_FILES['calls']}/{sequence}.resp")


def guest_run_layout(sandbox: Sandbox, run_id: str | None = None) -> GuestRunLayout:
    """A fresh run's layout in ``sandbox``; ``run_id`` defaults to a random token, so a run's
    directory cannot be guessed (and pre-planted) by an earlier program in the same sandbox."""
    rid = run_id if run_id is not None else secrets.token_hex(12)
    if not _RUN_ID.fullmatch(rid):
        raise ValueError(f"run id {rid!r} is not 1-64 letters, digits, '-' or '_'")
    root = f"{HOST_TOOLS_DIRECTORY}/{rid}"
    return GuestRunLayout(
        run_id=rid,
        sandbox_work_dir=sandbox.work_dir,
        root=root,
        work=f"{root}/{WORK_DIRECTORY}",
        transport=f"{root}/{TRANSPORT_DIRECTORY}",
    )


def check_files(
    layout: GuestRunLayout, files: Mapping[str, bytes | str]
) -> list[tuple[str, bytes | str]]:
    """Each caller file as a path under ``work/``, refused before anything is written: absolute
    and escaping paths (lexical confinement under ``work/``) and reserved top-level names."""
    checked: list[tuple[str, bytes | str]] = []
    for name, data in files.items():
        if name.startswith("/"):
            raise PathRefused(
                path=name, rule="absolute_outside_work_dir", detail="name run files relative"
            )
        confined = confine(name, layout.work_path)
        first = collision_key(confined.parts[0])
        if first in RESERVED_NAMES or first.startswith(f"{SHIM_MODULE}."):
            raise HostToolFileNameReserved(name)
        checked.append((f"{layout.work}/{confined.relative}", data))
    return checked
