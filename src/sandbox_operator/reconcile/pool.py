"""SandboxWarmPools: keep pre-started, never-used pods for one template, and hand one to a
Sandbox at admission.

Two parts, both reading the watched views only:

* :func:`reconcile_pool` keeps a pool at its ``replicas`` idle pods. The template is judged by the
  same policy as a Sandbox with that spec (a refusal makes the pool create nothing and report the
  very refusal); the pods are made for the backend the policy chose, labelled with the digest of
  that backend and the resolved template (:func:`shape_of`). Pods of another shape (the template
  or the host policy changed) are replaced; a failed idle pod is deleted and replaced; at most
  ``maxCreating`` pods are starting at once.
* :func:`claim_warm_pod` runs in the Sandbox's pass once it is admitted and nothing serves it
  yet: an idle, Ready pod of the same shape in its namespace is claimed atomically (see
  ``backends/warmpool.py``); when a matching pool has none to give, the Sandbox starts cold, and
  an Event and a metric say so. Never a refusal. A Sandbox with ``spec.storage`` always starts
  cold (its work dir is its own volume, which no pool pod mounts).

The policy decides before any of this: a pod is only ever claimed by a Sandbox already admitted
onto the pod's backend, and "same shape" means the pod was made for exactly the spec fields that
shape a pod (``WARM_POOL_TEMPLATE_FIELDS``, resources as resolved under the host policy).
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandbox_operator import labels as lbl
from sandbox_operator import metrics
from sandbox_operator.backends.base import (
    EnsureRequest,
    PoolRef,
    ServedBy,
    StartupError,
    TransientError,
)
from sandbox_operator.backends.runtimeclass import POD_TEMPLATE_VERSION
from sandbox_operator.backends.warmpool import (
    WarmPoolPods,
    build_pool_pod,
    is_idle,
    is_ready,
    pool_name_of,
)
from sandbox_operator.config import profiles
from sandbox_operator.contract import (
    SANDBOX_WARM_POOL_PLURAL,
    ConditionReason,
    ConditionType,
    HostPolicy,
    SandboxRefusal,
    SandboxSpec,
    SandboxWarmPoolResourceSpec,
    refusal_condition_reason,
)
from sandbox_operator.policy import BackendProfile, resolve_spec, select_backend
from sandbox_operator.reconcile.runtime import Runtime
from sandbox_operator.reconcile.status import Draft, send_status_patch
from sandbox_operator.reconcile.statusfields import StatusFields
from sandbox_operator.views import PodView, SandboxWarmPoolView

log = logging.getLogger(__name__)

READY = ConditionType.READY
R = ConditionReason

#: How many idle pods a claim tries before it gives up and starts cold (each try that loses a
#: race to another claimer costs one request).
CLAIM_ATTEMPTS = 3

#: Waiting reasons of an idle pod that are reported on the pool (the pod is left as it is: a new
#: one would meet the same problem).
_STUCK_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError"}
)


# ---- pure ---------------------------------------------------------------------------------------


def shape_of(backend: str, spec: SandboxSpec) -> str:
    """Digest of what a pod is made of: the backend and the pod-shaping fields of ``spec`` as
    resolved under the host policy (``policy.resolve_spec``). Equal digests: interchangeable
    pods."""
    resources = spec.resources
    shape = {
        "podTemplate": POD_TEMPLATE_VERSION,
        "backend": backend,
        "kind": spec.kind,
        "image": spec.image,
        "workDir": spec.work_dir,
        "egress": spec.egress.value,
        "egressAllow": sorted(spec.egress_allow),
        "requests": [resources.requests.cpu, resources.requests.memory],
        "limits": [resources.limits.cpu, resources.limits.memory],
    }
    raw = json.dumps(shape, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(raw).hexdigest()[:32]


@dataclass(frozen=True)
class TemplateJudgement:
    """What the policy says of a pool's template: the backend and shape, or why not."""

    backend: str | None
    shape: str | None
    spec: SandboxSpec | None
    reason: ConditionReason
    message: str


