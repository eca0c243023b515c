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
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HACK = REPO / "hack"
CACHE = Path(os.environ.get("SANDBOX_OPERATOR_CACHE", Path.home() / ".cache/sandbox-operator"))
STATE = Path(os.environ.get("SANDBOX_OPERATOR_STATE", CACHE / "state"))
LOGS = STATE / "logs"
PIDS = STATE / "pids"
PKI = STATE / "pki"
KUBECONFIG = STATE / "kubeconfig"

NODE_NAME = "sandbox-operator-node"
# SANDBOX_OPERATOR_PORT_OFFSET shifts every port: a second, api-level cluster beside the first
# (with its own SANDBOX_OPERATOR_STATE), e.g. to try `up --clean` without touching the first.
_PORT_OFFSET = int(os.environ.get("SANDBOX_OPERATOR_PORT_OFFSET", "0"))
ETCD_CLIENT_PORT = 2379 + _PORT_OFFSET
ETCD_PEER_PORT = 2380 + _PORT_OFFSET
APISERVER_PORT = 6443 + _PORT_OFFSET
KCM_PORT = 10257 + _PORT_OFFSET
SCHEDULER_PORT = 10259 + _PORT_OFFSET
KUBELET_PORT = 10250 + _PORT_OFFSET
KUBELET_HEALTHZ_PORT = 10248 + _PORT_OFFSET
KUBE_PROXY_METRICS_PORT = 10249 + _PORT_OFFSET
KUBE_PROXY_HEALTHZ_PORT = 10256 + _PORT_OFFSET
KWOK_PORT = 10262 + _PORT_OFFSET  # kwok's server (healthz, metrics); `kwok up` only
LOCAL_PATH_PORT = 10265 + _PORT_OFFSET  # the volume provisioner's /healthz
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
POD_SUBNET = "10.244.0.0/24"
CLUSTER_CIDR = "10.244.0.0/16"
BRIDGE = "sbxop0"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
# Client-side API rate limits of the controller-manager and the scheduler (see kcm_proc and
# scheduler_proc): raised from the defaults (20/30 and 50/100), headroom for the scale benchmark.
KCM_API_QPS, KCM_API_BURST = 100, 200
SCHEDULER_API_QPS, SCHEDULER_API_BURST = 200, 400

IMAGES = {
    "pause": "sandbox-operator.dev/pause:1",
    "busybox": "sandbox-operator.dev/busybox:1",
    "python": "sandbox-operator.dev/python:1",
}
RUNTIME_CLASSES = {"runc": "runc", "gvisor": "runsc"}

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


# --------------------------------------------------------------------------------------------
# Binaries and packages


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
    kube = ["kube-apiserver", "kube-controller-manager", "kubectl"]
    if level == "node":
        kube += ["kube-scheduler", "kubelet", "kube-proxy"]
    build_target("kubernetes", [bins.k8s / b for b in kube])
    if level == "node":
        build_target("gvisor", [bins.gvisor / "runsc"])
        build_target("helm", [bins.helm / "helm"])  # not used by the cluster; by the chart's tests
        build_netpol()
    return bins


# NetworkPolicy enforcement: kube-router's policy controller (hack/build-netpol.sh, docs/egress.md).
NETPOL = HACK / "build-netpol.sh"


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


# --------------------------------------------------------------------------------------------
# Certificates and kubeconfigs


def node_ip() -> str:
    """The IPv4 address of the interface that holds the default route (else the first global)."""
    out = run(["ip", "-4", "-o", "route", "show", "default"], check=False)
    dev = ""
    for tok_line in out.splitlines():
        toks = tok_line.split()
        if "dev" in toks:
            dev = toks[toks.index("dev") + 1]
            break
    addrs = run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"] + (["dev", dev] if dev else [])
    )
    for line in addrs.splitlines():
        toks = line.split()
        if "inet" in toks:
            return toks[toks.index("inet") + 1].split("/")[0]
    raise StepFailed("node ip", "no global IPv4 address on this machine")


@dataclass(frozen=True)
class Cert:
    name: str
    cn: str
    org: str = ""
    server: bool = False
    client: bool = False
    sans: tuple[str, ...] = ()


def leaf_certs(ip: str) -> list[Cert]:
    api_sans = (
        "DNS:kubernetes",
        "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc",
        "DNS:kubernetes.default.svc.cluster.local",
        "DNS:localhost",
        "IP:127.0.0.1",
        f"IP:{ip}",
        f"IP:{SERVICE_IP}",
    )
    return [
        Cert("apiserver", "kube-apiserver", server=True, sans=api_sans),
        Cert(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            "system:masters",
            client=True,
        ),
        Cert("admin", "sandbox-operator-admin", "system:masters", client=True),
        Cert("controller-manager", "system:kube-controller-manager", client=True),
        Cert("scheduler", "system:kube-scheduler", client=True),
        Cert("kube-proxy", "system:kube-proxy", client=True),
        Cert("kubelet-client", f"system:node:{NODE_NAME}", "system:nodes", client=True),
        Cert(
            "kubelet-serving",
            NODE_NAME,
            server=True,
            sans=(f"DNS:{NODE_NAME}", "DNS:localhost", "IP:127.0.0.1", f"IP:{ip}"),
        ),
    ]


