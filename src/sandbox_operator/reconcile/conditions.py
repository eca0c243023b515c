"""Status conditions as the contract's :class:`Condition` models, and when a status write is needed.

A status being computed holds its conditions as models (typed, validated once when read); they
become wire dicts (camelCase, unset fields omitted) only where a status is written
(``status.Draft.values``). ``lastTransitionTime`` moves only when a condition's status flips; a
new reason or message under the same status keeps it.

A held object's conditions are read through the views (``sandbox_operator.views.Conditions``),
without decoding a whole status.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from sandbox_operator.contract import Condition, ConditionReason, ConditionStatus, ConditionType
from sandbox_operator.reconcile.statusfields import StatusWrite
from sandbox_operator.views import Conditions, StatusView

log = logging.getLogger(__name__)

_ORDER: tuple[str, ...] = (ConditionType.ADMITTED, ConditionType.READY, ConditionType.DISPOSED)

MAX_MESSAGE = 4096


def now_rfc3339(now: datetime | None = None) -> str:
    return _now(now).strftime("%Y-%m-%dT%H:%M:%SZ")


def _now(now: datetime | None) -> datetime:
    """The transition time written: UTC, whole seconds (as ``now_rfc3339`` spells it)."""
    return (now or datetime.now(UTC)).astimezone(UTC).replace(microsecond=0)


def status_of(value: bool | ConditionStatus) -> ConditionStatus:
    """``True``/``False`` as the condition status it reports."""
    if isinstance(value, ConditionStatus):
        return value
    return ConditionStatus.TRUE if value else ConditionStatus.FALSE


def parse_conditions(held: Conditions) -> list[Condition]:
    """The conditions of a status as read from the API server (a view of its list), as models.
    The CRD's schema holds them to the same shape, so none is dropped in practice; one that does
    not validate (written around the schema) is left out, and logged, rather than failing every
    pass."""
    out: list[Condition] = []
    for cond in held:
        try:
            out.append(Condition.model_validate(cond.raw))
        except ValidationError:
            kind = cond.type
            log.warning("ignoring a status condition that does not validate: %r", kind)
    return out


def condition(conditions: Iterable[Condition], ctype: ConditionType | str) -> Condition | None:
    for cond in conditions:
        if cond.type == ctype:
            return cond
    return None


def with_condition(
    conditions: Sequence[Condition],
    ctype: ConditionType,
    status: bool | ConditionStatus,
    reason: ConditionReason,
    message: str,
    generation: int | None,
    now: datetime | None = None,
) -> list[Condition]:
    """A new condition list with ``ctype`` set; other conditions are kept unchanged."""
    value = status_of(status)
    message = message[:MAX_MESSAGE]
    out: list[Condition] = []
    replaced = False
    for cond in conditions:
        if cond.type != ctype:
            out.append(cond)
            continue
        replaced = True
        transition = cond.last_transition_time if cond.status == value else _now(now)
        out.append(_condition(ctype, value, reason, message, generation, transition))
    if not replaced:
        out.append(_condition(ctype, value, reason, message, generation, _now(now)))
    out.sort(key=lambda c: _ORDER.index(c.type) if c.type in _ORDER else len(_ORDER))
    return out


def set_condition(
    conditions: list[Any] | None,
    ctype: str,
    status: str,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """:func:`with_condition` on the wire's list (as read from the API server, read through
    :class:`Conditions`), giving the conditions' wire encodings."""
    models = with_condition(
        parse_conditions(Conditions(conditions)),
        ConditionType(ctype),
        ConditionStatus(status),
        ConditionReason(reason),
        message,
        generation,
        now,
    )
    return [c.to_wire() for c in models]


def _condition(
    ctype: ConditionType,
    status: ConditionStatus,
    reason: ConditionReason,
    message: str,
    generation: int | None,
    transition: datetime,
) -> Condition:
    return Condition(
        type=ctype.value,
        status=status,
        reason=ConditionReason(reason).value,
        message=message,
        last_transition_time=transition,
        observed_generation=generation,
    )


def _normalize(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _normalize(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_normalize(v) for v in value]
    return value


def status_patch(old: StatusView | None, new: StatusWrite) -> dict[str, Any] | None:
    """The merge patch (the JSON sent) that turns ``old`` into ``new`` for the keys of ``new``,
    or None.

    Only top-level keys present in ``new`` are compared; a key set to None in ``new`` is removed.
    Nothing is returned when nothing changed, so an unchanged status is never written.
    """
    held = old if old is not None else StatusView(None)
    patch = {key: value for key, value in new.items() if _changed(held.get(key), value)}
    return patch or None


def _changed(old: object, new: object) -> bool:
    """Whether a status field differs from what is held (None: removed, if held)."""
    if new is None:
        return old is not None
    return bool(_normalize(old) != _normalize(new))
