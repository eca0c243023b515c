"""Warm pools without a cluster: the template judged like a Sandbox spec, the pool's plan (fill,
bound, replace, scale down), the claim patch, and the claim itself over fake collaborators."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sandbox_operator import labels as lbl
from sandbox_operator.backends.base import (
    EnsureRequest,
    Observation,
    ObservedPhase,
    PoolRef,
    SandboxRef,
    ServedBy,
)
from sandbox_operator.backends.confinement import CONFINEMENT, confinement_digest
from sandbox_operator.backends.egress_proxy import PROXY_ADDRESS_ANNOTATION
from sandbox_operator.backends.warmpool import (
    POOL_POD_PREFIX,
    build_pool_network_policy,
    build_pool_pod,
    claim_patch,
    is_idle,
    pod_origin,
)
from sandbox_operator.config import parse_config, profiles
from sandbox_operator.contract import (
    IsolationScope,
    SandboxKey,
    SandboxRefusal,
    SandboxResourceSpec,
    SandboxSpec,
    WarmPoolTemplate,
)
from sandbox_operator.policy import resolve_spec, select_backend
from sandbox_operator.reconcile import compute
from sandbox_operator.reconcile import pool as pools
from sandbox_operator.reconcile.runtime import Runtime
from sandbox_operator.views import PodView, SandboxView, SandboxWarmPoolView

NS = "ns"
TEMPLATE = {"kind": "shell", "image": "busybox"}

CONFIG, _ = parse_config(
    {
        "hostPolicy": {"minIsolation": "container", "selection": "perSpec"},
        "backends": [
            {
                "name": "gvisor",
                "type": "runtimeClass",
                "runtimeClassName": "gvisor",
                "isolation": "hardened_container",
                "declarations": {"egressModes": ["closed", "allowlist"]},
                "egressProxy": {"url": "http://proxy:3128", "port": 3128},
            },
            {
                # Stands for a backend that cannot keep warm pods (e.g. a remote one): only
                # "gvisor" is passed as a pool backend below.
                "name": "remote",
                "type": "runtimeClass",
                "runtimeClassName": "kata",
                "isolation": "microvm",
                "declarations": {"egressModes": ["closed"]},
            },
        ],
    }
)


def judge(template: dict[str, Any], pool_backends: frozenset[str] = frozenset({"gvisor"})):
    return pools.judge_template(
        {"template": template, "replicas": 3},
        host_policy=CONFIG.host_policy,
        backend_profiles=profiles(CONFIG),
        pool_backends=pool_backends,
    )


def pool_obj(replicas: int = 3, max_creating: int = 5) -> SandboxWarmPoolView:
    return SandboxWarmPoolView(
        {
            "metadata": {"name": "p", "namespace": NS, "uid": "pool-uid", "generation": 2},
            "spec": {"template": TEMPLATE, "replicas": replicas, "maxCreating": max_creating},
            "status": {},
        }
    )


_names = iter(range(10_000))


def pod(
    shape: str,
    *,
    ready: bool = True,
    phase: str = "Running",
    claimed_by: str | None = None,
    created: str = "2099-01-01T00:00:00Z",
    waiting: str | None = None,
    pool_uid: str = "pool-uid",
) -> PodView:
    labels = {lbl.POOL_LABEL: "p", lbl.POOL_SHAPE_LABEL: shape, lbl.BACKEND_LABEL: "gvisor"}
    owners = [{"kind": "SandboxWarmPool", "name": "p", "uid": pool_uid}]
    if claimed_by:
        labels[lbl.SANDBOX_LABEL] = claimed_by
        owners = [{"kind": "Sandbox", "name": claimed_by, "uid": f"uid-{claimed_by}"}]
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if waiting:
        status["containerStatuses"] = [{"state": {"waiting": {"reason": waiting}}}]
    return PodView(
        {
            "metadata": {
                "name": f"{POOL_POD_PREFIX}p-{next(_names)}",
                "namespace": NS,
                "uid": "pod-uid",
                "resourceVersion": "7",
                "creationTimestamp": created,
                "labels": labels,
                "ownerReferences": owners,
            },
            "status": status,
        }
    )


# ---- the template ---------------------------------------------------------------------------


SHORT_IDLE = {"idleTimeoutSeconds": 30}


def test_the_shape_is_the_backend_and_the_resolved_pod_shaping_fields() -> None:
    base = resolve_spec(CONFIG.host_policy, SandboxSpec(kind="shell", image="busybox"))
    same = resolve_spec(
        CONFIG.host_policy,
        # Fields that do not shape the pod do not change the shape.
        SandboxSpec(
            kind="shell", image="busybox", lifetime={"ttlSeconds": 60, "idleTimeoutSeconds": 30}
        ),
    )
    assert pools.shape_of("gvisor", base) == pools.shape_of("gvisor", same)
    assert pools.shape_of("gvisor", base) != pools.shape_of("runc", base)
    for change in (
        {"image": "alpine"},
        {"work_dir": "/w"},
        {"resources": {"limits": {"memory": "1Gi"}}},
        {"kind": "python"},
        {"egress": "unrestricted"},
    ):
        other = resolve_spec(
            CONFIG.host_policy, SandboxSpec(**{"kind": "shell", "image": "busybox", **change})
        )
        assert pools.shape_of("gvisor", other) != pools.shape_of("gvisor", base), change


def test_a_new_pod_template_version_changes_every_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    # Idle pods an older operator made (e.g. closed pods with cluster DNS) must not be claimed.
    spec = resolve_spec(CONFIG.host_policy, SandboxSpec(kind="shell", image="busybox"))
    before = pools.shape_of("gvisor", spec)
    monkeypatch.setattr(pools, "POD_TEMPLATE_VERSION", pools.POD_TEMPLATE_VERSION + 1)
    assert pools.shape_of("gvisor", spec) != before


def test_a_template_is_admitted_like_a_sandbox_with_that_spec() -> None:
    j = judge(TEMPLATE)
    assert (j.backend, j.reason) == ("gvisor", "Ready")
    assert j.spec is not None and j.shape == pools.shape_of("gvisor", j.spec)
    # The host's default resources are in the spec the pods are made of.
    assert j.spec.resources.limits.memory is not None


def test_a_refused_template_carries_the_refusal_a_sandbox_gets() -> None:
    template = {**TEMPLATE, "requires": ["exec", "snapshot"]}
    with pytest.raises(SandboxRefusal) as refusal:
        select_backend(CONFIG.host_policy, profiles(CONFIG), SandboxSpec(**template))
    j = judge(template)
    assert j.reason == refusal.value.reason.value
    assert j.shape is None and j.backend is None


def test_a_backend_that_cannot_keep_pods_is_unsupported() -> None:
    j = judge({**TEMPLATE, "minIsolation": "microvm"}, frozenset({"gvisor"}))
    assert (j.backend, j.reason, j.shape) == ("remote", "PoolUnsupported", None)
    # An allowlist template is served like any other (its pods go through the egress proxy);
    # its allowlist is part of the shape.
    allow = judge({**TEMPLATE, "egress": "allowlist", "egressAllow": ["pypi.org"]})
    other = judge({**TEMPLATE, "egress": "allowlist", "egressAllow": ["example.com"]})
    assert allow.reason == "Ready" and allow.shape not in (None, other.shape)


def test_an_invalid_template_names_the_field() -> None:
    j = judge({**TEMPLATE, "workDir": "/w\x07"})
    assert j.reason == "TemplateInvalid" and "workDir" in j.message
    assert judge({**TEMPLATE, "lifetime": {}}).reason == "TemplateInvalid"


def test_the_template_holds_the_sandbox_specs_own_field_definitions() -> None:
    for name, info in WarmPoolTemplate.model_fields.items():
        assert info.description == SandboxSpec.model_fields[name].description, name


# ---- the pool's plan ------------------------------------------------------------------------


def test_an_empty_pool_fills_bounded_by_max_creating() -> None:
    j = judge(TEMPLATE)
    plan = pools.plan_pool(pool_obj(replicas=8, max_creating=3), j, [])
    assert plan.create == 3 and plan.delete == []
    assert plan.condition[:2] == (False, "Filling")
    # Three already starting: nothing more until one is Ready.
    starting = [pod(str(j.shape), ready=False, phase="Pending") for _ in range(3)]
    assert pools.plan_pool(pool_obj(replicas=8, max_creating=3), j, starting).create == 0


def test_a_full_pool_is_ready_and_counts_its_claimed_pods() -> None:
    j = judge(TEMPLATE)
    pods = [pod(str(j.shape)) for _ in range(3)] + [pod(str(j.shape), claimed_by="box")]
    plan = pools.plan_pool(pool_obj(replicas=3), j, pods)
    assert plan.create == 0 and plan.delete == []
    assert plan.condition[:2] == (True, "Ready")
    assert plan.status["replicas"] == 3 and plan.status["readyReplicas"] == 3
    assert plan.status["claimed"] == 1 and plan.status["shape"] == j.shape
    assert plan.status["selector"] == (
        "app.kubernetes.io/managed-by=sandbox-operator,sandbox-operator.dev/pool=p"
    )


def test_scaling_down_deletes_starting_pods_first_then_the_newest() -> None:
    j = judge(TEMPLATE)
    old = pod(str(j.shape), created="2099-01-01T00:00:00Z")
    new = pod(str(j.shape), created="2099-01-01T00:05:00Z")
    starting = pod(str(j.shape), ready=False, phase="Pending")
    plan = pools.plan_pool(pool_obj(replicas=1), j, [old, new, starting])
    assert plan.delete == [starting, new]
    assert plan.status["replicas"] == 1 and plan.status["readyReplicas"] == 1


def test_pods_of_another_shape_and_failed_pods_are_replaced() -> None:
    j = judge(TEMPLATE)
    stale = pod("0" * 32)
    failed = pod(str(j.shape), phase="Failed", ready=False)
    good = pod(str(j.shape))
    plan = pools.plan_pool(pool_obj(replicas=2), j, [stale, failed, good])
    assert stale in plan.delete and failed in plan.delete and good not in plan.delete
    assert plan.create == 1


def test_a_refused_template_deletes_idle_pods_and_leaves_claimed_ones() -> None:
    j = judge({**TEMPLATE, "requires": ["exec", "snapshot"]})
    idle = pod("a" * 32)
    claimed = pod("a" * 32, claimed_by="box")
    plan = pools.plan_pool(pool_obj(), j, [idle, claimed])
    assert plan.delete == [idle] and plan.create == 0
    assert plan.condition == (False, j.reason, j.message)


def test_pods_that_cannot_start_are_reported_not_churned() -> None:
    j = judge(TEMPLATE)
    stuck = pod(str(j.shape), ready=False, phase="Pending", waiting="ImagePullBackOff")
    plan = pools.plan_pool(pool_obj(replicas=1), j, [stuck])
    assert plan.delete == [] and plan.create == 0
    assert "ImagePullBackOff" in plan.condition[2]


def test_the_origin_is_read_off_the_pod() -> None:
    p = pod("s" * 32, claimed_by="box")
    assert pod_origin(p) == "SandboxWarmPool/p"  # the pool label, when no annotation
    p["metadata"]["annotations"] = {lbl.POOL_NAME_ANNOTATION: "a-long.pool.name"}
    assert pod_origin(p) == "SandboxWarmPool/a-long.pool.name"
    del p["metadata"]["labels"][lbl.POOL_LABEL]
    assert pod_origin(p) == "cold"


def test_idle_means_owned_by_the_pool_unclaimed_and_not_deleting() -> None:
    p = pod("s" * 32)
    assert is_idle(p) and is_idle(p, "pool-uid") and not is_idle(p, "other-pool")
    assert not is_idle(pod("s" * 32, claimed_by="box"))
    p["metadata"]["deletionTimestamp"] = "2099-01-01T00:00:00Z"
    assert not is_idle(p)


# ---- manifests and the claim patch ----------------------------------------------------------


def request(name: str = "box", spec: SandboxSpec | None = None) -> EnsureRequest:
    key = SandboxKey(scope="s", thread_id="t", agent_dir="agents/a", call_id="")
    spec = spec or SandboxSpec(**TEMPLATE)
    return EnsureRequest(
        sandbox=SandboxRef(NS, name, f"uid-{name}"),
        key=key,
        spec=resolve_spec(CONFIG.host_policy, spec),
        isolation_scope=IsolationScope.CONVERSATION,
        labels=lbl.object_labels(key, name, "gvisor", kind=spec.kind),
        annotations=lbl.key_annotations(key),
    )


def test_a_pool_pod_is_a_hardened_sandbox_pod_owned_by_the_pool() -> None:
    backend = CONFIG.backends[0]
    ref = PoolRef(NS, "p", "pool-uid")
    manifest = build_pool_pod(ref, request().spec, backend, "s" * 32)  # type: ignore[arg-type]
    meta = manifest["metadata"]
    assert meta["generateName"].startswith(POOL_POD_PREFIX) and "name" not in meta
    assert meta["ownerReferences"][0]["kind"] == "SandboxWarmPool"
    assert meta["labels"][lbl.POOL_SHAPE_LABEL] == "s" * 32
    assert lbl.SANDBOX_LABEL not in meta["labels"] and lbl.KEY_LABEL not in meta["labels"]
    container = manifest["spec"]["containers"][0]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert manifest["spec"]["automountServiceAccountToken"] is False
    assert manifest["spec"]["runtimeClassName"] == "gvisor"
    np = build_pool_network_policy(ref, "gvisor")
    assert np["spec"]["podSelector"] == {"matchLabels": {lbl.POOL_LABEL: "p"}}
    assert np["spec"]["egress"] == [] and np["spec"]["ingress"] == []


def test_the_claim_patch_is_conditional_and_hands_the_pod_to_the_sandbox() -> None:
    idle = pod("s" * 32)
    now = datetime(2099, 1, 1, tzinfo=UTC)
    patch = claim_patch(idle, request(), now)["metadata"]
    assert patch["resourceVersion"] == "7"
    assert patch["ownerReferences"] == [
        {
            "apiVersion": "sandbox-operator.dev/v1alpha1",
            "kind": "Sandbox",
            "name": "box",
            "uid": "uid-box",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert patch["labels"][lbl.SANDBOX_LABEL] == "box" and lbl.KEY_LABEL in patch["labels"]
    assert patch["annotations"][lbl.CLAIMED_AT_ANNOTATION] == "2099-01-01T00:00:00Z"


# ---- the claim --------------------------------------------------------------------------------


class FakeWarmPods:
    def __init__(self, rt: Runtime, lose: int = 0) -> None:
        self.rt = rt
        self.lose = lose  # the first `lose` claims lose a race
        self.claims: list[str] = []
        self.conflicts = 0

    async def claim(self, pod: dict[str, Any], req: EnsureRequest) -> ServedBy | None:
        name = pod["metadata"]["name"]
        self.claims.append(name)
        await asyncio.sleep(0)  # the request is in flight: other passes run meanwhile
        if self.lose > 0:
            self.lose -= 1
            return None
        held = self.rt.views.pods.get(NS, name)
        if (
            held is None
            or held["metadata"]["resourceVersion"] != pod["metadata"]["resourceVersion"]
        ):
            self.conflicts += 1  # the precondition fails: 409
            return None
        # As the API server applies the merge patch: maps merge, lists are replaced.
        patch = claim_patch(pod, req)["metadata"]
        meta = dict(pod["metadata"])
        for k in ("labels", "annotations"):
            meta[k] = {**(meta.get(k) or {}), **patch[k]}
        meta["ownerReferences"] = patch["ownerReferences"]
        meta["resourceVersion"] = "8"
        claimed = {**pod, "metadata": meta}
        self.rt.views.pods.upsert(claimed)
        return ServedBy("Pod", name, NS)


class FakePoolDriver:
    name = "gvisor"

    def __init__(self, rt: Runtime, lose: int = 0) -> None:
        self.warm = FakeWarmPods(rt, lose)
        self.network_policies: list[str] = []

    def warm_pool_pods(self) -> FakeWarmPods:
        return self.warm

    async def ensure_network_policy(self, req: EnsureRequest) -> None:
        await asyncio.sleep(0)
        self.network_policies.append(req.sandbox.name)

    def pool_pod_current(self, pod: dict[str, Any]) -> bool:
        return pod["metadata"].get("annotations", {}).get(PROXY_ADDRESS_ANNOTATION) != "stale"

    def pool_pod_serves(self, pod: dict[str, Any], spec: Any) -> bool:
        """Current, and confined as the pods this file makes (no spec): the digest the views
        keep. The driver's own check, against the pod it would make, is in
        test_confinement.py."""
        made = confinement_digest({})
        return self.pool_pod_current(pod) and (pod.get("spec") or {}).get(CONFINEMENT) == made


def claim_world(lose: int = 0) -> tuple[Runtime, FakePoolDriver, str]:
    rt = Runtime(config=CONFIG, kube=None, drivers={})  # type: ignore[arg-type]
    driver = FakePoolDriver(rt, lose)
    rt.drivers["gvisor"] = driver  # type: ignore[assignment]
    shape = pools.shape_of("gvisor", request().spec)
    rt.views.pools.upsert({**pool_obj(), "status": {"shape": shape}})
    return rt, driver, shape


async def test_a_pod_the_live_pool_did_not_make_is_never_claimed() -> None:
    """#28 item 1: a pod with the pool's labels and an owner reference of kind SandboxWarmPool
    is claimed only when that reference is the live pool's uid and the backend finds it confined
    as it makes the pool's pods."""
    rt, driver, shape = claim_world()
    stranger = pod(shape, pool_uid="some-other-uid")
    forged = PodView({**pod(shape), "spec": {"runtimeClassName": "runc"}})
    for p in (stranger, forged):
        rt.views.pods.upsert(p)
    claim = await pools.claim_warm_pod(rt, request(), "gvisor")
    assert claim.served_by is None and claim.exhausted == ("p",)
    assert driver.warm.claims == []
    genuine = pod(shape)
    rt.views.pods.upsert(genuine)
    claim = await pools.claim_warm_pod(rt, request(), "gvisor")
    assert claim.served_by is not None and claim.served_by.name == genuine["metadata"]["name"]


