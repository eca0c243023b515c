"""Reconcile one Sandbox: resolve its scope, ask the policy, create or observe, write conditions.

Level-based and idempotent: every pass reads the Sandbox, its SandboxScope and the backend's
objects afresh and derives the status from them, so any replica (or a restarted one) converges,
and a pass interrupted anywhere is simply repeated. The status is written only when it changed,
with the object's resourceVersion as a precondition (a concurrent writer makes us re-read).
No policy lives here: admission is ``sandbox_operator.policy.select_backend``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from sandbox_operator import labels as lbl
from sandbox_operator.backends.base import (
    BackendDriver,
    DisposalError,
    EnsureRequest,
    Observation,
    ObservedPhase,
    SandboxRef,
    ServedBy,
    StartupError,
    TransientError,
)
from sandbox_operator.config import profiles
from sandbox_operator.contract import (
    SANDBOX_PLURAL,
    ConditionReason,
    ConditionType,
    DisposalFailure,
    SandboxKey,
    SandboxRefusal,
    SandboxResourceSpec,
    SandboxScopeResourceSpec,
    parse_isolation,
)
from sandbox_operator.policy import check_call_key, effective_floor, select_backend
from sandbox_operator.reconcile import conditions as cnd
from sandbox_operator.reconcile.kube import Conflict
from sandbox_operator.reconcile.lifecycle import TERMINAL_REASONS, Verdict, judge
from sandbox_operator.reconcile.runtime import Runtime

log = logging.getLogger(__name__)

ADMITTED = ConditionType.ADMITTED.value
READY = ConditionType.READY.value
DISPOSED = ConditionType.DISPOSED.value
R = ConditionReason

#: Reasons reported as Normal events; every other reason is a Warning.
NORMAL_REASONS = frozenset({R.ADMITTED, R.CREATING, R.READY, R.DISPOSING, R.DISPOSED, R.PURGED})


class EnsurePending(Exception):
    """Creating the backend objects failed transiently; the status says so (``Creating``) and the
    handler retries after ``delay`` (the startup deadline still applies on every pass)."""

    def __init__(self, message: str, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class DisposalPending(Exception):
    """Disposal did not land; the finalizer stays and the handler retries after ``delay``."""

    def __init__(self, message: str, delay: float) -> None:
        super().__init__(message)
        self.delay = delay


@dataclass
class Draft:
    """The status being computed for one object, compared with the old one at write time."""

    obj: Mapping[str, Any]
    values: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        old = self.old
        self.values = {
            "conditions": [dict(c) for c in old.get("conditions") or []],
            "observedGeneration": self.generation,
        }

    @property
    def old(self) -> Mapping[str, Any]:
        return self.obj.get("status") or {}

    @property
    def generation(self) -> int | None:
        gen = (self.obj.get("metadata") or {}).get("generation")
        return int(gen) if gen is not None else None

    def cond(self, ctype: str, status: bool | str, reason: str, message: str) -> None:
        value = status if isinstance(status, str) else ("True" if status else "False")
        self.values["conditions"] = cnd.set_condition(
            self.values["conditions"], ctype, value, str(reason), message, self.generation
        )

    def set(self, **fields: Any) -> None:
        self.values.update(fields)

    def reason(self, ctype: str) -> str | None:
        c = cnd.find(self.values["conditions"], ctype)
        return None if c is None else str(c.get("reason"))


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = obj.get("metadata") or {}
    return meta


async def write_status(rt: Runtime, plural: str, draft: Draft) -> bool:
    """Patch the status if it changed; post an Event for each condition whose reason changed.

    Raises :class:`Conflict` when the object changed since it was read.
    """
    meta = _meta(draft.obj)
    patch = cnd.status_patch(draft.old, draft.values)
    if patch is None:
        return False
    if list(patch) == ["observedGeneration"] and draft.old.get("observedGeneration") is not None:
        pass  # generation moved on: still worth recording
    await rt.kube.patch_status(
        plural, meta["namespace"], meta["name"], patch, meta.get("resourceVersion")
    )
    old_conds = draft.old.get("conditions") or []
    for ctype in (ADMITTED, READY, DISPOSED):
        new = cnd.find(draft.values["conditions"], ctype)
        old = cnd.find(old_conds, ctype)
        if new is None or (
            old is not None
            and old.get("reason") == new.get("reason")
            and old.get("status") == new.get("status")
        ):
            continue
        if ctype == READY and draft.reason(ADMITTED) == new.get("reason"):
            continue  # a refusal is reported once, on Admitted
        reason = str(new.get("reason"))
        type_ = "Normal" if reason in NORMAL_REASONS else "Warning"
        await rt.kube.post_event(
            draft.obj, type_=type_, reason=reason, message=str(new.get("message", ""))
        )
    return True


def _time(value: Any) -> datetime | None:
    return cnd.parse_time(value)


def _served_by(obs: Observation) -> dict[str, Any] | None:
    if obs.served_by is None:
        return None
    out = {"kind": obs.served_by.kind, "name": obs.served_by.name}
    if obs.served_by.namespace:
        out["namespace"] = obs.served_by.namespace
    return out


def recorded_served_by(status: Mapping[str, Any] | None) -> ServedBy | None:
    """What ``status.servedBy`` recorded, for dispose (``None`` when nothing was recorded)."""
    raw = (status or {}).get("servedBy")
    if not isinstance(raw, Mapping) or not raw.get("kind") or not raw.get("name"):
        return None
    return ServedBy(str(raw["kind"]), str(raw["name"]), str(raw.get("namespace") or ""))


def egress_admitted(status: Mapping[str, Any] | None) -> datetime | None:
    """When the egress proxy says it admitted the sandbox (``status.egress.admitted``), if so."""
    egress = (status or {}).get("egress")
    if not isinstance(egress, Mapping):
        return None
    return _time(egress.get("admitted"))


def sandbox_ref(obj: Mapping[str, Any], served_by: ServedBy | None = None) -> SandboxRef:
    """The reference drivers get: the Sandbox plus what serves it (observed, else recorded) and
    what its status says of the egress proxy."""
    meta = _meta(obj)
    status = obj.get("status")
    return SandboxRef(
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        str(meta.get("uid", "")),
        served_by or recorded_served_by(status),
        egress_admitted(status),
    )


async def key_unclean(rt: Runtime, namespace: str, key: SandboxKey, uid: str) -> str | None:
    """Why the key is not clean (an earlier sandbox of this key is not disposed yet), or None.

    Found by labels alone: another Sandbox of the key that is being deleted or whose disposal
    failed, or backend objects of the key that belong to another Sandbox.
    """
    for other in await rt.kube.list_sandboxes(namespace, lbl.key_selector(key)):
        ometa = _meta(other)
        if ometa.get("uid") == uid:
            continue
        name = ometa.get("name")
        if ometa.get("deletionTimestamp"):
            return f"Sandbox {name} with the same key is still being disposed"
        if cnd.reason_of(other.get("status"), DISPOSED) == R.DISPOSAL_FAILED:
            return f"disposal of Sandbox {name} with the same key failed and has not landed yet"
    for driver in rt.drivers.values():
        try:
            objects = await driver.list_by_key(namespace, key)
        except Exception as exc:
            return f"cannot list backend {driver.name} for this key: {type(exc).__name__}"
        for o in objects:
            if (o.owner_uid and o.owner_uid != uid) or o.deleting:
                return f"{o.kind} {o.name} of an earlier sandbox with this key is not disposed yet"
    return None


async def reconcile_sandbox(rt: Runtime, namespace: str, name: str) -> None:
    async with rt.lock(namespace, name):
        for _ in range(5):
            try:
                await _reconcile_once(rt, namespace, name)
                return
            except Conflict:
                continue
        log.info("sandbox %s/%s: status kept changing under us; next pass retries", namespace, name)


async def _dispose_into(
    rt: Runtime, drivers: list[BackendDriver], ref: SandboxRef, draft: Draft
) -> DisposalFailure | None:
    failure: DisposalFailure | None = None
    for driver in drivers:
        try:
            await driver.dispose(ref)
        except DisposalError as exc:
            failure = failure or exc.failure
    if failure is None:
        draft.cond(DISPOSED, True, R.DISPOSED, "backend objects removed")
    else:
        draft.cond(
            DISPOSED,
            False,
            R.DISPOSAL_FAILED,
            f"disposal failed ({failure.code.value}) on backend {failure.backend}: "
            f"{failure.detail}",
        )
    return failure


def _drivers_for(rt: Runtime, status: Mapping[str, Any]) -> list[BackendDriver]:
    backend = status.get("backend")
    if backend in rt.drivers:
        return [rt.drivers[backend]]
    return list(rt.drivers.values())


async def _reconcile_once(rt: Runtime, namespace: str, name: str) -> None:
    obj = await rt.kube.get_sandbox(namespace, name)
    if obj is None or _meta(obj).get("deletionTimestamp"):
        return
    meta = _meta(obj)
    uid = str(meta.get("uid", ""))
    draft = Draft(obj)
    old = draft.old
    ref = SandboxRef(namespace, name, uid)
    now = datetime.now(UTC)

    # Terminal: nothing is created again; only a disposal that has not landed is retried.
    if draft.reason(READY) in TERMINAL_REASONS and not cnd.is_true(old, READY):
        if not cnd.is_true(old, DISPOSED):
            await _dispose_into(rt, _drivers_for(rt, old), sandbox_ref(obj), draft)
            await write_status(rt, SANDBOX_PLURAL, draft)
        return

    try:
        spec = SandboxResourceSpec.model_validate(obj.get("spec") or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        msg = f"spec is invalid: {where}: {first['msg']}"
        draft.cond(ADMITTED, False, R.STARTUP_FAILED, msg)
        draft.cond(READY, False, R.STARTUP_FAILED, msg)
        await write_status(rt, SANDBOX_PLURAL, draft)
        return
    sandbox_spec = spec.sandbox_spec()

    was_ready = cnd.is_true(old, READY)
    admitted = cnd.is_true(old, ADMITTED) and old.get("backend") in rt.drivers

    # The scope gives the key (and its floors); it is needed until the objects exist.
    scope_obj = await rt.kube.get_scope(namespace, spec.scope_ref)
    scope_spec: SandboxScopeResourceSpec | None = None
    scope_problem = ""
    if scope_obj is None:
        scope_problem = f"SandboxScope {spec.scope_ref!r} not found in namespace {namespace}"
    elif _meta(scope_obj).get("deletionTimestamp"):
        scope_problem = f"SandboxScope {spec.scope_ref!r} is being deleted"
    else:
        try:
            scope_spec = SandboxScopeResourceSpec.model_validate(scope_obj.get("spec") or {})
        except ValidationError:
            scope_problem = f"SandboxScope {spec.scope_ref!r} has an invalid spec"

    key: SandboxKey | None = None
    if scope_spec is not None:
        key = spec.key(scope_spec.scope, scope_spec.thread_id)
        want_labels = lbl.key_labels(key)
        want_labels[lbl.SANDBOX_LABEL] = lbl.sandbox_label_value(name)
        want_ann = lbl.key_annotations(key)
        have_labels = meta.get("labels") or {}
        have_ann = meta.get("annotations") or {}
        if any(have_labels.get(k) != v for k, v in want_labels.items()) or any(
            have_ann.get(k) != v for k, v in want_ann.items()
        ):
            patched = await rt.kube.patch_metadata(
                SANDBOX_PLURAL, namespace, name, want_labels, want_ann
            )
            if patched is None:
                return
            obj = patched
            draft = Draft(obj)

    if not admitted:
        if scope_spec is None:
            draft.cond(ADMITTED, False, R.SCOPE_NOT_FOUND, scope_problem)
            draft.cond(READY, False, R.SCOPE_NOT_FOUND, scope_problem)
            await write_status(rt, SANDBOX_PLURAL, draft)
            return
        await rt.refresh_availability()
        floor = effective_floor(
            rt.config.host_policy, sandbox_spec, scope_floor=scope_spec.min_isolation
        )
        try:
            check_call_key(
                rt.config.host_policy,
                sandbox_spec,
                spec.call_id,
                scope_min_isolation_scope=scope_spec.min_isolation_scope,
            )
            admission = select_backend(
                rt.config.host_policy,
                profiles(rt.config, rt.unavailable),
                sandbox_spec,
                scope_floor=scope_spec.min_isolation,
                scope_min_isolation_scope=scope_spec.min_isolation_scope,
            )
        except SandboxRefusal as refusal:
            reason = refusal.reason.value
            draft.cond(ADMITTED, False, reason, refusal.message)
            draft.cond(READY, False, reason, refusal.message)
            draft.set(
                backend=None,
                isolation=None,
                servedBy=None,
                effectiveFloor=floor.isolation.value,
            )
            await write_status(rt, SANDBOX_PLURAL, draft)
            return
        backend_name = admission.backend.name
        draft.set(
            backend=backend_name,
            isolation=parse_isolation(admission.backend.isolation).value,
            effectiveFloor=admission.floor.value,
            isolationScope=admission.isolation_scope.value,
        )
        isolation_scope = admission.isolation_scope
        admit_msg = (
            f"admitted to backend {backend_name} (isolation {admission.backend.isolation}, "
            f"effective floor {admission.floor.value})"
        )
    else:
        backend_name = str(old["backend"])
        isolation_scope = sandbox_spec.isolation_scope
        if old.get("isolationScope"):
            from sandbox_operator.contract import IsolationScope

            isolation_scope = IsolationScope(old["isolationScope"])
        admit_msg = str((cnd.find(old.get("conditions"), ADMITTED) or {}).get("message", ""))

    driver = rt.drivers[backend_name]
    ref = sandbox_ref(obj)  # with the recorded servedBy: drivers may look there too
    obs = await driver.observe(ref)

    if obs.phase is ObservedPhase.ABSENT and not was_ready:
        if key is None:
            draft.cond(ADMITTED, False, R.SCOPE_NOT_FOUND, scope_problem)
            draft.cond(READY, False, R.SCOPE_NOT_FOUND, scope_problem)
            await write_status(rt, SANDBOX_PLURAL, draft)
            return
        unclean = await key_unclean(rt, namespace, key, uid)
        if unclean:
            msg = f"refused until the earlier disposal lands: {unclean}"
            draft.cond(ADMITTED, False, R.KEY_UNCLEAN, msg)
            draft.cond(READY, False, R.KEY_UNCLEAN, msg)
            await write_status(rt, SANDBOX_PLURAL, draft)
            return

    draft.cond(ADMITTED, True, R.ADMITTED, admit_msg)
    admitted_cond = cnd.find(draft.values["conditions"], ADMITTED) or {}
    ready_cond = cnd.find(old.get("conditions"), READY) or {}
    lifetime = sandbox_spec.lifetime
    annotations = meta.get("annotations") or {}

    def verdict_for(observation: Observation) -> Verdict:
        return judge(
            observation,
            lifetime=lifetime,
            was_ready=was_ready,
            ready_since=_time(ready_cond.get("lastTransitionTime")) if was_ready else None,
            sandbox_created=_time(meta.get("creationTimestamp")),
            admitted_at=_time(admitted_cond.get("lastTransitionTime")) or now,
            last_activity=_time(annotations.get(lbl.LAST_ACTIVITY_ANNOTATION)),
            now=now,
        )

    verdict = verdict_for(obs)
    if verdict.create:
        assert key is not None
        if not cnd.is_true(draft.old, ADMITTED):
            # Record the admission (and so the startup clock) before anything is created: an
            # ensure that fails or never returns must still leave Admitted and a deadline.
            draft.cond(READY, False, R.CREATING, "creating the sandbox")
            written = await write_status(rt, SANDBOX_PLURAL, draft)
            if written:
                fresh = await rt.kube.get_sandbox(namespace, name)
                if fresh is None or _meta(fresh).get("uid") != uid:
                    return
                obj, draft = fresh, Draft(fresh)
                draft.cond(ADMITTED, True, R.ADMITTED, admit_msg)
        request = EnsureRequest(
            sandbox=ref,
            key=key,
            spec=sandbox_spec,
            isolation_scope=isolation_scope,
            labels=lbl.object_labels(key, name, backend_name),
            annotations=lbl.key_annotations(key),
        )
        try:
            await driver.ensure(request)
        except StartupError as exc:
            if exc.reason == R.KEY_UNCLEAN:
                draft.cond(ADMITTED, False, R.KEY_UNCLEAN, exc.message)
                draft.cond(READY, False, R.KEY_UNCLEAN, exc.message)
                await write_status(rt, SANDBOX_PLURAL, draft)
                return
            verdict = Verdict(False, R.STARTUP_FAILED, exc.message, terminal=True, dispose=True)
        except Exception as exc:  # transient: a 5xx, a 429, a dropped connection, ...
            what = exc.message if isinstance(exc, TransientError) else type(exc).__name__
            retry_after = exc.retry_after if isinstance(exc, TransientError) else None
            log.warning("sandbox %s/%s: creating failed, will retry: %s", namespace, name, what)
            draft.cond(READY, False, R.CREATING, f"creating the sandbox failed, retrying: {what}")
            draft.set(servedBy=None)
            await write_status(rt, SANDBOX_PLURAL, draft)
            raise EnsurePending(what, retry_after) from None
        else:
            obs = await driver.observe(ref)
            verdict = verdict_for(obs)
            if verdict.create:
                verdict = Verdict(False, R.CREATING, "creating the sandbox")

    draft.cond(READY, verdict.ready, verdict.reason, verdict.message)
    draft.set(servedBy=_served_by(obs))
    if verdict.dispose:
        target = sandbox_ref(obj, obs.served_by)
        if await _dispose_into(rt, [driver], target, draft) is not None and target.served_by:
            # Keep what is still to be disposed on record: the retry needs it, listed or not.
            draft.set(servedBy=_served_by(Observation(obs.phase, target.served_by)))
    await write_status(rt, SANDBOX_PLURAL, draft)


async def finalize_sandbox(rt: Runtime, namespace: str, name: str) -> None:
    """Dispose everything that serves the Sandbox; raise :class:`DisposalPending` if that fails."""
    async with rt.lock(namespace, name):
        obj = await rt.kube.get_sandbox(namespace, name)
        if obj is None:
            return
        draft = Draft(obj)
        terminal = draft.reason(READY) in TERMINAL_REASONS and not cnd.is_true(draft.old, READY)
        if not terminal:
            draft.cond(READY, False, R.DISPOSING, "the Sandbox is being deleted")
        if not cnd.is_true(draft.old, DISPOSED):
            draft.cond(DISPOSED, False, R.DISPOSING, "disposing backend objects")
        with contextlib.suppress(Conflict):
            await write_status(rt, SANDBOX_PLURAL, draft)
        obj = await rt.kube.get_sandbox(namespace, name) or obj
        draft = Draft(obj)
        failure = await _dispose_into(rt, _drivers_for(rt, draft.old), sandbox_ref(obj), draft)
        if failure is not None and not terminal:
            draft.cond(READY, False, R.DISPOSAL_FAILED, "disposal failed; see Disposed")
        with contextlib.suppress(Conflict):
            await write_status(rt, SANDBOX_PLURAL, draft)
        if failure is not None:
            raise DisposalPending(
                f"disposal failed ({failure.code.value}): {failure.detail}",
                rt.config.operator.disposal_retry_seconds,
            )
    rt.forget(namespace, name)
