#!/usr/bin/env python3
"""A real local Kubernetes cluster that the project brings up by itself.

    hack/cluster.py up [--level api|node] [--clean]
                                            start (idempotent: a running cluster is left alone;
                                            --clean: wipe the state of a stopped cluster first)
    hack/cluster.py down [--wipe]           stop every process it started, by pid; --wipe: state
    hack/cluster.py status                  what runs, where the kubeconfig and logs are, and
                                            whether the machine could run a microVM (vmx/svm
                                            and /dev/kvm, or only a paravirtual /dev/kvm)
    hack/cluster.py images                  build the images (and import them if containerd runs)
    hack/cluster.py kubeconfig              print the kubeconfig path
    hack/cluster.py kwok up [--nodes 3]     fake nodes for scale tests: start kwok, create the
                                            nodes and RuntimeClass `kwok` (cluster must be up)
    hack/cluster.py kwok down               delete them and stop kwok (`down` does it too)
    hack/cluster.py restart NAME [--kill]   stop one control-plane process (kube-apiserver,
                                            etcd, kube-controller-manager, kube-scheduler) and
                                            start it as `up` does; --kill: SIGKILL, a crash
                                            (fault tests: the API server restarted mid-burst)

Levels: `api` = etcd, kube-apiserver, kube-controller-manager, the volume provisioner
(hack/local_path_provisioner.py, StorageClass `sandbox-local`); `node` (the default) adds
kube-scheduler, containerd (runc and gVisor handlers, CNI bridge), a kubelet and kube-proxy,
imports the images and creates the RuntimeClasses `runc` and `gvisor`.

Only the standard library is used, so any python3 runs it (the volume provisioner it starts runs
on the project's venv, .venv/bin/python, for the `kubernetes` client). Binaries come from
hack/build-binaries.sh (built from the Go module proxy and cached by version), system packages
from Debian (installed when missing). Everything the cluster writes lives under one state
directory ($SANDBOX_OPERATOR_STATE, default ~/.cache/sandbox-operator/state): certificates,
kubeconfigs, etcd data, containerd and kubelet roots, pid files and logs/.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

# The commands live here; what they drive is the package beside this file (hack/localcluster/,
# one concern per module). The names below are looked up in this module when a command runs, so
# a test that replaces one here (STATE, PIDS, start, pid_alive, ...) changes what the command does.
# The `name as name` imports are not used here: the unit tests reach them through this module.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from localcluster.binaries import Bins, binary_paths, ensure_binaries, ensure_packages
from localcluster.containerd import containerd_proc, import_images, write_containerd_config
from localcluster.control_plane import (
    apiserver_proc,
    etcd_proc,
    kcm_proc,
    local_path_proc,
    scheduler_proc,
)
from localcluster.hostnet import prepare_host
from localcluster.kwok import KWOK_POD_CIDR as KWOK_POD_CIDR
from localcluster.kwok import KWOK_RUNTIME_CLASS, kwok_down, kwok_nodes, kwok_up
from localcluster.kwok import kwok_config_text as kwok_config_text
from localcluster.kwok import kwok_node as kwok_node
from localcluster.kwok import kwok_node_name as kwok_node_name
from localcluster.kwok import kwok_proc as kwok_proc
from localcluster.kwok import kwok_runtime_class as kwok_runtime_class
from localcluster.layout import HACK, KUBECONFIG, LOGS, NETPOL, NODE_NAME, PIDS, STATE
from localcluster.layout import POD_SUBNET as POD_SUBNET
from localcluster.machine import cpu_flags as cpu_flags
from localcluster.machine import detect_virtualisation as detect_virtualisation
from localcluster.machine import machine_virtualisation
from localcluster.node import (
    kube_proxy_proc,
    kubelet_proc,
    start_kube_router,
    write_kube_proxy_config,
    write_kubelet_config,
)
from localcluster.objects import (
    ensure_runtime_classes,
    ensure_storage_class,
    wait_default_service_account,
    wait_node_ready,
)
from localcluster.pki import ensure_kubeconfigs, ensure_pki, node_ip
from localcluster.probes import PROBES, alive_api, api, containerd_healthy, kwok_healthy
from localcluster.steps import T0, StepFailed, run, say
from localcluster.supervise import (
    ORDER,
    Proc,
    anything_running,
    pid_alive,
    read_pidfile,
    start,
    stop_record,
    wait_for,
)
from localcluster.teardown import stop_containers, wipe_state


@contextlib.contextmanager
def state_lock() -> Iterator[None]:
    STATE.parent.mkdir(parents=True, exist_ok=True)
    # Beside the state directory, not in it: `--clean` and `down --wipe` delete that directory.
    with (STATE.parent / f".{STATE.name}.lock").open("a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("another hack/cluster.py holds the state lock: waiting for it")
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def cmd_up(level: str, clean: bool = False) -> None:
    if os.geteuid() != 0 and level == "node":
        raise StepFailed("preflight", "the node level needs root (containerd, kubelet, CNI)")
    with state_lock():
        if clean and (PIDS.exists() or (STATE / "etcd").exists()) and not anything_running():
            say("--clean: state of a stopped cluster found; starting from an empty state")
            wipe_state()
            STATE.mkdir(parents=True, exist_ok=True)
        say(f"bringing up the local cluster, level {level}; state in {STATE}")
        ensure_packages(level)
        bins = ensure_binaries(level)
        ip = node_ip()
        ensure_pki(ip)
        ensure_kubeconfigs()
        start(etcd_proc(bins))
        start(apiserver_proc(bins, ip))
        start(kcm_proc(bins))
        # Both levels schedule: the api level has no node of its own, but kwok's fake nodes
        # (tests that need a control plane, not a kubelet) take pods only once they are bound.
        start(scheduler_proc(bins))
        wait_default_service_account()
        start(local_path_proc())
        ensure_storage_class()
        if level == "node":
            prepare_host()
            start(containerd_proc(write_containerd_config(bins)))
            import_images()
            start(kubelet_proc(bins, ip, write_kubelet_config()))
            wait_node_ready()
            start(kube_proxy_proc(bins, write_kube_proxy_config()))
            start_kube_router()
            ensure_runtime_classes()
        (STATE / "level").write_text(level)
    say(f"cluster is up (level {level}) in {time.monotonic() - T0:.0f}s")
    say(f"machine: {machine_virtualisation().line}")
    print(f"\nexport KUBECONFIG={KUBECONFIG}")
    print(f"kubectl: {bins.kube('kubectl')}")
    print(f"logs:    {LOGS}/")


#: What `restart` may restart: processes whose command line needs nothing but the binaries and
#: the node's address, so the restarted one is exactly what `up` starts.
RESTARTABLE: dict[str, Callable[[Bins, str], Proc]] = {
    "kube-apiserver": apiserver_proc,
    "etcd": lambda bins, ip: etcd_proc(bins),
    "kube-controller-manager": lambda bins, ip: kcm_proc(bins),
    "kube-scheduler": lambda bins, ip: scheduler_proc(bins),
}
#: Starts `restart` tries (2 s apart) when the new process exits while coming up.
RESTART_ATTEMPTS = 5


def cmd_restart(name: str, kill: bool = False) -> float:
    """Stop one running control-plane process (SIGTERM, or SIGKILL with `kill`) and start it
    again as `up` does. Returns the outage: seconds from the signal until it is healthy again."""
    with state_lock():
        record = read_pidfile(PIDS / f"{name}.json")
        if not record or not pid_alive(record):
            raise StepFailed(f"restart {name}", "it does not run: `hack/cluster.py up` first")
        proc = RESTARTABLE[name](binary_paths(), node_ip())
        started = time.monotonic()
        if kill:
            say(f"killing {name} (pid {record['pid']})")
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(record["pid"]), signal.SIGKILL)
            wait_for(f"{name} gone", lambda: not pid_alive(record), 10)
        else:
            stop_record(name, record)
        # The leader of a killed Go process is a zombie while its other threads still close
        # their files: its port can be held a moment longer, and a start then exits at once
        # ("bind: address already in use"; seen in a CI run). Started again until it binds.
        start(replace(proc, attempts=max(proc.attempts, RESTART_ATTEMPTS)))
        outage = time.monotonic() - started
    pid = (read_pidfile(PIDS / f"{name}.json") or {}).get("pid")
    say(f"{name} restarted (pid {record['pid']} -> {pid}): down for {outage:.1f}s")
    return outage


def cmd_kwok_up(nodes: int) -> None:
    with state_lock():
        kwok_up(nodes)
    say(f"kwok is up: {nodes} fake node(s); pods with runtimeClassName {KWOK_RUNTIME_CLASS} "
        "run there (on paper)")  # fmt: skip


def cmd_kwok_down() -> None:
    with state_lock():
        kwok_down()
    say("kwok is down")


def cmd_down(wipe: bool) -> None:
    with state_lock():
        if read_pidfile(PIDS / "kwok.json"):
            kwok_down(quiet=True)
        router = read_pidfile(PIDS / "kube-router.json")
        if router:
            stop_record("kube-router", router)
            (PIDS / "kube-router.json").unlink(missing_ok=True)
            subprocess.run(["bash", str(NETPOL), "cleanup"], capture_output=True)
        kubelet = read_pidfile(PIDS / "kubelet.json")
        if kubelet:
            stop_record("kubelet", kubelet)
        stop_containers()
        for name in ORDER:
            record = read_pidfile(PIDS / f"{name}.json")
            if record:
                stop_record(name, record)
                (PIDS / f"{name}.json").unlink(missing_ok=True)
        if wipe:
            wipe_state()
    say("cluster is down")


def cmd_status() -> int:
    rc = 0
    level = (STATE / "level").read_text() if (STATE / "level").exists() else "none"
    print(f"state:      {STATE} (last level brought up: {level})")
    print(f"kubeconfig: {KUBECONFIG}")
    print(f"machine:    {machine_virtualisation().line}")
    for name in reversed(ORDER):
        record = read_pidfile(PIDS / f"{name}.json")
        alive = bool(record and pid_alive(record))
        try:
            healthy = alive and PROBES[name]()
        except Exception:
            healthy = False
        state = "healthy" if healthy else ("running, not healthy" if alive else "stopped")
        pid = f"pid {record['pid']}" if alive and record else ""
        print(f"  {name:25s} {state:22s} {pid}")
        if record and not healthy:
            rc = 1
    kwok = read_pidfile(PIDS / "kwok.json")
    if kwok:  # only once `kwok up` ran
        alive = pid_alive(kwok)
        try:
            healthy = alive and kwok_healthy()
        except Exception:
            healthy = False
        state = "healthy" if healthy else ("running, not healthy" if alive else "stopped")
        pid = f"pid {kwok['pid']}" if alive else ""
        print(f"  {'kwok':25s} {state:22s} {pid}")
        rc = rc if healthy else 1
    if level == "none":
        rc = 3
    if alive_api():
        code, node = api("GET", f"/api/v1/nodes/{NODE_NAME}")
        if code == 200:
            conds = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
            print(f"  node {NODE_NAME}: Ready={conds.get('Ready')}")
        code, rcs = api("GET", "/apis/node.k8s.io/v1/runtimeclasses")
        if code == 200:
            names = [f"{i['metadata']['name']}({i['handler']})" for i in rcs["items"]]
            print(f"  runtimeclasses: {' '.join(names) or '-'}")
        code, scs = api("GET", "/apis/storage.k8s.io/v1/storageclasses")
        if code == 200:
            names = [f"{i['metadata']['name']}({i['provisioner']})" for i in scs["items"]]
            print(f"  storageclasses: {' '.join(names) or '-'}")
        if kwok:
            print(f"  fake nodes (kwok): {' '.join(kwok_nodes()) or '-'}")
    return rc


def cmd_images() -> None:
    if containerd_healthy():
        import_images()
    else:
        out = run(["bash", str(HACK / "images.sh"), "build"])
        print(out, end="")
        say("containerd is not running: `hack/cluster.py up` imports these when it starts it")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start the cluster (idempotent)")
    up.add_argument("--level", choices=("api", "node"), default="node")
    up.add_argument(
        "--clean",
        action="store_true",
        help="if nothing of the cluster runs, wipe its old state first (CI: no stale pods)",
    )
    down = sub.add_parser("down", help="stop every process the cluster started")
    down.add_argument("--wipe", action="store_true", help="also delete the state directory")
    sub.add_parser("status", help="show what runs")
    sub.add_parser("images", help="build the images; import them if containerd runs")
    sub.add_parser("kubeconfig", help="print the kubeconfig path")
    kwok = sub.add_parser("kwok", help="fake nodes for scale tests (kwok): up [--nodes N] | down")
    kwok_sub = kwok.add_subparsers(dest="kwok_cmd", required=True)
    kwok_up = kwok_sub.add_parser(
        "up", help="start kwok, create N fake nodes and RuntimeClass kwok"
    )
    kwok_up.add_argument("--nodes", type=int, default=3, help="number of fake nodes (default 3)")
    kwok_sub.add_parser("down", help="delete the fake nodes and RuntimeClass kwok, stop kwok")
    restart = sub.add_parser("restart", help="restart one control-plane process (fault tests)")
    restart.add_argument("name", choices=sorted(RESTARTABLE))
    restart.add_argument("--kill", action="store_true", help="SIGKILL (a crash), not SIGTERM")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "up":
            cmd_up(args.level, args.clean)
        elif args.cmd == "down":
            cmd_down(args.wipe)
        elif args.cmd == "status":
            return cmd_status()
        elif args.cmd == "images":
            cmd_images()
        elif args.cmd == "kubeconfig":
            print(KUBECONFIG)
        elif args.cmd == "kwok" and args.kwok_cmd == "up":
            if args.nodes < 1:
                parser.error("--nodes must be at least 1")
            cmd_kwok_up(args.nodes)
        elif args.cmd == "kwok":
            cmd_kwok_down()
        elif args.cmd == "restart":
            cmd_restart(args.name, args.kill)
    except StepFailed as exc:
        say(f"FAILED at step: {exc.step}: {exc.detail}")
        if exc.log is not None:
            say(f"log: {exc.log}")
            with contextlib.suppress(OSError):
                tail = exc.log.read_text(errors="replace").splitlines()[-25:]
                print("\n".join(f"    | {line}" for line in tail), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