async def test_a_claim_takes_an_idle_ready_pod_of_the_shape_after_the_network_policy() -> None:
    rt, driver, shape = claim_world()
    for p in (pod(shape, ready=False), pod("0" * 32), pod(shape, claimed_by="other")):
        rt.views.pods.upsert(p)
    good = pod(shape)
    rt.views.pods.upsert(good)
    claim = await pools.claim_warm_pod(rt, request(), "gvisor")
    assert claim.served_by is not None and claim.served_by.name == good["metadata"]["name"]
    assert claim.pool == "p"
    claimed = rt.views.pods.get(NS, good["metadata"]["name"])
    assert claimed is not None and pod_origin(claimed) == "SandboxWarmPool/p"
    assert driver.warm.claims == [good["metadata"]["name"]]
    assert driver.network_policies == ["box"]
    # The claimed pod is no longer idle in the views: the next claim finds nothing.
    again = await pools.claim_warm_pod(rt, request("box2"), "gvisor")
    assert again.served_by is None and again.exhausted == ("p",)


async def test_a_claim_that_loses_a_race_tries_another_pod() -> None:
    rt, driver, shape = claim_world(lose=1)
    for _ in range(2):
        rt.views.pods.upsert(pod(shape))
    claim = await pools.claim_warm_pod(rt, request(), "gvisor")
    assert claim.served_by is not None and len(driver.warm.claims) == 2
    assert claim.served_by.name == driver.warm.claims[1]


