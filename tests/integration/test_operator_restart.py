"""Restarts and purges: nothing the operator needs lives only in its memory. On a real API server,
the pods on no node (tests/fixtures/nodeless.py: the one Ready Sandbox here is the test's own
playing of the kubelet)."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from sandbox_operator import naming
from sandbox_operator.contract import GROUP, VERSION
from sandbox_operator.reconcile.runtime import FINALIZER
from tests.fixtures.cluster import fresh_namespace
from tests.fixtures.nodeless import off_node, serve
from tests.fixtures.operator import Kit
from tests.fixtures.operator import runc_only as fixture_runc_only

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def runc_only():
    return off_node(
        fixture_runc_only(pod={"terminationGracePeriodSeconds": 1}, operator={"resyncSeconds": 5})
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
    # The one policy is the namespace's for runc's closed pods (not a Sandbox's): it stays.
    assert [n.metadata.name for n in nps] == [naming.egress_policy_name("runc", "closed")]
    events = kit.events_until("conv", lambda evs: any(e.reason == "Purged" for e in evs))
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


#: A finalizer of someone else's: it holds the deleted Sandboxes while the new operator starts.
_HOLD = "test.sandbox-operator.dev/hold"


def test_a_restart_among_hundreds_of_deleted_sandboxes_serves_a_new_one_elsewhere_at_once(
    kit, start_operator
):
    """(#28 item 5) The operator is replaced while 300 Sandboxes of one namespace are being
    deleted (each still held: by our finalizer, and by someone else's). The new replica lists them
    all, lets go of its finalizer on each, and still serves a new Sandbox in another namespace
    within seconds. Before, kopf's worker limit (256) deadlocked its initial indexing: no event
    was handled at all, and the resync passed over the stale Sandboxes every few seconds, each
    pass a GET and a PATCH answered 404."""
    many = 300
    with fresh_namespace(kit.core, "restart-elsewhere") as elsewhere:
        other = Kit(kit.custom, kit.core, elsewhere)
        first = start_operator(runc_only(), args=("--standalone", "--namespace", elsewhere))
        first.kill()
        for i in range(many):
            body = kit.sandbox_body(f"old-{i:03d}", scope_ref="gone")
            body["metadata"]["finalizers"] = [FINALIZER, _HOLD]
            kit.custom.create_namespaced_custom_object(GROUP, VERSION, kit.ns, "sandboxes", body)
        kit.custom.delete_collection_namespaced_custom_object(GROUP, VERSION, kit.ns, "sandboxes")
        try:
            second = start_operator(runc_only(), args=("--standalone", "--namespace", elsewhere))
            other.scope()
            asked = time.monotonic()
            other.sandbox("new")
            serve(other, "new", timeout=60)
            took = time.monotonic() - asked
            print(f"new Sandbox Ready {took:.1f}s after its create, with {many} deleting")
            assert took < 30, took
            # ... and the deleted ones were let go by this operator (only the hold remains).
            _wait(
                lambda: all(s["metadata"]["finalizers"] == [_HOLD] for s in kit.list()),
                60,
                "our finalizer gone from every deleted Sandbox",
            )
            assert len(kit.list()) == many
            assert second.running
        finally:
            for obj in kit.list():
                kit.custom.patch_namespaced_custom_object(
                    GROUP, VERSION, kit.ns, "sandboxes", obj["metadata"]["name"],
                    {"metadata": {"finalizers": None}},
                )  # fmt: skip
            other.delete_all_while_served()
    _wait(lambda: not kit.list(), 60, "the deleted Sandboxes gone")
