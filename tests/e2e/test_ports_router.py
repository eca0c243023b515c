"""Ports through the router on the real node (docs/ports.md), runc: one Sandbox serving HTTP and
WebSocket on one declared port (a small stdlib server in the python image, started by the pod's
own command so it serves again after a resume), with its URL in status.ports; reached through
the router by its conversation's agent (granted ``connect`` on ``sandboxes/ports`` of its
conversation's Sandboxes by the Role the operator writes for the SandboxScope): a page fetched and
a WebSocket message echoed; both refused (403) to another conversation's agent and (401) to
anonymous callers, and forged tokens, 404 on an undeclared port; then suspended, and woken by the
next request, which it answers. One Sandbox does all of it (CI time).

The router runs on this machine (tests/fixtures/router.py), not as the chart's pod, and the node
reaches its own pods whatever the policies say; so a second test shows the chart's router
NetworkPolicy itself enforced by the node's policy engine, with pods standing in for the router
and for anyone else."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.fixtures.agents import token
from tests.fixtures.chart import by_kind, template
from tests.fixtures.node import exec_in, run_pod
from tests.fixtures.operator import GROUP, PYTHON, VERSION, Kit, OperatorProcess
from tests.fixtures.router import RouterProcess, running_router
from tests.fixtures.suspend import STORAGE, config

pytestmark = pytest.mark.e2e

#: The pod's server on 8080 (python3 -c): a page for a plain GET; for a WebSocket upgrade the
#: handshake (RFC 6455's accept key), then each text frame echoed back prefixed ``echo: ``.
SERVE = r"""
import base64, hashlib, http.server
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        key = self.headers.get("Sec-WebSocket-Key")
        if (self.headers.get("Upgrade") or "").lower() != "websocket" or not key:
            body = b"served-through-the-router\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        accept = base64.b64encode(hashlib.sha1(key.encode() + GUID).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        while len(head := self.rfile.read(2)) == 2 and head[0] & 15 != 8:
            mask = self.rfile.read(4) if head[1] & 128 else bytes(4)
            data = self.rfile.read(head[1] & 127)  # short frames only: this test's
            text = b"echo: " + bytes(c ^ mask[i % 4] for i, c in enumerate(data))
            self.wfile.write(bytes([0x81, len(text)]) + text)
            self.wfile.flush()
http.server.ThreadingHTTPServer(("", 8080), Handler).serve_forever()
"""
BASE_URL = "https://sandboxes.example.test"


def _agents(core: client.CoreV1Api, ns: str) -> tuple[str, str]:
    """Two agents' tokens (ServiceAccounts with nothing granted of their own): each is bound to a
    conversation by its SandboxScope, and the operator's Role for it is all it holds."""
    for sa in ("caller", "stranger"):
        core.create_namespaced_service_account(ns, {"metadata": {"name": sa}})
    return token(core, ns, "caller"), token(core, ns, "stranger")