async def test_concurrent_claims_in_one_process_never_race_for_a_pod() -> None:
    rt, driver, shape = claim_world()
    for _ in range(6):
        rt.views.pods.upsert(pod(shape))
    claims = await asyncio.gather(
        *(pools.claim_warm_pod(rt, request(f"box{i}"), "gvisor") for i in range(8))
    )
    served = [c.served_by.name for c in claims if c.served_by is not None]
    assert len(served) == 6 and len(set(served)) == 6
    assert driver.warm.conflicts == 0 and len(driver.warm.claims) == 6
    assert sum(1 for c in claims if c.exhausted == ("p",)) == 2
    assert rt.claiming == set()


async def test_no_candidate_costs_no_call_and_reports_no_pool_when_none_matches() -> None:
    rt, driver, _shape = claim_world()
    rt.views.pools.remove(NS, "p")
    claim = await pools.claim_warm_pod(rt, request(), "gvisor")
    assert claim == pools.Claim()
    assert driver.network_policies == [] and driver.warm.claims == []


async def test_other_backends_and_stale_pods_are_never_claimed() -> None:
    rt, driver, shape = claim_world()
    stale = pod(shape)
    stale["metadata"]["annotations"] = {PROXY_ADDRESS_ANNOTATION: "stale"}  # the proxy moved
    rt.views.pods.upsert(stale)
    assert (await pools.claim_warm_pod(rt, request(), "runc")).served_by is None
    assert (await pools.claim_warm_pod(rt, request(), "gvisor")).served_by is None
    assert driver.warm.claims == []
    # The pool replaces a stale idle pod like one of another shape.
    plan = pools.plan_pool(pool_obj(replicas=1), judge(TEMPLATE), [stale], driver.pool_pod_current)
    assert plan.delete == [stale] and plan.create == 1