def ensure_pki(ip: str) -> None:
    marker = PKI / "node-ip"
    same_ip = marker.exists() and marker.read_text() == ip
    certs = [c for c in leaf_certs(ip) if not same_ip or not (PKI / f"{c.name}.crt").exists()]
    if same_ip and not certs:
        return
    log = LOGS / "pki.log"
    with step(f"generate certificates (throwaway CA, node ip {ip})", log):
        PKI.mkdir(parents=True, exist_ok=True)
        os.chmod(PKI, 0o700)
        ca_key, ca_crt = PKI / "ca.key", PKI / "ca.crt"
        if not ca_crt.exists():
            run(
                [
                    "openssl",
                    "ecparam",
                    "-name",
                    "prime256v1",
                    "-genkey",
                    "-noout",
                    "-out",
                    str(ca_key),
                ],
                log=log,
            )
            run(
                ["openssl", "req", "-x509", "-new", "-key", str(ca_key), "-sha256", "-days", "3650",
                 "-subj", "/CN=sandbox-operator-ca", "-out", str(ca_crt),
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"],
                log=log,
            )  # fmt: skip
        if not (PKI / "sa.key").exists():
            run(["openssl", "genrsa", "-out", str(PKI / "sa.key"), "2048"], log=log)
            run(
                [
                    "openssl",
                    "rsa",
                    "-in",
                    str(PKI / "sa.key"),
                    "-pubout",
                    "-out",
                    str(PKI / "sa.pub"),
                ],
                log=log,
            )
        for cert in certs:
            key, csr, crt = (PKI / f"{cert.name}.{ext}" for ext in ("key", "csr", "crt"))
            ext = PKI / f"{cert.name}.ext"
            usages = [
                u for u, on in (("serverAuth", cert.server), ("clientAuth", cert.client)) if on
            ]
            lines = [
                "basicConstraints=critical,CA:FALSE",
                "keyUsage=critical,digitalSignature,keyEncipherment",
                f"extendedKeyUsage={','.join(usages)}",
            ]
            if cert.sans:
                lines.append(f"subjectAltName={','.join(cert.sans)}")
            ext.write_text("\n".join(lines) + "\n")
            subj = f"/CN={cert.cn}" + (f"/O={cert.org}" if cert.org else "")
            run(
                [
                    "openssl",
                    "ecparam",
                    "-name",
                    "prime256v1",
                    "-genkey",
                    "-noout",
                    "-out",
                    str(key),
                ],
                log=log,
            )
            run(
                ["openssl", "req", "-new", "-key", str(key), "-subj", subj, "-out", str(csr)],
                log=log,
            )
            run(
                ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca_crt),
                 "-CAkey", str(ca_key), "-CAcreateserial", "-days", "3650", "-sha256",
                 "-extfile", str(ext), "-out", str(crt)],
                log=log,
            )  # fmt: skip
            csr.unlink()
            ext.unlink()
        for f in PKI.glob("*.key"):
            os.chmod(f, 0o600)
        marker.write_text(ip)


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


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, user: str, cert: str, server: str) -> None:
    text = f"""apiVersion: v1
kind: Config
clusters:
- name: sandbox-operator
  cluster:
    server: {server}
    certificate-authority-data: {b64(PKI / "ca.crt")}
users:
- name: {user}
  user:
    client-certificate-data: {b64(PKI / f"{cert}.crt")}
    client-key-data: {b64(PKI / f"{cert}.key")}
contexts:
- name: sandbox-operator
  context:
    cluster: sandbox-operator
    user: {user}
    namespace: default
current-context: sandbox-operator
"""
    write_file(path, text, 0o600)


def ensure_kubeconfigs() -> None:
    server = f"https://127.0.0.1:{APISERVER_PORT}"
    KUBECONFIG.parent.mkdir(parents=True, exist_ok=True)
    write_kubeconfig(KUBECONFIG, "admin", "admin", server)
    kc = STATE / "kubeconfigs"
    kc.mkdir(parents=True, exist_ok=True)
    write_kubeconfig(kc / "controller-manager", "controller-manager", "controller-manager", server)
    write_kubeconfig(kc / "scheduler", "scheduler", "scheduler", server)
    write_kubeconfig(kc / "kubelet", "kubelet", "kubelet-client", server)
    write_kubeconfig(kc / "kube-proxy", "kube-proxy", "kube-proxy", server)


# --------------------------------------------------------------------------------------------
# Processes: started detached, recorded by pid, stopped by pid


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


# --------------------------------------------------------------------------------------------
# Health probes


def _tls_context(client: bool = True, verify: bool = True) -> ssl.SSLContext:
    ctx = (
        ssl.create_default_context(cafile=str(PKI / "ca.crt"))
        if verify
        else ssl._create_unverified_context()
    )
    if client:
        ctx.load_cert_chain(str(PKI / "admin.crt"), str(PKI / "admin.key"))
    return ctx


def http_ok(url: str, ctx: ssl.SSLContext | None = None, expect: bytes = b"ok") -> bool:
    with urllib.request.urlopen(url, context=ctx, timeout=3) as resp:
        body: bytes = resp.read()
        return resp.status == 200 and expect in body


