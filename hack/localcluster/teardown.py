"""Taking the node apart: every container task killed (none may outlive `down`), and for
`down --wipe` / `up --clean` the state directory deleted once nothing is mounted under it, with
the bridge, the Service guard and kube-router's and kube-proxy's iptables rules removed."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

from .containerd import ctr
from .hostnet import service_guard
from .layout import BRIDGE, CACHE, CONTAINERD_DIR, NETPOL, STATE
from .probes import containerd_healthy
from .steps import StepFailed, say


def stop_containers() -> None:
    """Kill every task containerd runs, so that no container or sandbox outlives `down`."""
    if not containerd_healthy():
        return
    ids = ctr("tasks", "ls", "-q", check=False, timeout=15).split()
    if ids:
        say(f"killing {len(ids)} container task(s)")
    for cid in ids:
        ctr("tasks", "kill", "-a", "-s", "SIGKILL", cid, check=False, timeout=5)
    for cid in ids:
        ctr("tasks", "delete", "-f", cid, check=False, timeout=5)
    # A task whose shim does not answer: end its recorded process (container init, gVisor
    # sandbox or exit watcher) by pid; the shim then finds it gone.
    tasks = CONTAINERD_DIR / "state" / "io.containerd.runtime.v2.task" / "k8s.io"
    for cid in ctr("tasks", "ls", "-q", check=False, timeout=15).split():
        with contextlib.suppress(OSError, ValueError):
            pid = int((tasks / cid / "init.pid").read_text().strip())
            if pid > 1:
                os.kill(pid, signal.SIGKILL)


def mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mnt = line.split()[4].replace("\\040", " ")
        if mnt.startswith(prefix):
            found.append(mnt)
    return sorted(found, key=len, reverse=True)


def wipe_state(network: bool = True) -> None:
    """Delete the state directory: unmount what the kubelet and containerd left mounted under
    it first, and refuse to delete anything while a mount remains."""
    if not STATE.exists():
        return
    for mnt in mounts_under(STATE):
        subprocess.run(["umount", "-l", mnt], capture_output=True)
    left = mounts_under(STATE)
    if left:
        raise StepFailed("wipe", f"still mounted, not deleting state: {left[:5]}")
    if network and (STATE / "cni").exists():  # only a node-level state made the bridge
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True)
        service_guard(install=False)
        subprocess.run(["bash", str(NETPOL), "cleanup"], capture_output=True)
        proxy = sorted((CACHE / "bin").glob("kubernetes-v*/kube-proxy"))
        if proxy:  # remove kube-proxy's iptables chains
            subprocess.run([str(proxy[-1]), "--cleanup"], capture_output=True)
    shutil.rmtree(STATE, ignore_errors=True)
    say(f"state wiped: {STATE}")
