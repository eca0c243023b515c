"""What the cluster runs, and where it comes from: Kubernetes, etcd, gVisor, helm, kube-router
built from the Go module proxy (hack/build-binaries.sh, hack/build-netpol.sh, cached by version),
and the Debian packages the node needs (installed when missing).

Each is built or installed only when missing, so a second `up` costs nothing here."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .layout import HACK, LOGS, NETPOL
from .steps import StepFailed, run, say, step

# Debian packages the node needs, each with a file that shows it is installed.
PACKAGES = {
    "openssl": "/usr/bin/openssl",
    "containerd": "/usr/bin/containerd",
    "runc": "/usr/sbin/runc",
    "containernetworking-plugins": "/usr/lib/cni/bridge",
    "umoci": "/usr/bin/umoci",
    "iptables": "/usr/sbin/iptables",
    "conntrack": "/usr/sbin/conntrack",
    "socat": "/usr/bin/socat",
    "iproute2": "/usr/sbin/ip",
    "kmod": "/usr/sbin/modprobe",
    "gcc": "/usr/bin/gcc",
    "libc6-dev": "/usr/lib/x86_64-linux-gnu/libc.a",
}
API_PACKAGES = ("openssl",)


@dataclass(frozen=True)
class Bins:
    k8s: Path
    etcd: Path
    helm: Path
    gvisor: Path

    def kube(self, name: str) -> str:
        return str(self.k8s / name)


def binary_paths() -> Bins:
    out = run(["bash", str(HACK / "build-binaries.sh"), "print-paths"])
    paths = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return Bins(
        k8s=Path(paths["K8S_BIN"]),
        etcd=Path(paths["ETCD_BIN"]),
        helm=Path(paths["HELM_BIN"]),
        gvisor=Path(paths["GVISOR_BIN"]),
    )


def build_target(target: str, want: list[Path]) -> None:
    if all(p.is_file() and os.access(p, os.X_OK) for p in want):
        return
    log = LOGS / f"build-{target}.log"
    name = f"build {target} from the Go module proxy (log {log})"
    with step(name, log):
        if shutil.which("go") is None:
            raise StepFailed(name, "`go` is not on PATH", log)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as fh:
            proc = subprocess.Popen(
                ["bash", str(HACK / "build-binaries.sh"), target],
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
            started = time.monotonic()
            while proc.poll() is None:
                time.sleep(5)
                if int(time.monotonic() - started) % 60 < 5:
                    say(f"  still building {target}: {(time.monotonic() - started) / 60:.0f} min")
        if proc.returncode != 0:
            raise StepFailed(name, f"build-binaries.sh {target} exited {proc.returncode}", log)
        missing = [str(p) for p in want if not p.is_file()]
        if missing:
            raise StepFailed(name, f"build finished but these are missing: {missing}", log)


def ensure_binaries(level: str) -> Bins:
    bins = binary_paths()
    build_target("etcd", [bins.etcd / "etcd"])
    # The control plane, scheduler included (kwok's fake nodes need pods bound): level api.
    kube = ["kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"]
    if level == "node":
        kube += ["kubelet", "kube-proxy"]
    build_target("kubernetes", [bins.k8s / b for b in kube])
    if level == "node":
        build_target("gvisor", [bins.gvisor / "runsc"])
        build_target("helm", [bins.helm / "helm"])  # not used by the cluster; by the chart's tests
        build_netpol()
    return bins


def build_netpol() -> None:
    binary = Path(run(["bash", str(NETPOL), "print-path"]).strip())
    if binary.is_file() and os.access(binary, os.X_OK) and shutil.which("ipset"):
        return
    log = LOGS / "build-kube-router.log"
    with step(f"build kube-router (NetworkPolicy controller) from the Go module proxy (log {log})"):
        if shutil.which("go") is None:
            raise StepFailed("build kube-router", "`go` is not on PATH", log)
        run(["bash", str(NETPOL), "build"], log=log)


def ensure_packages(level: str) -> None:
    wanted = PACKAGES if level == "node" else {k: PACKAGES[k] for k in API_PACKAGES}
    missing = [pkg for pkg, marker in wanted.items() if not Path(marker).exists()]
    if not missing:
        return
    log = LOGS / "apt.log"
    with step(f"install Debian packages {' '.join(missing)}", log):
        if os.geteuid() != 0:
            raise StepFailed(
                "apt-get", "not root: install these packages first: " + " ".join(missing)
            )
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        run(["apt-get", "update", "-q"], log=log, env=env)
        run(
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
            log=log,
            env=env,
        )
