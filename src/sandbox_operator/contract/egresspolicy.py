"""``status.egressPolicy`` and ``status.egressEditRefused``: which edit of a Sandbox's egress
(``spec.egressAllow``, ``spec.egressRules``) the operator accepted and the egress proxy enforces,
and why the latest one was refused, if it was.

Its own module because an egress edit is judged apart from the admission that started the
sandbox (docs/egress.md, "Editing egress on a live Sandbox"): the admitted lists
(``status.admittedEgressAllow`` / ``admittedEgressRules``) are what the proxy enforces, and these
records say from which ``metadata.generation`` they come and when they were accepted, and, for an
edit the operator refused, which generation and why (the lists then stay as they were). Two
fields, not one: the operator's status writes are merge patches of top-level fields, so a refusal
is cleared by removing its field.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from .base import ContractModel


class EgressPolicyStatus(ContractModel):
    """The egress in force on a Sandbox, written by the operator."""

    generation: int = Field(
        ge=0,
        description=(
            "metadata.generation whose egressAllow and egressRules are the admitted ones "
            "(status.admittedEgressAllow / admittedEgressRules), which the egress proxy enforces "
            "(0: admitted before this record existed)."
        ),
    )
    applied_at: datetime | None = Field(
        default=None,
        description="When the operator accepted that generation's egress.",
    )


class EgressEditRefusal(ContractModel):
    """The latest egress edit the operator refused; the egress in force stays as it was."""

    generation: int = Field(ge=0, description="metadata.generation of the refused edit.")
    reason: str = Field(
        max_length=63,
        pattern=r"^[A-Za-z][A-Za-z0-9]*$",
        description="The refusal's reason (e.g. EgressNotEnforced, EgressEditNotSupported).",
    )
    message: str = Field(
        default="",
        max_length=1024,
        description="Why the edit was refused; never carries secrets or endpoints.",
    )
