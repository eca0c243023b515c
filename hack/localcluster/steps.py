"""How `up` and the other commands report and fail: a timestamped line per step, and a failure
that names its step and the log to read (`main` prints the log's last lines). Also the two ways
they touch the outside: running a command, writing a file that running processes read."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

T0 = time.monotonic()


class StepFailed(Exception):
    """A step of `up` failed; `log` is where its output went."""

    def __init__(self, step: str, detail: str, log: Path | None = None) -> None:
        super().__init__(f"{step}: {detail}")
        self.step = step
        self.detail = detail
        self.log = log


def say(msg: str) -> None:
    print(f"[cluster {time.strftime('%H:%M:%S')} +{time.monotonic() - T0:5.0f}s] {msg}", flush=True)


@contextlib.contextmanager
def step(name: str, log: Path | None = None) -> Iterator[None]:
    say(f"{name} ...")
    started = time.monotonic()
    try:
        yield
    except StepFailed:
        raise
    except Exception as exc:  # any failure inside a step is reported as that step's
        raise StepFailed(name, f"{type(exc).__name__}: {exc}", log) from exc
    say(f"{name}: done in {time.monotonic() - started:.1f}s")


def run(argv: list[str], *, log: Path | None = None, check: bool = True, **kw: Any) -> str:
    """Run a command; its output goes to `log` (appended) or is returned."""
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as fh:
            fh.write(f"\n$ {' '.join(argv)}\n")
            fh.flush()
            proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, text=True, **kw)
        out = ""
    else:
        proc = subprocess.run(argv, capture_output=True, text=True, **kw)
        out = proc.stdout
    if check and proc.returncode != 0:
        detail = f"`{' '.join(argv[:3])} ...` exited {proc.returncode}"
        if log is None:
            detail += f": {(proc.stderr or proc.stdout).strip()[-2000:]}"
        raise StepFailed(argv[0], detail, log)
    return out


def write_file(path: Path, text: str, mode: int = 0o644) -> None:
    """Write atomically, and only when the content differs: running processes (containerd
    watches the CNI directory, shims run the runsc wrapper) never see a half-written file."""
    try:
        if path.read_text() == text and (path.stat().st_mode & 0o777) == mode:
            return
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    tmp.replace(path)