def api(method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """A request to the API server as the admin user."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        f"https://127.0.0.1:{APISERVER_PORT}{path}",
        data=data,
        method=method,
        headers={"Content-Type": "application/json", "Accept": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, context=_tls_context(), timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        try:
            return err.code, json.loads(err.read() or b"null")
        except ValueError:
            return err.code, None


def etcd_healthy() -> bool:
    return http_ok(f"http://127.0.0.1:{ETCD_CLIENT_PORT}/health", expect=b'"true"')


def apiserver_ready() -> bool:
    return http_ok(f"https://127.0.0.1:{APISERVER_PORT}/readyz", _tls_context())


def kcm_healthy() -> bool:
    return http_ok(
        f"https://127.0.0.1:{KCM_PORT}/healthz", _tls_context(client=False, verify=False)
    )


def scheduler_healthy() -> bool:
    return http_ok(
        f"https://127.0.0.1:{SCHEDULER_PORT}/healthz", _tls_context(client=False, verify=False)
    )


def kube_proxy_healthy() -> bool:
    return http_ok(f"http://127.0.0.1:{KUBE_PROXY_HEALTHZ_PORT}/healthz", expect=b"")


def kubelet_healthy() -> bool:
    return http_ok(f"http://127.0.0.1:{KUBELET_HEALTHZ_PORT}/healthz")


CONTAINERD_DIR = STATE / "containerd"
CONTAINERD_SOCK = CONTAINERD_DIR / "containerd.sock"


def ctr(*args: str, log: Path | None = None, check: bool = True, timeout: float = 120) -> str:
    argv = ["ctr", "--address", str(CONTAINERD_SOCK), "-n", "k8s.io", *args]
    try:
        return run(argv, log=log, check=check, timeout=timeout)
    except subprocess.TimeoutExpired:
        if check:
            raise StepFailed("ctr", f"`ctr {' '.join(args[:2])}` timed out", log) from None
        return ""


def containerd_healthy() -> bool:
    if not CONTAINERD_SOCK.exists():
        return False
    out = subprocess.run(
        ["ctr", "--address", str(CONTAINERD_SOCK), "version"], capture_output=True, timeout=5
    )
    return out.returncode == 0


# --------------------------------------------------------------------------------------------
# Components


def etcd_proc(bins: Bins) -> Proc:
    data = STATE / "etcd"
    return Proc(
        "etcd",
        [
            str(bins.etcd / "etcd"),
            "--name=sandbox-operator",
            f"--data-dir={data}",
            f"--listen-client-urls=http://127.0.0.1:{ETCD_CLIENT_PORT}",
            f"--advertise-client-urls=http://127.0.0.1:{ETCD_CLIENT_PORT}",
            f"--listen-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}",
            f"--initial-cluster=sandbox-operator=http://127.0.0.1:{ETCD_PEER_PORT}",
            "--listen-metrics-urls=",
            # A disposable test cluster: trade durability for speed on slow shared disks.
            "--unsafe-no-fsync",
            "--quota-backend-bytes=4294967296",
            "--log-level=warn",
        ],
        etcd_healthy,
    )


def apiserver_proc(bins: Bins, ip: str) -> Proc:
    return Proc(
        "kube-apiserver",
        [
            bins.kube("kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{ETCD_CLIENT_PORT}",
            "--bind-address=0.0.0.0",
            f"--secure-port={APISERVER_PORT}",
            f"--advertise-address={ip}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,"
            "DefaultTolerationSeconds,NodeRestriction,RuntimeClass,Priority,ResourceQuota,"
            "PodSecurity,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,"
            "ValidatingAdmissionPolicy",
            f"--client-ca-file={PKI / 'ca.crt'}",
            f"--tls-cert-file={PKI / 'apiserver.crt'}",
            f"--tls-private-key-file={PKI / 'apiserver.key'}",
            f"--kubelet-client-certificate={PKI / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={PKI / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={PKI / 'ca.crt'}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-account-key-file={PKI / 'sa.pub'}",
            f"--service-account-signing-key-file={PKI / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            "--profiling=false",
            "--event-ttl=1h",
            "--v=1",
        ],
        apiserver_ready,
        timeout=120,
    )


def kcm_proc(bins: Bins) -> Proc:
    kc = STATE / "kubeconfigs" / "controller-manager"
    return Proc(
        "kube-controller-manager",
        [
            bins.kube("kube-controller-manager"),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={KCM_PORT}",
            "--leader-elect=false",
            # "*" = every default controller: garbage collector, namespace, service-account,
            # service-account-token, root-ca-cert-publisher, node lifecycle, ...
            "--controllers=*",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={PKI / 'sa.key'}",
            f"--root-ca-file={PKI / 'ca.crt'}",
            f"--cluster-signing-cert-file={PKI / 'ca.crt'}",
            f"--cluster-signing-key-file={PKI / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # Client-side rate limits (defaults 20/30) raised for the scale benchmark
            # (benchmarks/scale.py, thousands of pods on kwok nodes): headroom, so that the
            # garbage collector, namespace and pod-GC controllers never queue behind 20/s.
            f"--kube-api-qps={KCM_API_QPS}",
            f"--kube-api-burst={KCM_API_BURST}",
            "--profiling=false",
            "--v=1",
        ],
        kcm_healthy,
    )


def scheduler_proc(bins: Bins) -> Proc:
    kc = STATE / "kubeconfigs" / "scheduler"
    return Proc(
        "kube-scheduler",
        [
            bins.kube("kube-scheduler"),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={SCHEDULER_PORT}",
            "--leader-elect=false",
            # The default 50 requests/s would cap binding at ~50 pods/s (one bind per pod).
            # Headroom for benchmarks/scale.py: measured on 2 cores, the API server is the limit
            # (2,000 kwok pods created at ~40/s, each bound 0.4 s p50 after creation).
            f"--kube-api-qps={SCHEDULER_API_QPS}",
            f"--kube-api-burst={SCHEDULER_API_BURST}",
            "--profiling=false",
            "--v=1",
        ],
        scheduler_healthy,
    )


# containerd 1.6 runs gVisor through its runc v2 shim (gVisor's own shim speaks a newer
# protocol). runsc speaks runc's command line, with two differences this wrapper bridges:
# - runc gives a container its stdio at `create`; runsc takes a pod's app container's stdio from
#   the `start` process, whose output the shim captures into a pipe of its own (the container's
#   output would land there, and the shim, waiting for that pipe's EOF, hangs StartContainer).
#   So at `create` a holder process keeps the container's stdio open and `start` runs with it.
# - runsc reports the sandbox's pid for an app container, so the shim would only see the
#   container exit when the whole pod ends. A watcher process (`runsc wait`, exiting with the
#   container's status) stands in as the container's pid.
RUNSC_WRAPPER = """#!/bin/sh
# Written by hack/cluster.py: runsc as the binary of containerd's runc v2 shim.
dir=@DIR@
eval "id=\\${$#}"
root="" bundle="" pidfile="" cmd="" prev=""
for a in "$@"; do
  case "$prev" in
    --root) root="$a" ;;
    --bundle|-b) bundle="$a" ;;
    --pid-file) pidfile="$a" ;;
  esac
  case "$a" in
    --root=*) root="${a#--root=}" ;;
    --bundle=*) bundle="${a#--bundle=}" ;;
    --pid-file=*) pidfile="${a#--pid-file=}" ;;
    create|start|delete|kill) [ -z "$cmd" ] && cmd="$a" ;;
  esac
  prev="$a"
done
# containerd treats a kill or delete of a container that is already gone as done only when
# runc's words say so; runsc says it differently ("sandbox is not running").
mapped() {
  words="$1"; shift
  out="$(@RUNSC@ "$@" 2>&1)" && { [ -n "$out" ] && printf '%s\\n' "$out"; return 0; }
  rc=$?
  case "$out" in
    *"not running"*|*"does not exist"*|*"no such"*|*"not found"*|*"not exist"*)
      printf '%s\\n' "$words" >&2 ;;
    *) printf '%s\\n' "$out" >&2 ;;
  esac
  return $rc
}
kill_holder() {
  pid="$(cat "$dir/$id.holder" 2>/dev/null)"
  if [ -n "$pid" ] && grep -qx sleep "/proc/$pid/comm" 2>/dev/null; then kill "$pid"; fi
  rm -f "$dir/$id.holder"
}
case "$cmd" in
  create)
    sleep 2147483647 <&0 &
    echo $! >"$dir/$id.holder"
    @RUNSC@ "$@" || { rc=$?; kill_holder; exit $rc; }
    if [ -n "$pidfile" ] && grep -Eq '"io.kubernetes.cri.container-type": *"container"' \\
        "$bundle/config.json" 2>/dev/null; then
      : >"$dir/$id.watcher"
      (
        while [ ! -e "$dir/$id.started" ]; do
          [ -e "$dir/$id.watcher" ] || exit 255
          sleep 0.1
        done
        rm -f "$dir/$id.started" "$dir/$id.watcher"
        st="$(@RUNSC@ --root "$root" wait "$id" 2>/dev/null \\
          | sed -n 's/.*"exitStatus": *\\([0-9]*\\).*/\\1/p')"
        exit "${st:-255}"
      ) </dev/null >/dev/null 2>&1 &
      printf %s $! >"$pidfile"
    fi
    exit 0 ;;
  start)
    pid="$(cat "$dir/$id.holder" 2>/dev/null)"
    if [ -n "$pid" ] && [ -e "/proc/$pid/fd/1" ]; then
      @RUNSC@ "$@" </proc/$pid/fd/0 >/proc/$pid/fd/1 2>/proc/$pid/fd/2
    else
      @RUNSC@ "$@"
    fi
    rc=$?
    kill_holder
    [ -e "$dir/$id.watcher" ] && : >"$dir/$id.started"
    exit $rc ;;
  delete)
    kill_holder
    rm -f "$dir/$id.watcher" "$dir/$id.started"
    mapped "container $id does not exist" "$@"
    exit $? ;;
  kill)
    mapped "container not running" "$@"
    exit $? ;;
