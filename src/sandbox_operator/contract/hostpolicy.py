"""What a backend declares about itself, what the host mandates (floors, selection, resource
defaults and ceilings), and how a disposal went: the contract models around a spec."""

from __future__ import annotations

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from .base import (
    DEFAULT_TRANSFER_LIMITS,
    CapabilitySet,
    ContractModel,
    EgressSet,
    IsolationScopeSet,
    IsolationValue,
    OsFamilySet,
    TransferLimits,
)
from .enums import (
    DEFAULT_CAPABILITIES,
    DisposalCode,
    Isolation,
    IsolationScope,
    Selection,
)
from .quantities import (
    DEFAULT_RESOURCE_CEILING,
    DEFAULT_RESOURCE_LIMITS,
    DEFAULT_RESOURCE_REQUESTS,
    RESOURCE_NAMES,
    ResourceList,
    _amounts,
    parse_quantity,
)


class BackendDeclarations(ContractModel):
    """What a backend declares about itself. Each field's default is its own silence rule."""

    capabilities: CapabilitySet = Field(
        default=DEFAULT_CAPABILITIES,
        description="What the backend can do; silence means exactly exec and files_in.",
    )
    limits: TransferLimits = Field(
        default=DEFAULT_TRANSFER_LIMITS,
        description="Transfer ceilings (each direction); silence means the default ceilings.",
    )
    egress_modes: EgressSet = Field(
        default=frozenset(),
        description="Egress modes the backend enforces; silence is none, refusing every spec.",
    )
    os_families: OsFamilySet = Field(
        default=frozenset(),
        description="Guest OS families; silence refuses only a spec that asks for one.",
    )
    isolation_scopes: IsolationScopeSet = Field(
        default=frozenset({IsolationScope.CONVERSATION}),
        description="Isolation scopes served; silence means conversation only.",
    )
    observes_egress: bool = Field(
        default=False,
        description="Whether the backend records egress decisions; informational.",
    )
    egress_rules: bool = Field(
        default=False,
        description=(
            "Whether the backend's egress hop judges egressRules (methods and paths) on plain "
            "http requests; silence refuses every spec with egressRules."
        ),
    )
    egress_rules_https: bool = Field(
        default=False,
        description=(
            "Whether it judges them inside HTTPS too (TLS terminated at the egress proxy, whose "
            "CA the sandbox trusts); silence refuses every rule naming https."
        ),
    )
    egress_credentials: bool = Field(
        default=False,
        description=(
            "Whether its egress hop attaches an egressRules credential (a Secret's value as a "
            "header) to the requests of one HTTPS origin; silence refuses every rule naming one."
        ),
    )
    persistent_storage: bool = Field(
        default=False,
        description=(
            "Whether the backend keeps a work volume across suspend and resume; silence refuses "
            "every spec with storage."
        ),
    )


def _fill_from(given: ResourceList, builtin: ResourceList) -> ResourceList:
    """``given`` with every unset resource taken from ``builtin``."""
    return ResourceList(
        **{r: getattr(given, r) or getattr(builtin, r) for r in RESOURCE_NAMES},
    )


