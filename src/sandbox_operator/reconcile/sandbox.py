"""Reconcile one Sandbox: read the views, compute the wanted state, write only the difference.

A pass reads the Sandbox, its SandboxScope and its pod from the in-memory views (``views.py``;
the API server only to confirm a scope the views miss), asks ``compute.py`` what the status
should say and what to create or dispose, then makes at most one create or disposal request and
one status patch (``resourceVersion`` as a precondition: a concurrent writer makes the pass run
again on the newer object). A pass over a Ready, unchanged Sandbox makes no API call at all.

Passes run on watch events (the Sandbox, its scope, its pod) and on the deadlines the previous
pass computed (startup, TTL, idle, disposal retry); nothing polls. No policy lives here.

What the pass shares with no other decision lives beside it: the operator's metadata patch
(``metadata.py``), the validated-spec cache (``spec_cache.py``) and the one status writer with its
metrics (``writer.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from sandbox_operator import kubeobj
from sandbox_operator import labels as lbl
from sandbox_operator.backends.base import (
    BackendDriver,
    EnsureRequest,
    Observation,
    ObservedPhase,
    Resettable,
    StartupError,
    TransientError,
    WatchedDisposal,
    follows_egress_edits,
    resets,
    suspends,
)
from sandbox_operator.config import profiles
from sandbox_operator.contract import (
    ConditionReason,
    Egress,
    SandboxKey,
    SandboxResourceSpec,
)
from sandbox_operator.policy import resolve_spec
from sandbox_operator.reconcile import compute, egress_edit, reset
from sandbox_operator.reconcile.disposal import (
    dispose_into,
    drivers_for,
    finalize_sandbox,
    key_unclean,
)
from sandbox_operator.reconcile.lifecycle import Verdict
from sandbox_operator.reconcile.metadata import ensure_metadata
from sandbox_operator.reconcile.pool import claim_warm_pod
from sandbox_operator.reconcile.runtime import Runtime
from sandbox_operator.reconcile.spec_cache import parsed_spec
from sandbox_operator.reconcile.status import (
    ADMITTED,
    DISPOSED,
    READY,
    Draft,
    R,
    sandbox_gone,
    sandbox_ref,
)
from sandbox_operator.reconcile.step import Step, sooner
from sandbox_operator.reconcile.writer import write_step
from sandbox_operator.views import SandboxScopeView, SandboxView

log = logging.getLogger(__name__)

#: While a driver that is not watched still reports compute stopping, look again this often.
SUSPEND_RECHECK_SECONDS = 2.0

#: After the views were found to lack a pod that exists (put into them from the API server),
#: look again this soon.
VIEW_RECHECK_SECONDS = 0.2

# A create that failed transiently is retried after BASE * 2**attempt, at most MAX seconds
# (or after the backend's Retry-After, when it is longer and still below MAX).
_ENSURE_BACKOFF = 5.0
_MAX_ENSURE_BACKOFF = 60.0


def ensure_retry_delay(retry: int, hint: float | None = None) -> float:
    """Exponential backoff for a transiently failed create: 5, 10, 20, 40, 60, 60, ... s."""
    delay = min(_MAX_ENSURE_BACKOFF, _ENSURE_BACKOFF * float(2 ** min(max(retry, 0), 10)))
    if hint is not None:
        delay = min(_MAX_ENSURE_BACKOFF, max(delay, hint))
    return delay


async def reconcile_sandbox(rt: Runtime, namespace: str, name: str) -> float | None:
    """One pass; returns the seconds until the next deadline (None: wait for a watch event).

    Gather (the views, the backend's observation) -> decide (``compute``: pure) -> at most one
    action (create, claim, suspend or dispose) -> one status write (:func:`write_step`).
    Raises :class:`Conflict` when the write lost a race (the caller looks again soon)."""
    obj = rt.views.sandboxes.get(namespace, name)
    if obj is None:
        rt.forget(namespace, name)
        return None
    if obj.metadata.deleting:
        step = await finalize_sandbox(rt, obj)
    elif (namespace, name) in rt.purging:
        return None  # its scope's purge deletes it; the deletion event brings it back
    else:
        step = await _pass(rt, obj)
    return await write_step(rt, step)


async def _scope_object(rt: Runtime, namespace: str, scope_ref: str) -> SandboxScopeView | None:
    """The SandboxScope a Sandbox names, from the views; a miss is confirmed with one read: its
    watch event can lag the Sandbox's (a scope created just before, under load), and
    ``ScopeNotFound`` is terminal for a waiting client. Passes run on events, not on a timer."""
    held = rt.views.scopes.get(namespace, scope_ref)
    if held is not None:
        return held
    return await rt.kube.get_scope(namespace, scope_ref)


@dataclass(frozen=True)
class _Seen:
    """What a pass gathered about a Sandbox that may run: the object (with the operator's
    metadata on it), its validated spec, the scope it names, and the pass's clock."""

    obj: SandboxView
    spec: SandboxResourceSpec
    scope: compute.ScopeResolution
    key: SandboxKey | None
    now: datetime
    resetting: bool = False  # this pass retired the serving pod: what serves it next is new

    @property
    def view(self) -> SandboxView:
        return self.obj

    @property
    def ident(self) -> tuple[str, str, str]:
        meta = self.view.metadata
        return meta.namespace, meta.name, meta.uid


async def _pass(rt: Runtime, obj: SandboxView) -> Step:
    draft = Draft(obj)
    status = obj.status
    # Terminal: nothing is created again; only a disposal that has not landed is retried.
    if compute.is_terminal(status):
        if status.conditions.is_true(DISPOSED):
            return Step.wait()
        requeue = await dispose_into(rt, drivers_for(rt, status), sandbox_ref(obj), draft)
        return Step.write(obj, draft, requeue=requeue)
    seen = await _gather(rt, obj)
    if isinstance(seen, Step):
        return seen
    return await _admit(rt, seen)


async def _gather(rt: Runtime, obj: SandboxView) -> _Seen | Step:
    """The spec (validated once per generation) and the scope it names."""
    view = obj
    parsed = parsed_spec(rt, view)
    if isinstance(parsed, str):
        refused = compute.Plan(
            conditions=(
                (ADMITTED, False, R.STARTUP_FAILED, parsed),
                (READY, False, R.STARTUP_FAILED, parsed),
            )
        )
        return Step.write(obj, Draft(obj), refused)
    namespace = view.metadata.namespace
    scope = compute.resolve_scope(
        await _scope_object(rt, namespace, parsed.scope_ref),
        parsed.scope_ref,
        namespace,
        conversation_holder=rt.views.conversation_holder(namespace, parsed.scope_ref),
    )
    key = parsed.key(scope.spec.scope, scope.spec.thread_id) if scope.spec is not None else None
    return _Seen(obj, parsed, scope, key, datetime.now(UTC))


async def _admit(rt: Runtime, seen: _Seen) -> Step:
    """Suspended stays suspended; otherwise admitted (once, or again on a resume) or refused."""
    obj, spec, now = seen.obj, seen.spec, seen.now
    view = seen.view
    draft = Draft(obj)
    annotations = view.metadata.annotations
    suspension = compute.suspension(
        spec,
        view.status,
        last_activity=lbl.read_last_activity(annotations.get(lbl.LAST_ACTIVITY_ANNOTATION), now),
    )
    if suspension.state in ("suspend", "suspended"):
        assert suspension.by is not None
        return await _suspend(rt, obj, draft, spec, suspension.by, now)
    rejudge = suspension.state == "resume"
    if rejudge or not view.status.conditions.is_true(ADMITTED):
        await rt.refresh_availability()
    admission = compute.admit(
        view,
        spec,
        seen.scope,
        host_policy=rt.config.host_policy,
        profiles=profiles(rt.config, rt.unavailable),
        known_backends=tuple(rt.drivers),
        rejudge=rejudge,
    )
    if not admission.admitted:
        # A refused resume stays suspended: nothing starts. A refusal is its status write alone:
        # nothing was made for it, so it needs no finalizer, and it holds no key.
        plan = (compute.refused_resume_plan if rejudge else compute.refusal_plan)(admission)
        return Step.write(obj, draft, plan, admission)
    router = rt.config.router
    ns, name, _ = seen.ident
    admission = replace(
        admission,
        fields={
            **admission.fields,
            **compute.port_fields(spec, ns, name, router.base_url if router else None),
        },
    )
    # Admitted: the finalizer and key labels go on before anything is made for it (one
    # metadata patch, only when something is missing).
    fresh = await ensure_metadata(rt, obj, seen.scope, seen.key, spec.kind)
    if fresh is None:  # 404: it is gone
        sandbox_gone(rt, obj)
        return Step.wait()
    if fresh is not obj:
        seen = replace(seen, obj=fresh)
        obj, draft = fresh, Draft(fresh)
    if rejudge:
        admission = _egress_edit(rt, seen, admission, rt.drivers.get(str(admission.backend)))
        plan = compute.resume_plan(obj, admission, now=now)
        return Step.write(obj, draft, plan, admission)
    return await _serve(rt, seen, draft, admission)


async def _serve(rt: Runtime, seen: _Seen, draft: Draft, admission: compute.Admission) -> Step:
    """Admitted: observe what serves it, and plan from that (create, suspend, dispose, or only
    say how it is doing)."""
    obj, spec, now = seen.obj, seen.spec, seen.now
    namespace, _, uid = seen.ident
    assert admission.backend is not None
    backend = admission.backend
    driver = rt.drivers[backend]
    admission = _egress_edit(rt, seen, admission, driver)
    view = seen.view
    wanted = reset.reset_wanted(spec, view.status)
    if wanted is not None:
        if not resets(driver):
            admission = replace(
                admission, fields={**admission.fields, **reset.reset_refused(backend)}
            )
        else:
            return await _reset(rt, seen, draft, admission, driver, wanted)
    observation = await driver.observe(sandbox_ref(obj))
    was_ready = view.status.conditions.is_true(READY)
    unclean = None
    if observation.phase is ObservedPhase.ABSENT and not was_ready and admission.key is not None:
        unclean = await key_unclean(rt, namespace, admission.key, spec.kind, uid)
    plan = compute.plan(
        view,
        spec,
        admission,
        observation,
        key_unclean=unclean,
        scope_problem=seen.scope.problem,
        now=now,
        seal=rt.pool_seal,
    )
    if plan.suspend:  # idle, and lifetime.idleAction suspend; or the backend stopped it
        detail = ""
        if observation.phase is ObservedPhase.SUSPENDED:
            detail = "stopped by the backend" + (
                f" ({observation.detail_reason})" if observation.detail_reason else ""
            )
        return await _suspend(rt, obj, draft, spec, compute.SUSPENDED_BY_IDLE, now, detail)
    if plan.create:
        if not view.status.conditions.is_true(ADMITTED) and not _watched(driver):
            # Record the admission (and so the startup clock) before anything is created: an
            # ensure that fails or never returns must still leave Admitted and a deadline. This
            # pass writes it; the next (at once) creates. (A watched driver's objects carry their
            # own creation time, which is the startup clock: its admission is recorded with the
            # first observation, one write less.)
            return Step.write(obj, draft, plan, admission, requeue=0.0)
        created = await _create(rt, seen, draft, admission, driver, observation)
        if isinstance(created, Step):
            return created
        plan, observation = created
    return await _report(rt, obj, draft, plan, admission, observation)


def _egress_edit(
    rt: Runtime, seen: _Seen, admission: compute.Admission, driver: object
) -> compute.Admission:
    """The admission with what an egress edit (``egress_edit``) writes, and its Event."""
    if seen.spec.egress is not Egress.ALLOWLIST:
        return admission
    profile = next(
        (p for p in profiles(rt.config, rt.unavailable) if p.name == admission.backend), None
    )
    view = seen.view
    edit = egress_edit.egress_edit(
        seen.spec,
        view.status,
        admission.fields,
        generation=view.metadata.generation,
        backend=profile,
        follows_edits=follows_egress_edits(driver),
        allow_unrestricted=rt.config.host_policy.allow_unrestricted_egress,
        now=seen.now,
    )
    if not edit.fields:
        return admission
    return replace(
        admission, fields={**admission.fields, **edit.fields}, events=admission.events + edit.events
    )


async def _reset(
    rt: Runtime,
    seen: _Seen,
    draft: Draft,
    admission: compute.Admission,
    driver: Resettable,
    wanted: int,
) -> Step:
    """A reset (``spec.resets`` raised): the pod serving the sandbox is deleted as a disposal
    deletes it, and once it is gone (at once on a backend whose disposals go at once; else the
    pass its deletion event brings) a never-used one takes its place in the same pass: a warm
    pool's idle pod when one matches, else a new pod (the create of a Sandbox admitted long
    ago). ``status.resets`` records it. The key, name, conversation and NetworkPolicy stay; the
    instance (the pod's uid) is new."""
    obj, now = seen.obj, seen.now
    try:
        still = await driver.retire(sandbox_ref(obj))
    except TransientError as exc:
        log.warning("sandbox %s/%s: resetting failed, will retry: %s", *seen.ident[:2], exc.message)
        return Step.wait(ensure_retry_delay(0, exc.retry_after))
    if still:  # stopping on the node (or held by a finalizer): its deletion event brings us back
        waiting = ", ".join(f"{o.kind} {o.name}" for o in still)
        pending = compute.Plan(
            conditions=((READY, False, R.CREATING, f"resetting: waiting for {waiting} to stop"),),
        )
        return Step.write(obj, draft, pending, admission)
    draft.cond(READY, False, R.CREATING, "resetting")  # Ready again is a new transition
    admission = replace(admission, fields={**admission.fields, **reset.reset_fields(wanted, now)})
    absent = Observation(ObservedPhase.ABSENT)
    created = await _create(rt, replace(seen, resetting=True), draft, admission, driver, absent)
    if isinstance(created, Step):
        return created
    plan, observation = created
    return await _report(rt, obj, draft, plan, admission, observation)


async def _create(
    rt: Runtime,
    seen: _Seen,
    draft: Draft,
    admission: compute.Admission,
    driver: BackendDriver,
    observation: Observation,
) -> Step | tuple[compute.Plan, Observation]:
    """The pass's one action: claim a warm pod, or create (resume) what serves the sandbox.
    Returns the plan made from what is seen after it, or the Step a failure ends in."""
    obj, spec, now = seen.obj, seen.spec, seen.now
    namespace, name, _ = seen.ident
    assert admission.key is not None and admission.backend is not None
    ref = sandbox_ref(obj)
    request = EnsureRequest(
        sandbox=ref,
        key=admission.key,
        # With the host's default resources filled in (requests under limits).
        spec=resolve_spec(rt.config.host_policy, spec.sandbox_spec()),
        isolation_scope=admission.isolation_scope or spec.sandbox_spec().isolation_scope,
        labels=lbl.object_labels(admission.key, name, admission.backend, kind=spec.kind),
        annotations=lbl.object_annotations(admission.key, spec.scope_ref),
    )
    try:
        claim = await claim_warm_pod(rt, request, admission.backend)
    except StartupError as exc:  # the egress NetworkPolicy was refused
        return Step.write(obj, draft, _startup_failed(admission, exc.message), admission)
    if claim.served_by is not None:
        claimed = await driver.observe(replace(ref, served_by=claim.served_by))
        plan = compute.plan(
            seen.view, spec, admission, claimed, key_unclean=None, scope_problem="", now=now,
            seal=rt.pool_seal, resetting=seen.resetting,
        )  # fmt: skip
        return Step.write(obj, draft, plan, admission)
    if claim.exhausted:
        await rt.kube.post_event(
            obj,
            type_="Normal",
            reason=R.POOL_EXHAUSTED,
            message=f"no idle pod in warm pool {', '.join(claim.exhausted)}; starting cold",
        )
    failed = await _start(rt, seen, draft, admission, driver, request, observation)
    if failed is not None:
        return failed
    rt.ensure_attempts.pop((namespace, name), None)
    observation = await driver.observe(ref)
    plan = compute.plan(
        seen.view, spec, admission, observation, key_unclean=None, scope_problem="", now=now,
        seal=rt.pool_seal, resetting=seen.resetting,
    )  # fmt: skip
    if plan.create:  # not seen yet: it exists, the watch will tell how it is doing
        plan = compute.Plan(
            conditions=(
                (ADMITTED, True, R.ADMITTED, admission.message),
                (READY, False, R.CREATING, "creating the sandbox"),
            ),
            fields=plan.fields,
            requeue_after=_startup_deadline(seen.view, spec, now),
        )
    return plan, observation


async def _start(
    rt: Runtime,
    seen: _Seen,
    draft: Draft,
    admission: compute.Admission,
    driver: BackendDriver,
    request: EnsureRequest,
    observation: Observation,
) -> Step | None:
    """Create what serves the sandbox (or start it again, storage kept); None when the backend
    took it, else the Step its failure ends in."""
    obj, spec, now = seen.obj, seen.spec, seen.now
    namespace, name, _ = seen.ident
    try:
        resume = observation.phase is ObservedPhase.SUSPENDED or compute.resuming(seen.view.status)
        if resume and suspends(driver):
            await driver.resume(request)  # stopped, storage kept: start it again
        else:
            await driver.ensure(request)
    except StartupError as exc:
        if exc.reason == R.KEY_UNCLEAN:
            refused = compute.Admission(False, R.KEY_UNCLEAN, exc.message)
            return Step.write(obj, draft, compute.refusal_plan(refused))
        reason = R.FAILED if exc.reason == R.FAILED else R.STARTUP_FAILED  # lost while kept
        return Step.write(obj, draft, _startup_failed(admission, exc.message, reason), admission)
    except Exception as exc:  # transient: a 5xx, a 429, a dropped connection, ...
        what = exc.message if isinstance(exc, TransientError) else type(exc).__name__
        hint = exc.retry_after if isinstance(exc, TransientError) else None
        attempt = rt.ensure_attempts.get((namespace, name), 0)
        rt.ensure_attempts[(namespace, name)] = attempt + 1
        log.warning("sandbox %s/%s: creating failed, will retry: %s", namespace, name, what)
        pending = compute.Plan(
            conditions=(
                (ADMITTED, True, R.ADMITTED, admission.message),
                (READY, False, R.CREATING, f"creating the sandbox failed, retrying: {what}"),
            ),
            fields={**admission.fields, "servedBy": None},
        )
        # The startup deadline still applies: never wait past it to find out.
        retry = sooner(ensure_retry_delay(attempt, hint), _startup_deadline(seen.view, spec, now))
        return Step.write(obj, draft, pending, admission, requeue=retry)
    return None


async def _report(
    rt: Runtime,
    obj: SandboxView,
    draft: Draft,
    plan: compute.Plan,
    admission: compute.Admission,
    observation: Observation,
) -> Step:
    """The plan as the Step to write, unless what it would report is the views' lag."""
    namespace, name = obj.key
    failed = plan.verdict is not None and plan.verdict.reason == R.FAILED
    if (
        failed
        and observation.phase in (ObservedPhase.ABSENT, ObservedPhase.DISPOSING)
        and await _being_deleted(rt, namespace, name)
    ):
        # The pod went first because the Sandbox itself is being deleted (a scope purge, a
        # collection delete): that is disposal, not failure. Its own deletion event follows.
        return Step.wait()
    if (
        failed
        and observation.phase is ObservedPhase.ABSENT
        and observation.detail_reason != "Foreign"  # a pod under its name, not its own: judged
        and await _serving_pod_exists(rt, namespace, obj)
    ):
        # The views lacked a pod that exists: after a peering pause kopf lists every kind again,
        # each on its own (the Sandboxes before the pods), so a standby that takes over can see
        # a Ready Sandbox before its pod. Never failed and disposed on the views' word alone:
        # the pod is in the view now, look again.
        return Step.wait(VIEW_RECHECK_SECONDS)
    # Progress while starting ("starting: Pending", "starting: ContainerCreating") is written at
    # most every MESSAGE_DEBOUNCE_SECONDS; what is awaited (the egress proxy) and every new
    # reason are written at once.
    debounce = (
        plan.verdict is not None and plan.verdict.reason == R.CREATING and not observation.pending
    )
    return Step.write(obj, draft, plan, admission, debounce=debounce)


async def _suspend(
    rt: Runtime,
    obj: SandboxView,
    draft: Draft,
    spec: SandboxResourceSpec,
    by: str,
    now: datetime,
    detail: str = "",
) -> Step:
    """Stop the compute that serves the sandbox, keep its storage, and say so; the TTL still
    ends it. Neither admitted again nor planned while it stays suspended."""
    view = obj
    backend = view.status.backend
    driver = rt.drivers.get(backend) if backend else None
    still: list[str] = []
    kept = None
    if driver is not None and suspends(driver):
        try:
            found = await driver.suspend(sandbox_ref(obj))
        except TransientError as exc:
            log.warning(
                "sandbox %s/%s: suspending failed, will retry: %s",
                *view.key,
                exc.message,
            )
            return Step.wait(ensure_retry_delay(0, exc.retry_after))
        still = [f"{o.kind} {o.name}" for o in found]
        if not still:
            kept = await driver.observe(sandbox_ref(obj))
    elif driver is not None:  # a backend declaring persistentStorage always can (config check)
        log.warning("backend %s cannot suspend; sandbox reported suspended as is", backend)
    plan = compute.suspended_plan(
        view, spec, by, still_stopping=still, now=now, kept=kept, detail=detail
    )
    # A driver that is not watched is asked again while its compute is still stopping.
    unwatched = driver is not None and not _watched(driver)
    recheck = SUSPEND_RECHECK_SECONDS if still and unwatched else None
    return Step.write(obj, draft, plan, requeue=recheck)


def _startup_failed(
    admission: compute.Admission, message: str, reason: ConditionReason = R.STARTUP_FAILED
) -> compute.Plan:
    """Admitted, but what serves it could not be created (``Failed``: could not be started
    again, e.g. its kept work volume was lost): terminal, and disposed."""
    verdict = Verdict(False, reason, message, terminal=True, dispose=True)
    return compute.Plan(
        conditions=(
            (ADMITTED, True, R.ADMITTED, admission.message),
            (READY, False, verdict.reason, verdict.message),
        ),
        fields={**admission.fields, "servedBy": None},
        dispose=True,
        verdict=verdict,
    )


def _watched(driver: BackendDriver) -> bool:
    return isinstance(driver, WatchedDisposal) and driver.watches_disposal


def _startup_deadline(view: SandboxView, spec: SandboxResourceSpec, now: datetime) -> float | None:
    """Seconds until the startup timeout, counted from the admission (this pass's, when it is
    the one admitting)."""
    cond = view.status.conditions.find(ADMITTED)
    admitted_at = (cond.since if cond is not None else None) or now
    timeout = float(spec.sandbox_spec().lifetime.startup_timeout_seconds)
    return max(0.0, timeout - (now - admitted_at).total_seconds()) + 0.05


async def _serving_pod_exists(rt: Runtime, namespace: str, view: SandboxView) -> bool:
    """Whether the pod the status names as serving the sandbox exists after all, though the
    observation found none: in the view by now (it arrived meanwhile), or on the API server
    (asked once, only on this rare path; then put into the view)."""
    served = view.status.served_by
    if served.kind != kubeobj.POD_KIND or not served.name:
        return False
    pod_ns, pod_name = served.namespace or namespace, served.name
    if rt.views.pods.get(pod_ns, pod_name) is not None:
        return True
    pod = await rt.kube.get_pod(pod_ns, pod_name)
    if pod is None:
        return False
    rt.views.pods.upsert(pod)
    return True


async def _being_deleted(rt: Runtime, namespace: str, name: str) -> bool:
    """Ask the API server once (only on this rare path) whether the Sandbox is being deleted:
    its pod's deletion can be seen before its own."""
    if (namespace, name) in rt.purging:
        return True
    current = await rt.kube.get_sandbox(namespace, name)
    if current is None:
        return True
    rt.views.put_sandbox(current)
    return current.metadata.deleting
