"""Process supervision without a supervisor: each component is started detached (its own
session, its output appended to logs/NAME.log), recorded in pids/NAME.json (pid, executable,
a fingerprint of its command line and inputs, start time), waited for until healthy, and later
stopped by that pid.

The record is what makes `up` idempotent: a live process with the same fingerprint is left
alone, a changed one restarted; and what lets `down` stop exactly what `up` started."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .layout import LOGS, PIDS
from .steps import StepFailed, say, step


@dataclass
class Proc:
    name: str
    argv: list[str]
    health: Callable[[], bool]
    env: dict[str, str] | None = None
    timeout: float = 90.0
    # Files the process reads its configuration from: a change restarts it, like a new flag.
    inputs: tuple[Path, ...] = ()
    # Starts to try when the process exits while coming up (the kubelet exits when containerd's
    # CRI is still initialising, which `ctr version` cannot see).
    attempts: int = 1

    @property
    def pidfile(self) -> Path:
        return PIDS / f"{self.name}.json"

    @property
    def log(self) -> Path:
        return LOGS / f"{self.name}.log"

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256(json.dumps([self.argv, sorted((self.env or {}).items())]).encode())
        for path in self.inputs:
            digest.update(path.read_bytes())
        return digest.hexdigest()[:16]


def read_pidfile(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data


def pid_alive(record: dict[str, Any]) -> bool:
    """The recorded process still runs: same pid, same executable, not a zombie."""
    pid = int(record.get("pid", 0))
    if pid <= 0:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    return cmdline[0].decode(errors="replace") == record.get("exe")


def wait_for(
    what: str,
    check: Callable[[], bool],
    timeout: float,
    log: Path | None = None,
    alive: Callable[[], bool] | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # a probe that raises is simply "not yet"
            pass
        if alive is not None and not alive():
            raise StepFailed(what, "the process exited", log)
        time.sleep(0.5)
    raise StepFailed(what, f"not healthy after {timeout:.0f}s", log)


def start(proc: Proc) -> None:
    """Start `proc` unless the recorded one runs with the same command line (then: no-op)."""
    record = read_pidfile(proc.pidfile)
    if record and pid_alive(record):
        if record.get("fingerprint") == proc.fingerprint:
            wait_for(proc.name, proc.health, proc.timeout, proc.log, lambda: pid_alive(record))
            return
        say(f"{proc.name}: configuration changed, restarting pid {record['pid']}")
        stop_record(proc.name, record)
    with step(f"start {proc.name} (log {proc.log})", proc.log):
        LOGS.mkdir(parents=True, exist_ok=True)
        PIDS.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(proc.env or {})
        for attempt in range(1, proc.attempts + 1):
            child = spawn(proc, env)
            try:
                wait_for(
                    f"{proc.name} health",
                    proc.health,
                    proc.timeout,
                    proc.log,
                    lambda child=child: child.poll() is None,
                )
                return
            except StepFailed as exc:
                if child.poll() is None or attempt == proc.attempts:
                    raise
                say(f"{proc.name} exited at start ({exc.detail}); retrying ({attempt})")
                time.sleep(2)


def spawn(proc: Proc, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with proc.log.open("a") as fh:
        fh.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(proc.argv)}\n")
        fh.flush()
        child = subprocess.Popen(
            proc.argv,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    record = {
        "pid": child.pid,
        "exe": proc.argv[0],
        "fingerprint": proc.fingerprint,
        "started": time.time(),
    }
    proc.pidfile.write_text(json.dumps(record))
    return child


def stop_record(name: str, record: dict[str, Any], grace: float = 10.0) -> None:
    pid = int(record["pid"])
    if not pid_alive(record):
        return
    say(f"stopping {name} (pid {pid})")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and pid_alive(record):
        time.sleep(0.2)
    if pid_alive(record):
        say(f"{name} (pid {pid}) ignored SIGTERM for {grace:.0f}s: SIGKILL")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)


#: The cluster's processes in the order `down` stops them (`status` lists them the other way).
ORDER = [
    "local-path-provisioner",
    "kube-router",
    "kube-proxy",
    "kubelet",
    "kube-scheduler",
    "containerd",
    "kube-controller-manager",
    "kube-apiserver",
    "etcd",
]


def anything_running() -> bool:
    return any(
        (record := read_pidfile(PIDS / f"{name}.json")) and pid_alive(record) for name in ORDER
    )
