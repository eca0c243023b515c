"""The host learns what a conversation's disposal did (#25 item 3), on a real API server: the
Sandboxes' pods run on no node, and the test reports each Ready as a kubelet would
(tests/fixtures/nodeless.py; one runtime, as without a node runc and gVisor differ only in a
name).

``delete_scope(wait=True)`` returns the operator's purge as the SandboxScope's last state recorded
it (read off the watch's DELETED event: the scope is gone by then), ``dispose_scope`` counts the
Sandboxes that are gone rather than the deletes it issued and names each one still there by its
``DisposalCode``, and each is reported to the observer as one ``ScopeDisposed``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from sandbox_operator.client import SandboxClient, SandboxObserver, ScopeDisposed
from sandbox_operator.contract import GROUP, VERSION, DisposalCode, SandboxSpec, ScopePurge
from tests.fixtures.nodeless import KubeletPlayer, off_node
from tests.fixtures.operator import BUSYBOX, Kit, local_config, observed_client

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HOLD = "example.com/hold"


class Recorder(SandboxObserver):
    def __init__(self) -> None:
        self.events: list[Any] = []

    def scope_disposed(self, event: ScopeDisposed) -> None:
        self.events.append(event)


def spec() -> SandboxSpec:
    return SandboxSpec.model_validate(
        {
            "kind": "shell",
            "image": BUSYBOX,
            "requires": ["exec"],
            "resources": {
                "requests": {"cpu": "10m", "memory": "16Mi"},
                "limits": {"cpu": "500m", "memory": "128Mi"},
            },
        }
    )


@pytest.fixture
async def observed(
    kubeconfig: str, namespace: str
) -> AsyncIterator[tuple[SandboxClient, Recorder]]:
    recorder = Recorder()
    async with observed_client(kubeconfig, namespace, recorder) as c:
        yield c, recorder


async def test_the_host_learns_what_a_purge_did(
    observed: tuple[SandboxClient, Recorder], start_operator: Any, kit: Kit
) -> None:
    runtime = "runc"
    client, recorder = observed
    start_operator(off_node(local_config(selection="fixed", pinned=runtime)))
    with KubeletPlayer(kit.core, kit.ns) as kubelet:
        await _purges_told(client, recorder, kit, runtime)
    assert len(kubelet.played) == 4  # every Sandbox's pod was Ready by the test, none by a node


async def _purges_told(client: SandboxClient, recorder: Recorder, kit: Kit, runtime: str) -> None:
    # delete_scope(wait=True): the operator's purge, from the scope's last state.
    scope_ref = await client.create_scope(scope="tenant-a", thread_id=f"purge-{runtime}")
    for agent in ("agents/a", "agents/b"):
        await client.acquire(scope_ref, agent, spec())
    purge = await client.delete_scope(scope_ref, wait=True, timeout=120)
    assert purge == ScopePurge(disposed=2), purge
    assert kit.list() == [] and kit.pods() == []
    [event] = recorder.events
    assert (event.scope, event.thread_id, event.scope_ref) == (
        "tenant-a",
        f"purge-{runtime}",
        scope_ref,
    )
    assert (event.count, event.undisposed, event.failure) == (2, (), None)
    # Deleting it again: nothing was purged this time, and nothing is reported.
    assert await client.delete_scope(scope_ref, wait=True) is None
    assert len(recorder.events) == 1

    # dispose_scope: the Sandboxes gone are counted; one held by someone else's finalizer is
    # named, by code, once the wait is over.
    scope_ref = await client.create_scope(scope="tenant-a", thread_id=f"dispose-{runtime}")
    held = await client.acquire(scope_ref, "agents/held", spec())
    await client.acquire(scope_ref, "agents/free", spec())
    kit.custom.patch_namespaced_custom_object(
        GROUP, VERSION, kit.ns, "sandboxes", held.name,
        {"metadata": {"finalizers": [*kit.get(held.name)["metadata"]["finalizers"], HOLD]}},
    )  # fmt: skip
    try:
        purge = await client.dispose_scope(scope_ref, timeout=15)
        assert purge.disposed == 1, purge
        [failure] = purge.undisposed
        assert failure.code is DisposalCode.TIMEOUT and held.name in failure.detail, failure
        assert recorder.events[-1].count == 1 and recorder.events[-1].undisposed == (failure,)
    finally:
        obj = kit.get(held.name)
        if obj is not None:
            kit.custom.patch_namespaced_custom_object(
                GROUP, VERSION, kit.ns, "sandboxes", held.name,
                {"metadata": {"finalizers": [f for f in obj["metadata"].get("finalizers") or []
                                             if f != HOLD]}},
            )  # fmt: skip
    await client.delete_scope(scope_ref, wait=True)
