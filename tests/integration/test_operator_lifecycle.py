"""The operator's lifecycle where no pod needs to run, on a real API server: a Sandbox whose
RuntimeClass is missing (at start, or removed after) is refused or ends StartupFailed with no
pod; a pod that never starts ends as StartupTimeout; delete takes the pod and leaves the
namespace's NetworkPolicy; a TTL expires and disposes. The pods run on no node: where a test
needs its Sandbox Ready it reports the pod Ready as a kubelet would (tests/fixtures/nodeless.py).
What only a node shows (the hardened pod under gVisor and runc, a missing image, a node without
the handler, a pod that dies) is tests/e2e/test_operator_lifecycle.py."""

from __future__ import annotations

import contextlib
import time

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from sandbox_operator import naming
from tests.fixtures.nodeless import off_node, play_kubelet, serve
from tests.fixtures.operator import egress_policy_of, pinned_config

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def module_operator_config():
    """The tests on ``module_kit`` share one runc operator, its pods on no node (the others
    start their own, with a backend of theirs)."""
    return off_node(pinned_config("runc", "runc", "container"))


def test_missing_runtime_class(kit, start_operator, kubectl):
    # Missing when the operator starts: the backend is unavailable and the sandbox is refused.
    start_operator(pinned_config("ghost", "no-such-runtime-class", "container"))
    kit.scope()
    kit.sandbox("ghostly")
    kit.wait_condition("ghostly", "Admitted", reasons=("BackendUnavailable",), status="False")
    assert kit.pod("ghostly") is None


def test_runtime_class_removed_after_start_is_startup_failed(kit, start_operator):
    node = client.NodeV1Api(kit.core.api_client)
    rc_name = f"vanishing-{kit.ns[-6:]}"
    node.create_runtime_class(
        client.V1RuntimeClass(metadata=client.V1ObjectMeta(name=rc_name), handler="runc")
    )
    try:
        start_operator(pinned_config("vanishing", rc_name, "container"))
        node.delete_runtime_class(rc_name)
        kit.scope()
        kit.sandbox("orphaned")
        obj = kit.wait_condition(
            "orphaned", reasons=("StartupFailed", "BackendUnavailable"), timeout=60
        )
        assert (
            "RuntimeClass" in kit.condition(obj, "Ready")["message"]
            or "runtime" in kit.condition(obj, "Ready")["message"].lower()
        )
    finally:
        with contextlib.suppress(ApiException):
            node.delete_runtime_class(rc_name)


def test_startup_timeout(module_kit):
    kit = module_kit
    kit.scope()
    # No node can satisfy the request (off_node; and within the host's ceiling of 8 CPU, none
    # of this 2-core machine either), so the pod stays Pending.
    kit.sandbox(
        "toobig",
        resources={
            "requests": {"cpu": "8", "memory": "16Mi"},
            "limits": {"cpu": "8", "memory": "128Mi"},
        },
        lifetime={"startupTimeoutSeconds": 6, "ttlSeconds": 600, "idleTimeoutSeconds": 300},
    )
    obj = kit.wait_condition("toobig", reasons=("StartupTimeout",), timeout=60)
    assert "startupTimeoutSeconds (6)" in kit.condition(obj, "Ready")["message"]
    kit.wait_condition("toobig", "Disposed", status="True", timeout=60)
    assert kit.pod("toobig") is None


def test_deleting_the_sandbox_deletes_its_pod_and_keeps_the_namespaces_policy(module_kit):
    """The pod goes with its Sandbox; the NetworkPolicy that confined it is the namespace's (one
    per backend and egress mode, no owner) and stays for the next sandbox of its kind."""
    kit = module_kit
    kit.scope()
    kit.sandbox("short")
    serve(kit, "short", timeout=120)
    policy = egress_policy_of(kit, naming.pod_name("short"))
    assert not policy.metadata.owner_references
    kit.delete("short")
    kit.wait_gone("short", timeout=60)
    assert kit.pod("short") is None
    net = client.NetworkingV1Api(kit.core.api_client)
    nps = net.list_namespaced_network_policy(kit.ns).items
    assert [(n.metadata.name, n.metadata.uid) for n in nps] == [
        (policy.metadata.name, policy.metadata.uid)
    ]


def test_ttl_expires_and_disposes(module_kit):
    kit = module_kit
    kit.scope()
    kit.sandbox(
        "brief",
        lifetime={"startupTimeoutSeconds": 60, "ttlSeconds": 20, "idleTimeoutSeconds": 20},
    )
    play_kubelet(kit.core, kit.ns, kit.wait_pod("brief", timeout=60))
    kit.wait_condition("brief", reasons=("Ready", "Expired"), timeout=60)
    obj = kit.wait_condition("brief", reasons=("Expired",), timeout=60)
    assert "Seconds" in kit.condition(obj, "Ready")["message"]
    kit.wait_condition("brief", "Disposed", status="True", timeout=60)
    deadline = time.monotonic() + 30
    while kit.pod("brief") is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert kit.pod("brief") is None