# ---- a pod older than its Sandbox -------------------------------------------------------------


def test_a_pod_ready_before_the_admission_starts_the_idle_clock_at_the_admission() -> None:
    now = datetime(2099, 1, 1, 12, tzinfo=UTC)
    spec = {
        "scopeRef": "conv",
        "agentDir": "a",
        **TEMPLATE,
        "lifetime": {"ttlSeconds": 3600, "idleTimeoutSeconds": 60},
    }
    obj = {
        "metadata": {"name": "box", "namespace": NS, "uid": "u", "generation": 1},
        "spec": spec,
        "status": {},
    }
    parsed = SandboxResourceSpec.model_validate(spec)
    admission = compute.Admission(True, "Admitted", "admitted", "gvisor", key=None)
    # The pool's pod has been Ready for an hour: the Sandbox, admitted now, is Ready, not
    # Expired, and its idle deadline is a full idleTimeoutSeconds away.
    obs = Observation(
        ObservedPhase.READY, ServedBy("Pod", "x", NS), ready_at=now - timedelta(hours=1)
    )
    admission = compute.Admission(
        True,
        "Admitted",
        "admitted",
        "gvisor",
        key=SandboxKey(scope="s", thread_id="t", agent_dir="a", call_id=""),
    )
    plan = compute.plan(
        SandboxView(obj), parsed, admission, obs, key_unclean=None, scope_problem="", now=now
    )
    assert plan.verdict is not None and plan.verdict.ready
    assert plan.requeue_after is not None and abs(plan.requeue_after - 60) < 1


