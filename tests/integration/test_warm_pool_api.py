"""SandboxWarmPool against a real API server: the schema and its scale subresource, and the
operator judging a pool's template like a Sandbox spec (a refused template creates nothing)."""

from __future__ import annotations

import time

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandbox_operator import labels as lbl
from sandbox_operator.contract import GROUP, SANDBOX_WARM_POOL_PLURAL, VERSION
from tests.fixtures.admission import assert_refused, fixed
from tests.fixtures.faults import runc_config
from tests.fixtures.nodeless import off_node, play_kubelet

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def module_operator_config():
    """The operator tests share one (``module_kit``); the schema tests need none."""
    return fixed()


TEMPLATE = {"kind": "shell", "image": "busybox:1.36", "resources": {"limits": {"memory": "64Mi"}}}


def pool_body(name: str, replicas: int = 0, **template: object) -> dict[str, object]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxWarmPool",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "template": {**TEMPLATE, **template}},
    }


def create_pool(kit, name: str, replicas: int = 0, **template: object) -> dict[str, object]:
    result: dict[str, object] = kit.custom.create_namespaced_custom_object(
        GROUP, VERSION, kit.ns, SANDBOX_WARM_POOL_PLURAL, pool_body(name, replicas, **template)
    )
    return result


def wait_pool(kit, name: str, predicate, timeout: float = 60):
    deadline = time.monotonic() + timeout
    obj = None
    while time.monotonic() < deadline:
        obj = kit.get(name, SANDBOX_WARM_POOL_PLURAL)
        if obj is not None and predicate(obj):
            return obj
        time.sleep(0.5)
    raise AssertionError(f"pool {name} never matched; last seen: {obj}")


def pool_pods(kit, name: str):
    return kit.pods(f"{lbl.POOL_LABEL}={name}")


@pytest.mark.parametrize(
    ("template", "needle"),
    [
        ({"egressAllow": ["pypi.org"]}, "egressAllow is only valid with egress allowlist"),
        ({"workDir": "relative/dir"}, "workDir"),
        ({"lifetime": {"ttlSeconds": 60}}, "lifetime"),
    ],
)
def test_the_schema_refuses_a_bad_template_with_the_field_named(kit, crds, template, needle):
    with pytest.raises(ApiException) as err:
        kit.custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            kit.ns,
            SANDBOX_WARM_POOL_PLURAL,
            pool_body("bad", **template),
            field_validation="Strict",
        )
    assert err.value.status == 422 or (
        err.value.status == 400 and "unknown field" in err.value.body
    )
    assert needle in err.value.body


def test_replicas_are_bounded_and_set_through_the_scale_subresource(kit, crds):
    with pytest.raises(ApiException) as err:
        create_pool(kit, "too-many", replicas=100_000)
    assert err.value.status == 422 and "spec.replicas" in err.value.body
    create_pool(kit, "scaled")
    kit.custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, kit.ns, SANDBOX_WARM_POOL_PLURAL, "scaled", {"spec": {"replicas": 3}}
    )
    obj = kit.get("scaled", SANDBOX_WARM_POOL_PLURAL)
    assert obj is not None and obj["spec"]["replicas"] == 3
    scale = kit.custom.get_namespaced_custom_object_scale(
        GROUP, VERSION, kit.ns, SANDBOX_WARM_POOL_PLURAL, "scaled"
    )
    assert scale["spec"]["replicas"] == 3


def test_a_pool_makes_idle_pods_and_reports_them_through_scale(module_kit):
    kit = module_kit
    create_pool(kit, "warm", replicas=2)
    obj = wait_pool(kit, "warm", lambda o: (o.get("status") or {}).get("replicas") == 2)
    status = obj["status"]
    assert status["backend"] == "gvisor" and len(status["shape"]) == 32
    pods = pool_pods(kit, "warm")
    assert len(pods) == 2
    for pod in pods:
        assert pod.metadata.name.startswith("sbx-wp-warm-")
        assert pod.metadata.labels[lbl.POOL_SHAPE_LABEL] == status["shape"]
        assert lbl.SANDBOX_LABEL not in pod.metadata.labels
        assert [o.kind for o in pod.metadata.owner_references] == ["SandboxWarmPool"]
        assert pod.spec.runtime_class_name == "gvisor"
    net = client.NetworkingV1Api(kit.core.api_client)
    policy = net.read_namespaced_network_policy("sbx-wp-warm", kit.ns)
    assert policy.spec.pod_selector.match_labels == {lbl.POOL_LABEL: "warm"}
    assert policy.spec.egress is None or policy.spec.egress == []
    scale = kit.custom.get_namespaced_custom_object_scale(
        GROUP, VERSION, kit.ns, SANDBOX_WARM_POOL_PLURAL, "warm"
    )
    assert scale["status"]["replicas"] == 2
    assert scale["status"]["selector"] == status["selector"]
    # Scaled to zero: the idle pods go.
    kit.custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, kit.ns, SANDBOX_WARM_POOL_PLURAL, "warm", {"spec": {"replicas": 0}}
    )
    wait_pool(kit, "warm", lambda o: (o.get("status") or {}).get("replicas") == 0)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(
        p.metadata.deletion_timestamp is None for p in pool_pods(kit, "warm")
    ):
        time.sleep(0.5)
    assert all(p.metadata.deletion_timestamp is not None for p in pool_pods(kit, "warm"))


