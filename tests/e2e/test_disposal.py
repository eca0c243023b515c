"""(#36 item 3) Disposal off the caller's path, through the client on the real node, under runc and
gVisor (docs/disposal.md). By default a disposal is what it always was: the pod deleted with its own
grace period and gone from the API server only once the kubelet stopped it. With the opt-in
(``pod.disposalGracePeriodSeconds: 0``) ``dispose(wait=True)`` returns once the Sandbox is gone from
the API server, and by then its pod is gone too, deleted with no grace period (never in a grace
period anyone could exec into it during), its last state still running (the API server let it go
before the kubelet stopped it: the caller never waited for the node); nothing reaches it by name;
and the same key acquired at once gets a pod of its own, without the old one's files. Times are
measured in benchmarks/maf.py, never asserted here."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from sandbox_operator import naming
from sandbox_operator.client import SandboxClient
from sandbox_operator.contract import Capability, SandboxSpec, Storage
from tests.fixtures.disposal import (
    PodHistory,
    assert_removed_after_the_node_stopped_it,
    assert_removed_without_grace,
    fast_disposal,
)
from tests.fixtures.operator import BUSYBOX, Kit, local_config
from tests.fixtures.suspend import STORAGE
from tests.fixtures.suspend import config as suspend_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SPEC = SandboxSpec.model_validate(
    {
        "kind": "shell",
        "image": BUSYBOX,
        "requires": [Capability.EXEC, Capability.FILES_IN, Capability.FILES_OUT],
        "resources": {
            "requests": {"cpu": "10m", "memory": "16Mi"},
            "limits": {"cpu": "500m", "memory": "128Mi"},
        },
    }
)


@pytest.fixture
async def aclient(kubeconfig: str, namespace: str) -> AsyncIterator[SandboxClient]:
    c = await SandboxClient.from_kubeconfig(namespace, kubeconfig=kubeconfig, default_timeout=180)
    yield c
    await c.close()


def read_pod(kit: Kit, name: str) -> Any:
    try:
        return kit.core.read_namespaced_pod(name, kit.ns)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


@pytest.mark.parametrize("runtime", ["runc", "gvisor"])
async def test_a_disposal_returns_with_its_pod_gone_and_the_key_free(
    aclient: SandboxClient,
    kit: Kit,
    kubectl: Callable[..., subprocess.CompletedProcess[str]],
    start_operator: Callable[..., Any],
    runtime: str,
) -> None:
    start_operator(fast_disposal(local_config(selection="fixed", pinned=runtime)))
    scope_ref = await aclient.create_scope(scope="tenant-a", thread_id=f"dispose-{runtime}")
    sandbox = await aclient.acquire(scope_ref, "agents/disposed", SPEC)
    pod_name = str((sandbox.resource or {})["status"]["servedBy"]["name"])
    await sandbox.write_file("left.txt", b"from the disposed sandbox")

    with PodHistory(kit.core, kit.ns, pod_name) as history:
        await aclient.dispose(sandbox, wait=True)
        # Returned: the Sandbox is gone, and nothing is left of its pod to reach by name.
        assert kit.get(sandbox.name) is None
        now = read_pod(kit, pod_name)
        assert now is None or now.metadata.uid != history.uid, now.metadata
        reached = kubectl("exec", "-n", kit.ns, pod_name, "--", "true", check=False)
        assert reached.returncode != 0, reached.stdout
        assert_removed_without_grace(history)

    # The same key again, at once: a new Sandbox, a pod of its own (its name is the old pod's:
    # the kubelet tells them apart by uid), none of the old one's files.
    again = await aclient.acquire(scope_ref, "agents/disposed", SPEC)
    assert again.name == sandbox.name
    assert (again.resource or {})["metadata"]["uid"] != (sandbox.resource or {})["metadata"]["uid"]
    new_pod = read_pod(kit, str((again.resource or {})["status"]["servedBy"]["name"]))
    assert new_pod is not None and new_pod.metadata.uid != history.uid
    assert not await again.exists("left.txt")
    await aclient.dispose(again, wait=True)


@pytest.mark.parametrize("runtime", ["runc", "gvisor"])
async def test_by_default_a_disposal_waits_until_the_node_stopped_the_pod(
    aclient: SandboxClient,
    kit: Kit,
    start_operator: Callable[..., Any],
    runtime: str,
) -> None:
    """Without the opt-in: the pod is deleted with its own grace period and stays in the API
    server (its namespace's egress policies still selecting it) until the kubelet stopped its
    containers; dispose returns only after that."""
    start_operator(local_config(selection="fixed", pinned=runtime))
    scope_ref = await aclient.create_scope(scope="tenant-a", thread_id=f"default-{runtime}")
    sandbox = await aclient.acquire(scope_ref, "agents/disposed", SPEC)
    pod_name = str((sandbox.resource or {})["status"]["servedBy"]["name"])
    with PodHistory(kit.core, kit.ns, pod_name) as history:
        await aclient.dispose(sandbox, wait=True)
        assert kit.get(sandbox.name) is None
        now = read_pod(kit, pod_name)
        assert now is None or now.metadata.uid != history.uid, now.metadata
        assert_removed_after_the_node_stopped_it(history)


@pytest.mark.parametrize("runtime", ["runc", "gvisor"])
async def test_a_sandbox_with_storage_returns_with_its_claim_gone_and_the_key_free(
    aclient: SandboxClient,
    kit: Kit,
    start_operator: Callable[..., Any],
    storage_class: str,
    runtime: str,
) -> None:
    """A guard, passing before #36 item 3 too: with a work volume, when dispose returns its
    claim is gone (the finalizer waits for it; it goes a moment after the pod) and the same key
    acquired at once is served on a new, empty volume. (Not waiting for the claim went unnoticed
    here in a trial: the claim goes within the Sandbox's own watch delay.)"""
    start_operator(suspend_config(runtime))
    spec = SPEC.model_copy(update={"storage": Storage.model_validate(STORAGE)})
    scope_ref = await aclient.create_scope(scope="tenant-a", thread_id=f"storage-{runtime}")
    sandbox = await aclient.acquire(scope_ref, "agents/stored", spec)
    await sandbox.write_file("left.txt", b"on the old volume")
    claim = naming.work_volume_name(sandbox.name)
    old = kit.core.read_namespaced_persistent_volume_claim(claim, kit.ns).metadata.uid
    await aclient.dispose(sandbox, wait=True)
    try:
        now = kit.core.read_namespaced_persistent_volume_claim(claim, kit.ns)
    except ApiException as exc:
        assert exc.status == 404
    else:
        assert now.metadata.uid != old, now.metadata
    again = await aclient.acquire(scope_ref, "agents/stored", spec)
    assert not await again.exists("left.txt")
    new = kit.core.read_namespaced_persistent_volume_claim(claim, kit.ns).metadata.uid
    assert new != old
    await aclient.dispose(again, wait=True)
