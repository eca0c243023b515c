"""Views of status conditions: one condition, and a status's list of them.

Why its own module: the Sandbox, SandboxScope and SandboxWarmPool statuses, and a pod's, all
carry conditions; finding one by type and reading its status, reason and transition time was
spelled out at each reader.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from sandbox_operator.contract import ConditionStatus
from sandbox_operator.views.fields import Field, optional_int, text_field, time_field
from sandbox_operator.views.objects import Raw


class ConditionView(Raw):
    """One entry of ``status.conditions``."""

    __slots__ = ()
    type = text_field()
    status = text_field()
    is_true = Field(lambda v: v == ConditionStatus.TRUE, "status")
    reason = text_field()
    message = text_field()
    last_transition_time = text_field()
    #: ``lastTransitionTime`` parsed (memoised per string).
    since = time_field("lastTransitionTime")
    observed_generation = Field(optional_int)


class Conditions(Sequence[ConditionView]):
    """A status's ``conditions`` list, read by type."""

    __slots__ = ("_raw",)

    def __init__(self, raw: object) -> None:
        self._raw: list[Any] = raw if isinstance(raw, list) else []

    def __len__(self) -> int:
        return len(self._raw)

    def __getitem__(self, index: int) -> ConditionView:  # type: ignore[override]
        return ConditionView(self._raw[index])

    def __iter__(self) -> Iterator[ConditionView]:
        return (ConditionView(c) for c in self._raw if c is not None)

    @property
    def raw(self) -> list[Any]:
        return self._raw

    def find(self, ctype: str) -> ConditionView | None:
        for cond in self:
            if cond.type == ctype:
                return cond
        return None

    def is_true(self, ctype: str) -> bool:
        found = self.find(ctype)
        return found is not None and found.is_true
