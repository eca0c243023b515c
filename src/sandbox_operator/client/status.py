"""What a Sandbox object says, read through the contract's models: its status (conditions, what
serves it, suspension), the key its annotations carry, and what a wait on it concludes.

The status is parsed with :class:`SandboxResourceStatus`, the model the CRD is generated from, so
the client and the operator read one vocabulary (condition types and reasons are the enums). The
API server already holds a stored status to that schema; the client must still never crash on
one it cannot fully read (an operator newer than the client may write fields this client does not
know; test doubles and hand-made objects write partial conditions). So the parse is lenient, and
deliberately so:

* keys the models do not know are dropped (the contract models forbid extras);
* a condition without ``lastTransitionTime`` (which the client never reads) is read with the
  epoch;
* when the status as a whole does not validate, each field is kept only when it validates on its
  own, and each condition only when it does; what is dropped is logged at debug level.

A status that reads as nothing is the empty status: the Sandbox is pending.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from sandbox_operator import labels as lbl
from sandbox_operator.client.errors import acquire_error_for
from sandbox_operator.client.observer import EffectiveState
from sandbox_operator.contract import (
    Capability,
    ConditionReason,
    ConditionStatus,
    ConditionType,
    SandboxKey,
    SandboxSpec,
)
from sandbox_operator.contract.resources import Condition, SandboxResourceStatus, ServedBy
from sandbox_operator.views import SandboxView

log = logging.getLogger(__name__)

__all__ = [
    "RESET_REFUSED",
    "Goal",
    "ResetTo",
    "effective_state",
    "evaluate",
    "evaluate_for",
    "is_suspended",
    "key_from_object",
    "read_status",
    "served_by",
]


@dataclass(frozen=True)
class ResetTo:
    """A reset's wait: done once the operator reports Ready for a pod that answers
    ``spec.resets`` = ``count`` (``status.resets``); terminal ``ResetRefused`` when the operator
    says the backend cannot reset."""

    count: int


#: ``status`` reason of a reset refused (``status.resetRefused``), as a wait reports it.
RESET_REFUSED = "ResetRefused"

#: A wait's verdict on an object: ("ready" | "pending" | "terminal", reason, message).
Verdict = tuple[str, str, str]


class JudgedGoal(Protocol):
    """A wait whose goal another module judges (an egress edit's,
    :class:`~sandbox_operator.client.egressedits.EgressEditAt`): its verdict on each version of
    the object, "ready" once reached."""

    def verdict(self, obj: SandboxView) -> Verdict: ...


#: What a wait is for: ``ready`` (acquire: Suspended is terminal), ``resumed`` (a wait that
#: resumed the sandbox: Suspended is on its way back unless the spec says suspended again),
#: ``suspended`` (a suspend: done once the operator reports Suspended for the current spec),
#: a reset (:class:`ResetTo`), or a goal judged elsewhere (:class:`JudgedGoal`).
Goal = Literal["ready", "resumed", "suspended"] | ResetTo | JudgedGoal

#: A value of a wire mapping (kept as it is by :func:`_known`).
V = TypeVar("V")

_EMPTY = SandboxResourceStatus()
#: What a condition without ``lastTransitionTime`` is read with (the client never reads it).
_EPOCH = "1970-01-01T00:00:00Z"


def _aliases(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(field.alias or name for name, field in model.model_fields.items())


_STATUS_KEYS = _aliases(SandboxResourceStatus)
_CONDITION_KEYS = _aliases(Condition)
_SERVED_BY_KEYS = _aliases(ServedBy)


def _known(raw: Mapping[str, V], keys: frozenset[str]) -> dict[str, V]:
    return {k: v for k, v in raw.items() if k in keys}


def _condition(raw: object) -> Condition | None:
    """One raw condition, unknown keys dropped and ``lastTransitionTime`` defaulted, as the
    contract's model; None when it is not a valid :class:`Condition` even then."""
    if not isinstance(raw, Mapping):
        return None
    try:
        return Condition.model_validate(
            {"lastTransitionTime": _EPOCH, **_known(raw, _CONDITION_KEYS)}
        )
    except ValidationError:
        log.debug("sandbox status: dropped a condition the contract does not accept")
        return None