def _exceeds(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and parse_quantity(a) > parse_quantity(b)


class ResourcePolicy(ContractModel):
    """The host's resource settings: defaults for what a spec leaves out, and ceilings.

    A default fills only what the spec does not state (the spec wins); a ceiling refuses a larger
    ask with ``ResourcesExceedCeiling`` (never clamps it). An unset ``maxLimits`` entry means the
    built-in :data:`DEFAULT_RESOURCE_CEILING` (or the default limit, when larger); an unset
    ``maxRequests`` entry means only the limit ceiling bounds requests.
    """

    default_requests: ResourceList = Field(
        default=DEFAULT_RESOURCE_REQUESTS,
        description="Requests for what a spec leaves out, capped at the sandbox's limits; an "
        f"unset resource keeps the built-in default ({_amounts(DEFAULT_RESOURCE_REQUESTS)}).",
    )
    default_limits: ResourceList = Field(
        default=DEFAULT_RESOURCE_LIMITS,
        description="Limits for what a spec leaves out, raised to a larger stated request; an "
        f"unset resource keeps the built-in default ({_amounts(DEFAULT_RESOURCE_LIMITS)}).",
    )
    max_requests: ResourceList = Field(
        default_factory=ResourceList,
        description="Largest request a spec may state, per resource; unset: only maxLimits "
        "bounds requests.",
    )
    max_limits: ResourceList = Field(
        default_factory=ResourceList,
        description="Largest limit (and so request) a spec may state, per resource; unset: the "
        f"built-in ceiling ({_amounts(DEFAULT_RESOURCE_CEILING)}), or the default limit when "
        "that is larger.",
    )

    @field_validator("default_requests")
    @classmethod
    def _complete_requests(cls, value: ResourceList) -> ResourceList:
        return _fill_from(value, DEFAULT_RESOURCE_REQUESTS)

    @field_validator("default_limits")
    @classmethod
    def _complete_limits(cls, value: ResourceList) -> ResourceList:
        return _fill_from(value, DEFAULT_RESOURCE_LIMITS)

    @model_validator(mode="after")
    def _defaults_within_ceilings(self) -> ResourcePolicy:
        for r in RESOURCE_NAMES:
            pairs = (
                ("defaultRequests", self.default_requests, "defaultLimits", self.default_limits),
                ("defaultLimits", self.default_limits, "maxLimits", self.max_limits),
                ("defaultRequests", self.default_requests, "maxRequests", self.max_requests),
            )
            for low_name, low, high_name, high in pairs:
                if _exceeds(getattr(low, r), getattr(high, r)):
                    raise ValueError(
                        f"{low_name}.{r} ({getattr(low, r)}) exceeds {high_name}.{r} "
                        f"({getattr(high, r)})"
                    )
        return self


class HostPolicy(ContractModel):
    """The host's mandate: the floors, how a backend is chosen, and the resource defaults."""

    min_isolation: IsolationValue = Field(
        default=Isolation.MICROVM,
        description="Isolation floor for every sandbox on this host.",
    )
    min_isolation_scope: IsolationScope = Field(
        default=IsolationScope.CONVERSATION,
        description="Least separation a sandbox may provide on this host.",
    )
    selection: Selection = Field(
        default=Selection.FIXED,
        description="fixed: one backend serves every spec; perSpec: first backend that passes.",
    )
    pinned_backend: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        description="Under fixed selection, the backend to use (default: the first registered).",
    )
    allow_unrestricted_egress: bool = Field(
        default=False,
        description="Whether a spec may ask for unrestricted egress at all.",
    )
    denied_capabilities: CapabilitySet = Field(
        default=frozenset(),
        description="Capabilities refused outright, whatever a backend declares: a spec "
        "requiring one is refused (CapabilityDenied) before any backend is judged. "
        "[host_tools] closes the host-tool channel for every Sandbox.",
    )
    resources: ResourcePolicy = Field(
        default_factory=ResourcePolicy,
        description="Default requests and limits for what a spec leaves out, and the ceilings "
        "a spec may ask up to.",
    )

    @model_validator(mode="after")
    def _pin_only_when_fixed(self) -> HostPolicy:
        if self.pinned_backend is not None and self.selection is not Selection.FIXED:
            raise ValueError(
                "pinnedBackend is only valid with selection fixed "
                f"(selection is {self.selection.value})"
            )
        return self


class DisposalFailure(ContractModel):
    """One sandbox that could not be disposed; branch on ``code``, not on ``detail``."""

    code: DisposalCode = Field(description="Why disposal failed.")
    detail: str = Field(
        default="",
        max_length=1024,
        description="Human-readable detail; carries no secrets or endpoints.",
    )
    backend: str = Field(max_length=63, description="Backend that held the sandbox.")


class ScopePurge(ContractModel):
    """Outcome of disposing every sandbox of one scope and thread."""

    disposed: int = Field(default=0, ge=0, description="Sandboxes disposed.")
    undisposed: tuple[DisposalFailure, ...] = Field(
        default=(),
        max_length=256,
        description="Sandboxes that could not be disposed, with the reason for each.",
    )

    @property
    def complete(self) -> bool:
        """True when nothing was left behind."""
        return not self.undisposed
