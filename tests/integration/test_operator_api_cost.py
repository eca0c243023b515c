"""What the operator costs the API server, counted through its own client (``/metrics``).

The operator reconciles from watched views: a Ready, unchanged Sandbox costs no request however
often it is passed over, and admitting a Sandbox lists nothing (key uniqueness and scope
membership come from the views). The API-level cluster runs no kubelet, so the test plays the
kubelet's one part here, through the real API server: it reports the sandbox pod Running and
Ready on its status subresource (what kwok does for fake nodes).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from sandbox_operator import naming
from tests.fixtures.operator import local_config

pytestmark = pytest.mark.integration

READS = ("get", "list")
WRITES = ("create", "update", "patch", "delete", "deletecollection")


def delta(after: dict[tuple[str, str], float], before: dict[tuple[str, str], float]) -> dict:
    out = {k: v - before.get(k, 0.0) for k, v in after.items()}
    return {k: v for k, v in out.items() if v}


def play_kubelet(kit: Any, sandbox: str) -> None:
    """Report the sandbox's pod Running and Ready, as a kubelet would."""
    pod = kit.wait_pod(sandbox, timeout=30)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {
        "phase": "Running",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
        ],
        "containerStatuses": [
            {
                "name": "sandbox",
                "ready": True,
                "restartCount": 0,
                "image": pod.spec.containers[0].image,
                "imageID": "",
                "state": {"running": {"startedAt": now}},
            }
        ],
    }
    kit.core.patch_namespaced_pod_status(naming.pod_name(sandbox), kit.ns, {"status": status})


def test_a_ready_unchanged_sandbox_costs_nothing_and_admission_lists_nothing(kit, start_operator):
    # A 1 s safety-net resync: every Sandbox is passed over again and again during the test.
    op = start_operator(local_config(floor="container", operator={"resyncSeconds": 1}))
    kit.scope()
    kit.sandbox("first")
    kit.wait_condition("first", "Admitted", status="True", timeout=60)
    kit.wait_pod("first", timeout=30)
    time.sleep(0.5)
    if (kit.condition(kit.get("first"), "Ready") or {}).get("reason") != "Ready":
        play_kubelet(kit, "first")  # no kubelet runs it (an API-level cluster)
    kit.wait_condition("first", "Ready", reasons=("Ready",), timeout=60)

    # Admission: from create to Admitted and the pod created, no list and no read at all.
    before = op.api_requests()
    kit.sandbox("second", agent_dir="agents/second")
    kit.wait_condition("second", "Admitted", status="True", timeout=60)
    kit.wait_pod("second", timeout=30)
    time.sleep(1.5)  # let the passes triggered by its own writes run out
    admission = delta(op.api_requests(), before)
    assert not [k for k in admission if k[0] in READS], admission
    writes = {k: v for k, v in admission.items() if k[0] in WRITES}
    # One metadata patch (finalizer + key labels) and the pod, the scope's count, and status
    # patches: Admitted/Creating, then one per change the pod went through on the way (the
    # Creating message names the pod's state; on a cluster with a node the pod may also become
    # Ready meanwhile). Nothing per other object, and nothing twice. No NetworkPolicy: the
    # namespace's policy of its backend and egress mode, made for "first", confines it too.
    assert writes.get(("create", "pods")) == 1, writes
    assert ("create", "networkpolicies") not in writes, writes
    assert writes.get(("patch", "sandboxes")) == 1, writes
    assert writes.get(("patch", "sandboxes/status"), 0) >= 1, writes
    assert writes.get(("patch", "sandboxscopes/status")) == 1, writes
    # No Event: admitted and created are in the conditions (#26: an Event per transition every
    # Sandbox makes was one more write per Sandbox, read by nobody who does not read conditions).
    assert ("create", "events") not in writes, writes
    if (kit.condition(kit.get("second"), "Ready") or {}).get("reason") != "Ready":
        play_kubelet(kit, "second")
    kit.wait_condition("second", "Ready", reasons=("Ready",), timeout=60)

    # Idle: several resync periods over two Ready sandboxes, zero requests of any kind of ours.
    time.sleep(1.5)
    before = op.api_requests()
    time.sleep(6)
    # (kopf's long-lived watch streams reconnect every couple of minutes: not per object.)
    idle = {k: v for k, v in delta(op.api_requests(), before).items() if k[0] != "watch"}
    assert idle == {}, idle
    # ... although the operator did pass over them: its reconcile counter moved.
    passes = sum(
        v
        for (name, labels), v in op.metrics().items()
        if name == "sandbox_operator_reconcile_duration_seconds_count"
        and dict(labels).get("kind") == "sandbox"
    )
    assert passes >= 2 * 4, passes


def test_cleanup_deletes_each_object_once(kit, start_operator):
    """(#26 item 2) Deleting a Ready Sandbox deletes its pod once: the answer of each delete goes
    into the views at once, so the passes woken meanwhile (by the Sandbox's own status write, by
    the pod's status changes) do not delete it again. (#26 item 3) Three Sandboxes of one backend
    and egress mode made one NetworkPolicy, the namespace's, and their cleanup deletes none."""
    op = start_operator(local_config(floor="container"))
    start = op.api_requests()
    kit.scope()
    names = [f"c{i}" for i in range(3)]
    for name in names:
        kit.sandbox(name, agent_dir=f"agents/{name}")
    for name in names:
        kit.wait_pod(name, timeout=30)
        if (kit.condition(kit.get(name), "Ready") or {}).get("reason") != "Ready":
            play_kubelet(kit, name)
        kit.wait_condition(name, "Ready", reasons=("Ready",), timeout=60)
    made = delta(op.api_requests(), start)
    assert made.get(("create", "networkpolicies")) == 1, made
    before = op.api_requests()
    for name in names:
        kit.delete(name)
    for name in names:
        kit.wait_gone(name, timeout=60)
    time.sleep(1)
    cleanup = delta(op.api_requests(), before)
    assert cleanup.get(("delete", "pods")) == len(names), cleanup
    assert ("delete", "networkpolicies") not in cleanup, cleanup
    assert ("create", "events") not in cleanup, cleanup  # Disposing/Disposed: conditions only
    # (#36 item 3) Disposal off the caller's path costs no write more: per Sandbox its pod's
    # delete and its finalizer's removal, and the scope's count; nothing read back. The count is
    # debounced (COUNT_DEBOUNCE_SECONDS), not batched over the whole cleanup: deletions that end
    # more than that apart are counted in more than one write, never more than one per member.
    writes = {k: v for k, v in cleanup.items() if k[0] in WRITES}
    assert writes.pop(("patch", "sandboxes")) == len(names), cleanup
    assert writes.pop(("delete", "pods")) == len(names), cleanup
    assert 1 <= writes.pop(("patch", "sandboxscopes/status"), 0) <= len(names), cleanup
    assert not writes, cleanup
    assert not [k for k in cleanup if k[0] in READS], cleanup
