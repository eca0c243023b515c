"""The operator against a real API server: refusals before anything runs, per-spec routing,
scope resolution and KeyUnclean. These need no running pods (the API server and controllers
suffice), so they also pass on an API-level cluster."""

from __future__ import annotations

import time

import pytest

from sandbox_operator import naming
from tests.fixtures.admission import assert_refused, fixed, gvisor
from tests.fixtures.operator import DECLARATIONS, REPO, local_config

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def module_operator_config():
    """The tests on ``module_kit`` share one operator of this configuration (the others start
    their own, with a configuration of theirs or more than one replica)."""
    return fixed()


def test_isolation_below_floor_is_refused_and_no_pod_is_ever_created(module_kit):
    kit = module_kit
    kit.scope()
    kit.sandbox("wants-microvm", minIsolation="microvm")
    obj = assert_refused(kit, "wants-microvm", "IsolationBelowFloor")
    assert obj["status"]["effectiveFloor"] == "microvm"
    assert "microvm" in kit.condition(obj, "Ready")["message"]
    # A scope floor raises the host's, too.
    kit.scope("strict", thread_id="thread-2", minIsolation="vm")
    kit.sandbox("in-strict-scope", scope_ref="strict")
    assert_refused(kit, "in-strict-scope", "IsolationBelowFloor")
    time.sleep(3)  # a few resync periods later, still nothing
    assert kit.core.list_namespaced_pod(kit.ns).items == []
    events = kit.events("wants-microvm")
    assert any(e.reason == "IsolationBelowFloor" and e.type == "Warning" for e in events)


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"requires": ["exec", "snapshot"]}, "CapabilityNotSupported"),
        ({"requiresOsFamily": "windows"}, "OsFamilyNotSupported"),
        (
            {"filesIn": {"maxBytesPerFile": 64 * 1024 * 1024, "maxTotalBytes": 64 * 1024 * 1024}},
            "TransferLimitsNotPermitted",
        ),
        ({"egress": "allowlist", "egressAllow": ["example.com"]}, "EgressNotEnforced"),
    ],
)
def test_each_check_refuses_with_its_reason(module_kit, spec, reason):
    kit = module_kit
    kit.scope()
    kit.sandbox("refused", **spec)
    assert_refused(kit, "refused", reason)


@pytest.mark.parametrize(
    ("spec", "backend_kw", "reason"),
    [
        (
            {"isolationScope": "call", "callId": "call-1"},
            {"declarations": {**DECLARATIONS, "isolationScopes": ["conversation"]}},
            "IsolationScopeNotEnforced",
        ),
        ({}, {"runtimeClassName": "no-such-runtime-class"}, "BackendUnavailable"),
    ],
)
def test_each_backend_check_refuses_with_its_reason(kit, start_operator, spec, backend_kw, reason):
    start_operator(fixed(**backend_kw))
    kit.scope()
    kit.sandbox("refused", **spec)
    assert_refused(kit, "refused", reason)


def test_resources_above_the_host_ceiling_are_refused_before_any_backend(kit, start_operator):
    config = fixed()
    # A ceiling below the built-in default limit needs a default under it (else: no start).
    config["hostPolicy"]["resources"] = {
        "defaultLimits": {"memory": "64Mi"},
        "maxLimits": {"memory": "64Mi"},
    }
    start_operator(config)
    kit.scope()
    # The fixture's spec states limits.memory 128Mi.
    kit.sandbox("too-big")
    obj = assert_refused(kit, "too-big", "ResourcesExceedCeiling")
    message = kit.condition(obj, "Admitted")["message"]
    assert "limits.memory 128Mi > maxLimits.memory 64Mi" in message
    kit.sandbox("fits", resources={"limits": {"cpu": "500m", "memory": "64Mi"}})
    kit.wait_condition("fits", "Admitted", status="True", timeout=60)


def test_a_capability_the_host_denies_is_refused_whatever_the_backend_declares(kit, start_operator):
    """hostPolicy.deniedCapabilities (#25 item 6): the backend declares host_tools, the host
    denies it: a Sandbox requiring it is refused with CapabilityDenied; one that does not is
    admitted on the same backend."""
    config = fixed(
        declarations={**DECLARATIONS, "capabilities": ["exec", "files_in", "host_tools"]}
    )
    config["hostPolicy"]["deniedCapabilities"] = ["host_tools"]
    start_operator(config)
    kit.scope()
    kit.sandbox("tools", requires=["exec", "host_tools"])
    obj = assert_refused(kit, "tools", "CapabilityDenied")
    message = kit.condition(obj, "Admitted")["message"]
    assert "host_tools" in message and "deniedCapabilities" in message
    kit.sandbox("plain", requires=["exec"])
    kit.wait_condition("plain", "Admitted", status="True", timeout=60)


def test_a_call_scope_raised_by_the_host_needs_a_call_id(kit, start_operator):
    config = local_config(
        floor="hardened_container",
        selection="fixed",
        pinned="gvisor",
        backends=[gvisor()],
        min_isolation_scope="call",
    )
    kit.scope()
    start_operator(config)
    _call_scope_needs_a_call_id(kit, "host")


