"""The client against the real operator on the local cluster: acquire/dispose, races, call
scope, namespace confinement, and the conformance suites on operator-made sandboxes under runc
and gVisor (through an exec session). Refusals and a scope deleted under a waiting acquire need
no node: tests/integration/test_client_api.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from sandbox_operator import labels as lbl
from sandbox_operator import naming
from sandbox_operator.client import (
    SandboxClient,
    SandboxForbidden,
    SessionExecTransport,
    SyncSandboxClient,
    pod_session_factory,
)
from sandbox_operator.conformance import check_call_scope, check_sandbox
from sandbox_operator.contract import Capability, SandboxKey, SandboxSpec
from tests.fixtures.agents import token, token_client
from tests.fixtures.cluster import TEST_NAMESPACE_LABELS
from tests.fixtures.operator import BUSYBOX, PYTHON, Kit, local_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ALL = frozenset(
    {
        Capability.EXEC,
        Capability.RUN_CODE,
        Capability.FILES_IN,
        Capability.FILES_OUT,
        Capability.FILES_LIST,
        Capability.FILES_DELETE,
    }
)
SMALL = {
    "requests": {"cpu": "10m", "memory": "16Mi"},
    "limits": {"cpu": "500m", "memory": "256Mi"},
}


def spec(image: str = BUSYBOX, **fields: Any) -> SandboxSpec:
    data: dict[str, Any] = {
        "kind": "shell",
        "image": image,
        "requires": ALL,
        "resources": SMALL,
        **fields,
    }
    return SandboxSpec.model_validate(data)


@pytest.fixture
def operator(start_operator: Callable[..., Any]) -> Callable[..., Any]:
    return start_operator


@pytest.fixture
async def aclient(kubeconfig: str, namespace: str) -> AsyncIterator[SandboxClient]:
    c = await SandboxClient.from_kubeconfig(namespace, kubeconfig=kubeconfig, default_timeout=180)
    yield c
    await c.close()


def pods_of(kit: Kit, sandbox_name: str) -> list[k8s.V1Pod]:
    return kit.pods(lbl.sandbox_selector(sandbox_name))


async def test_acquire_exec_dispose(aclient: SandboxClient, kit: Kit, operator: Any) -> None:
    operator()
    scope_ref = await aclient.create_scope(scope="tenant-a", thread_id="t-1")
    sb = await aclient.acquire(scope_ref, "agents/shell", spec())
    key = SandboxKey(scope="tenant-a", thread_id="t-1", agent_dir="agents/shell")
    assert sb.name == naming.sandbox_name(key, "shell")
    res = await sb.exec(["echo", "a b$(echo x)c"])
    assert res.stdout == b"a b$(echo x)c\n"
    # A second acquire of the same key returns the same sandbox.
    again = await aclient.acquire(scope_ref, "agents/shell", spec())
    assert again.name == sb.name
    assert len(pods_of(kit, sb.name)) == 1
    await aclient.dispose(sb, wait=True)
    assert kit.get(sb.name) is None


async def test_two_concurrent_acquires_yield_one_pod(
    aclient: SandboxClient, kubeconfig: str, namespace: str, kit: Kit, operator: Any
) -> None:
    operator()
    scope_ref = await aclient.create_scope(scope="tenant-a", thread_id="race")
    other = await SandboxClient.from_kubeconfig(namespace, kubeconfig=kubeconfig)
    try:
        assert other.field_manager != aclient.field_manager
        a, b = await asyncio.gather(
            aclient.acquire(scope_ref, "agents/racer", spec()),
            other.acquire(scope_ref, "agents/racer", spec()),
        )
        assert a.name == b.name
        assert len([s for s in kit.list() if s["spec"]["agentDir"] == "agents/racer"]) == 1
        assert len(pods_of(kit, a.name)) == 1
        await a.write_file("from-a", b"a")
        assert (await b.read_file("from-a")) == b"a"
    finally:
        await other.close()


async def test_sandbox_for_call_isolated_and_deleted(
    aclient: SandboxClient, kit: Kit, operator: Any
) -> None:
    operator()
    scope_ref = await aclient.create_scope(scope="tenant-a", thread_id="calls")
    names: list[str] = []
    async with (
        aclient.sandbox_for_call(scope_ref, "agents/call", spec()) as first,
        aclient.sandbox_for_call(scope_ref, "agents/call", spec()) as second,
    ):
        names += [first.name, second.name]
        report = await check_call_scope(first, second)
        assert report.ok, report.failures
    for name in names:
        obj = kit.get(name)
        assert obj is None or obj["metadata"].get("deletionTimestamp")
    with pytest.raises(RuntimeError):
        async with aclient.sandbox_for_call(scope_ref, "agents/call", spec()) as third:
            names.append(third.name)
            raise RuntimeError("the call failed")
    obj = kit.get(names[-1])
    assert obj is None or obj["metadata"].get("deletionTimestamp")


@pytest.mark.parametrize("backend", ["runc", "gvisor"])
async def test_conformance_on_operator_sandboxes(
    aclient: SandboxClient, operator: Any, backend: str, kubeconfig: str, namespace: str
) -> None:
    """Through an exec session (#39 item 2, docs/exec-session.md): the client's opt-in data
    plane, on the operator's hardened pods (the plain one runs every other test here)."""
    operator(local_config(selection="fixed", pinned=backend))
    scope_ref = await aclient.create_scope(scope="tenant-a", thread_id=f"conf-{backend}")
    sessions = await SandboxClient.from_kubeconfig(
        namespace, kubeconfig=kubeconfig, dataplanes={"Pod": pod_session_factory}
    )
    try:
        sb = await sessions.acquire(scope_ref, "agents/conformance", spec(PYTHON), timeout=180)
        reports = await check_sandbox(sb)
        failures = {r.suite: r.failures for r in reports if r.failures}
        assert not failures, failures
        assert (await sb.run_code("print(6 * 7)")).stdout == b"42\n"
        transport = getattr(getattr(sb.dataplane, "inner", None), "transport", None)
        assert isinstance(transport, SessionExecTransport)
        assert transport.opened >= 1 and not transport.unavailable
    finally:
        await sessions.close()


def test_sync_client(kubeconfig: str, namespace: str, operator: Any) -> None:
    operator()
    with SyncSandboxClient.from_kubeconfig(namespace, kubeconfig=kubeconfig) as c:
        scope_ref = c.create_scope(scope="tenant-a", thread_id="sync")
        sb = c.acquire(scope_ref, "agents/sync", spec(), timeout=180)
        assert sb.exec("echo $((2 + 3))").stdout == b"5\n"
        sb.write_file("x.bin", b"\x00\xff")
        assert sb.read_file("x.bin") == b"\x00\xff"
        with c.sandbox_for_call(scope_ref, "agents/sync", spec(), timeout=180) as call:
            assert call.name != sb.name
        c.dispose(sb, wait=True)


# -- namespace confinement with the shipped Role -------------------------------------------


def _apply_rbac(api: k8s.ApiClient, namespace: str) -> None:
    from kubernetes import utils

    docs = list(yaml.safe_load_all((REPO / "docs/examples/rbac.yaml").read_text()))
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects", []):
            subject["namespace"] = namespace
        utils.create_from_dict(api, doc, namespace=namespace)


@pytest.fixture
def other_namespace(core_v1: k8s.CoreV1Api, namespace: str) -> Iterator[str]:
    name = f"{namespace}-other"[:63]
    core_v1.create_namespace(
        k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels=TEST_NAMESPACE_LABELS))
    )
    yield name
    core_v1.delete_namespace(name)