def test_a_refused_template_creates_nothing_and_carries_the_sandboxes_reason(module_kit):
    kit = module_kit
    kit.scope()
    kit.sandbox("wants-snapshot", requires=["exec", "snapshot"])
    assert_refused(kit, "wants-snapshot", "CapabilityNotSupported")
    create_pool(kit, "refused", replicas=3, requires=["exec", "snapshot"])
    obj = wait_pool(kit, "refused", lambda o: bool((o.get("status") or {}).get("conditions")))
    ready = kit.condition(obj, "Ready")
    assert ready is not None and (ready["status"], ready["reason"]) == (
        "False",
        "CapabilityNotSupported",
    )
    time.sleep(3)
    assert pool_pods(kit, "refused") == []
    assert obj["status"].get("backend") is None and obj["status"]["replicas"] == 0


def test_a_template_the_policy_refuses_creates_nothing(kit, start_operator):
    """A template whose floor no backend reaches: refused for the reason a Sandbox of the same
    spec is, and nothing is made for it, not after a resync either."""
    start_operator(runc_config(resyncSeconds=5))
    kit.scope()
    create_pool(kit, "vm", 2, minIsolation="microvm")

    def refused(obj) -> bool:
        cond = kit.condition(obj) or {}
        return cond.get("status") == "False" and cond.get("reason") != "Filling"

    pool = wait_pool(kit, "vm", refused, timeout=60)
    # A Sandbox with the same spec is refused for the very same reason.
    kit.sandbox("vmbox", minIsolation="microvm")
    sbx = kit.wait_condition("vmbox", "Admitted", status="False", timeout=60)
    admitted = kit.condition(sbx, "Admitted")
    ready = kit.condition(pool)
    assert ready["reason"] == admitted["reason"], (ready, admitted)
    assert ready["reason"] not in ("Ready", "Filling", "TemplateInvalid", "PoolUnsupported")
    time.sleep(8)  # more than a resync: still nothing
    pool = kit.get("vm", SANDBOX_WARM_POOL_PLURAL)
    st = pool["status"]
    assert kit.condition(pool)["reason"] == admitted["reason"]
    assert st.get("backend") is None and st.get("shape") is None, st
    assert st.get("replicas", 0) == 0 and st.get("readyReplicas", 0) == 0, st
    assert pool_pods(kit, "vm") == []
    assert kit.core.list_namespaced_pod(kit.ns).items == []
    net = client.NetworkingV1Api(kit.core.api_client)
    assert net.list_namespaced_network_policy(kit.ns).items == []


def test_a_claimed_pod_s_idle_clock_starts_at_the_claim(kit, start_operator):
    """A pool pod Ready for longer than the claiming Sandbox's idleTimeoutSeconds does not make
    the Sandbox expire at once: its idle time counts from the claim. (The pool's pod is on no
    node: the test reports it Ready as a kubelet would, tests/fixtures/nodeless.py.)"""
    start_operator(off_node(runc_config(resyncSeconds=5)))
    kit.scope()
    spec = kit.sandbox_body("template")["spec"]
    fields = ("kind", "image", "workDir", "requires", "resources")  # what a Sandbox's spec shares
    create_pool(kit, "old", 1, **{f: spec[f] for f in fields})
    deadline = time.monotonic() + 60
    while not (pods := pool_pods(kit, "old")) and time.monotonic() < deadline:
        time.sleep(0.3)
    (pod,) = pods
    assert not pod.spec.node_name, pod.spec.node_name
    play_kubelet(kit.core, kit.ns, pod)

    def ready(obj) -> bool:
        st = obj.get("status") or {}
        cond = kit.condition(obj) or {}
        return (
            st.get("readyReplicas") == 1
            and st.get("replicas") == 1
            and cond.get("status") == "True"
        )

    wait_pool(kit, "old", ready, timeout=60)
    time.sleep(15)  # the idle pod has been Ready for > 10 s
    kit.sandbox(
        "brief",
        lifetime={"startupTimeoutSeconds": 60, "ttlSeconds": 600, "idleTimeoutSeconds": 10},
    )
    obj = kit.wait_condition("brief", reasons=("Ready",), status="True", timeout=60)
    ready_at = time.monotonic()
    assert obj["status"]["servedFrom"] == "SandboxWarmPool/old", obj["status"]
    assert obj["status"]["servedBy"]["kind"] == "Pod", obj["status"]
    assert obj["status"]["servedBy"]["name"] == pod.metadata.name, obj["status"]
    time.sleep(6)
    assert kit.condition(kit.get("brief"))["status"] == "True", kit.get("brief")["status"]
    obj = kit.wait_condition("brief", reasons=("Expired",), timeout=40)
    assert time.monotonic() - ready_at >= 8, kit.condition(obj)
