"""The client's suspend / resume against the real operator on the local cluster (issue 16):
a handle writes files, suspends (the pod goes), resumes (a new pod, the same bytes through the
same handle); acquire resumes a sandbox suspended by kubectl or by the idle timeout; a resume
refused after the floor was raised raises the typed refusal; the sync twins."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from sandbox_operator.client import (
    SandboxClient,
    SandboxNotSuspendable,
    SyncSandboxClient,
)
from sandbox_operator.contract import Capability, SandboxSpec
from tests.fixtures.operator import BUSYBOX, Kit
from tests.fixtures.suspend import STORAGE, config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def module_operator_config() -> dict[str, Any]:
    """Every test here shares one runc operator (``module_kit``)."""
    return config("runc")


SMALL = {
    "requests": {"cpu": "10m", "memory": "16Mi"},
    "limits": {"cpu": "500m", "memory": "128Mi"},
}


def spec(**fields: Any) -> SandboxSpec:
    data: dict[str, Any] = {
        "kind": "shell",
        "image": BUSYBOX,
        "requires": [Capability.EXEC, Capability.FILES_IN, Capability.FILES_OUT],
        "resources": SMALL,
        "storage": dict(STORAGE),
        **fields,
    }
    return SandboxSpec.model_validate({k: v for k, v in data.items() if v is not None})


@pytest.fixture
async def aclient(kubeconfig: str, module_kit: Kit) -> AsyncIterator[SandboxClient]:
    c = await SandboxClient.from_kubeconfig(
        module_kit.ns, kubeconfig=kubeconfig, default_timeout=180
    )
    yield c
    await c.close()


# The handle's part is the client's, whatever the runtime: runc only, the module's operator (the
# work volume across a suspension is proven on runc and gVisor in tests/e2e/test_suspend_resume.py).
async def test_handle_suspends_and_resumes_with_its_files(
    aclient: SandboxClient, module_kit: Kit, storage_class: str
) -> None:
    kit = module_kit
    scope_ref = await aclient.create_scope(scope="tenant-s", thread_id="handle-runc")
    sandbox = await aclient.acquire(scope_ref, "agents/s", spec())
    payload = os.urandom(4096)
    await sandbox.write_file("keep.bin", payload)
    pod = kit.pod(sandbox.name)
    assert pod is not None

    await sandbox.suspend()
    obj = kit.get(sandbox.name)
    assert obj is not None and obj["status"]["suspendedBy"] == "spec"
    await asyncio.sleep(0)  # the pod may still be terminating; Suspended says it is going

    await sandbox.resume()
    again = kit.pod(sandbox.name)
    assert again is not None and again.metadata.uid != pod.metadata.uid
    assert await sandbox.read_file("keep.bin") == payload

    # Suspended through the handle: the next use resumes it by itself.
    await sandbox.suspend()
    assert await sandbox.read_file("keep.bin") == payload
    assert kit.get(sandbox.name)["status"]["resumeCount"] == 2  # type: ignore[index]
    await aclient.dispose(sandbox, wait=True)


async def test_no_storage_refused_typed(aclient: SandboxClient) -> None:
    scope_ref = await aclient.create_scope(scope="tenant-s", thread_id="plain")
    sandbox = await aclient.acquire(scope_ref, "agents/p", spec(storage=None))
    with pytest.raises(SandboxNotSuspendable):
        await sandbox.suspend()
    assert (await sandbox.exec(["true"])).ok


async def test_acquire_resumes_kubectl_and_idle_suspensions(
    aclient: SandboxClient,
    module_kit: Kit,
    kubectl: Callable[..., Any],
    storage_class: str,
) -> None:
    kit = module_kit
    scope_ref = await aclient.create_scope(scope="tenant-s", thread_id="acquire")
    sbx_spec = spec(lifetime={"idleTimeoutSeconds": 10, "idleAction": "suspend", "ttlSeconds": 900})
    sandbox = await aclient.acquire(scope_ref, "agents/a", sbx_spec)
    await sandbox.write_file("note.txt", b"kept")
    await sandbox.close()

    kubectl(
        "patch", "sbx", sandbox.name, "-n", aclient.namespace, "--type", "merge",
        "-p", '{"spec":{"suspended":true}}',
    )  # fmt: skip
    kit.wait_condition(sandbox.name, reasons=("Suspended",), status="False", timeout=90)
    again = await aclient.acquire(scope_ref, "agents/a", sbx_spec)
    assert await again.read_file("note.txt") == b"kept"
    assert kit.get(again.name)["spec"]["suspended"] is False  # type: ignore[index]
    await again.close()

    # Left alone past its idle timeout, it suspends itself; the next acquire resumes it.
    obj = kit.wait_condition(sandbox.name, reasons=("Suspended",), status="False", timeout=120)
    assert obj["status"]["suspendedBy"] == "idle"
    third = await aclient.acquire(scope_ref, "agents/a", sbx_spec)
    assert await third.read_file("note.txt") == b"kept"
    assert kit.get(third.name)["status"]["resumeCount"] == 2  # type: ignore[index]
    await aclient.dispose(third, wait=True)


def test_sync_twins(kubeconfig: str, module_kit: Kit, storage_class: str) -> None:
    with SyncSandboxClient.from_kubeconfig(
        module_kit.ns, kubeconfig=kubeconfig, default_timeout=180
    ) as client:
        scope_ref = client.create_scope(scope="tenant-s", thread_id="sync")
        sandbox = client.acquire(scope_ref, "agents/y", spec())
        sandbox.write_file("a.txt", "x")
        sandbox.suspend()
        client.resume(sandbox)
        assert sandbox.read_text("a.txt") == "x"
        client.dispose(sandbox, wait=True)
