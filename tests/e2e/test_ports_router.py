"""Ports through the router on the real node (docs/ports.md), runc: one Sandbox serving HTTP on a
declared port (busybox httpd, started by the pod's own command so it serves again after a
resume), with its URL in status.ports; reached through the router by its conversation's agent
(granted ``connect`` on ``sandboxes/ports`` of its conversation's Sandboxes by the Role the
operator writes for the SandboxScope), refused (403) to another conversation's agent and (401)
to anonymous and forged tokens, 404 on an undeclared port; then suspended, and woken by the next
request, which it answers.

The router runs on this machine (tests/fixtures/router.py), not as the chart's pod: the image
on the node is main's. So the NetworkPolicy admitting the router is not what this test shows
(the node reaches its own pods whatever the policies say); tests/unit/test_chart_router.py
renders it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.fixtures.agents import token
from tests.fixtures.operator import GROUP, VERSION, Kit, OperatorProcess
from tests.fixtures.router import RouterProcess, running_router
from tests.fixtures.suspend import STORAGE, config

pytestmark = pytest.mark.e2e

#: The pod's command: serve the work directory's www/ on 8080, then idle as the default does.
SERVE = (
    "mkdir -p /workspace/www && echo served-through-the-router > /workspace/www/index.html && "
    "httpd -p 8080 -h /workspace/www; "
    "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"
)
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
    cfg["backends"][0]["pod"]["keepAliveCommand"] = ["/bin/sh", "-c", SERVE]
    cfg["router"] = {"baseUrl": BASE_URL}
    start_operator(cfg)
    caller, stranger = _agents(core_v1, kit.ns)
    kit.scope(agentServiceAccounts=["caller"])
    kit.scope("other", thread_id="thread-2", agentServiceAccounts=["stranger"])
    kit.sandbox("web", ports=[{"name": "web", "port": 8080}], storage=STORAGE)
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
    # httpd may still be starting when the Sandbox is Ready (502 until it listens), and the
    # conversation's Role may not name the Sandbox yet (403 until the operator writes it).
    status, body = _until(
        "the page", 60, lambda: (a := router.request(path, caller))[0] not in (403, 502) and a
    )
    assert (status, body.strip()) == (200, "served-through-the-router")
    assert router.request(path, stranger)[0] == 403
    assert router.request(path, None)[0] == 401
    assert router.request(path, "not-a-token")[0] == 401
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
