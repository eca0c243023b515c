"""One Sandbox's pass as pure functions: what it should look like, given what is seen.

The reconciler (``sandbox.py``) gathers the inputs from the in-memory views and the backend
driver's observation, calls these, and applies the result: at most one create or dispose, then
one status patch. Nothing here does I/O or knows the API server, so every rule is unit-tested on
plain values (``tests/unit/test_reconcile_compute.py``).

Before both, :func:`suspension` reads whether the Sandbox is (to be) suspended, or resumed: a
suspended Sandbox is neither admitted again nor planned (:func:`suspended_plan`), and a resume is
admitted afresh (``admit(..., rejudge=True)``).

Two steps, because the second needs the backend the first chose:

1. :func:`admit` — the scope, the spec and the host policy decide whether the Sandbox may run and
   where (or it already was admitted, which is never decided again);
2. :func:`plan` — with the chosen backend's observation, the lifetime rules
   (``lifecycle.judge``) decide the Ready condition, whether to create or dispose, and when the
   next deadline falls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Literal

from pydantic import ValidationError

from sandbox_operator import labels as lbl
from sandbox_operator.backends.base import Observation, ObservedPhase
from sandbox_operator.contract import (
    SERVED_FROM_COLD,
    BackendUnavailable,
    ConditionReason,
    ConditionType,
    Egress,
    HostPolicy,
    IsolationScope,
    SandboxKey,
    SandboxRefusal,
    SandboxResourceSpec,
    SandboxScopeResourceSpec,
    Selection,
    parse_isolation,
    refusal_condition_reason,
)
from sandbox_operator.contract.ports import port_statuses
from sandbox_operator.policy import BackendProfile, admit_request, effective_floor
from sandbox_operator.reconcile import conditions as cnd
from sandbox_operator.reconcile.lifecycle import TERMINAL_REASONS, Verdict, judge
from sandbox_operator.reconcile.seal import NOT_CONFIGURED, Seal
from sandbox_operator.reconcile.statusfields import ServedByStatus, StatusFields, served_by_wire
from sandbox_operator.views import SandboxScopeView, SandboxStatusView, SandboxView
from sandbox_operator.views.fields import timestamp

ADMITTED = ConditionType.ADMITTED
READY = ConditionType.READY
DISPOSED = ConditionType.DISPOSED
R = ConditionReason

Cond = tuple[ConditionType, bool, ConditionReason, str]  # (type, status, reason, message)


#: The decision functions take views (``sandbox_operator.views``); ``.of`` at their entry also
#: wraps a plain dict (the unit tests' objects) without copying it.


# ---- inputs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScopeResolution:
    """The SandboxScope a Sandbox names, as far as it can be used."""

    spec: SandboxScopeResourceSpec | None
    problem: str = ""  # why it cannot be used, when ``spec`` is None
    reason: ConditionReason = R.SCOPE_NOT_FOUND  # the refusal's reason, when ``spec`` is None


def resolve_scope(
    scope_obj: SandboxScopeView | None,
    scope_ref: str,
    namespace: str,
    *,
    conversation_holder: str | None = None,
) -> ScopeResolution:
    """``conversation_holder``: the older SandboxScope that holds the conversation this one
    names (``Views.conversation_holder``): this one cannot be used while that one exists."""
    if scope_obj is None:
        return ScopeResolution(
            None, f"SandboxScope {scope_ref!r} not found in namespace {namespace}"
        )
    scope_view = scope_obj
    if scope_view.metadata.deleting:
        return ScopeResolution(None, f"SandboxScope {scope_ref!r} is being deleted")
    if conversation_holder is not None:
        return ScopeResolution(
            None,
            f"SandboxScope {scope_ref!r} is refused: SandboxScope {conversation_holder!r} "
            "already holds its scope and threadId in this namespace (one conversation, one "
            f"SandboxScope); use scopeRef {conversation_holder!r}",
            R.SCOPE_CONFLICT,
        )
    try:
        return ScopeResolution(SandboxScopeResourceSpec.model_validate(scope_view.spec))
    except ValidationError:
        return ScopeResolution(None, f"SandboxScope {scope_ref!r} has an invalid spec")


def parse_spec(obj: SandboxView) -> SandboxResourceSpec | str:
    """The validated spec, or the message of a ``StartupFailed`` saying which field is wrong."""
    try:
        return SandboxResourceSpec.model_validate(obj.spec)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"spec is invalid: {where}: {first['msg']}"


def is_terminal(status: SandboxStatusView) -> bool:
    """Ended (StartupFailed, StartupTimeout, Failed, Expired): nothing is created again."""
    ready = status.conditions.find(READY)
    return ready is not None and ready.reason in TERMINAL_REASONS and not ready.is_true


# ---- step 1: admission --------------------------------------------------------------------------


@dataclass(frozen=True)
class Admission:
    """Whether the Sandbox may run, where, and what its status says of it."""

    admitted: bool
    reason: ConditionReason  # the Admitted condition's reason (a refusal's, or Admitted)
    message: str
    backend: str | None = None
    isolation_scope: IsolationScope | None = None
    key: SandboxKey | None = None
    fields: StatusFields = field(default_factory=lambda: StatusFields())  # status fields to set
    decided_now: bool = False  # a new admission (or refusal), not one recorded earlier
    events: tuple[tuple[str, str, str], ...] = ()  # (type, reason, message), posted once written


def admit(
    obj: SandboxView,
    spec: SandboxResourceSpec,
    scope: ScopeResolution,
    *,
    host_policy: HostPolicy,
    profiles: Sequence[BackendProfile],
    known_backends: Sequence[str],
    rejudge: bool = False,
) -> Admission:
    """Decide (or recall) the admission. Once Admitted onto a backend this operator still
    serves, the decision stands: the policy is never asked again for a running sandbox. A
    suspended sandbox being resumed (``rejudge``) is judged again, as if new: the floor, the
    capabilities and the egress may have changed while nothing ran."""
    status = obj.status
    key = spec.key(scope.spec.scope, scope.spec.thread_id) if scope.spec is not None else None
    admitted = status.conditions.find(ADMITTED)
    if (
        not rejudge
        and admitted is not None
        and admitted.is_true
        and status.backend in known_backends
    ):
        isolation_scope = spec.sandbox_spec().isolation_scope
        if status.isolation_scope:
            isolation_scope = IsolationScope(status.isolation_scope)
        return Admission(True, R.ADMITTED, admitted.message, status.backend, isolation_scope, key)
    if scope.spec is None:
        return Admission(False, scope.reason, scope.problem, decided_now=True)
    sandbox_spec = spec.sandbox_spec()
    floor = effective_floor(host_policy, sandbox_spec, scope_floor=scope.spec.min_isolation)
    # A resume stays on the backend that holds its work volume: judged again there, never moved
    # (another backend would start it on an empty one).
    held = status.backend if rejudge and sandbox_spec.storage else ""
    candidates = profiles
    if held and host_policy.selection is Selection.PER_SPEC:
        candidates = [p for p in profiles if p.name == held]
    try:
        if held and not any(p.name == held for p in profiles):
            raise BackendUnavailable(
                backend=held,
                kind=sandbox_spec.kind,
                unavailable_reason="it is no longer configured, and it holds the work volume",
            )
        chosen = admit_request(
            host_policy,
            candidates,
            sandbox_spec,
            call_id=spec.call_id,
            scope_floor=scope.spec.min_isolation,
            scope_min_isolation_scope=scope.spec.min_isolation_scope,
        )
        if held and chosen.backend.name != held:
            raise BackendUnavailable(
                backend=held,
                kind=sandbox_spec.kind,
                unavailable_reason=(
                    f"fixed selection now uses backend {chosen.backend.name!r}, and a resume "
                    f"stays on the backend holding the work volume"
                ),
            )
    except SandboxRefusal as refusal:
        return Admission(
            False,
            refusal_condition_reason(refusal.reason),
            refusal.message,
            key=key,
            fields={
                "backend": None,
                "isolation": None,
                "servedBy": None,
                "effectiveFloor": floor.isolation.value,
            },
            decided_now=True,
        )
    backend = chosen.backend.name
    return Admission(
        True,
        R.ADMITTED,
        f"admitted to backend {backend} (isolation {chosen.backend.isolation}, "
        f"effective floor {chosen.floor.value})",
        backend,
        chosen.isolation_scope,
        key,
        fields={
            "backend": backend,
            "isolation": parse_isolation(chosen.backend.isolation).value,
            "effectiveFloor": chosen.floor.value,
            "isolationScope": chosen.isolation_scope.value,
            **admitted_allow(spec),
        },
        decided_now=True,
    )


def port_fields(
    spec: SandboxResourceSpec, namespace: str, name: str, router_url: str | None
) -> StatusFields:
    """``status.ports``: each declared port and, once a router is configured, its URL (nothing
    for a spec without ports)."""
    if not spec.ports:
        return {}
    return {"ports": [p.to_wire() for p in port_statuses(spec.ports, router_url, namespace, name)]}


def admitted_allow(spec: SandboxResourceSpec) -> StatusFields:
    """``status.admittedEgressAllow`` for a new admission: the hosts the policy just judged,
    which the egress proxy enforces from then on (never the live spec)."""
    if spec.egress is not Egress.ALLOWLIST:
        return {}
    fields: StatusFields = {"admittedEgressAllow": list(spec.egress_allow)}
    if spec.egress_rules:  # absent without rules: what older Sandboxes' status holds
        fields["admittedEgressRules"] = [r.to_wire() for r in spec.egress_rules]
    return fields


# ---- suspension ------------------------------------------------------------------------------

SUSPENDED_BY_SPEC = "spec"
SUSPENDED_BY_IDLE = "idle"


@dataclass(frozen=True)
class Suspension:
    """Where a Sandbox stands on suspension, from its spec and what its status recorded.

    ``running``: neither suspended nor to be; ``suspend``: to be suspended now (``by`` says
    why); ``suspended``: suspended and staying so; ``resume``: suspended, and to be resumed.
    """

    state: Literal["running", "suspend", "suspended", "resume"]
    by: str | None = None


def suspension(
    spec: SandboxResourceSpec, status: SandboxStatusView, *, last_activity: datetime | None
) -> Suspension:
    """Suspended by the spec while ``spec.suspended``; suspended by idling until a use newer than
    the suspension (the client's last-activity stamp). Idling into suspension is the lifetime
    verdict's to decide (``Verdict.suspend``), not this function's."""
    recorded = status.suspended_by
    if spec.suspended:
        if recorded:
            return Suspension("suspended", SUSPENDED_BY_SPEC)
        return Suspension("suspend", SUSPENDED_BY_SPEC)
    if recorded == SUSPENDED_BY_IDLE:
        since = status.suspended_at
        if last_activity is None or since is None or last_activity <= since:
            return Suspension("suspended", SUSPENDED_BY_IDLE)
        return Suspension("resume")
    if recorded:
        return Suspension("resume")
    return Suspension("running")


def _ttl_reached(obj: SandboxView, spec: SandboxResourceSpec, now: datetime) -> datetime | None:
    """When the TTL ends the sandbox (``None`` when it has no creation time); whether it has is
    ``result <= now``."""
    created = obj.metadata.created
    if created is None:
        return None
    return created + timedelta(seconds=spec.sandbox_spec().lifetime.ttl_seconds)


def suspended_plan(
    obj: SandboxView,
    spec: SandboxResourceSpec,
    by: str,
    *,
    still_stopping: Sequence[str],
    now: datetime,
    kept: Observation | None = None,
    detail: str = "",
) -> Plan:
    """The status of a suspended (or suspending) Sandbox, and when to look again: the TTL still
    ends it (``Expired``, and everything disposed, work volume included).

    ``kept``: what the backend reports once the compute stopped; a serving object it keeps (a
    remote sandbox, stopped) stays in ``servedBy``, so a resume finds that one or refuses, never
    starting an empty one in its place. ``detail``: why, when the backend stopped it itself."""
    status = obj.status
    ttl_at = _ttl_reached(obj, spec, now)
    ttl = spec.sandbox_spec().lifetime.ttl_seconds
    if ttl_at is not None and ttl_at <= now:
        verdict = Verdict(
            False,
            R.EXPIRED,
            f"ttlSeconds ({ttl}) reached while suspended; the sandbox was disposed",
            terminal=True,
            dispose=True,
        )
        return Plan(
            conditions=((READY, False, verdict.reason, verdict.message),),
            fields={"suspendedBy": None},
            dispose=True,
            verdict=verdict,
        )
    fields: StatusFields = {"suspendedBy": by}
    if not status.suspended_by:
        fields["suspendedAt"] = cnd.now_rfc3339(now)
        if status.backend:
            # Counted only once something was admitted (and so created): a Sandbox created
            # suspended is started, not resumed, when its spec lets it go.
            fields["suspendCount"] = status.suspend_count + 1
    if not still_stopping:
        fields["servedBy"] = served_by_status(kept) if kept is not None else None
    why = "spec.suspended" if by == SUSPENDED_BY_SPEC else "idle timeout (idleAction suspend)"
    if detail:
        why = detail
    if still_stopping:
        message = f"suspending ({why}): stopping {', '.join(still_stopping[:3])}"
    else:
        resume = (
            "set spec.suspended to false to resume"
            if by == SUSPENDED_BY_SPEC
            else "any use through the client resumes it"
        )
        message = f"suspended ({why}): compute stopped, work volume kept; {resume}"
    requeue = None if ttl_at is None else max(0.0, (ttl_at - now).total_seconds()) + 0.05
    return Plan(
        conditions=((READY, False, R.SUSPENDED, message),),
        fields=fields,
        requeue_after=requeue,
    )


def resume_plan(obj: SandboxView, admission: Admission, *, now: datetime) -> Plan:
    """A suspended Sandbox admitted again: record the resume; the next pass starts it."""
    status = obj.status
    fields: StatusFields = {**admission.fields, "suspendedBy": None}
    message = "resuming: starting the compute on the kept work volume"
    if status.suspend_count:
        fields["resumedAt"] = cnd.now_rfc3339(now)
        fields["resumeCount"] = status.resume_count + 1
    else:
        message = "creating the sandbox (it was created suspended)"
    return Plan(
        conditions=(
            (ADMITTED, True, R.ADMITTED, admission.message),
            (READY, False, R.CREATING, message),
        ),
        fields=fields,
        requeue_after=0.0,
    )


def resuming(status: SandboxStatusView) -> bool:
    """Whether creating the serving objects now is a resume (start again on the kept storage)
    rather than a first start: the sandbox was resumed, and so ran before."""
    return bool(status.resumed_at)


def refused_resume_plan(admission: Admission) -> Plan:
    """A resume the policy refuses: it stays suspended (nothing starts), and both conditions carry
    the refusal, as for a new Sandbox. Its backend stays on record (its volume is there)."""
    fields: StatusFields = {}
    if "effectiveFloor" in admission.fields:
        fields["effectiveFloor"] = admission.fields["effectiveFloor"]
    return Plan(
        conditions=(
            (ADMITTED, False, admission.reason, f"resume refused: {admission.message}"),
            (READY, False, admission.reason, f"resume refused: {admission.message}"),
        ),
        fields=fields,
    )


# ---- step 2: plan ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What to do in this pass: conditions and fields to write, at most one action, and when
    to look again (seconds from ``now``; None: only a watch event brings the next pass)."""

    conditions: tuple[Cond, ...] = ()
    fields: StatusFields = field(default_factory=lambda: StatusFields())
    create: bool = False
    dispose: bool = False
    suspend: bool = False
    verdict: Verdict | None = None
    requeue_after: float | None = None


def refusal_plan(admission: Admission) -> Plan:
    return Plan(
        conditions=(
            (ADMITTED, False, admission.reason, admission.message),
            (READY, False, admission.reason, admission.message),
        ),
        fields=StatusFields(**admission.fields),
    )


def plan(
    obj: SandboxView,
    spec: SandboxResourceSpec,
    admission: Admission,
    observation: Observation,
    *,
    key_unclean: str | None,
    scope_problem: str,
    now: datetime,
    seal: Seal = NOT_CONFIGURED,
    resetting: bool = False,
) -> Plan:
    """The Ready verdict for an admitted Sandbox and what it takes to get there.

    ``resetting``: this pass retired the pod that served it (a reset, :func:`reset_wanted`):
    what is observed now is a new instance, judged as one starting (never Ready before, its
    startup clock from now).

    ``seal`` is whether idle pool pods are sealed until claimed (reconcile/seal.py): a Sandbox
    served from a pool records, once, whether its pod was sealed from its creation to the claim.

    ``key_unclean`` is asked for (and matters) only while nothing exists yet and the Sandbox
    was never Ready: an earlier sandbox of the same key must be disposed before this one starts.
    """
    meta, status = obj.metadata, obj.status
    was_ready = status.conditions.is_true(READY) and not resetting
    if observation.phase is ObservedPhase.ABSENT and not was_ready and not resetting:
        if admission.key is None:
            return refusal_plan(Admission(False, R.SCOPE_NOT_FOUND, scope_problem))
        if key_unclean:
            msg = f"refused until the earlier disposal lands: {key_unclean}"
            return refusal_plan(Admission(False, R.KEY_UNCLEAN, msg))

    admitted_cond = status.conditions.find(ADMITTED)
    admitted_at = (admitted_cond.since if admitted_cond and admitted_cond.is_true else None) or now
    for restarted in ("resumedAt", "resetAt"):
        restarted_at = now if resetting else timestamp(status.get(restarted))
        if restarted_at is not None and restarted_at > admitted_at:
            # A resumed or reset sandbox's startup clock (and its idle clock's floor) is the
            # resume or the reset.
            admitted_at = restarted_at
    if observation.ready_at is not None and observation.ready_at < admitted_at:
        # A pod started before this Sandbox was admitted (a warm pool's) serves it from the
        # admission on: its idle clock does not start earlier.
        observation = replace(observation, ready_at=admitted_at)
    ready_cond = status.conditions.find(READY)
    lifetime = spec.sandbox_spec().lifetime
    annotations = meta.annotations
    ready_since = ready_cond.since if was_ready and ready_cond is not None else None
    # Anyone who may annotate the Sandbox may write it: garbage or a stamp from the future is
    # ignored, one a little ahead is now (labels.read_last_activity).
    last_activity = lbl.read_last_activity(annotations.get(lbl.LAST_ACTIVITY_ANNOTATION), now)
    verdict = judge(
        observation,
        lifetime=lifetime,
        was_ready=was_ready,
        ready_since=ready_since,
        sandbox_created=meta.created,
        admitted_at=admitted_at,
        last_activity=last_activity,
        now=now,
    )
    conditions: list[Cond] = [(ADMITTED, True, R.ADMITTED, admission.message)]
    fields = StatusFields(**admission.fields)
    fields["servedBy"] = served_by_status(observation)
    if observation.served_by is not None:
        # Observed, not remembered: a restarted operator reports it the same.
        fields["servedFrom"] = observation.served_from or SERVED_FROM_COLD
        if fields["servedFrom"] != SERVED_FROM_COLD:
            # Judged at the claim (its status write is this one) and remembered after it: what
            # happens to the policies later cannot reach back before the claim.
            kept = None if resetting else status.sealed_until_claim
            covered = seal.covers(observation.created_at)
            fields["sealedUntilClaim"] = kept if isinstance(kept, bool) else covered
        elif resetting:
            fields["sealedUntilClaim"] = None  # judged of a pool pod that no longer serves it
    if verdict.create:
        conditions.append((READY, False, R.CREATING, "creating the sandbox"))
        return Plan(tuple(conditions), fields, create=True, verdict=verdict)
    if verdict.suspend:
        return Plan((), fields, suspend=True, verdict=verdict)
    conditions.append((READY, verdict.ready, verdict.reason, verdict.message))
    return Plan(
        tuple(conditions),
        fields,
        dispose=verdict.dispose,
        verdict=verdict,
        requeue_after=next_deadline(
            verdict,
            observation,
            lifetime_ttl=lifetime.ttl_seconds,
            lifetime_idle=lifetime.idle_timeout_seconds,
            startup_timeout=lifetime.startup_timeout_seconds,
            sandbox_created=meta.created,
            admitted_at=admitted_at,
            ready_since=ready_since if was_ready else observation.ready_at,
            last_activity=last_activity,
            now=now,
        ),
    )


def served_by_status(obs: Observation) -> ServedByStatus | None:
    """``status.servedBy`` for what the driver observed serving the sandbox."""
    return served_by_wire(obs.served_by)


def next_deadline(
    verdict: Verdict,
    observation: Observation,
    *,
    lifetime_ttl: float,
    lifetime_idle: float,
    startup_timeout: float,
    sandbox_created: datetime | None,
    admitted_at: datetime | None,
    ready_since: datetime | None,
    last_activity: datetime | None,
    now: datetime,
) -> float | None:
    """Seconds until the verdict could change without any watch event: the startup timeout
    while starting, TTL or idle timeout while Ready, or when the driver asked to look again.
    None once terminal (only a failed disposal is retried, by the caller)."""
    if verdict.terminal:
        return None
    candidates: list[datetime] = []
    if observation.recheck_at is not None:
        candidates.append(observation.recheck_at)
    if verdict.ready:
        if sandbox_created is not None:
            candidates.append(sandbox_created + timedelta(seconds=lifetime_ttl))
        idle_from = max(
            (t for t in (ready_since, observation.ready_at, last_activity) if t is not None),
            default=None,
        )
        if idle_from is not None:
            candidates.append(idle_from + timedelta(seconds=lifetime_idle))
    else:
        started = observation.created_at or admitted_at
        if started is not None:
            candidates.append(started + timedelta(seconds=startup_timeout))
    if not candidates:
        return None
    # A little after the deadline, so the pass that runs then sees it passed.
    return max(0.0, (min(candidates) - now).total_seconds()) + 0.05
