"""The workload's spec: what a sandbox of one workload kind needs (:class:`SandboxSpec`), with its
lifetime and its storage. Attributes are snake_case; the wire (YAML, JSON, Kubernetes) spelling
is camelCase.

Invalid values and invalid combinations raise at construction, and the error names the field.

The spec's parts with rules of their own are modules of their own: the shared base in
:mod:`.base`, quantities and resources in :mod:`.quantities`, the key in :mod:`.key`, declared
outputs in :mod:`.outputs`, egress hosts in :mod:`.egresshosts`, the workDir rules in
:mod:`.workdir`, and what backends declare and the host mandates in :mod:`.hostpolicy`. Each name
is imported from the module that defines it; :mod:`sandbox_operator.contract` is the public
surface.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final

from pydantic import Field, StrictStr, field_validator, model_validator
from pydantic.alias_generators import to_camel

from .base import (
    DECLARED_OUTPUTS_MAX_ITEMS,
    DEFAULT_TRANSFER_LIMITS,
    EGRESS_ALLOW_MAX_ITEMS,
    INVISIBLE_CHARACTERS,
    LABEL_KEY_MAX_LENGTH,
    LABEL_VALUE_MAX_LENGTH,
    LABELS_MAX_ITEMS,
    PATH_MAX_LENGTH,
    CapabilitySet,
    ContractModel,
    IsolationValue,
    TransferLimits,
)
from .egresshosts import EgressHost
from .egressrules import EGRESS_RULES_MAX_ITEMS, EgressRule
from .enums import (
    DEFAULT_CAPABILITIES,
    AccessMode,
    Capability,
    Egress,
    IdleAction,
    IsolationScope,
    OsFamily,
)
from .outputs import DeclaredOutput
from .ports import PORTS_MAX_ITEMS, SandboxPort, ports_problem
from .quantities import (
    DEFAULT_RESOURCE_CEILING,
    DEFAULT_RESOURCE_LIMITS,
    DEFAULT_RESOURCE_REQUESTS,
    Quantity,
    ResourceRequirements,
    _amounts,
    parse_quantity,
)
from .workdir import DRIVE_LETTER_PATTERN, check_work_dir


class Lifetime(ContractModel):
    """How long a sandbox may take to start, live, and sit idle."""

    startup_timeout_seconds: int = Field(
        default=120,
        ge=1,
        le=3600,
        description="Seconds the sandbox may take to become ready before it counts as failed.",
    )
    ttl_seconds: int = Field(
        default=3600,
        ge=1,
        le=7 * 24 * 3600,
        description="Seconds after creation when the sandbox expires and is disposed.",
    )
    idle_timeout_seconds: int = Field(
        default=900,
        ge=1,
        le=7 * 24 * 3600,
        description=(
            "Seconds without use after which the sandbox is disposed (or suspended: idleAction)."
        ),
    )
    idle_action: IdleAction = Field(
        default=IdleAction.DISPOSE,
        description=(
            "What the idle timeout does: dispose (default) or suspend (stop the compute, keep "
            "the work volume; needs storage)."
        ),
    )

    @model_validator(mode="after")
    def _idle_within_ttl(self) -> Lifetime:
        if self.idle_timeout_seconds > self.ttl_seconds:
            raise ValueError(
                f"idleTimeoutSeconds ({self.idle_timeout_seconds}) exceeds ttlSeconds "
                f"({self.ttl_seconds})"
            )
        return self


#: A storage class name (a DNS subdomain).
STORAGE_CLASS_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: Largest work volume a spec may ask for, before any host ceiling.
STORAGE_MAX: Final = "1Ti"


class Storage(ContractModel):
    """A persistent work directory: a volume that outlives the sandbox's compute (suspend and
    resume keep it) and is disposed with the sandbox."""

    size: Quantity = Field(description="Size of the work volume, e.g. 1Gi (at most 1Ti).")
    storage_class_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=STORAGE_CLASS_PATTERN,
        description="Storage class of the work volume; unset: the cluster's default class.",
    )
    access_mode: AccessMode = Field(
        default=AccessMode.READ_WRITE_ONCE,
        description="ReadWriteOnce (default) or ReadWriteOncePod.",
    )

    @field_validator("size")
    @classmethod
    def _size_in_range(cls, value: str) -> str:
        amount = parse_quantity(value)
        if amount <= 0:
            raise ValueError("storage.size must be more than zero")
        if amount > parse_quantity(STORAGE_MAX):
            raise ValueError(f"storage.size {value} is above {STORAGE_MAX}")
        return value


#: An image reference: no whitespace or control characters.
IMAGE_PATTERN: Final = r"^[^\x00-\x20\x7f-\x9f\p{Z}]+$"
#: A workload kind: a label-safe name (it names the sandbox in refusals and metrics).
KIND_PATTERN: Final = r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"

#: Spec fields left off the wire while empty or false (see :meth:`SandboxSpec.to_wire`).
OMITTED_WHEN_UNSET: Final = ("labels", "outputs_named_at_call_time", "egress_rules", "ports")


class SandboxSpec(ContractModel):
    """What a sandbox of one workload kind needs. Everything not stated gets the closed posture."""

    kind: str = Field(
        max_length=63,
        pattern=KIND_PATTERN,
        description="Workload kind (e.g. python); names the sandbox in refusals and metrics.",
    )
    image: str = Field(
        min_length=1,
        max_length=512,
        # No whitespace (any Unicode space) and no control character, spelled as a class RE2 (the
        # API server) and Rust (pydantic) read alike: their \S disagree on \v and Unicode spaces.
        pattern=IMAGE_PATTERN,
        description="Container image (or remote image reference) the sandbox runs.",
    )
    work_dir: str = Field(
        default="/workspace",
        min_length=1,
        pattern=r"^(/|[A-Za-z]:[\\/])[^\x00-\x1f\x7f" + INVISIBLE_CHARACTERS + "]*$",
        max_length=PATH_MAX_LENGTH,
        description=(
            "Absolute, normalised working directory in the guest; declared outputs are under it. "
            "Not a root or system directory (/proc, /etc, C:\\Windows, ...)."
        ),
    )
    requires: CapabilitySet = Field(
        default=DEFAULT_CAPABILITIES,
        max_length=len(Capability),
        description="Capabilities the workload cannot run without.",
    )
    min_isolation: IsolationValue | None = Field(
        default=None,
        description="Isolation floor for this kind; may raise the host's floor, never lower it.",
    )
    isolation_scope: IsolationScope = Field(
        default=IsolationScope.CONVERSATION,
        description="conversation: one sandbox per conversation; call: one per call.",
    )
    requires_os_family: OsFamily | None = Field(
        default=None,
        description="Guest OS family the workload's commands are written for, if any.",
    )
    egress: Egress = Field(
        default=Egress.CLOSED,
        description="Network reach: closed (none), allowlist (egressAllow only), unrestricted.",
    )
    egress_allow: tuple[EgressHost, ...] = Field(
        default=(),
        max_length=EGRESS_ALLOW_MAX_ITEMS,
        # A set in the CRD (x-kubernetes-list-type: set), so a duplicate is a 422 there too.
        json_schema_extra={"uniqueItems": True},
        description="Hosts reachable under egress allowlist; everything else is denied.",
    )
    egress_rules: tuple[EgressRule, ...] = Field(
        default=(),
        max_length=EGRESS_RULES_MAX_ITEMS,
        description=(
            "Hosts reachable under egress allowlist only with the methods and paths named "
            "(judged by the egress proxy on each request); a host is in egressAllow or here, "
            "not both."
        ),
    )
    files_in: TransferLimits = Field(
        default=DEFAULT_TRANSFER_LIMITS,
        description="Ceilings on files sent into the sandbox.",
    )
    files_out: TransferLimits = Field(
        default=DEFAULT_TRANSFER_LIMITS,
        description="Ceilings on files collected from the sandbox.",
    )
    declared_outputs: tuple[DeclaredOutput, ...] = Field(
        default=(),
        max_length=DECLARED_OUTPUTS_MAX_ITEMS,
        description="Artifacts the workload produces, in collection order.",
    )
    outputs_named_at_call_time: bool = Field(
        default=False,
        description=(
            "The workload also lands or consumes artifacts it can name only when it runs (e.g. "
            "after listing a directory): the client collects outputs named at the call only "
            "when this is set; needs files_out in requires; filesOut caps them together with "
            "declaredOutputs."
        ),
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description=(
            "CPU and memory requests and limits. What is left out comes from the host policy "
            f"(unless configured: requests {_amounts(DEFAULT_RESOURCE_REQUESTS)}, limits "
            f"{_amounts(DEFAULT_RESOURCE_LIMITS)}); requests never exceed limits, and an ask "
            "above the host's ceilings (unless configured: "
            f"{_amounts(DEFAULT_RESOURCE_CEILING)}) is refused (ResourcesExceedCeiling)."
        ),
    )
    lifetime: Lifetime = Field(
        default_factory=Lifetime,
        description="Startup timeout, time to live, idle timeout and what idling does.",
    )
    labels: dict[StrictStr, Annotated[StrictStr, Field(max_length=LABEL_VALUE_MAX_LENGTH)]] = Field(
        default_factory=dict,
        max_length=LABELS_MAX_ITEMS,
        description=(
            "The host's own words about this workload (a tenant, a cost centre), carried "
            "verbatim: stored as given and handed to the client's observers; never read by "
            "admission, never put on pods or other objects, never in a condition or a metric."
        ),
    )
    storage: Storage | None = Field(
        default=None,
        description=(
            "A persistent work directory (a PersistentVolumeClaim on runtime-class backends), "
            "kept while the sandbox is suspended; unset: the work directory lives and dies with "
            "the sandbox's compute."
        ),
    )

    ports: tuple[SandboxPort, ...] = Field(
        default=(),
        max_length=PORTS_MAX_ITEMS,
        description=(
            "Ports the workload serves, reachable only through the operator's router by callers "
            "the Kubernetes API authorizes (docs/ports.md); names and numbers unique. Fixed after "
            "creation."
        ),
    )

    def to_wire(self) -> dict[str, Any]:
        """The camelCase wire form, without the fields added after Sandboxes existed
        (:data:`OMITTED_WHEN_UNSET`) while they say nothing: a Sandbox created before a field
        existed has none, and the spec's fields may be neither added nor removed after creation,
        so an empty value written on every apply would refuse re-acquiring it."""
        wire = super().to_wire()
        for name in OMITTED_WHEN_UNSET:
            if not getattr(self, name):
                wire.pop(to_camel(name), None)
        return wire

    @field_validator("labels")
    @classmethod
    def _label_keys(cls, value: dict[str, str]) -> dict[str, str]:
        # Keys only: a value is the host's and is kept as given. The count is already bounded.
        for key in value:
            if not 1 <= len(key) <= LABEL_KEY_MAX_LENGTH:
                raise ValueError(
                    f"a labels key must be 1 to {LABEL_KEY_MAX_LENGTH} characters "
                    f"(one is {len(key)})"
                )
        return value

    @field_validator("work_dir", mode="before")
    @classmethod
    def _work_dir_absolute(cls, value: object) -> object:
        return check_work_dir(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _combinations(self) -> SandboxSpec:
        if self.lifetime.idle_action is IdleAction.SUSPEND and self.storage is None:
            raise ValueError(
                "lifetime.idleAction suspend needs storage (a suspended sandbox keeps only its "
                "work volume)"
            )
        if self.egress_allow and self.egress is not Egress.ALLOWLIST:
            raise ValueError(
                f"egressAllow is only valid with egress allowlist (egress is {self.egress.value})"
            )
        if len(set(self.egress_allow)) != len(self.egress_allow):
            raise ValueError("egressAllow lists a host more than once")
        if self.egress_rules and self.egress is not Egress.ALLOWLIST:
            raise ValueError(
                f"egressRules is only valid with egress allowlist (egress is {self.egress.value})"
            )
        ruled = [r.host for r in self.egress_rules]
        if len(set(ruled)) != len(ruled):
            raise ValueError("egressRules names a host more than once")
        both = sorted(set(ruled) & set(self.egress_allow))
        if both:
            raise ValueError(
                f"egressRules names {', '.join(both)}, which egressAllow lets through for every "
                "method and path: list a host in one of them"
            )
        ports = ports_problem(self.ports)
        if ports is not None:
            raise ValueError(ports)
        if self.requires_os_family is OsFamily.POSIX and re.match(
            DRIVE_LETTER_PATTERN, self.work_dir
        ):
            raise ValueError(
                f"workDir {self.work_dir!r} is a Windows path, but requiresOsFamily is posix"
            )
        if self.outputs_named_at_call_time and Capability.FILES_OUT not in self.requires:
            raise ValueError(
                "outputsNamedAtCallTime needs files_out in requires (outputs are collected with it)"
            )
        if self.declared_outputs:
            if Capability.FILES_OUT not in self.requires:
                raise ValueError(
                    "declaredOutputs needs files_out in requires (outputs are collected with it)"
                )
            if len(self.declared_outputs) > self.files_out.max_files:
                raise ValueError(
                    f"declaredOutputs has {len(self.declared_outputs)} entries, more than "
                    f"filesOut.maxFiles ({self.files_out.max_files})"
                )
            landing = [o.landing_name for o in self.declared_outputs]
            duplicates = sorted({n for n in landing if landing.count(n) > 1})
            if duplicates:
                raise ValueError(
                    f"declaredOutputs land two artifacts under the same name: {duplicates}"
                )
        return self