esac
exec @RUNSC@ "$@"
"""


def write_containerd_config(bins: Bins) -> Path:
    root = CONTAINERD_DIR
    cni_conf = STATE / "cni" / "net.d"
    cni_conf.mkdir(parents=True, exist_ok=True)
    conflist = {
        "cniVersion": "0.4.0",
        "name": "sandbox-operator",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                # No masquerade: pods reach this node (API server, proxies on it), nothing beyond.
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(STATE / "cni" / "networks"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    write_file(cni_conf / "10-sandbox-operator.conflist", json.dumps(conflist, indent=2) + "\n")
    # runsc's global flags go before the runc-style subcommand the shim passes: a wrapper.
    # `touch $STATE/runsc-debug` (then `up`) writes gVisor's debug logs to logs/runsc/.
    runsc_flags = ["--platform=systrap"]
    if (STATE / "runsc-debug").exists():
        (LOGS / "runsc").mkdir(parents=True, exist_ok=True)
        runsc_flags += ["--debug", f"--debug-log={LOGS / 'runsc'}/%ID%.%COMMAND%.log"]
    runsc = root / "runsc-wrapper"
    runsc.parent.mkdir(parents=True, exist_ok=True)
    exe = f"{bins.gvisor / 'runsc'} {' '.join(runsc_flags)}"
    holders = root / "runsc-stdio"
    holders.mkdir(parents=True, exist_ok=True)
    write_file(runsc, RUNSC_WRAPPER.replace("@RUNSC@", exe).replace("@DIR@", str(holders)), 0o755)
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    config = f"""version = 2
root = "{root / "root"}"
state = "{root / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{CONTAINERD_SOCK}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "opt"}"

[{cri}]
  sandbox_image = "{IMAGES["pause"]}"
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  tolerate_missing_hugetlb_controller = true
  # The kubelet asks for negative OOM scores (pause: -998); lowering a score needs
  # CAP_SYS_RESOURCE, which root lacks on these machines: clamp to containerd's own score.
  restrict_oom_score_adj = true

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
  discard_unpacked_layers = false

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{root / "runc"}"

# gVisor: runsc speaks runc's command line, so containerd 1.6 drives it through the runc v2
# shim. runsc joins a pod's containers into one sandbox from the CRI annotations.
[{cri}.containerd.runtimes.runsc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runsc.options]
  BinaryName = "{runsc}"
  SystemdCgroup = false
  Root = "{root / "runsc"}"

