"""The `egress` conformance suite over a real client `Sandbox` handle, on both local backends:
a sandbox acquired through `SandboxClient` (egress closed by default) passes
`closed_reaches_nothing` against hosts an unrestricted pod in the same namespace reaches."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes import client

from sandbox_operator.client import SandboxClient
from sandbox_operator.conformance.egress import check_egress
from sandbox_operator.contract import Capability, SandboxSpec
from sandbox_operator.egress.probe import ProbeTarget, expect_answered, judge
from tests.fixtures.egress_probe import (
    BRIDGE_GATEWAY,
    Outside,
    backend,
    probe_in_pod,
    unrestricted_pod,
)
from tests.fixtures.operator import PYTHON

pytestmark = pytest.mark.e2e


@pytest.fixture
async def aclient(kubeconfig: str, namespace: str) -> AsyncIterator[SandboxClient]:
    c = await SandboxClient.from_kubeconfig(namespace, kubeconfig=kubeconfig, default_timeout=180)
    yield c
    await c.close()


@pytest.mark.parametrize("runtime_class", ["runc", "gvisor"])
async def test_closed_sandbox_passes_the_egress_suite(
    aclient: SandboxClient,
    kit: Any,
    start_operator: Any,
    core_v1: client.CoreV1Api,
    outside: Outside,
    runtime_class: str,
) -> None:
    reachable = [
        ProbeTarget("outside", outside.address, outside.port),
        ProbeTarget("bridge-gateway", BRIDGE_GATEWAY, outside.port),
    ]
    # The control: the same targets answer an unrestricted pod here.
    await asyncio.to_thread(unrestricted_pod, core_v1, kit.ns, "open-peer", runtime_class, outside)
    results, _ = await asyncio.to_thread(probe_in_pod, core_v1, kit.ns, "open-peer", reachable)
    control = [expect_answered(r, body_contains=outside.token) for r in results]
    assert all(c.ok for c in control), judge(control)

    start_operator(backend(runtime_class))
    scope_ref = await aclient.create_scope(scope="tenant-a", thread_id=f"egress-{runtime_class}")
    spec = SandboxSpec.model_validate(
        {
            "kind": "shell",
            "image": PYTHON,
            "requires": {Capability.EXEC},
            "resources": {
                "requests": {"cpu": "10m", "memory": "16Mi"},
                "limits": {"cpu": "500m", "memory": "256Mi"},
            },
        }
    )
    sb = await aclient.acquire(scope_ref, "agents/egress", spec)
    assert str(sb.spec.egress) == "closed"
    report = await check_egress(sb, reachable=reachable)
    assert report.ok, report.failures
    assert report.passed == ["closed_reaches_nothing", "closed_refuses_the_proxy_route_too"]
    await aclient.dispose(sb, wait=True)
