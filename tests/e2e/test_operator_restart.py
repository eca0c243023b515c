"""Restarts and purges: nothing the operator needs lives only in its memory."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from sandbox_operator import naming
from tests.fixtures.operator import DECLARATIONS, local_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def runc_only():
    return local_config(
        floor="container",
        selection="fixed",
        pinned="runc",
        backends=[
            {
                "name": "runc",
                "type": "runtimeClass",
                "runtimeClassName": "runc",
                "isolation": "container",
                "declarations": DECLARATIONS,
                "pod": {"terminationGracePeriodSeconds": 1},
            }
        ],
        operator={"resyncSeconds": 5},
    )


def _wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_deleting_a_scope_disposes_all_its_sandboxes_from_a_fresh_operator(kit, start_operator):
    first = start_operator(runc_only())
    kit.scope("conv")
    kit.scope("bystander", thread_id="thread-other")
    for i in range(20):
        kit.sandbox(f"s{i:02d}", scope_ref="conv")
    kit.sandbox("keep", scope_ref="bystander")
    _wait(lambda: len(kit.pods()) == 21, 180, "21 pods")
    # The replica that created them goes away; a new one, with an empty memory, does the purge.
    first.kill()
    second = start_operator(runc_only())
    kit.delete("conv", "sandboxscopes")
    kit.wait_gone("conv", "sandboxscopes", timeout=240)
    remaining = [p.metadata.name for p in kit.pods()]
    assert remaining == [naming.pod_name("keep")]
    assert [s["metadata"]["name"] for s in kit.list()] == ["keep"]
    nps = client.NetworkingV1Api(kit.core.api_client).list_namespaced_network_policy(kit.ns).items
    assert [n.metadata.name for n in nps] == [naming.pod_name("keep")]
    events = kit.events("conv")
    purged = [e for e in events if e.reason == "Purged"]
    assert purged and "20 sandbox" in purged[0].message, [(e.reason, e.message) for e in events]
    assert second.running


def test_sigkill_during_fifty_creates_leaves_exactly_fifty_pods(kit, start_operator):
    op = start_operator(runc_only())
    kit.scope()
    for i in range(50):
        kit.sandbox(f"n{i:02d}")
        if i == 20:
            _wait(lambda: len(kit.pods()) >= 3, 60, "the first pods")
            op.kill()  # mid-flight: some created, some not, some half-written statuses
            time.sleep(1)
    op.restart()
    _wait(
        lambda: (
            all((kit.condition(s, "Admitted") or {}).get("status") == "True" for s in kit.list())
            and len(kit.list()) == 50
        ),
        240,
        "all 50 admitted",
    )
    _wait(lambda: len(kit.pods()) == 50, 120, "50 pods")
    time.sleep(5)  # and it stays so
    pods = kit.pods()
    assert len(pods) == 50
    sandboxes = {s["metadata"]["name"]: s["metadata"]["uid"] for s in kit.list()}
    for pod in pods:
        (owner,) = pod.metadata.owner_references
        assert sandboxes[owner.name] == owner.uid  # every pod is owned by its own Sandbox
    assert sorted(p.metadata.name for p in pods) == sorted(naming.pod_name(n) for n in sandboxes)
    all_pods = kit.core.list_namespaced_pod(kit.ns).items
    assert len(all_pods) == 50  # no orphans
