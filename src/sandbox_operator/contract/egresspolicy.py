"""``status.egressPolicy``: which edit of a Sandbox's egress (``spec.egressAllow``,
``spec.egressRules``) the operator accepted and the egress proxy enforces, or why one was refused.

Its own module because an egress edit is judged apart from the admission that started the
sandbox (docs/egress.md, "Editing egress on a live Sandbox"): the admitted lists
(``status.admittedEgressAllow`` / ``admittedEgressRules``) are what the proxy enforces, and this
record says from which ``metadata.generation`` they come, when they were accepted, and, for an
edit the operator refused, which generation and why (the lists then stay as they were).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from .base import ContractModel


class EgressPolicyStatus(ContractModel):
    """The egress edit in force on a Sandbox, written by the operator."""

    generation: int = Field(
        ge=0,
        description=(
            "metadata.generation whose egressAllow and egressRules are the admitted ones "
            "(status.admittedEgressAllow / admittedEgressRules), which the egress proxy enforces."
        ),
    )
    applied_at: datetime | None = Field(
        default=None,
        description="When the operator accepted that generation's egress.",
    )
    refused_generation: int | None = Field(
        default=None,
        ge=0,
        description=(
            "The latest metadata.generation whose egress edit the operator refused; the admitted "
            "lists stay those of `generation`. Unset once a later edit is accepted."
        ),
    )
    refused_reason: str | None = Field(
        default=None,
        max_length=63,
        pattern=r"^[A-Za-z][A-Za-z0-9]*$",
        description="The refusal's reason (e.g. EgressNotEnforced, EgressEditNotSupported).",
    )
    refused: str | None = Field(
        default=None,
        max_length=1024,
        description="Why that edit was refused; never carries secrets or endpoints.",
    )
