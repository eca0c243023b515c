"""The client against a real API server (no node, mostly no operator): server-side apply
convergence, spec conflicts, missing scopes, prompt errors, and refusals reported by the
operator without waiting for the deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from sandbox_operator import labels as lbl
from sandbox_operator import naming
from sandbox_operator.client import (
    SandboxClient,
    SandboxGone,
    SandboxNoBackendCanServe,
    SandboxNotReadyInTime,
    SandboxRefused,
    SandboxScopeNotFound,
    SandboxSpecConflict,
    refusal_error_for,
)
from sandbox_operator.contract import Capability, SandboxKey, SandboxSpec
from tests.fixtures.operator import Kit, local_config

pytestmark = [pytest.mark.integration]


def spec(**fields: Any) -> SandboxSpec:
    data: dict[str, Any] = {
        "kind": "shell",
        "image": "sandbox-operator.dev/busybox:1",
        "requires": [Capability.EXEC, Capability.FILES_IN],
        **fields,
    }
    return SandboxSpec.model_validate(data)


@pytest.fixture
async def aclient(kubeconfig: str, namespace: str, kit: Kit) -> AsyncIterator[SandboxClient]:
    c = await SandboxClient.from_kubeconfig(namespace, kubeconfig=kubeconfig)
    yield c
    await c.close()


async def test_missing_scope(aclient: SandboxClient) -> None:
    with pytest.raises(SandboxScopeNotFound) as info:
        await aclient.acquire("no-such-scope", "agents/x", spec(), timeout=5)
    assert info.value.reason == "ScopeNotFound"


async def test_racing_acquires_converge_on_one_object(
    aclient: SandboxClient, kubeconfig: str, namespace: str, kit: Kit
) -> None:
    scope_ref = await aclient.create_scope(scope="tenant-a", thread_id="race")
    other = await SandboxClient.from_kubeconfig(namespace, kubeconfig=kubeconfig)
    try:
        results = await asyncio.gather(
            aclient.acquire(scope_ref, "agents/r", spec(), timeout=3),
            other.acquire(scope_ref, "agents/r", spec(), timeout=3),
            return_exceptions=True,
        )
    finally:
        await other.close()
    # No operator here: both wait, both give up at their own deadline, on the same object.
    assert all(isinstance(r, SandboxNotReadyInTime) for r in results), results
    names = {r.sandbox for r in results if isinstance(r, SandboxNotReadyInTime)}
    key = SandboxKey(scope="tenant-a", thread_id="race", agent_dir="agents/r")
    assert names == {naming.sandbox_name(key, "shell")}
    assert [s["metadata"]["name"] for s in kit.list()] == [naming.sandbox_name(key, "shell")]
    managers = {m["manager"] for m in kit.list()[0]["metadata"]["managedFields"]}
    assert {aclient.field_manager, other.field_manager} <= managers


async def test_different_spec_for_same_key_conflicts(
    aclient: SandboxClient, kubeconfig: str, namespace: str
) -> None:
    scope_ref = await aclient.create_scope(scope="tenant-a", thread_id="conflict")
    with pytest.raises(SandboxNotReadyInTime):
        await aclient.acquire(scope_ref, "agents/c", spec(), timeout=1)
    other = await SandboxClient.from_kubeconfig(namespace, kubeconfig=kubeconfig)
    try:
        with pytest.raises(SandboxSpecConflict):
            await other.acquire(
                scope_ref, "agents/c", spec(image="sandbox-operator.dev/python:1"), timeout=5
            )
    finally:
        await other.close()


async def test_two_kinds_under_one_key_are_two_sandboxes(aclient: SandboxClient, kit: Kit) -> None:
    """maf-sandbox's identity is (key, kind): another kind (with its own image) under the same key
    is another Sandbox, never a spec conflict; the key label still selects both."""
    scope_ref = await aclient.create_scope(scope="tenant-a", thread_id="kinds")
    for kind, image in (("shell", "sandbox-operator.dev/busybox:1"), ("py", "example/py:1")):
        with pytest.raises(SandboxNotReadyInTime):
            await aclient.acquire(scope_ref, "agents/k", spec(kind=kind, image=image), timeout=1)
    key = SandboxKey(scope="tenant-a", thread_id="kinds", agent_dir="agents/k")
    by_name = {s["metadata"]["name"]: s for s in kit.list()}
    assert set(by_name) == {naming.sandbox_name(key, "shell"), naming.sandbox_name(key, "py")}
    for kind in ("shell", "py"):
        obj = by_name[naming.sandbox_name(key, kind)]
        assert obj["spec"]["kind"] == kind
        assert obj["metadata"]["labels"][lbl.KIND_LABEL] == kind
        assert obj["metadata"]["labels"][lbl.KEY_LABEL] == lbl.key_value(key)


async def test_scope_deleted_while_waiting(aclient: SandboxClient) -> None:
    scope_ref = await aclient.create_scope(scope="tenant-a", thread_id="gone")
    task = asyncio.ensure_future(aclient.acquire(scope_ref, "agents/g", spec(), timeout=60))
    await asyncio.sleep(1.5)
    assert not task.done()
    start = time.monotonic()
    await aclient.delete_scope(scope_ref)
    with pytest.raises(SandboxGone) as info:
        await task
    assert time.monotonic() - start < 10
    assert info.value.reason in ("ScopeDeleted", "Deleted")


async def test_sandbox_deleted_while_waiting(aclient: SandboxClient, kit: Kit) -> None:
    scope_ref = await aclient.create_scope(scope="tenant-a", thread_id="deleted")
    task = asyncio.ensure_future(aclient.acquire(scope_ref, "agents/d", spec(), timeout=60))
    await asyncio.sleep(1.5)
    start = time.monotonic()
    for obj in kit.list():
        kit.delete(obj["metadata"]["name"])
    with pytest.raises(SandboxGone):
        await task
    assert time.monotonic() - start < 10


async def test_refusal_raised_without_waiting_for_deadline(
    aclient: SandboxClient, start_operator: Callable[..., Any]
) -> None:
    start_operator()
    scope_ref = await aclient.create_scope(scope="tenant-a", thread_id="refused")
    start = time.monotonic()
    with pytest.raises(SandboxRefused) as info:
        await aclient.acquire(scope_ref, "agents/vm", spec(min_isolation="vm"), timeout=120)
    assert time.monotonic() - start < 30
    assert isinstance(info.value, SandboxNoBackendCanServe)
    assert type(info.value) is refusal_error_for(info.value.reason)
    assert info.value.sandbox and info.value.namespace == aclient.namespace


async def test_refused_under_fixed_selection(
    aclient: SandboxClient, start_operator: Callable[..., Any]
) -> None:
    start_operator(local_config(selection="fixed", pinned="runc"))
    scope_ref = await aclient.create_scope(scope="tenant-a", thread_id="fixed")
    start = time.monotonic()
    with pytest.raises(SandboxRefused) as info:
        await aclient.acquire(
            scope_ref,
            "agents/snap",
            spec(requires=[Capability.EXEC, Capability.FILES_IN, Capability.SNAPSHOT]),
            timeout=120,
        )
    assert time.monotonic() - start < 30
    assert info.value.reason == "CapabilityNotSupported"
    assert type(info.value).__name__ == "SandboxCapabilityNotSupported"


async def test_scope_deleted_while_the_operator_holds_the_sandbox_unscheduled(
    aclient: SandboxClient, start_operator: Callable[..., Any]
) -> None:
    """As ``test_scope_deleted_while_waiting``, with the operator running: its pod is made and
    never scheduled (above any node here: 8 CPU, within the host's ceiling), and the scope's
    deletion still ends the wait at once."""
    start_operator()
    scope_ref = await aclient.create_scope(scope="tenant-a", thread_id="deleted")
    stuck = spec(resources={"requests": {"cpu": "8", "memory": "16Mi"}, "limits": {"cpu": "8"}})
    task = asyncio.ensure_future(aclient.acquire(scope_ref, "agents/stuck", stuck, timeout=120))
    await asyncio.sleep(3)
    assert not task.done()
    start = time.monotonic()
    await aclient.delete_scope(scope_ref)
    with pytest.raises(SandboxGone):
        await task
    assert time.monotonic() - start < 15


async def test_dispose_with_a_uid_never_deletes_a_replacement(
    aclient: SandboxClient, kit: Kit
) -> None:
    """``dispose(name, uid=...)`` deletes that very object: the API server refuses the delete
    (precondition) when the name now holds a Sandbox recreated since it was read, and the
    client reads that as 'what was meant is gone'. Without a uid the name is deleted whatever
    holds it."""
    first = kit.sandbox("sbx-replaced")
    kit.delete("sbx-replaced")
    kit.wait_gone("sbx-replaced")
    replacement = kit.sandbox("sbx-replaced")
    assert replacement["metadata"]["uid"] != first["metadata"]["uid"]
    await aclient.dispose("sbx-replaced", wait=True, uid=first["metadata"]["uid"])
    still = kit.get("sbx-replaced")
    assert still is not None and still["metadata"]["uid"] == replacement["metadata"]["uid"]
    await aclient.dispose("sbx-replaced", wait=True, uid=replacement["metadata"]["uid"])
    assert kit.get("sbx-replaced") is None