def judge_template(
    raw_spec: Mapping[str, Any],
    *,
    host_policy: HostPolicy,
    backend_profiles: Sequence[BackendProfile],
    pool_backends: frozenset[str],
) -> TemplateJudgement:
    """Admit the template exactly as a Sandbox with that spec would be (no scope: the host's
    floors only), then check the chosen backend can keep warm pods."""
    try:
        pool_spec = SandboxWarmPoolResourceSpec.model_validate(dict(raw_spec))
        spec = pool_spec.template.sandbox_spec()
    except ValueError as exc:
        return TemplateJudgement(None, None, None, R.TEMPLATE_INVALID, _first_error(exc))
    try:
        chosen = select_backend(host_policy, backend_profiles, spec)
    except SandboxRefusal as refusal:
        return TemplateJudgement(
            None, None, None, refusal_condition_reason(refusal.reason), refusal.message
        )
    backend = chosen.backend.name
    if backend not in pool_backends:
        return TemplateJudgement(
            backend,
            None,
            None,
            R.POOL_UNSUPPORTED,
            f"backend {backend} cannot keep warm pods (only runtime-class backends can)",
        )
    resolved = resolve_spec(host_policy, spec)
    return TemplateJudgement(
        backend, shape_of(backend, resolved), resolved, R.READY, f"admitted to backend {backend}"
    )


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return f"template is invalid: {where}: {first.get('msg', '')}"[:500]
    return f"template is invalid: {exc}"[:500]


@dataclass
class PoolPlan:
    """What one pass does to a pool: pods to create and delete, the status to write."""

    create: int = 0
    delete: list[PodView] = field(default_factory=list)
    status: StatusFields = field(default_factory=lambda: StatusFields())
    condition: tuple[bool, ConditionReason, str] = (False, R.FILLING, "")


def plan_pool(
    pool: SandboxWarmPoolView,
    judgement: TemplateJudgement,
    pods: Sequence[PodView],
    current: Callable[[PodView], bool] = lambda _pod: True,
) -> PoolPlan:
    """Given the pool, the judgement of its template and every pod carrying its label, decide
    the pods to create and delete and what the status says. ``current(pod)``: whether an idle
    pod can still serve as it is (the backend's word: e.g. its egress proxy address is still the
    namespace's); a pod that cannot is replaced like one of another shape."""
    view = pool
    meta = view.metadata
    idle = [p for p in pods if is_idle(p, meta.uid)]
    plan = PoolPlan()
    plan.status = {
        "backend": judgement.backend,
        "shape": judgement.shape,
        "selector": lbl.format_selector(
            {
                lbl.MANAGED_BY_LABEL: lbl.MANAGED_BY_VALUE,
                lbl.POOL_LABEL: lbl.sandbox_label_value(meta.name),
            }
        ),
        "claimed": sum(1 for p in pods if _claimed(p)),
    }
    if judgement.shape is None:
        plan.delete = list(idle)
        plan.status.update({"replicas": 0, "readyReplicas": 0})
        plan.condition = (False, judgement.reason, judgement.message)
        return plan
    shaped = [
        p for p in idle if _labels(p).get(lbl.POOL_SHAPE_LABEL) == judgement.shape and current(p)
    ]
    plan.delete = [p for p in idle if p not in shaped]  # another shape, or stale: replaced
    failed = [p for p in shaped if _phase(p) in ("Failed", "Succeeded")]
    plan.delete += failed
    live = [p for p in shaped if p not in failed]
    _size(plan, live, view.replicas, view.max_creating)
    return plan


def _claimed(pod: PodView) -> bool:
    """A pool pod a Sandbox took (its label), not on its way out."""
    return lbl.SANDBOX_LABEL in _labels(pod) and not pod.metadata.deleting


def _size(plan: PoolPlan, live: list[PodView], wanted: int, max_creating: int) -> None:
    """Bring ``live`` idle pods of the right shape to ``wanted`` (creating at most
    ``max_creating`` at a time) and say how far the pool is."""
    ready = [p for p in live if is_ready(p)]
    starting = [p for p in live if not is_ready(p)]
    if len(live) > wanted:
        # Scale down: starting pods first (nobody can claim them yet), then the newest.
        surplus = len(live) - wanted
        order = starting[::-1] + sorted(ready, key=_created, reverse=True)
        plan.delete += order[:surplus]
    else:
        plan.create = max(0, min(wanted - len(live), max_creating - len(starting)))
    kept_ready = [p for p in ready if p not in plan.delete]
    plan.status.update({"replicas": min(len(live), wanted), "readyReplicas": len(kept_ready)})
    stuck = sorted({r for p in starting if (r := _waiting_reason(p)) in _STUCK_REASONS})
    filling = f"{len(kept_ready)} of {wanted} idle pods ready"
    if len(kept_ready) >= wanted:
        plan.condition = (True, R.READY, f"{wanted} idle pods ready")
    elif stuck:
        plan.condition = (False, R.FILLING, f"{filling}; pods cannot start: {', '.join(stuck)}")
    else:
        plan.condition = (False, R.FILLING, filling)


