"""What the operator publishes about the backends it serves, for clients that must know before any
sandbox exists (a maf-sandbox ``SandboxBackend`` reads its ``declarations`` synchronously, so the
answer has to be settled, not asked of a running guest).

The operator writes one ConfigMap, :data:`PUBLISHED_CONFIGMAP`, into every namespace it serves
(and into its own namespace when it serves all namespaces), with the document below under
:data:`PUBLISHED_KEY`, serialised in the contract's camelCase wire spelling. It is derived from the
operator's validated configuration only: what a backend declares there is exactly what the
operator's admission checks hold it to, so a reader never learns more than the operator enforces.
Availability is deliberately absent: it changes over time, and the route never depends on it.
"""

from __future__ import annotations

from typing import Final

from pydantic import Field

from .base import ContractModel
from .hostpolicy import BackendDeclarations, HostPolicy

#: The ConfigMap the operator publishes its backends in.
PUBLISHED_CONFIGMAP: Final = "sandbox-operator-backends"
#: The ConfigMap's data key holding :class:`PublishedBackends` as JSON.
PUBLISHED_KEY: Final = "backends.json"


class PublishedBackend(ContractModel):
    """One registered backend, as the operator's configuration declares it."""

    name: str = Field(min_length=1, max_length=63)
    type: str = Field(min_length=1, max_length=63, description="runtimeClass or acas")
    isolation: str = Field(description="The rung the backend sits on (as configured).")
    declarations: BackendDeclarations = Field(default_factory=BackendDeclarations)
    resets: bool = Field(
        default=False,
        description=(
            "Whether the operator resets this backend's Sandboxes (spec.resets: the compute "
            "replaced by a never-used one); False from an operator that predates it."
        ),
    )


class PublishedBackends(ContractModel):
    """The host policy and the backends, in registration order (perSpec selection's order)."""

    host_policy: HostPolicy
    backends: tuple[PublishedBackend, ...] = Field(min_length=1)
