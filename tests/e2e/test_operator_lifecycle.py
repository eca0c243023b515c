"""The operator end to end on a real node: pods run under gVisor and runc, become Ready, and fail
with distinct reasons only a node gives (a missing image, no handler for the RuntimeClass, a pod
that dies). What needs no pod to run is tests/integration/test_operator_lifecycle.py."""

from __future__ import annotations

import contextlib

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from sandbox_operator import naming
from tests.fixtures.operator import egress_policy_of, pinned_config

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def module_operator_config():
    """The tests on ``module_kit`` share one runc operator (the others start their own, with a
    backend of theirs)."""
    return pinned_config("runc", "runc", "container")


def test_apply_becomes_ready_with_a_hardened_pod_under_gvisor(kit, start_operator, kubectl):
    start_operator(pinned_config("gvisor", "gvisor", "hardened_container"))
    _apply_becomes_ready_with_a_hardened_pod(kit, kubectl, "gvisor", "hardened_container")


def test_apply_becomes_ready_with_a_hardened_pod_under_runc(module_kit, kubectl):
    _apply_becomes_ready_with_a_hardened_pod(module_kit, kubectl, "runc", "container")


def _apply_becomes_ready_with_a_hardened_pod(kit, kubectl, runtime_class, isolation):
    kit.scope()
    kit.sandbox("box")
    # `kubectl wait` works on the Ready condition.
    out = kubectl(
        "wait",
        "-n",
        kit.ns,
        "--for=condition=Ready",
        "sandboxes.sandbox-operator.dev/box",
        "--timeout=120s",
        check=False,
    )
    assert out.returncode == 0, out.stderr
    obj = kit.get("box")
    st = obj["status"]
    assert st["backend"] == runtime_class and st["isolation"] == isolation
    # pods are always named sbx-...: a hand-named Sandbox's pod gets a derived name
    assert st["servedBy"] == {"kind": "Pod", "name": naming.pod_name("box"), "namespace": kit.ns}
    assert st["servedBy"]["name"].startswith("sbx-box-")
    assert kit.condition(obj, "Admitted")["status"] == "True"
    pod = kit.pod("box")
    spec = pod.spec
    assert spec.runtime_class_name == runtime_class
    assert spec.automount_service_account_token is False
    assert spec.enable_service_links is False
    assert not spec.host_network and not spec.host_pid and not spec.host_ipc
    assert spec.security_context.run_as_non_root is True
    assert spec.security_context.seccomp_profile.type == "RuntimeDefault"
    (c,) = spec.containers
    sc = c.security_context
    assert sc.allow_privilege_escalation is False
    assert sc.capabilities.drop == ["ALL"]
    assert sc.seccomp_profile.type == "RuntimeDefault"
    assert sc.run_as_user == 65532
    assert c.working_dir == "/workspace"
    vols = {v.name: v for v in spec.volumes}
    work = next(m for m in c.volume_mounts if m.mount_path == "/workspace")
    assert vols[work.name].empty_dir is not None
    assert all(v.host_path is None for v in spec.volumes)
    assert not any(v.projected for v in spec.volumes)  # no service-account token volume
    owner = pod.metadata.owner_references[0]
    assert owner.kind == "Sandbox" and owner.uid == obj["metadata"]["uid"]
    # The workload runs through exec, unprivileged, and can write its work dir.
    out = kubectl(
        "exec",
        "-n",
        kit.ns,
        naming.pod_name("box"),
        "--",
        "/bin/sh",
        "-c",
        "id -u; touch /workspace/f && echo ok",
    )
    assert out.stdout.split() == ["65532", "ok"]
    np = egress_policy_of(kit, naming.pod_name("box"))
    assert np.spec.policy_types == ["Ingress", "Egress"] and not np.spec.egress
    # printer columns
    table = kubectl("get", "sbx", "-n", kit.ns).stdout
    assert "Ready" in table and runtime_class in table


def test_missing_image_is_startup_failed(kit, start_operator):
    start_operator(pinned_config("runc", "runc", "container", pod={"imagePullPolicy": "Never"}))
    kit.scope()
    kit.sandbox("noimage", image="sandbox-operator.dev/does-not-exist:1")
    obj = kit.wait_condition("noimage", reasons=("StartupFailed",), timeout=120)
    assert "ErrImageNeverPull" in kit.condition(obj, "Ready")["message"]
    kit.wait_condition("noimage", "Disposed", reasons=("Disposed",), status="True", timeout=60)
    assert kit.pod("noimage") is None


def test_runtime_class_without_a_handler_on_the_node_is_startup_failed(kit, start_operator):
    """The RuntimeClass exists, so the backend is available and the pod is created, but the
    node's containerd has no such handler: the kubelet retries forever, and the operator reads
    its FailedCreatePodSandBox events to end the sandbox as StartupFailed, saying why, well
    before the startup timeout."""
    node = client.NodeV1Api(kit.core.api_client)
    rc_name = f"no-handler-{kit.ns[-6:]}"
    node.create_runtime_class(
        client.V1RuntimeClass(metadata=client.V1ObjectMeta(name=rc_name), handler="nohandler")
    )
    try:
        start_operator(pinned_config("nohandler", rc_name, "container"))
        kit.scope()
        kit.sandbox(
            "handlerless",
            lifetime={"startupTimeoutSeconds": 300, "ttlSeconds": 600, "idleTimeoutSeconds": 300},
        )
        obj = kit.wait_condition("handlerless", reasons=("StartupFailed",), timeout=90)
        message = kit.condition(obj, "Ready")["message"]
        assert "RuntimeHandlerMissing" in message or "no handler 'nohandler'" in message, message
        assert rc_name in message, message
        kit.wait_condition("handlerless", "Disposed", status="True", timeout=60)
    finally:
        with contextlib.suppress(ApiException):
            node.delete_runtime_class(rc_name)


def test_pod_that_dies_after_ready_is_failed(module_kit, kubectl):
    kit = module_kit
    kit.scope()
    kit.sandbox("mortal")
    kit.wait_condition("mortal", reasons=("Ready",), status="True", timeout=120)
    kubectl(
        "exec",
        "-n",
        kit.ns,
        naming.pod_name("mortal"),
        "--",
        "/bin/sh",
        "-c",
        "kill 1",
        check=False,
    )
    obj = kit.wait_condition("mortal", reasons=("Failed",), timeout=60)
    assert kit.condition(obj, "Ready")["status"] == "False"
