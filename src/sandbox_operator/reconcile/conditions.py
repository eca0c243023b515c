"""Status conditions in the shape of metav1.Condition, and when a status write is needed.

Conditions are kept as wire dicts (camelCase), exactly as the API server returns them, so that
"did anything change" is a plain comparison. ``lastTransitionTime`` moves only when a condition's
status flips; a new reason or message under the same status keeps it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sandbox_operator.contract import ConditionType

_ORDER = (ConditionType.ADMITTED.value, ConditionType.READY.value, ConditionType.DISPOSED.value)

MAX_MESSAGE = 4096


def now_rfc3339(now: datetime | None = None) -> str:
    t = (now or datetime.now(UTC)).astimezone(UTC).replace(microsecond=0)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def find(conditions: Iterable[Mapping[str, Any]] | None, ctype: str) -> Mapping[str, Any] | None:
    for cond in conditions or ():
        if cond.get("type") == ctype:
            return cond
    return None


def set_condition(
    conditions: Sequence[Mapping[str, Any]] | None,
    ctype: str,
    status: str,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """A new condition list with ``ctype`` set; other conditions are kept unchanged."""
    message = message[:MAX_MESSAGE]
    out: list[dict[str, Any]] = []
    replaced = False
    for cond in conditions or ():
        if cond.get("type") != ctype:
            out.append(dict(cond))
            continue
        replaced = True
        transition = cond.get("lastTransitionTime")
        if cond.get("status") != status or not transition:
            transition = now_rfc3339(now)
        out.append(_condition(ctype, status, reason, message, generation, str(transition)))
    if not replaced:
        out.append(_condition(ctype, status, reason, message, generation, now_rfc3339(now)))
    out.sort(key=lambda c: _ORDER.index(c["type"]) if c["type"] in _ORDER else len(_ORDER))
    return out


def remove_condition(
    conditions: Sequence[Mapping[str, Any]] | None, ctype: str
) -> list[dict[str, Any]]:
    return [dict(c) for c in conditions or () if c.get("type") != ctype]


def _condition(
    ctype: str, status: str, reason: str, message: str, generation: int | None, transition: str
) -> dict[str, Any]:
    cond: dict[str, Any] = {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def _normalize(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _normalize(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_normalize(v) for v in value]
    return value


def status_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that turns ``old`` into ``new`` for the keys of ``new``, or None.

    Only top-level keys present in ``new`` are compared; a key set to None in ``new`` is removed.
    Nothing is returned when nothing changed, so an unchanged status is never written.
    """
    old = old or {}
    patch: dict[str, Any] = {}
    for key, value in new.items():
        if value is None:
            if old.get(key) is not None:
                patch[key] = None
        elif _normalize(old.get(key)) != _normalize(value):
            patch[key] = value
    return patch or None


def reason_of(status: Mapping[str, Any] | None, ctype: str) -> str | None:
    cond = find((status or {}).get("conditions"), ctype)
    return None if cond is None else str(cond.get("reason"))


def is_true(status: Mapping[str, Any] | None, ctype: str) -> bool:
    cond = find((status or {}).get("conditions"), ctype)
    return cond is not None and cond.get("status") == "True"
