"""Reset (``spec.resets``, docs/reset.md) as pure functions: whether a reset is due, and what
the status says once it is made or refused.

Its own module because a reset is its own decision beside admission and the plan: the pass
(``sandbox.py``) asks :func:`reset_wanted` before it observes anything, and a due reset replaces
the serving pod instead of planning from it; ``compute.plan(resetting=True)`` then judges the pod
that took its place.
"""

from __future__ import annotations

from datetime import datetime

from sandbox_operator.contract import SandboxResourceSpec
from sandbox_operator.reconcile.statusfields import StatusFields
from sandbox_operator.views import SandboxStatusView


def reset_wanted(spec: SandboxResourceSpec, status: SandboxStatusView) -> int | None:
    """The ``spec.resets`` to serve now: above ``status.resets`` (the one the serving pod
    answers), and not refused already; None when no reset is due."""
    served = status.resets
    served_count = served if isinstance(served, int) else 0
    if spec.resets <= served_count or status.reset_refused:
        return None
    return spec.resets


def reset_fields(wanted: int, now: datetime) -> StatusFields:
    """The status of a reset done (the old pod gone, the new one claimed or created)."""
    return {"resets": wanted, "resetAt": now.isoformat(), "resetRefused": None}


def reset_refused(backend: str) -> StatusFields:
    """The status of a reset the backend cannot make; the sandbox serves on as it was."""
    return {
        "resetRefused": (
            f"backend {backend} cannot reset a sandbox (replace its compute by a never-used "
            "one); dispose of the Sandbox and create a new one instead"
        )
    }