[{cri}.cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "{cni_conf}"
  max_conf_num = 1
"""
    path = root / "config.toml"
    write_file(path, config)
    return path


def containerd_proc(config: Path) -> Proc:
    return Proc(
        "containerd",
        ["/usr/bin/containerd", f"--config={config}", "--log-level=warn"],
        containerd_healthy,
        # Not the runsc wrapper: shims run it afresh for every call, no restart needed.
        inputs=(config, *sorted((STATE / "cni" / "net.d").glob("*"))),
    )


def write_kubelet_config() -> Path:
    cfg = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(PKI / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCK}",
        "tlsCertFile": str(PKI / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(PKI / "kubelet-serving.key"),
        "port": KUBELET_PORT,
        "healthzPort": KUBELET_HEALTHZ_PORT,
        "healthzBindAddress": "127.0.0.1",
        "readOnlyPort": 0,
        "clusterDomain": "cluster.local",
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        # The images exist only locally (no registry to pull them back): never GC them, and
        # do not evict for disk pressure on a shared development disk.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "maxPods": 110,
        "serializeImagePulls": False,
        "resolvConf": "/etc/resolv.conf",
        "podLogsDir": str(STATE / "pod-logs"),
    }
    path = STATE / "kubelet-config.json"
    write_file(path, json.dumps(cfg, indent=2) + "\n")
    return path


def kubelet_proc(bins: Bins, ip: str, config: Path) -> Proc:
    return Proc(
        "kubelet",
        [
            bins.kube("kubelet"),
            f"--config={config}",
            f"--kubeconfig={STATE / 'kubeconfigs' / 'kubelet'}",
            f"--root-dir={STATE / 'kubelet'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={ip}",
            f"--pod-infra-container-image={IMAGES['pause']}",
            "--v=1",
        ],
        kubelet_healthy,
        timeout=120,
        inputs=(config,),
        attempts=10,
    )


def write_kube_proxy_config() -> Path:
    cfg = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(STATE / "kubeconfigs" / "kube-proxy")},
        "mode": "iptables",
        "clusterCIDR": CLUSTER_CIDR,
        "hostnameOverride": NODE_NAME,
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": f"127.0.0.1:{KUBE_PROXY_HEALTHZ_PORT}",
        "metricsBindAddress": f"127.0.0.1:{KUBE_PROXY_METRICS_PORT}",
        # No NodePorts on 127.0.0.1 (that would need route_localnet on the host's interfaces).
        "iptables": {"localhostNodePorts": False},
        # Leave the host's conntrack sysctls as they are.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }
    path = STATE / "kube-proxy-config.json"
    write_file(path, json.dumps(cfg, indent=2) + "\n")
    return path


def kube_proxy_proc(bins: Bins, config: Path) -> Proc:
    return Proc(
        "kube-proxy",
        [bins.kube("kube-proxy"), f"--config={config}", "--v=1"],
        kube_proxy_healthy,
        inputs=(config,),
        attempts=3,
    )


# --------------------------------------------------------------------------------------------
# Node preparation, images, objects


def prepare_host() -> None:
    for module in ("overlay", "br_netfilter"):
        subprocess.run(["modprobe", module], capture_output=True)
    for key, value in (
        ("net/ipv4/ip_forward", "1"),
        ("net/bridge/bridge-nf-call-iptables", "1"),
        ("net/bridge/bridge-nf-call-ip6tables", "1"),
    ):
        with contextlib.suppress(OSError):
            Path("/proc/sys", key).write_text(value)
    service_guard(install=True)


GUARD_CHAIN = "SBXOP-SERVICE-GUARD"


def service_guard(install: bool) -> None:
    """A Service IP that kube-proxy did not translate (no such Service, or kube-proxy not up yet)
    must fail on this machine instead of following the default route out of it. The filter
    table sees destinations after kube-proxy's DNAT, so only untranslated ones match."""
    ipt = ["iptables", "-w", "5"]
    reject = ["-j", "REJECT", "--reject-with", "icmp-net-unreachable"]
    checks = [
        [*ipt, "-C", GUARD_CHAIN, "-d", SERVICE_CIDR, *reject],
        [*ipt, "-C", "OUTPUT", "-j", GUARD_CHAIN],
        [*ipt, "-C", "FORWARD", "-j", GUARD_CHAIN],
    ]
    if install and all(subprocess.run(c, capture_output=True).returncode == 0 for c in checks):
        return
    subprocess.run(["ip", "route", "delete", "blackhole", SERVICE_CIDR], capture_output=True)
    for chain in ("OUTPUT", "FORWARD"):
        while (
            subprocess.run([*ipt, "-D", chain, "-j", GUARD_CHAIN], capture_output=True).returncode
            == 0
        ):
            pass
    subprocess.run([*ipt, "-F", GUARD_CHAIN], capture_output=True)
    if not install:
        subprocess.run([*ipt, "-X", GUARD_CHAIN], capture_output=True)
        return
    subprocess.run([*ipt, "-N", GUARD_CHAIN], capture_output=True)
    run([*ipt, "-A", GUARD_CHAIN, "-d", SERVICE_CIDR, *reject])
    for chain in ("OUTPUT", "FORWARD"):
        run([*ipt, "-I", chain, "1", "-j", GUARD_CHAIN])


def import_images() -> None:
    log = LOGS / "images.log"
    with step("build images from Debian packages (cached)", log):
        out = run(
            ["bash", str(HACK / "images.sh"), "build"],
            env=dict(os.environ, CONTAINERD_ADDRESS=str(CONTAINERD_SOCK)),
        )
    tarballs = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    present = set(ctr("images", "ls", "-q").split())
    record = STATE / "images.imported"
    done = json.loads(record.read_text()) if record.exists() else {}
    todo = {ref: tar for ref, tar in tarballs.items() if ref not in present or done.get(ref) != tar}
    if not todo:
        return
    with step(f"import images into containerd: {' '.join(todo)}", log):
        for ref, tar in todo.items():
            ctr("images", "import", tar, log=log)
            if ref not in ctr("images", "ls", "-q").split():
                raise StepFailed("import images", f"{ref} missing after import", log)
            done[ref] = tar
        record.write_text(json.dumps(done, indent=2))


def wait_node_ready() -> None:
    def ready() -> bool:
        code, node = api("GET", f"/api/v1/nodes/{NODE_NAME}")
        if code != 200:
            return False
        conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
        return conds.get("Ready") == "True"

    with step(f"wait for node {NODE_NAME} Ready", LOGS / "kubelet.log"):
        wait_for("node Ready", ready, 180, LOGS / "kubelet.log")


def ensure_runtime_classes() -> None:
    for name, handler in RUNTIME_CLASSES.items():
        code, obj = api("GET", f"/apis/node.k8s.io/v1/runtimeclasses/{name}")
        if code == 200 and obj.get("handler") == handler:
            continue
        if code == 200:
            api("DELETE", f"/apis/node.k8s.io/v1/runtimeclasses/{name}")
        body = {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": name, "labels": {"sandbox-operator.dev/cluster": "local"}},
            "handler": handler,
        }
        code, obj = api("POST", "/apis/node.k8s.io/v1/runtimeclasses", body)
        if code not in (200, 201, 409):
            raise StepFailed("runtime classes", f"creating {name}: HTTP {code} {obj}")
        say(f"RuntimeClass {name} -> handler {handler}")


def wait_default_service_account() -> None:
    def exists() -> bool:
        return api("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200

    wait_for("default service account", exists, 60, LOGS / "kube-controller-manager.log")


# --------------------------------------------------------------------------------------------
# Commands


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
        wait_default_service_account()
        start(local_path_proc())
        ensure_storage_class()
        if level == "node":
            prepare_host()
            start(scheduler_proc(bins))
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


def kube_router_healthy() -> bool:
    """The policy controller has synced once: its FORWARD chain exists."""
    cmd = ["iptables", "-w", "5", "-S", "KUBE-ROUTER-FORWARD"]
    return subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0


def kube_router_proc() -> Proc:
    argv = run(["bash", str(NETPOL), "print-command", NODE_NAME, str(KUBECONFIG)]).split()
    return Proc("kube-router", argv, kube_router_healthy, timeout=120)


def start_kube_router() -> None:
    """Start kube-router's policy controller (after the node is Ready). A recorded one with the
    same command line is left alone; otherwise it is stopped and its rules removed first (it
    does not remove rules it wrote with other flags)."""
    proc = kube_router_proc()
    record = read_pidfile(proc.pidfile)
    if record and pid_alive(record) and record.get("fingerprint") == proc.fingerprint:
        start(proc)
        return
    if record:
        stop_record("kube-router", record)
    run(["bash", str(NETPOL), "cleanup"], log=proc.log)
    start(proc)


# --------------------------------------------------------------------------------------------
# Volumes: hack/local_path_provisioner.py serves StorageClass `sandbox-local` (the cluster's
# default class): a directory under STATE/local-path for each claim, a hostPath PersistentVolume
# of it on the one node, both deleted with the claim (docs/cluster.md, "Volumes").

LOCAL_PATH = HACK / "local_path_provisioner.py"
LOCAL_PATH_ROOT = STATE / "local-path"
LOCAL_PATH_PROVISIONER = "sandbox-operator.dev/local-path"
STORAGE_CLASS = "sandbox-local"


def local_path_healthy() -> bool:
    return http_ok(f"http://127.0.0.1:{LOCAL_PATH_PORT}/healthz")


def local_path_proc() -> Proc:
    # The project's venv (the `kubernetes` client); a fixed path, so that every caller of `up`
    # (make, pytest, a plain python3) starts the same command line.
    venv = REPO / ".venv" / "bin" / "python"
    return Proc(
        "local-path-provisioner",
        [
            str(venv) if venv.exists() else sys.executable,
            str(LOCAL_PATH),
            f"--kubeconfig={KUBECONFIG}",
            f"--root={LOCAL_PATH_ROOT}",
            f"--node={NODE_NAME}",
            f"--health-port={LOCAL_PATH_PORT}",
        ],
        local_path_healthy,
        timeout=60,
        # A changed provisioner restarts on the next `up`, like a changed flag.
        inputs=(LOCAL_PATH,),
    )


def storage_class() -> dict[str, Any]:
    """`Immediate` binding: one node, so there is no placement to wait for, and a claim is bound
    before its pod exists (the pod does not wait for provisioning)."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "labels": {"sandbox-operator.dev/cluster": "local"},
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": LOCAL_PATH_PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
        "allowVolumeExpansion": False,
    }


def ensure_storage_class() -> None:
    body = storage_class()
    path = f"/apis/storage.k8s.io/v1/storageclasses/{STORAGE_CLASS}"
    code, obj = api("GET", path)
    if code == 200:
        keys = ("provisioner", "reclaimPolicy", "volumeBindingMode", "allowVolumeExpansion")
        annotations = obj["metadata"].get("annotations") or {}
        wanted = body["metadata"]["annotations"].items()
        if all(obj.get(k) == body[k] for k in keys) and wanted <= annotations.items():
            return
        api("DELETE", path)  # provisioner, reclaim policy and binding mode are immutable
    code, obj = api("POST", "/apis/storage.k8s.io/v1/storageclasses", body)
    if code not in (200, 201, 409):
        raise StepFailed("storage class", f"creating {STORAGE_CLASS}: HTTP {code} {obj}")
    say(f"StorageClass {STORAGE_CLASS} (default) -> provisioner {LOCAL_PATH_PROVISIONER}")


# --------------------------------------------------------------------------------------------
# Fake nodes for scale tests: kwok (hack/build-kwok.sh; docs/cluster.md, "Fake nodes: kwok").
# `kwok up` runs kwok's controller as one more supervised process and creates Node objects it
# plays: leases and Ready status for the nodes, Pending -> Running/Ready for pods bound to them,
# and their removal once deleted. Nothing runs on a fake node; it is not a runtime.

KWOK = HACK / "build-kwok.sh"
KWOK_DIR = STATE / "kwok"
# kwok manages the nodes that carry this annotation (and only those: never the real node).
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
# Labels and taint of the fake nodes; the RuntimeClass `kwok` steers pods onto them.
KWOK_NODE_LABELS = {"type": "kwok", "sandbox-operator.dev/cluster": "local"}
KWOK_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
KWOK_RUNTIME_CLASS = "kwok"
# Named to list after the real node ("sandbox-operator-node" < "sbxop-kwok-0"): code that takes
# the first node of `kubectl get nodes` keeps getting the real one.
KWOK_NODE_PREFIX = "sbxop-kwok-"
# Generous: 10,000 pods over 3 nodes fit with room to spare (pods, and 10m CPU / 16Mi each).
KWOK_ALLOCATABLE = {"cpu": "256", "memory": "1Ti", "pods": "110000", "ephemeral-storage": "10Ti"}
# Addresses nobody routes (198.18.0.0/15, benchmarking): pod IPs from their own range, node
# addresses of their own. Never the real node's address: kube-router treats every pod whose
# hostIP is its node's address as local and would write firewall chains for each fake pod.
KWOK_POD_CIDR = "10.245.0.0/16"
KWOK_NODE_IP_BASE = "198.18.0."

# Stages (kwok's lifecycle rules). The upstream ones come with the build (node-initialize,
# node-heartbeat-with-lease, pod-ready, pod-complete, from kwok's "fast" sets); the deletion
# Stage is ours: a deleted pod without finalizers is removed at once (kwok deletes it with grace
# 0, whatever grace the deleter asked for), one with finalizers waits for them like on a kubelet.
KWOK_POD_DELETE_STAGE = """apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
    - key: '.metadata.finalizers'
      operator: 'DoesNotExist'
  next:
    delete: true
"""
# A KwokConfiguration in the config file is taken as it is: kwok applies its defaults only when
# there is none, so every option it needs is spelled out (a zero parallelism is refused).
KWOK_OPTIONS = {
    "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
    "kind": "KwokConfiguration",
    "options": {
        "cidr": KWOK_POD_CIDR,
        # kwok renews a Lease per node (the node controller's heartbeat), like a kubelet.
        "nodeLeaseDurationSeconds": 40,
        "nodeLeaseParallelism": 4,
        # Status patches in flight at once (default 4): thousands of pods become Ready in step
        # with the scheduler instead of queueing behind kwok.
        "podPlayStageParallelism": 16,
        "nodePlayStageParallelism": 4,
        "podsOnNodeSyncParallelism": 2,
        "enablePodsOnNodeSyncListPager": True,
        "enablePodsOnNodeSyncStreamWatch": False,
        "enableDebuggingHandlers": False,
        "enableProfilingHandler": False,
        "enableContentionProfiling": False,
    },
}


def kwok_paths() -> tuple[Path, Path]:
    """(kwok binary, directory of the upstream Stage files), from hack/build-kwok.sh."""
    binary = Path(run(["bash", str(KWOK), "print-path"]).strip())
    stages = Path(run(["bash", str(KWOK), "print-stages"]).strip())
    return binary, stages


def build_kwok() -> tuple[Path, Path]:
    binary, stages = kwok_paths()
    if binary.is_file() and os.access(binary, os.X_OK) and any(stages.glob("*.yaml")):
        return binary, stages
    log = LOGS / "build-kwok.log"
    with step(f"build kwok from the Go module proxy (log {log})", log):
        if shutil.which("go") is None:
            raise StepFailed("build kwok", "`go` is not on PATH", log)
        run(["bash", str(KWOK), "build"], log=log)
    return binary, stages


def kwok_config_text(stages: Path) -> str:
    """kwok's --config: its options and the Stages, as one multi-document YAML file."""
    docs = [json.dumps(KWOK_OPTIONS, indent=2)]
    docs += [p.read_text().strip() for p in sorted(stages.glob("*.yaml"))]
    docs.append(KWOK_POD_DELETE_STAGE.strip())
    return "\n---\n".join(docs) + "\n"


def kwok_healthy() -> bool:
    return http_ok(f"http://127.0.0.1:{KWOK_PORT}/healthz")


def kwok_proc(binary: Path, config: Path) -> Proc:
    key, value = KWOK_ANNOTATION
    return Proc(
        "kwok",
        [
            str(binary),
            f"--kubeconfig={KUBECONFIG}",
            f"--config={config}",
            f"--manage-nodes-with-annotation-selector={key}={value}",
            f"--server-address=127.0.0.1:{KWOK_PORT}",
            # INFO logs every node and pod patch: thousands of lines per scale run.
            "--v=WARN",
        ],
        kwok_healthy,
        # kwok reads HOME for its default config (~/.kwok/kwok.yaml): point it at its own dir.
        env={"HOME": str(KWOK_DIR)},
        inputs=(config,),
    )


def kwok_node_name(index: int) -> str:
    return f"{KWOK_NODE_PREFIX}{index}"


def kwok_node(index: int) -> dict[str, Any]:
    """A fake Node: annotated for kwok, labelled `type=kwok`, tainted so that only pods that
    tolerate the taint (the `kwok` RuntimeClass adds the toleration) land on it."""
    name = kwok_node_name(index)
    key, value = KWOK_ANNOTATION
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {key: value, "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                **KWOK_NODE_LABELS,
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node-role.kubernetes.io/agent": "",
            },
        },
        "spec": {"taints": [dict(KWOK_TAINT)]},
        "status": {
            "allocatable": dict(KWOK_ALLOCATABLE),
            "capacity": dict(KWOK_ALLOCATABLE),
            "addresses": [
                {"type": "InternalIP", "address": f"{KWOK_NODE_IP_BASE}{10 + index}"},
                {"type": "Hostname", "address": name},
            ],
        },
    }


