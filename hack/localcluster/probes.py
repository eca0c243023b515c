"""Is it up? One health check per component (what `up` waits for and `status` shows), and
`api`, the admin user's client for the API server: plain urllib with the cluster's own CA, so
that the tooling needs nothing beyond the standard library."""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from .layout import (
    APISERVER_PORT,
    CONTAINERD_SOCK,
    ETCD_CLIENT_PORT,
    KCM_PORT,
    KUBE_PROXY_HEALTHZ_PORT,
    KUBELET_HEALTHZ_PORT,
    KWOK_PORT,
    LOCAL_PATH_PORT,
    PKI,
    SCHEDULER_PORT,
)


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


def containerd_healthy() -> bool:
    if not CONTAINERD_SOCK.exists():
        return False
    out = subprocess.run(
        ["ctr", "--address", str(CONTAINERD_SOCK), "version"], capture_output=True, timeout=5
    )
    return out.returncode == 0


def kube_router_healthy() -> bool:
    """The policy controller has synced once: its FORWARD chain exists."""
    cmd = ["iptables", "-w", "5", "-S", "KUBE-ROUTER-FORWARD"]
    return subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0


def local_path_healthy() -> bool:
    return http_ok(f"http://127.0.0.1:{LOCAL_PATH_PORT}/healthz")


def kwok_healthy() -> bool:
    return http_ok(f"http://127.0.0.1:{KWOK_PORT}/healthz")


def alive_api() -> bool:
    try:
        return (PKI / "admin.crt").exists() and apiserver_ready()
    except Exception:
        return False


#: The health check of each process `up` starts, by name (`status` runs them).
PROBES: dict[str, Callable[[], bool]] = {
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