def _prepared(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The status's known fields as the status model's validation takes them (the decoder's
    input: values as the wire holds them, the conditions already read into the model)."""
    fields = _known(raw, _STATUS_KEYS)
    conditions = fields.get("conditions")
    if isinstance(conditions, Iterable) and not isinstance(conditions, str | bytes | Mapping):
        fields["conditions"] = [c for c in map(_condition, conditions) if c is not None]
    served = fields.get("servedBy")
    if isinstance(served, Mapping):
        fields["servedBy"] = _known(served, _SERVED_BY_KEYS)
    return fields


def read_status(obj: SandboxView) -> SandboxResourceStatus:
    """The status of a Sandbox object as the contract's model (leniently: see the module).

    Like every reader this module exports, it takes the Sandbox's view (the client's API calls
    answer views); a plain dict handed by a caller outside the type checker is wrapped."""
    raw = SandboxView.of(obj).raw_status
    if not raw:
        return _EMPTY
    fields = _prepared(raw)
    try:
        return SandboxResourceStatus.model_validate(fields)
    except ValidationError:
        pass
    kept = {key: value for key, value in fields.items() if _validates(key, value)}
    return SandboxResourceStatus.model_validate(kept)


def _validates(key: str, value: object) -> bool:
    """Whether one status field validates on its own (logged at debug level when not)."""
    try:
        SandboxResourceStatus.model_validate({key: value})
    except ValidationError:
        log.debug("sandbox status: dropped %s, which the contract does not accept", key)
        return False
    return True


def _conditions(status: SandboxResourceStatus) -> dict[str, Condition]:
    return {c.type: c for c in status.conditions}


def _stale(obj: SandboxView, status: SandboxResourceStatus) -> bool:
    """The status was computed for an older generation: it says nothing about this one."""
    generation = obj.metadata.generation
    observed = status.observed_generation
    return bool(observed is not None and generation and observed < generation)


def served_by(obj: SandboxView) -> ServedBy | None:
    """What serves the Sandbox now (``status.servedBy``), if anything."""
    return read_status(obj).served_by


def effective_state(
    obj: SandboxView,
    spec: SandboxSpec,
    *,
    host_tools: Sequence[str] = (),
    call: str | None = None,
) -> EffectiveState:
    """The :class:`EffectiveState` of a served Sandbox, from the status the operator wrote
    (``obj``: the Sandbox's view)."""
    status = read_status(obj)
    allow = status.admitted_egress_allow
    required = tuple(c.value for c in Capability if c in spec.requires)
    return EffectiveState(
        backend=status.backend,
        isolation=_value(status.isolation),
        isolation_floor=_value(status.effective_floor),
        isolation_scope=_value(status.isolation_scope),
        served_by_kind=status.served_by.kind if status.served_by else None,
        served_from=status.served_from,
        egress=spec.egress.value,
        egress_allow=tuple(str(h) for h in (allow if allow is not None else spec.egress_allow)),
        capabilities_required=required,
        capabilities_matched=required,
        capabilities_offered=None,
        host_tools=tuple(host_tools),
        call=call,
    )


def _value(member: Enum | None) -> str | None:
    return None if member is None else str(member.value)


def key_from_object(obj: SandboxView) -> SandboxKey | None:
    """The sandbox key a Sandbox object carries in its annotations (None if it carries none)."""
    ann = SandboxView.of(obj).metadata.annotations
    try:
        return SandboxKey(
            scope=ann[lbl.SCOPE_ANNOTATION],
            thread_id=ann[lbl.THREAD_ANNOTATION],
            agent_dir=ann[lbl.AGENT_DIR_ANNOTATION],
            call_id=ann.get(lbl.CALL_ANNOTATION, ""),
        )
    except (KeyError, ValueError):
        return None


def evaluate(obj: SandboxView) -> Verdict:
    """("ready" | "pending" | "terminal", reason, message) for a Sandbox object."""
    return _evaluate(SandboxView.of(obj))


def _evaluate(obj: SandboxView) -> Verdict:
    status = read_status(obj)
    conds = _conditions(status)
    disposed = conds.get(ConditionType.DISPOSED)
    if disposed is not None and disposed.status is ConditionStatus.TRUE:
        return "terminal", disposed.reason, disposed.message
    admitted = conds.get(ConditionType.ADMITTED)
    stale = _stale(obj, status)
    refused = admitted is not None and admitted.status is ConditionStatus.FALSE and not stale
    if admitted is not None and refused and acquire_error_for(admitted.reason) is not None:
        return "terminal", admitted.reason, admitted.message
    ready = conds.get(ConditionType.READY)
    if ready is not None and not stale:
        if ready.status is ConditionStatus.TRUE:
            return "ready", ready.reason, ""
        if acquire_error_for(ready.reason) is not None:
            return "terminal", ready.reason, ready.message
        return "pending", ready.reason, ready.message
    return "pending", admitted.reason if admitted else ConditionReason.PENDING.value, ""


def _suspended_now(obj: SandboxView) -> bool:
    """The operator reports the Sandbox suspended for its current spec (Ready=False Suspended)."""
    status = read_status(obj)
    ready = _conditions(status).get(ConditionType.READY)
    return (
        ready is not None
        and not _stale(obj, status)
        and ready.status is ConditionStatus.FALSE
        and ready.reason == ConditionReason.SUSPENDED
    )


def is_suspended(obj: SandboxView) -> bool:
    """Whether a Sandbox object is suspended or on its way there, whatever suspended it: its spec
    says ``suspended``, or its status says it is (``suspendedBy``, Ready reason ``Suspended``)."""
    view = SandboxView.of(obj)
    if view.suspended:
        return True
    status = read_status(view)
    if status.suspended_by:
        return True
    ready = _conditions(status).get(ConditionType.READY)
    return ready is not None and ready.reason == ConditionReason.SUSPENDED


def _evaluate_reset(obj: SandboxView, count: int) -> Verdict:
    """Ready counts only for a pod that answers reset ``count``."""
    status = read_status(obj)
    if status.resets >= count:
        return _evaluate(obj)
    if status.reset_refused and not _stale(obj, status):
        return "terminal", RESET_REFUSED, status.reset_refused
    state, reason, message = _evaluate(obj)
    return ("pending", reason, message) if state == "ready" else (state, reason, message)


def evaluate_for(obj: SandboxView, goal: Goal) -> Verdict:
    """:func:`evaluate` for a wait with a goal; "ready" means the goal is reached."""
    return _evaluate_for(SandboxView.of(obj), goal)


def _evaluate_for(obj: SandboxView, goal: Goal) -> Verdict:
    suspended = ConditionReason.SUSPENDED.value
    if isinstance(goal, ResetTo):
        return _evaluate_reset(obj, goal.count)
    if not isinstance(goal, str):
        return goal.verdict(obj)
    if goal == "suspended":
        if _suspended_now(obj):
            return "ready", suspended, ""
        state, reason, message = _evaluate(obj)
        # Ready (still, or for an older spec) is on its way to Suspended.
        return ("pending", reason, message) if state == "ready" else (state, reason, message)
    state, reason, message = _evaluate(obj)
    if goal == "resumed" and state == "terminal" and reason == suspended:
        if obj.suspended:
            # Suspended again (spec.suspended true) while the resume was waited on.
            return "terminal", reason, message or "spec.suspended was set again"
        return "pending", reason, message
    return state, reason, message