def _labels(pod: PodView) -> Mapping[str, str]:
    return pod.metadata.labels


def _phase(pod: PodView) -> str:
    return pod.status.phase


def _created(pod: PodView) -> str:
    return pod.metadata.creation_timestamp


def _waiting_reason(pod: PodView) -> str:
    for cs in pod.status.container_statuses:
        if cs.waiting_reason:
            return cs.waiting_reason
    return ""


# ---- the pool's pass ----------------------------------------------------------------------------


def pool_pods_api(rt: Runtime, backend: str) -> WarmPoolPods | None:
    """The warm pool calls of a backend that can keep warm pods (None: it cannot)."""
    driver = rt.drivers.get(backend)
    make = getattr(driver, "warm_pool_pods", None)
    return make() if make is not None else None


def _pool_backends(rt: Runtime) -> frozenset[str]:
    return frozenset(n for n, d in rt.drivers.items() if getattr(d, "warm_pool_pods", None))


async def reconcile_pool(rt: Runtime, namespace: str, name: str) -> float | None:
    pool = rt.views.pools.get(namespace, name)
    if pool is None:
        return None
    view = pool
    meta = view.metadata
    if meta.deleting:
        return None  # the garbage collector deletes its idle pods and NetworkPolicy
    await rt.refresh_availability()
    judgement = judge_template(
        view.spec,
        host_policy=rt.config.host_policy,
        backend_profiles=profiles(rt.config, rt.unavailable),
        pool_backends=_pool_backends(rt),
    )
    pods = rt.views.pods.select(namespace, lbl.POOL_LABEL, lbl.sandbox_label_value(name))
    driver: Any = rt.drivers.get(judgement.backend or "")
    serves = getattr(driver, "pool_pod_serves", None)
    template = judgement.spec

    def current(pod: PodView) -> bool:
        """Current, and confined as the backend makes this pool's pods: a pod carrying the
        pool's labels and owner that is not (made by someone else, or by another configuration)
        is replaced, never counted and never claimed."""
        return serves is None or template is None or bool(serves(pod, template))

    plan = plan_pool(view, judgement, pods, current)
    ref = PoolRef(namespace, name, meta.uid)
    api = pool_pods_api(rt, judgement.backend) if judgement.backend else None
    any_api = api or next((a for b in rt.drivers if (a := pool_pods_api(rt, b)) is not None), None)
    for pod in plan.delete:
        if any_api is not None:
            await any_api.delete(pod)
    requeue: float | None = None
    if plan.create and api is not None and judgement.spec is not None and judgement.shape:
        try:
            await api.ensure_network_policy(ref, str(judgement.backend))
            address = await driver.pool_proxy(ref, judgement.spec)
            for _ in range(plan.create):
                manifest = build_pool_pod(
                    ref, judgement.spec, driver.config, judgement.shape, address
                )
                await api.create(manifest)
        except TransientError as exc:
            log.warning("pool %s/%s: %s", namespace, name, exc.message)
            requeue = 5.0
        except StartupError as exc:  # the egress proxy's objects were refused (RBAC, ...)
            plan.condition = (False, R.FILLING, exc.message)
            requeue = 30.0
        except Exception as exc:  # an API refusal of the pod (quota, admission policy, ...)
            message = (
                f"creating a pool pod failed: {type(exc).__name__} {getattr(exc, 'status', '')}"
            )
            plan.condition = (False, R.FILLING, message.strip())
            requeue = 10.0
    await _write_pool_status(rt, pool, plan)
    return requeue


async def _write_pool_status(rt: Runtime, pool: SandboxWarmPoolView, plan: PoolPlan) -> None:
    meta = pool.metadata
    draft = Draft(pool)
    ok, reason, message = plan.condition
    draft.cond(READY, ok, reason, message)
    draft.set(**plan.status)
    patched = await send_status_patch(rt, SANDBOX_WARM_POOL_PLURAL, draft)
    if patched is None:
        return
    if patched.obj is None:
        rt.views.pools.remove(meta.namespace, meta.name, meta.uid or None)
    else:
        rt.views.pools.upsert(patched.obj)