def kwok_runtime_class() -> dict[str, Any]:
    """RuntimeClass `kwok`: its scheduling section sends a pod that names it to the fake nodes
    (node selector) and lets it past their taint. The handler is never run: no kubelet serves
    those nodes."""
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {
            "name": KWOK_RUNTIME_CLASS,
            "labels": {"sandbox-operator.dev/cluster": "local"},
        },
        "handler": "runc",
        "scheduling": {
            "nodeSelector": {"type": KWOK_NODE_LABELS["type"]},
            "tolerations": [
                {
                    "key": KWOK_TAINT["key"],
                    "operator": "Equal",
                    "value": KWOK_TAINT["value"],
                    "effect": KWOK_TAINT["effect"],
                }
            ],
        },
    }


def kwok_nodes() -> list[str]:
    """Names of the fake nodes that exist (label `type=kwok` and the name prefix)."""
    code, obj = api("GET", f"/api/v1/nodes?labelSelector=type%3D{KWOK_NODE_LABELS['type']}")
    if code != 200:
        raise StepFailed("kwok nodes", f"listing nodes: HTTP {code} {obj}")
    names = [i["metadata"]["name"] for i in obj.get("items", [])]
    return sorted(n for n in names if n.startswith(KWOK_NODE_PREFIX))


def ensure_kwok_objects(nodes: int) -> None:
    """Exactly `nodes` fake nodes (extra ones deleted) and the `kwok` RuntimeClass."""
    want = {kwok_node_name(i): i for i in range(nodes)}
    have = set(kwok_nodes())
    for name in sorted(have - set(want)):
        api("DELETE", f"/api/v1/nodes/{name}")
        say(f"fake node {name} deleted")
    for name, index in want.items():
        if name in have:
            continue
        code, obj = api("POST", "/api/v1/nodes", kwok_node(index))
        if code not in (200, 201, 409):
            raise StepFailed("kwok nodes", f"creating {name}: HTTP {code} {obj}")
    body = kwok_runtime_class()
    path = f"/apis/node.k8s.io/v1/runtimeclasses/{KWOK_RUNTIME_CLASS}"
    code, obj = api("GET", path)
    if code == 200 and (obj.get("handler"), obj.get("scheduling")) != (
        body["handler"],
        body["scheduling"],
    ):
        api("DELETE", path)  # handler and scheduling are immutable
        code = 404
    if code != 200:
        code, obj = api("POST", "/apis/node.k8s.io/v1/runtimeclasses", body)
        if code not in (200, 201, 409):
            raise StepFailed("kwok runtime class", f"HTTP {code} {obj}")


