"""What one Sandbox pass decided to write, handed from the deciding code to the one writer.

Every path of a pass (admission, refusal, create, claim, suspend, terminal disposal, the
finalizer's disposal) ends in a :class:`Step`; ``writer.write_step`` is the only place a
Sandbox's status is written. So a pass writes its status at most once, and what it writes is
decided before the write (the shape of agent-sandbox's ``Reconcile`` -> ``computeConditions``
-> ``updateStatus``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sandbox_operator.reconcile import compute
from sandbox_operator.reconcile.status import Draft
from sandbox_operator.views import SandboxView


@dataclass(frozen=True)
class Step:
    """The outcome of a pass.

    ``draft`` None: nothing to write, look again after ``requeue`` seconds (None: on a watch
    event). Otherwise ``plan`` (when given) is laid over the draft (its disposal included) and
    the draft written if it differs; ``requeue`` then bounds the plan's own next look."""

    obj: SandboxView | None = None
    draft: Draft | None = None
    plan: compute.Plan | None = None
    admission: compute.Admission | None = None
    debounce: bool = False
    requeue: float | None = None

    @classmethod
    def wait(cls, requeue: float | None = None) -> Step:
        """Nothing to write."""
        return cls(requeue=requeue)

    @classmethod
    def write(
        cls,
        obj: SandboxView,
        draft: Draft,
        plan: compute.Plan | None = None,
        admission: compute.Admission | None = None,
        *,
        debounce: bool = False,
        requeue: float | None = None,
    ) -> Step:
        return cls(obj, draft, plan, admission, debounce, requeue)


def sooner(a: float | None, b: float | None) -> float | None:
    """The earlier of two next looks (None: none)."""
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
