"""Suspend and resume from the client against a real API server, no operator: the CRD's CEL rule
refuses ``suspended`` without storage (typed), ``spec.suspended`` is the one spec field besides
lifetime that changes after creation (kubectl patch included), acquire never owns it (no apply
conflict with whoever suspended), and the waits end on what a stand-in operator writes to the
status subresource."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from sandbox_operator import labels as lbl
from sandbox_operator.client import (
    SandboxClient,
    SandboxIsolationBelowFloor,
    SandboxNotReadyInTime,
    SandboxNotSuspendable,
)
from sandbox_operator.contract import GROUP, SANDBOX_PLURAL, VERSION, Capability, SandboxSpec
from tests.fixtures.operator import Kit

pytestmark = [pytest.mark.integration]

STORAGE = {"size": "1Gi"}


def spec(**fields: Any) -> SandboxSpec:
    data: dict[str, Any] = {
        "kind": "shell",
        "image": "sandbox-operator.dev/busybox:1",
        "requires": [Capability.EXEC, Capability.FILES_IN],
        **fields,
    }
    return SandboxSpec.model_validate(data)


async def until(done: Callable[[], bool]) -> None:
    while True:
        if done():
            return
        await asyncio.sleep(0.1)


def stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
async def aclient(kubeconfig: str, namespace: str, kit: Kit) -> AsyncIterator[SandboxClient]:
    c = await SandboxClient.from_kubeconfig(namespace, kubeconfig=kubeconfig)
    yield c
    await c.close()


async def created(aclient: SandboxClient, thread: str, **fields: Any) -> str:
    """A Sandbox created by the client's acquire (no operator: it gives up at its deadline)."""
    scope_ref = await aclient.create_scope(scope="tenant-s", thread_id=thread)
    with pytest.raises(SandboxNotReadyInTime) as info:
        await aclient.acquire(scope_ref, "agents/s", spec(**fields), timeout=1)
    return info.value.sandbox


async def write_status(aclient: SandboxClient, name: str, status: dict[str, Any]) -> None:
    """Play the operator: merge ``status`` into the status subresource."""
    await aclient.custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        aclient.namespace,
        SANDBOX_PLURAL,
        name,
        {"status": status},
        _content_type="application/merge-patch+json",  # type: ignore[call-arg]
    )


def conditions(
    gen: int, *, ready: tuple[str, str], admitted: tuple[str, str] = ("True", "Admitted")
) -> list[dict[str, Any]]:
    now = stamp()
    return [
        {
            "type": "Admitted",
            "status": admitted[0],
            "reason": admitted[1],
            "message": "",
            "lastTransitionTime": now,
            "observedGeneration": gen,
        },
        {
            "type": "Ready",
            "status": ready[0],
            "reason": ready[1],
            "message": "",
            "lastTransitionTime": now,
            "observedGeneration": gen,
        },
    ]


async def test_no_storage_cannot_be_suspended(
    aclient: SandboxClient, kit: Kit, kubectl: Callable[..., Any]
) -> None:
    name = await created(aclient, "nostore")
    with pytest.raises(SandboxNotSuspendable):
        await aclient.suspend(name)
    # Past the client's own check, the API server refuses it (the CRD's CEL rule), typed.
    with pytest.raises(SandboxNotSuspendable) as info:
        await aclient.objects.patch_suspended(name, True)
    assert "storage" in info.value.message
    result = kubectl(
        "patch",
        "sbx",
        name,
        "-n",
        aclient.namespace,
        "--type",
        "merge",
        "-p",
        json.dumps({"spec": {"suspended": True}}),
        check=False,
    )
    assert result.returncode != 0 and "storage" in result.stderr
    assert kit.get(name)["spec"]["suspended"] is False  # type: ignore[index]