def wait_kwok_nodes_ready(nodes: int, since: float, timeout: float = 60) -> None:
    """`nodes` fake nodes Ready, each held by this kwok (its Lease renewed since `since`)."""

    def held(name: str) -> bool:
        code, lease = api("GET", kwok_lease_path(name))
        renewed = (lease.get("spec") or {}).get("renewTime") if code == 200 else None
        when = datetime.fromisoformat(renewed.replace("Z", "+00:00")) if renewed else None
        return when is not None and when.timestamp() >= since - 1

    def ready() -> bool:
        code, obj = api("GET", f"/api/v1/nodes?labelSelector=type%3D{KWOK_NODE_LABELS['type']}")
        count = 0
        for node in obj.get("items", []) if code == 200 else []:
            conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
            count += conds.get("Ready") == "True" and held(node["metadata"]["name"])
        return count >= nodes

    wait_for(f"{nodes} fake node(s) Ready and held by kwok", ready, timeout, LOGS / "kwok.log")


def kwok_lease_path(node: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}"


def release_kwok_leases() -> None:
    """Delete the fake nodes' Leases (with no kwok running). kwok holds each node through its
    Lease under a per-process identity: a new kwok would otherwise leave the nodes, and every
    pod bound to them, alone until the old Leases expire (40 s) and its next try (~10 s)."""
    for name in kwok_nodes():
        api("DELETE", kwok_lease_path(name))


def cmd_kwok_up(nodes: int) -> None:
    with state_lock():
        if not alive_api():
            raise StepFailed(
                "kwok up", "the cluster's API server is not running: `hack/cluster.py up` first"
            )
        if not (PIDS / "kube-scheduler.json").exists():
            say("note: no kube-scheduler runs (level api): pods are bound to fake nodes only if "
                "they name spec.nodeName")  # fmt: skip
        binary, stages = build_kwok()
        KWOK_DIR.mkdir(parents=True, exist_ok=True)
        config = KWOK_DIR / "kwok.yaml"
        write_file(config, kwok_config_text(stages))
        proc = kwok_proc(binary, config)
        record = read_pidfile(proc.pidfile)
        running = bool(record and pid_alive(record))
        if record and running and record.get("fingerprint") != proc.fingerprint:
            say(f"kwok: configuration changed, restarting pid {record['pid']}")
            stop_record("kwok", record)
            running = False
        if not running:
            release_kwok_leases()
        start(proc)
        started = float((read_pidfile(proc.pidfile) or {}).get("started", 0))
        with step(f"kwok: {nodes} fake node(s) {KWOK_NODE_PREFIX}*, RuntimeClass kwok"):
            ensure_kwok_objects(nodes)
            wait_kwok_nodes_ready(nodes, started)
    say(f"kwok is up: {nodes} fake node(s); pods with runtimeClassName {KWOK_RUNTIME_CLASS} "
        "run there (on paper)")  # fmt: skip