def test_a_call_scope_raised_by_the_scope_needs_a_call_id(module_kit):
    module_kit.scope(minIsolationScope="call")
    _call_scope_needs_a_call_id(module_kit, "scope")


def _call_scope_needs_a_call_id(kit, raised_by):
    """A call scope raised above the spec's by ``raised_by`` (``host`` or ``scope``)."""
    # The spec keeps the default scope (conversation): its schema then forbids a callId, so
    # the key names no call, and serving it would share one sandbox across the calls.
    kit.sandbox("shared")
    obj = assert_refused(kit, "shared", "CallIdRequired")
    assert f"required by: {raised_by}" in kit.condition(obj, "Admitted")["message"]
    # Asking per call, with the call's id, is served.
    kit.sandbox("per-call", isolationScope="call", callId="call-1")
    obj = kit.wait_condition("per-call", "Admitted", status="True", timeout=60)
    assert obj["status"]["isolationScope"] == "call"


def test_per_spec_selection_picks_the_first_backend_that_passes(kit, start_operator):
    no_code = {**DECLARATIONS, "capabilities": ["exec", "files_in"]}
    config = local_config(
        floor="container",
        backends=[
            gvisor(declarations=no_code),
            {
                "name": "runc",
                "type": "runtimeClass",
                "runtimeClassName": "runc",
                "isolation": "container",
                "declarations": DECLARATIONS,
            },
        ],
    )
    start_operator(config)
    kit.scope()
    kit.sandbox("needs-code", requires=["exec", "run_code"])
    kit.sandbox("plain")
    # host_tools: the gvisor entry here declares only exec + files_in, runc declares it.
    kit.sandbox("needs-tools", requires=["exec", "files_in", "files_out", "host_tools"])
    a = kit.wait_condition("needs-code", "Admitted", status="True")
    b = kit.wait_condition("plain", "Admitted", status="True")
    c = kit.wait_condition("needs-tools", "Admitted", status="True")
    assert a["status"]["backend"] == "runc" and a["status"]["isolation"] == "container"
    assert b["status"]["backend"] == "gvisor"
    assert c["status"]["backend"] == "runc"
    assert kit.wait_pod("needs-code").spec.runtime_class_name == "runc"
    assert kit.wait_pod("plain").spec.runtime_class_name == "gvisor"
    # None passes: every backend is named with its reason.
    kit.sandbox("nothing", requires=["snapshot"])
    obj = kit.wait_condition("nothing", "Admitted", reasons=("NoBackendCanServe",))
    msg = kit.condition(obj, "Admitted")["message"]
    assert "gvisor" in msg and "runc" in msg


def test_host_tools_is_admitted_on_gvisor(module_kit):
    kit = module_kit
    kit.scope()
    kit.sandbox("tools", requires=["exec", "files_in", "files_out", "host_tools"])
    obj = kit.wait_condition("tools", "Admitted", status="True", timeout=60)
    assert obj["status"]["backend"] == "gvisor"
    assert obj["status"]["isolation"] == "hardened_container"


def test_missing_scope_waits_and_proceeds_when_it_appears(module_kit):
    kit = module_kit
    kit.sandbox("early", scope_ref="later")
    kit.wait_condition("early", "Admitted", reasons=("ScopeNotFound",), status="False")
    assert kit.pods() == []
    kit.scope("later")
    obj = kit.wait_condition("early", "Admitted", status="True", timeout=30)
    labels = obj["metadata"]["labels"]
    assert labels["sandbox-operator.dev/sandbox"] == "early"
    assert obj["metadata"]["annotations"]["sandbox-operator.dev/scope"] == "tenant-a"
    pod = kit.wait_pod("early")
    assert pod.metadata.owner_references[0].name == "early"


def test_failed_disposal_reports_disposal_failed_and_refuses_the_same_key(kit, start_operator):
    runc = gvisor(name="runc", runtimeClassName="runc", isolation="container")
    config = local_config(floor="container", selection="fixed", pinned="runc", backends=[runc])
    config["operator"]["disposeTimeoutSeconds"] = 4
    start_operator(config)
    kit.scope()
    kit.sandbox("first", agent_dir="agents/same")
    kit.wait_condition("first", "Admitted", status="True")
    kit.wait_pod("first")
    # A finalizer nobody removes: the pod cannot go away, so disposal cannot land.
    stuck = "sandbox-operator.dev/test-stuck"
    kit.core.patch_namespaced_pod(
        naming.pod_name("first"), kit.ns, {"metadata": {"finalizers": [stuck]}}
    )
    try:
        kit.delete("first")
        obj = kit.wait_condition("first", "Disposed", reasons=("DisposalFailed",), timeout=90)
        msg = kit.condition(obj, "Disposed")["message"]
        assert "timeout" in msg
        assert obj["metadata"]["finalizers"]  # kept: the Sandbox is not let go
        # Same key, another name: refused until the earlier disposal lands.
        kit.sandbox("second", agent_dir="agents/same")
        kit.wait_condition("second", "Admitted", reasons=("KeyUnclean",), status="False")
        assert kit.pod("second") is None
        # Same key, another kind: another sandbox (maf-sandbox's identity is (key, kind)), which
        # the earlier one's failed disposal does not hold back.
        kit.sandbox("other-kind", agent_dir="agents/same", kind="python")
        kit.wait_condition("other-kind", "Admitted", status="True")
        kit.wait_pod("other-kind")
    finally:
        kit.core.patch_namespaced_pod(
            naming.pod_name("first"), kit.ns, {"metadata": {"finalizers": None}}
        )
    kit.wait_gone("first", timeout=90)
    kit.wait_condition("second", "Admitted", status="True", timeout=60)
    kit.wait_pod("second")


