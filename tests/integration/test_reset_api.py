"""Reset (``spec.resets``, #36 item 1) against a real API server: the CRD lets the count only
grow and refuses it with storage; the operator answers a raised count by deleting the serving pod
at once and putting a never-used pod in its place in the same pass (a warm pool's idle pod when
one matches, else a new pod), and records it in ``status.resets``; the client's ``reset`` waits
for exactly that. Pods run on no node: the test plays the kubelet (tests/fixtures/nodeless.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from sandbox_operator import labels as lbl
from sandbox_operator.client import SandboxClient, SandboxNotResettable
from sandbox_operator.contract import GROUP, SANDBOX_PLURAL, SANDBOX_WARM_POOL_PLURAL, VERSION
from tests.fixtures.faults import runc_config
from tests.fixtures.nodeless import KubeletPlayer, off_node, play_kubelet, serve
from tests.fixtures.operator import Kit

pytestmark = pytest.mark.integration


def patch_resets(kit: Kit, name: str, count: int) -> dict[str, Any]:
    result: dict[str, Any] = kit.custom.patch_namespaced_custom_object(
        GROUP, VERSION, kit.ns, SANDBOX_PLURAL, name, {"spec": {"resets": count}}
    )
    return result


def status_of(kit: Kit, name: str) -> dict[str, Any]:
    return dict((kit.get(name) or {}).get("status") or {})


def wait_status(kit: Kit, name: str, predicate: Any, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = status_of(kit, name)
        if predicate(status):
            return status
        time.sleep(0.2)
    raise AssertionError(f"sandbox {name}: status never matched; last: {status}")


def ready(status: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def test_resets_only_grow_and_never_come_with_storage(kit: Kit, crds: Any) -> None:
    kit.scope()
    kit.sandbox("counted")
    patch_resets(kit, "counted", 2)
    with pytest.raises(ApiException) as err:
        patch_resets(kit, "counted", 1)
    assert err.value.status == 422 and "resets may only increase" in err.value.body
    with pytest.raises(ApiException) as err:
        kit.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            kit.ns,
            SANDBOX_PLURAL,
            "counted",
            [{"op": "remove", "path": "/spec/resets"}],
            _content_type="application/json-patch+json",
        )
    assert err.value.status == 422 and "resets may only increase" in err.value.body
    with pytest.raises(ApiException) as err:
        kit.sandbox("stored", storage={"size": "1Gi"}, resets=1)
    assert err.value.status == 422 and "resets needs a sandbox without storage" in err.value.body


def test_a_reset_replaces_the_pod_by_a_never_used_one_in_one_pass(
    kit: Kit, start_operator: Any
) -> None:
    """Cold: the old pod is gone from the API server when status.resets says so, a new pod of
    the same name (a new uid) serves, and Ready comes back once it runs. Then with a matching
    warm pool: the reset claims the pool's idle pod and is Ready in the same write."""
    start_operator(off_node(runc_config(resyncSeconds=300)))
    kit.scope()
    kit.sandbox("r")
    serve(kit, "r")
    old = kit.pod("r")
    assert old is not None
    patch_resets(kit, "r", 1)
    status = wait_status(kit, "r", lambda s: s.get("resets") == 1)
    assert status.get("resetAt")
    assert not ready(status), status  # the new pod is not running yet
    new = kit.pod("r")
    assert new is not None and new.metadata.uid != old.metadata.uid
    assert new.metadata.deletion_timestamp is None
    play_kubelet(kit.core, kit.ns, new)
    status = wait_status(kit, "r", ready)
    assert status["servedFrom"] == "cold" and status["resets"] == 1

    # A matching warm pool: the next reset claims its idle pod.
    spec = kit.sandbox_body("template")["spec"]
    fields = ("kind", "image", "workDir", "requires", "resources")
    kit.custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        kit.ns,
        SANDBOX_WARM_POOL_PLURAL,
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxWarmPool",
            "metadata": {"name": "spare"},
            "spec": {"replicas": 1, "template": {f: spec[f] for f in fields}},
        },
    )
    deadline = time.monotonic() + 60
    while not (pool := kit.pods(f"{lbl.POOL_LABEL}=spare")) and time.monotonic() < deadline:
        time.sleep(0.3)
    (idle,) = pool
    play_kubelet(kit.core, kit.ns, idle)
    time.sleep(1)  # the operator's view of the pool pod Ready
    patch_resets(kit, "r", 2)
    status = wait_status(kit, "r", lambda s: s.get("resets") == 2)
    assert ready(status), status  # claimed Ready: Ready in the reset's own write
    assert status["servedFrom"] == "SandboxWarmPool/spare"
    assert status["servedBy"]["name"] == idle.metadata.name
    assert kit.pod("r") is None  # the cold pod went at once
    # Ready again is a new transition, so an instance id reading it changes.
    cond = kit.condition(kit.get("r"), "Ready")
    assert cond is not None and cond["status"] == "True"


@pytest.fixture
async def aclient(kubeconfig: str, kit: Kit) -> AsyncIterator[SandboxClient]:
    c = await SandboxClient.from_kubeconfig(kit.ns, kubeconfig=kubeconfig)
    yield c
    await c.close()


async def test_the_client_resets_and_waits_for_the_new_pod(
    kit: Kit, start_operator: Any, aclient: SandboxClient
) -> None:
    start_operator(off_node(runc_config(resyncSeconds=300)))
    kit.scope()
    kit.sandbox("c")
    with KubeletPlayer(kit.core, kit.ns):
        await asyncio.to_thread(serve, kit, "c")
        before = await asyncio.to_thread(kit.pod, "c")
        await aclient.reset("c", timeout=60)
        status = status_of(kit, "c")
        assert status["resets"] == 1 and ready(status)
        after = await asyncio.to_thread(kit.pod, "c")
        assert before is not None and after is not None
        assert after.metadata.uid != before.metadata.uid
        await aclient.reset("c", timeout=60)
        assert status_of(kit, "c")["resets"] == 2
    # With storage, the client refuses before asking (and the API server would refuse it).
    kit.sandbox("s", storage={"size": "1Gi"})
    with pytest.raises(SandboxNotResettable):
        await aclient.reset("s", timeout=5)