# ---- in a Sandbox's pass ------------------------------------------------------------------------


async def test_a_sandbox_pass_serves_from_the_pool_or_cold_and_says_which() -> None:
    from tests.fixtures.reconcile import SPEC, FakeDriver, reconcile_sandbox, runtime

    rt, kube, _ = runtime()
    kube.add("sandboxscopes", "conv", {"scope": "s", "threadId": "t"})

    class PoolDriver(FakeDriver):
        def __init__(self) -> None:
            super().__init__("gvisor")
            self.warm = FakeWarmPods(rt)
            self.network_policies: list[str] = []

        def warm_pool_pods(self) -> FakeWarmPods:
            return self.warm

        async def ensure_network_policy(self, req: EnsureRequest) -> None:
            self.network_policies.append(req.sandbox.name)

        def pool_pod_current(self, pod: dict[str, Any]) -> bool:
            return True

        def pool_pod_serves(self, pod: dict[str, Any], spec: Any) -> bool:
            return True

        async def observe(self, sandbox: SandboxRef) -> Observation:
            if sandbox.served_by is not None and sandbox.served_by.name in self.warm.claims:
                pod = rt.views.pods.get(NS, sandbox.served_by.name)
                assert pod is not None
                return Observation(
                    ObservedPhase.READY, sandbox.served_by, served_from=pod_origin(pod)
                )
            return await super().observe(sandbox)

    driver = PoolDriver()
    rt.drivers["gvisor"] = driver  # type: ignore[assignment]
    spec = resolve_spec(CONFIG.host_policy, SandboxSpec(kind="shell", image="busybox"))
    rt.views.pools.upsert({**pool_obj(), "status": {"shape": pools.shape_of("gvisor", spec)}})
    warm = pod(pools.shape_of("gvisor", spec))
    rt.views.pods.upsert(warm)

    kube.add("sandboxes", "first", SPEC)
    await reconcile_sandbox(rt, NS, "first")
    status = kube.objs[("sandboxes", "first")]["status"]
    assert status["servedFrom"] == "SandboxWarmPool/p"
    assert status["servedBy"]["name"] == warm["metadata"]["name"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Ready")
    assert driver.creates == 0 and driver.network_policies == ["first"]

    # The pool is empty now: the next one starts cold, with an Event saying why.
    kube.add("sandboxes", "second", {**SPEC, "agentDir": "agents/b"})
    await reconcile_sandbox(rt, NS, "second")
    assert kube.objs[("sandboxes", "second")]["status"]["servedFrom"] == "cold"
    assert driver.creates == 1
    assert ("second", "Normal", "PoolExhausted") in kube.events