def test_two_replicas_acting_at_once_never_double_create(kit, start_operator):
    """Even without peering (both replicas act), deterministic names and create-or-adopt give
    exactly one pod per Sandbox and one consistent status."""
    runc = gvisor(name="runc", runtimeClassName="runc", isolation="container")
    config = local_config(floor="container", selection="fixed", pinned="runc", backends=[runc])
    start_operator(config)
    start_operator(config)
    kit.scope()
    for i in range(10):
        kit.sandbox(f"r{i}")
    for i in range(10):
        kit.wait_condition(f"r{i}", "Admitted", status="True", timeout=90)
    time.sleep(4)
    pods = kit.core.list_namespaced_pod(kit.ns).items
    assert sorted(p.metadata.name for p in pods) == sorted(
        naming.pod_name(f"r{i}") for i in range(10)
    )
    for p in pods:
        assert len(p.metadata.owner_references) == 1


def test_health_endpoint_reports_backend_availability(kit, start_operator):
    import json
    import urllib.request

    config = fixed(runtimeClassName="no-such-runtime-class")
    op = start_operator(config)
    with urllib.request.urlopen(f"http://127.0.0.1:{op.port}/healthz", timeout=5) as resp:
        assert resp.status == 200
        body = json.loads(resp.read())
    assert "does not exist" in body["backends"]["gvisor"]


def test_kopf_peering_lets_only_the_highest_priority_replica_act(kit, start_operator, kubectl):
    """With a peering object, the lower-priority replica stands by, and takes over when the
    higher one stops."""
    crd = kubectl("get", "crd", "kopfpeerings.kopf.dev", check=False)
    if crd.returncode != 0:
        kubectl("apply", "-f", str(REPO / "examples/kopf-peering.yaml"), check=False)
        kubectl("wait", "--for=condition=Established", "crd/kopfpeerings.kopf.dev")
    kubectl(
        "apply",
        "-n",
        kit.ns,
        "-f",
        "-",
        input="apiVersion: kopf.dev/v1\nkind: KopfPeering\nmetadata:\n  name: sandbox-operator\n",
    )
    runc = gvisor(name="runc", runtimeClassName="runc", isolation="container")
    config = local_config(floor="container", selection="fixed", pinned="runc", backends=[runc])
    low = start_operator(config, args=("--peering", "sandbox-operator", "--priority", "100"))
    high = start_operator(config, args=("--peering", "sandbox-operator", "--priority", "200"))
    deadline = time.monotonic() + 30
    while "Pausing operations" not in low.log() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "Pausing operations" in low.log(), low.log()
    kit.scope()
    kit.sandbox("while-high")
    kit.wait_condition("while-high", "Admitted", status="True", timeout=60)
    high.stop()  # a clean stop withdraws it from the peering at once
    kit.sandbox("after-high")
    kit.wait_condition("after-high", "Admitted", status="True", timeout=90)
    assert "Resuming operations" in low.log()
    kit.wait_pod("after-high")
    assert sorted(p.metadata.name for p in kit.core.list_namespaced_pod(kit.ns).items) == sorted(
        naming.pod_name(n) for n in ("after-high", "while-high")
    )


def test_garbage_in_kopf_annotations_neither_stalls_nor_wedges_a_sandbox(kit, start_operator):
    """kopf's bookkeeping annotations are writable by whoever may annotate a Sandbox (the
    agent's role may). The operator keeps none and reads none: garbage there changes nothing,
    and such a Sandbox is admitted and deleted at once (no waiting for a resync)."""
    start_operator(local_config(floor="container", operator={"resyncSeconds": 3600}))
    kit.scope()
    body = kit.sandbox_body("garbled")
    body["metadata"]["annotations"] = {
        "kopf.zalando.org/last-handled-configuration": "{not json",
        "sandbox-operator.dev/last-handled-configuration": "{not json",
        "sandbox-operator.dev/sandbox_changed": "garbage",
    }
    kit.custom.create_namespaced_custom_object(
        "sandbox-operator.dev", "v1alpha1", kit.ns, "sandboxes", body
    )
    kit.wait_condition("garbled", "Admitted", status="True", timeout=30)
    started = time.monotonic()
    kit.delete("garbled")
    kit.wait_gone("garbled", timeout=30)
    assert time.monotonic() - started < 30
