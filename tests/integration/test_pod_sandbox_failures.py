"""A pod whose node lacks the RuntimeClass's handler, learnt of from the operator's watch of the
kubelet's ``FailedCreatePodSandBox`` Events (#26 item 2: no Event list per starting pod).

The API-level cluster runs no kubelet, so the test posts the Event a kubelet would, through the
real API server, about the Sandbox's real (Pending) pod; the operator's watch delivers it and the
Sandbox ends as StartupFailed (RuntimeHandlerMissing) at once, with one list of Events in all
(the watch's first) however many pods wait."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.fixtures.operator import Kit, runc_only

pytestmark = pytest.mark.integration

CONTAINERD = (
    "Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox "
    'runtime: no runtime for "nohandler" is configured'
)


def post_kubelet_event(kit: Kit, pod: Any) -> None:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    kit.core.create_namespaced_event(
        kit.ns,
        {
            "metadata": {"generateName": f"{pod.metadata.name}."},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.metadata.name,
                "namespace": kit.ns,
                "uid": pod.metadata.uid,
            },
            "reason": "FailedCreatePodSandBox",
            "message": CONTAINERD,
            "type": "Warning",
            "source": {"component": "kubelet", "host": "n1"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        },
    )


def unschedulable_runc() -> dict[str, Any]:
    """runc, with a node selector no node has: the pods stay Pending (the cluster's node would
    otherwise start them)."""
    return runc_only(pod={"nodeSelector": {"sandbox-operator.dev/test-no-such-node": "x"}})


def test_a_kubelet_event_ends_the_sandbox_through_the_watch(kit, start_operator):
    op = start_operator(unschedulable_runc())
    kit.scope()
    for name in ("a", "b", "c"):
        kit.sandbox(name, agent_dir=f"agents/{name}")
    pods = {name: kit.wait_pod(name, timeout=30) for name in ("a", "b", "c")}
    time.sleep(4)  # past the 3 s after which a pod's Events used to be listed
    post_kubelet_event(kit, pods["a"])
    obj = kit.wait_condition("a", reasons=("StartupFailed",), timeout=20)
    message = kit.condition(obj, "Ready")["message"]
    assert "no handler 'nohandler'" in message, message
    for name in ("b", "c"):
        assert kit.condition(kit.get(name), "Ready")["reason"] == "Creating"
    listed = op.api_requests().get(("list", "events"), 0.0)
    assert listed == 1, op.api_requests()  # the watch's first list; none per pod
    assert op.api_requests().get(("watch", "events"), 0.0) >= 1, op.api_requests()