async def test_agent_role_confined_to_its_namespace(
    kubeconfig: str,
    namespace: str,
    other_namespace: str,
    api_client: k8s.ApiClient,
    core_v1: k8s.CoreV1Api,
    kit: Kit,
    operator: Any,
) -> None:
    operator()
    _apply_rbac(api_client, namespace)
    host = await token_client(kubeconfig, namespace, token(core_v1, namespace, "host"))
    agent = await token_client(kubeconfig, namespace, token(core_v1, namespace, "agent"))
    try:
        # The host creates the scope; the agent may not.
        scope_ref = await host.create_scope(scope="tenant-a", thread_id="rbac")
        with pytest.raises(SandboxForbidden):
            await agent.create_scope(scope="tenant-a", thread_id="forged")
        # The agent's Role is enough to acquire and work in its own namespace.
        sb = await agent.acquire(scope_ref, "agents/rbac", spec(), timeout=180)
        assert (await sb.exec(["id", "-u"])).ok
        # Another namespace is out of reach: its scopes, its sandboxes, its pods.
        kit.custom.create_namespaced_custom_object(
            "sandbox-operator.dev",
            "v1alpha1",
            other_namespace,
            "sandboxscopes",
            {
                "apiVersion": "sandbox-operator.dev/v1alpha1",
                "kind": "SandboxScope",
                "metadata": {"name": "theirs"},
                "spec": {"scope": "tenant-b", "threadId": "t"},
            },
        )
        agent.namespace = other_namespace
        with pytest.raises(SandboxForbidden):
            await agent.acquire("theirs", "agents/rbac", spec(), timeout=30)
        with pytest.raises(SandboxForbidden):
            await agent.dispose(sb.name)
    finally:
        await host.close()
        await agent.close()