async def test_suspended_is_mutable_and_acquire_does_not_own_it(
    aclient: SandboxClient, kit: Kit, kubectl: Callable[..., Any]
) -> None:
    name = await created(aclient, "mutable", storage=STORAGE)
    gen = kit.get(name)["metadata"]["generation"]  # type: ignore[index]
    await aclient.suspend(name, wait=False)
    obj = kit.get(name)
    assert obj is not None and obj["spec"]["suspended"] is True
    assert obj["metadata"]["generation"] == gen + 1
    await aclient.resume(name, wait=False)
    assert kit.get(name)["spec"]["suspended"] is False  # type: ignore[index]

    # kubectl, as documented: another field manager owns spec.suspended now.
    kubectl(
        "patch",
        "sbx",
        name,
        "-n",
        aclient.namespace,
        "--type",
        "merge",
        "-p",
        '{"spec":{"suspended":true}}',
    )
    assert kit.get(name)["spec"]["suspended"] is True  # type: ignore[index]
    # The client's acquire re-applies its spec without a conflict over spec.suspended, and
    # resumes the sandbox (no operator here: it gives up at its deadline, resumed in spec).
    scope_ref = kit.get(name)["spec"]["scopeRef"]  # type: ignore[index]
    with pytest.raises(SandboxNotReadyInTime):
        await aclient.acquire(scope_ref, "agents/s", spec(storage=STORAGE), timeout=2)
    assert kit.get(name)["spec"]["suspended"] is False  # type: ignore[index]

    # Every other spec field stays immutable.
    with pytest.raises(ApiException) as info:
        kit.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            aclient.namespace,
            SANDBOX_PLURAL,
            name,
            {"spec": {"image": "sandbox-operator.dev/python:1"}},
        )
    assert info.value.status == 422


async def test_waits_end_on_what_the_operator_writes(aclient: SandboxClient, kit: Kit) -> None:
    name = await created(aclient, "waits", storage=STORAGE)

    async def operator_suspends() -> None:
        await until(lambda: bool((kit.get(name) or {}).get("spec", {}).get("suspended")))
        gen = kit.get(name)["metadata"]["generation"]  # type: ignore[index]
        await write_status(
            aclient,
            name,
            {
                "observedGeneration": gen,
                "suspendedBy": "spec",
                "suspendedAt": stamp(),
                "suspendCount": 1,
                "conditions": conditions(gen, ready=("False", "Suspended")),
            },
        )

    helper = asyncio.ensure_future(operator_suspends())
    await asyncio.wait_for(aclient.suspend(name, timeout=30), 40)
    await helper

    async def operator_refuses() -> None:
        await until(lambda: not (kit.get(name) or {}).get("spec", {}).get("suspended"))
        gen = kit.get(name)["metadata"]["generation"]  # type: ignore[index]
        await write_status(
            aclient,
            name,
            {
                "observedGeneration": gen,
                "conditions": conditions(
                    gen, ready=("False", "Suspended"), admitted=("False", "IsolationBelowFloor")
                ),
            },
        )

    helper = asyncio.ensure_future(operator_refuses())
    with pytest.raises(SandboxIsolationBelowFloor):
        await asyncio.wait_for(aclient.resume(name, timeout=30), 40)
    await helper


async def test_resume_of_idle_suspended_stamps_activity(aclient: SandboxClient, kit: Kit) -> None:
    name = await created(aclient, "idle", storage=STORAGE, lifetime={"idleAction": "suspend"})
    gen = kit.get(name)["metadata"]["generation"]  # type: ignore[index]
    suspended_at = stamp()
    await write_status(
        aclient,
        name,
        {
            "observedGeneration": gen,
            "suspendedBy": "idle",
            "suspendedAt": suspended_at,
            "suspendCount": 1,
            "conditions": conditions(gen, ready=("False", "Suspended")),
        },
    )

    async def operator_resumes() -> None:
        while True:
            ann = (kit.get(name) or {}).get("metadata", {}).get("annotations") or {}
            activity = ann.get(lbl.LAST_ACTIVITY_ANNOTATION)
            if activity and activity > suspended_at:
                break
            await asyncio.sleep(0.1)
        await write_status(
            aclient,
            name,
            {
                "observedGeneration": gen,
                "suspendedBy": None,
                "resumedAt": stamp(),
                "resumeCount": 1,
                "conditions": conditions(gen, ready=("True", "Ready")),
            },
        )

    helper = asyncio.ensure_future(operator_resumes())
    await asyncio.wait_for(aclient.resume(name, timeout=30), 40)
    await helper
    obj = kit.get(name)
    assert obj is not None and obj["spec"]["suspended"] is False  # resumed by activity, not spec