def _until(what: str, timeout: float, check: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_a_declared_port_is_reached_through_the_router_and_wakes_its_sandbox(
    kit: Kit,
    start_operator: Callable[..., OperatorProcess],
    storage_class: str,
    core_v1: client.CoreV1Api,
    kubeconfig: str,
    tmp_path: Path,
) -> None:
    cfg = config("runc")
    cfg["backends"][0]["pod"]["keepAliveCommand"] = ["python3", "-c", SERVE]
    cfg["router"] = {"baseUrl": BASE_URL}
    start_operator(cfg)
    caller, stranger = _agents(core_v1, kit.ns)
    kit.scope(agentServiceAccounts=["caller"])
    kit.scope("other", thread_id="thread-2", agentServiceAccounts=["stranger"])
    kit.sandbox("web", image=PYTHON, ports=[{"name": "web", "port": 8080}], storage=STORAGE)
    obj = kit.wait_condition("web", status="True", timeout=120)
    (port,) = obj["status"]["ports"]
    assert port == {
        "name": "web",
        "port": 8080,
        "protocol": "http",
        "url": f"{BASE_URL}/{kit.ns}/web/web/",
    }
    path = f"/{kit.ns}/web/web/index.html"
    settings = {"wakeTimeoutSeconds": 120, "reviewCacheSeconds": 1}
    with running_router(kubeconfig, kit.ns, tmp_path, **settings) as router:
        try:
            _check(kit, router, path, caller, stranger)
        except BaseException:
            print(f"--- router log:\n{router.log()}")
            raise


def _check(kit: Kit, router: RouterProcess, path: str, caller: str, stranger: str) -> None:
    # The server may still be starting when the Sandbox is Ready (502 until it listens), and the
    # conversation's Role may not name the Sandbox yet (403 until the operator writes it).
    status, body = _until(
        "the page", 60, lambda: (a := router.request(path, caller))[0] not in (403, 502) and a
    )
    assert (status, body.strip()) == (200, "served-through-the-router")
    assert router.request(path, stranger)[0] == 403
    assert router.request(path, None)[0] == 401
    assert router.request(path, "not-a-token")[0] == 401
    # WebSocket on the same declared port: an upgrade echoed for the conversation's agent only.
    socket = f"/{kit.ns}/web/web/socket"
    assert router.websocket(socket, caller, "hello") == (101, "echo: hello")
    assert router.websocket(socket, stranger, "hello") == (403, None)
    assert router.websocket(socket, None, "hello") == (401, None)
    assert router.request(f"/{kit.ns}/web/9090/", caller)[0] == 404
    # Suspended: the next request resumes it (once) and is answered when it is Ready again.
    kit.custom.patch_namespaced_custom_object(
        GROUP, VERSION, kit.ns, "sandboxes", "web", {"spec": {"suspended": True}}
    )
    kit.wait_condition("web", reasons=("Suspended",), timeout=60)
    _until("the pod gone", 60, lambda: not kit.pods())
    status, body = router.request(path, caller, timeout=150)
    assert (status, body.strip()) == (200, "served-through-the-router"), body
    woken = kit.get("web")
    assert woken is not None
    assert woken["spec"]["suspended"] is False
    assert woken["status"]["resumeCount"] == 1


#: Two busybox httpd on the pod: 8080 declared, 8081 not.
SERVE_TWO = (
    "mkdir -p /workspace/www && echo served > /workspace/www/index.html && "
    "httpd -p 8080 -h /workspace/www && httpd -p 8081 -h /workspace/www; "
    "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"
)


def _fetch(core: client.CoreV1Api, ns: str, pod: str, address: str, port: int) -> bool:
    """Whether ``pod`` gets the page from ``address:port`` (busybox nc, 3 s)."""
    out = exec_in(
        core, ns, pod, "sh", "-c",
        f'printf "GET /index.html HTTP/1.0\\r\\n\\r\\n" | nc -w 3 {address} {port}',
    )  # fmt: skip
    return "served" in out


def test_the_charts_policy_admits_only_the_router_and_only_to_declared_ports(
    kit: Kit,
    start_operator: Callable[..., OperatorProcess],
    core_v1: client.CoreV1Api,
    api_client: client.ApiClient,
) -> None:
    """The chart's router NetworkPolicy (rendered for this namespace as its release namespace),
    enforced by the node's policy engine (kube-router): a pod with the router's labels reaches
    the Sandbox's declared port and not an undeclared one its guest also serves; a pod without
    them reaches neither. (The router's own binary is not what this shows: the policy is.)"""
    cfg = config("runc")
    cfg["backends"][0]["pod"]["keepAliveCommand"] = ["/bin/sh", "-c", SERVE_TWO]
    start_operator(cfg)
    kit.scope()
    kit.sandbox("net", ports=[{"name": "web", "port": 8080}])
    kit.wait_condition("net", status="True", timeout=120)
    (sandbox_pod,) = kit.pods()
    address = sandbox_pod.status.pod_ip
    values = {"router.enabled": "true", "router.sandboxNamespaces": f"{{{kit.ns}}}"}
    (policy,) = [
        o for o in by_kind(template(values, namespace=kit.ns), "NetworkPolicy")
        if o["metadata"]["name"].endswith("-router-ingress")
    ]  # fmt: skip
    client.NetworkingV1Api(api_client).create_namespaced_network_policy(kit.ns, policy)
    router_labels = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    run_pod(core_v1, kit.ns, "router-like")
    core_v1.patch_namespaced_pod("router-like", kit.ns, {"metadata": {"labels": router_labels}})
    run_pod(core_v1, kit.ns, "stranger")
    _until(
        "the router's pod admitted",
        60,
        lambda: _fetch(core_v1, kit.ns, "router-like", address, 8080),
    )
    assert not _fetch(core_v1, kit.ns, "router-like", address, 8081)
    assert not _fetch(core_v1, kit.ns, "stranger", address, 8080)
    assert not _fetch(core_v1, kit.ns, "stranger", address, 8081)