# ---- a Sandbox's claim --------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """The outcome of looking for a warm pod: the pod claimed and its pool, or (no pod) the
    matching pools that had none to give."""

    served_by: ServedBy | None = None
    pool: str | None = None
    exhausted: tuple[str, ...] = ()


def _matching_pools(rt: Runtime, namespace: str, shape: str) -> list[str]:
    """Pools in the namespace whose status says they make pods of this shape."""
    out = []
    for ns, name in rt.views.pools.names():
        if ns != namespace:
            continue
        pool = rt.views.pools.get(ns, name)
        if pool is not None and pool.status.shape == shape:
            out.append(name)
    return sorted(out)


async def claim_warm_pod(rt: Runtime, request: EnsureRequest, backend: str) -> Claim:
    """Claim an idle, Ready pod of the request's shape for its Sandbox, if a pool has one.

    ``request.spec`` is the admitted spec resolved under the host policy. A candidate is picked
    from the views at random (so claims spread over the pool) and reserved in this process before
    anything is awaited, so concurrent passes never race for one pod; a claim that still loses a
    race (another replica, a deletion) picks a fresh candidate, at most ``CLAIM_ATTEMPTS`` times.

    A spec with ``storage`` is never served from a pool (no claim, no exhaustion reported): its
    work dir is a volume of its own, which no pod made before the Sandbox mounts.
    """
    if request.spec.storage is not None:
        return Claim()
    api = pool_pods_api(rt, backend)
    if api is None:
        return Claim()
    driver: Any = rt.drivers[backend]
    shape = shape_of(backend, request.spec)
    ns = request.sandbox.namespace

    def made_by_live_pool(pod: PodView) -> bool:
        """Owned by the very pool (its uid) that the views hold under the pod's pool name."""
        name = pool_name_of(pod)
        pool = rt.views.pools.get(ns, name) if name else None
        uid = pool.metadata.uid if pool is not None else ""
        return bool(uid) and is_idle(pod, pool_uid=uid)

    def reserve() -> PodView | None:
        """A fresh candidate, reserved (no await between looking and reserving). Labels and
        owner references can be copied by anyone who may create pods: a candidate must also be
        owned by the live pool's uid and confined exactly as this backend makes the pool's pods
        (``pool_pod_serves``), or it is never claimed."""
        candidates = [
            p
            for p in rt.views.pods.select(ns, lbl.POOL_SHAPE_LABEL, shape)
            if is_idle(p)
            and is_ready(p)
            and (ns, p.metadata.name) not in rt.claiming
            and _labels(p).get(lbl.BACKEND_LABEL) == backend
            and made_by_live_pool(p)
            and driver.pool_pod_serves(p, request.spec)
        ]
        if not candidates:
            return None
        pod = random.choice(candidates)
        rt.claiming.add((ns, pod.metadata.name))
        return pod

    pod = reserve()
    policy_ready = False
    attempts = 0
    while pod is not None:
        pod_key = (ns, pod.metadata.name)
        try:
            if not policy_ready:
                # The Sandbox's own NetworkPolicy before the pod is its: by the time the claim
                # lands (and Ready is reported), what the Sandbox was admitted to reach is in
                # force. Until then the pool's deny-all policy holds the pod.
                await driver.ensure_network_policy(request)
                policy_ready = True
            # The view may have moved on while we waited: claim what it holds now.
            current = rt.views.pods.get(*pod_key)
            served = await api.claim(current, request) if current and is_idle(current) else None
        finally:
            rt.claiming.discard(pod_key)
        if served is not None:
            pool = _labels(pod).get(lbl.POOL_LABEL, "")
            metrics.WARM_CLAIMS.labels(pool, "warm").inc()
            return Claim(served, pool)
        attempts += 1
        pod = reserve() if attempts < CLAIM_ATTEMPTS else None
    pools = _matching_pools(rt, ns, shape)
    for pool in pools:
        metrics.WARM_CLAIMS.labels(pool, "exhausted").inc()
    return Claim(exhausted=tuple(pools))