def kwok_down(quiet: bool = False) -> None:
    """Delete the fake nodes and the `kwok` RuntimeClass (when the API server answers), then
    stop kwok. Pods left on a deleted node are removed by the controller-manager's pod GC."""
    if alive_api():
        for name in kwok_nodes():
            api("DELETE", f"/api/v1/nodes/{name}")
            say(f"fake node {name} deleted")
        code, _ = api("DELETE", f"/apis/node.k8s.io/v1/runtimeclasses/{KWOK_RUNTIME_CLASS}")
        if code == 200:
            say(f"RuntimeClass {KWOK_RUNTIME_CLASS} deleted")
    elif not quiet:
        say("the API server does not answer: fake nodes and RuntimeClass left as they are")
    record = read_pidfile(PIDS / "kwok.json")
    if record:
        stop_record("kwok", record)
        (PIDS / "kwok.json").unlink(missing_ok=True)


def cmd_kwok_down() -> None:
    with state_lock():
        kwok_down()
    say("kwok is down")


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
    pid = (read_pidfile(proc.pidfile) or {}).get("pid")
    say(f"{name} restarted (pid {record['pid']} -> {pid}): down for {outage:.1f}s")
    return outage


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


def anything_running() -> bool:
    return any(
        (record := read_pidfile(PIDS / f"{name}.json")) and pid_alive(record) for name in ORDER
    )


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


# --------------------------------------------------------------------------------------------
# What the machine can virtualise: whether a microVM runtime (Kata, Firecracker) could run here.
# The local cluster runs none (runc = container, gvisor = hardened_container); this says why not,
# or that one could be added (docs/cluster.md, "A microVM RuntimeClass").

#: CPU flags of hardware virtualisation in /proc/cpuinfo: Intel VT-x, AMD-V.
HW_VIRT_FLAGS = ("vmx", "svm")
#: Kernel modules that say which /dev/kvm this is: PVM (paravirtual: no hardware virtualisation,
#: guests need a PVM-enabled kernel) vs KVM on VT-x / AMD-V.
PVM_MODULE = "kvm_pvm"
HW_KVM_MODULES = ("kvm_intel", "kvm_amd")
#: What the local cluster offers instead of a microVM, said in every line.
LOCAL_RUNGS = "this cluster runs runc = container and gvisor = hardened_container, no microVM"


@dataclass(frozen=True)
class Virtualisation:
    """What this machine offers a microVM runtime. ``kind``: ``hardware`` (vmx/svm and
    /dev/kvm), ``paravirtual`` (/dev/kvm without vmx/svm, e.g. PVM, which stock guest kernels
    cannot boot on), ``no-kvm`` (vmx/svm but no /dev/kvm), ``none``, or ``unknown`` (not an x86
    CPU: its /proc/cpuinfo has no flags to tell). ``line``: that, said in one line."""

    kind: str
    line: str


def cpu_flags(cpuinfo: str) -> frozenset[str] | None:
    """The x86 CPU flags in /proc/cpuinfo text; None when there is no `flags` line (not x86)."""
    flags: set[str] = set()
    seen = False
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            seen = True
            flags.update(value.split())
    return frozenset(flags) if seen else None


def detect_virtualisation(
    cpuinfo: str, kvm_device: bool, modules: frozenset[str] = frozenset()
) -> Virtualisation:
    """Judge the machine from the text of /proc/cpuinfo, whether /dev/kvm exists and the loaded
    kernel modules (/sys/module). Pure, so it is tested on made-up machines: a /dev/kvm alone does
    not mean a microVM can boot (a PVM device has one and runs only PVM-built guest kernels)."""
    flags = cpu_flags(cpuinfo)
    hw = sorted(set(HW_VIRT_FLAGS) & (flags or frozenset()))
    if hw and kvm_device:
        return Virtualisation(
            "hardware",
            f"hardware virtualisation ({'/'.join(hw)} in /proc/cpuinfo) and /dev/kvm: a Kata or "
            f"Firecracker RuntimeClass could be added (docs/cluster.md); {LOCAL_RUNGS}",
        )
    if hw:
        return Virtualisation(
            "no-kvm",
            f"hardware virtualisation ({'/'.join(hw)}) but no /dev/kvm (kvm module not loaded "
            f"or the device not passed in), so no microVM can start; {LOCAL_RUNGS}",
        )
    if kvm_device and flags is None and PVM_MODULE not in modules:
        known = sorted(set(HW_KVM_MODULES) & modules)
        return Virtualisation(
            "unknown",
            "/dev/kvm present, but /proc/cpuinfo has no x86 flags to tell hardware from "
            f"paravirtual virtualisation (modules: {', '.join(known) or 'none known'}); "
            f"{LOCAL_RUNGS}",
        )
    if kvm_device:
        pvm = f"; {PVM_MODULE} loaded" if PVM_MODULE in modules else ""
        return Virtualisation(
            "paravirtual",
            f"only a paravirtual /dev/kvm (no vmx/svm in /proc/cpuinfo{pvm}): stock Kata or "
            f"Firecracker guest kernels cannot boot on it; {LOCAL_RUNGS}",
        )
    return Virtualisation(
        "none",
        f"no hardware virtualisation (no vmx/svm) and no /dev/kvm; {LOCAL_RUNGS}",
    )


def machine_virtualisation() -> Virtualisation:
    """:func:`detect_virtualisation` for this machine."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    try:
        modules = frozenset(os.listdir("/sys/module"))
    except OSError:
        modules = frozenset()
    return detect_virtualisation(cpuinfo, Path("/dev/kvm").is_char_device(), modules)


def cmd_status() -> int:
    rc = 0
    probes = {
        "etcd": etcd_healthy,
        "kube-apiserver": apiserver_ready,
        "kube-controller-manager": kcm_healthy,
        "kube-scheduler": scheduler_healthy,
        "containerd": containerd_healthy,
        "kubelet": kubelet_healthy,
        "kube-proxy": kube_proxy_healthy,
        "kube-router": kube_router_healthy,
        "local-path-provisioner": local_path_healthy,
    }
    level = (STATE / "level").read_text() if (STATE / "level").exists() else "none"
    print(f"state:      {STATE} (last level brought up: {level})")
    print(f"kubeconfig: {KUBECONFIG}")
    print(f"machine:    {machine_virtualisation().line}")
    for name in reversed(ORDER):
        record = read_pidfile(PIDS / f"{name}.json")
        alive = bool(record and pid_alive(record))
        try:
            healthy = alive and probes[name]()
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


def alive_api() -> bool:
    try:
        return (PKI / "admin.crt").exists() and apiserver_ready()
    except Exception:
        return False


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
