"""Pydantic models of the contract: what a workload asks for, what a backend declares, what the
host mandates. Attributes are snake_case; the wire (YAML, JSON, Kubernetes) spelling is camelCase.

Invalid values and invalid combinations raise at construction, and the error names the field.

This module holds the workload's side (the key, the spec and its parts); the shared base is in
:mod:`.base`, quantities and resources in :mod:`.quantities`, and what backends declare and the
host mandates in :mod:`.hostpolicy`. Every name of those is importable from here too.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final

from pydantic import (
    AfterValidator,
    Field,
    StrictStr,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from .base import (
    DECLARED_OUTPUTS_MAX_ITEMS,
    DEFAULT_TRANSFER_LIMITS,
    EGRESS_ALLOW_MAX_ITEMS,
    HOST_MAX_LENGTH,
    INVISIBLE_CHARACTERS,
    KEY_MAX_LENGTH,
    LABEL_KEY_MAX_LENGTH,
    LABEL_VALUE_MAX_LENGTH,
    LABELS_MAX_ITEMS,
    NO_CONTROL_PATTERN,
    NON_EMPTY_NO_CONTROL_PATTERN,
    PATH_MAX_LENGTH,
    CapabilitySet,
    ContractModel,
    EgressSet,
    IsolationScopeSet,
    IsolationValue,
    MiB,
    OsFamilySet,
    TransferLimits,
)
from .enums import (
    DEFAULT_CAPABILITIES,
    AccessMode,
    Capability,
    Disposition,
    Egress,
    IdleAction,
    IsolationScope,
    OsFamily,
)
from .hostpolicy import (
    BackendDeclarations,
    DisposalFailure,
    HostPolicy,
    ResourcePolicy,
    ScopePurge,
)
from .quantities import (
    DEFAULT_RESOURCE_CEILING,
    DEFAULT_RESOURCE_LIMITS,
    DEFAULT_RESOURCE_REQUESTS,
    QUANTITY_MAX,
    QUANTITY_MAX_LENGTH,
    QUANTITY_PATTERN,
    RESOURCE_NAMES,
    Quantity,
    ResourceList,
    ResourceRequirements,
    _amounts,
    parse_quantity,
)

__all__ = [
    "DECLARED_OUTPUTS_MAX_ITEMS",
    "DEFAULT_RESOURCE_CEILING",
    "DEFAULT_RESOURCE_LIMITS",
    "DEFAULT_RESOURCE_REQUESTS",
    "DEFAULT_TRANSFER_LIMITS",
    "DRIVE_LETTER_PATTERN",
    "EGRESS_ALLOW_MAX_ITEMS",
    "HOST_MAX_LENGTH",
    "HOST_PATTERN",
    "IMAGE_PATTERN",
    "IP_LITERAL_PATTERN",
    "KEY_MAX_LENGTH",
    "KIND_PATTERN",
    "LABELS_MAX_ITEMS",
    "LABEL_KEY_MAX_LENGTH",
    "LABEL_VALUE_MAX_LENGTH",
    "LOOPBACK_SUFFIX",
    "METADATA_HOSTS",
    "NON_EMPTY_NO_CONTROL_PATTERN",
    "NO_CONTROL_PATTERN",
    "PATH_MAX_LENGTH",
    "POSIX_SYSTEM_DIRS",
    "POSIX_SYSTEM_WORK_DIR_PATTERN",
    "QUANTITY_MAX",
    "QUANTITY_MAX_LENGTH",
    "QUANTITY_PATTERN",
    "RELATIVE_PATH_PATTERN",
    "RESOURCE_NAMES",
    "STORAGE_CLASS_PATTERN",
    "STORAGE_MAX",
    "UNNORMALISED_WORK_DIR_PATTERN",
    "WINDOWS_ALIAS_WORK_DIR_PATTERN",
    "WINDOWS_SYSTEM_DIRS",
    "WINDOWS_SYSTEM_WORK_DIR_PATTERN",
    "BackendDeclarations",
    "CapabilitySet",
    "ContractModel",
    "DeclaredOutput",
    "DisposalFailure",
    "EgressHost",
    "EgressSet",
    "HostPolicy",
    "IsolationScopeSet",
    "IsolationValue",
    "Lifetime",
    "MiB",
    "OsFamilySet",
    "Quantity",
    "ResourceList",
    "ResourcePolicy",
    "ResourceRequirements",
    "SandboxKey",
    "SandboxSpec",
    "ScopePurge",
    "Storage",
    "TransferLimits",
    "egress_host_problem",
    "parse_quantity",
    "work_dir_problem",
]

#: A literal relative path: no leading '/', no empty segments, no backslashes, no control
#: characters and no glob characters ('*', '?', '['): a declared output names one file, never a
#: pattern ('.'/'..' segments and drive letters are checked apart, by CEL in the CRD).
_PATH_SEGMENT: Final = r"[^/\\*?\[\x00-\x1f\x7f" + INVISIBLE_CHARACTERS + "]+"
RELATIVE_PATH_PATTERN: Final = f"^{_PATH_SEGMENT}(/{_PATH_SEGMENT})*$"
#: A path that starts with a drive letter (``C:``): absolute on Windows, never relative.
DRIVE_LETTER_PATTERN: Final = r"^[A-Za-z]:"

_SEGMENT_FORBIDDEN = re.compile("[\\x00-\\x1f\\x7f\\\\" + INVISIBLE_CHARACTERS + "]")
_GLOB = re.compile(r"[*?\[]")


def _check_relative_path(value: str, what: str) -> str:
    if not value:
        raise ValueError(f"{what} must not be empty")
    if value.startswith("/") or re.match(DRIVE_LETTER_PATTERN, value):
        raise ValueError(f"{what} {value!r} must be relative to workDir, not absolute")
    if _SEGMENT_FORBIDDEN.search(value):
        raise ValueError(
            f"{what} {value!r} must not contain backslashes, control characters or invisible "
            "formatting characters (bidirectional controls, zero-width characters)"
        )
    if _GLOB.search(value):
        raise ValueError(
            f"{what} {value!r} must be a literal path: glob characters (*, ?, [) are not allowed"
        )
    for segment in value.split("/"):
        if segment in ("", ".", ".."):
            raise ValueError(f"{what} {value!r} must not contain empty, '.' or '..' segments")
    return value


class DeclaredOutput(ContractModel):
    """One artifact a workload produces, named in advance as a literal path under workDir."""

    path: str = Field(
        max_length=PATH_MAX_LENGTH,
        pattern=RELATIVE_PATH_PATTERN,
        description="Literal path of the artifact, relative to workDir (no globs, no '..').",
    )
    media_type: str = Field(
        max_length=255,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*$",
        description="Declared media type (e.g. image/png); declared, never sniffed.",
    )
    required: bool = Field(
        default=True,
        description="When false, the artifact's absence is normal rather than an error.",
    )
    name: str | None = Field(
        default=None,
        max_length=PATH_MAX_LENGTH,
        pattern=RELATIVE_PATH_PATTERN,
        description="Name the artifact lands under; defaults to path.",
    )
    disposition: Disposition = Field(
        default=Disposition.LAND,
        description="land: delivered to the host's sink; consume: parsed by the declaring kind.",
    )

    # Before the pattern constraint, so a person gets the specific reason.
    @field_validator("path", "name", mode="before")
    @classmethod
    def _relative(cls, value: object, info: Any) -> object:
        if isinstance(value, str):
            return _check_relative_path(value, info.field_name)
        return value

    @property
    def landing_name(self) -> str:
        """The name the artifact lands under."""
        return self.name or self.path


#: Control characters and invisible formatting characters (bidirectional controls, zero-width
#: characters: ``INVISIBLE_CHARACTERS``): a key part that reads like another must be another.
_KEY_PART_FORBIDDEN = re.compile("[\\x00-\\x1f\\x7f" + INVISIBLE_CHARACTERS + "]")


def _check_key_part(value: str, field: str, *, allow_empty: bool = False) -> str:
    if not value and not allow_empty:
        raise ValueError(f"{field} must not be empty")
    if _KEY_PART_FORBIDDEN.search(value):
        raise ValueError(
            f"{field} must not contain control characters or invisible formatting characters "
            "(bidirectional controls, zero-width characters)"
        )
    return value


class SandboxKey(ContractModel):
    """The one sandbox a caller may reach: ``(scope, thread_id, agent_dir, call_id)``.

    ``call_id`` is empty unless the workload runs one sandbox per call.
    """

    scope: str = Field(max_length=KEY_MAX_LENGTH, description="Tenant or scope of the caller.")
    thread_id: str = Field(max_length=KEY_MAX_LENGTH, description="Conversation thread.")
    agent_dir: str = Field(max_length=KEY_MAX_LENGTH, description="Agent the sandbox belongs to.")
    call_id: str = Field(
        default="",
        max_length=KEY_MAX_LENGTH,
        description="Call the sandbox serves; empty unless the isolation scope is call.",
    )

    @field_validator("scope", "thread_id", "agent_dir")
    @classmethod
    def _non_empty(cls, value: str, info: Any) -> str:
        return _check_key_part(value, to_camel(info.field_name))

    @field_validator("call_id")
    @classmethod
    def _call_id_clean(cls, value: str) -> str:
        return _check_key_part(value, "callId", allow_empty=True)


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

HOST_PATTERN: Final = (
    r"^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)
KIND_PATTERN: Final = r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"

#: A host whose last label is all digits or ``0x`` hex is an IPv4 literal in one of the forms
#: resolvers accept (``169.254.169.254``, ``0x7f.1``); IPv6 literals never match HOST_PATTERN.
IP_LITERAL_PATTERN: Final = r"(^|\.)([0-9]+|0x[0-9a-f]*)$"
#: Names of cloud metadata services (and loopback): reaching one hands a sandbox the node's
#: credentials, so no allowlist may name one, or a wildcard that covers one. Single-label names
#: ("metadata", "instance-data", "localhost") are refused by the two-label rule already.
METADATA_HOSTS: Final[tuple[str, ...]] = (
    "metadata.google.internal",
    "metadata.goog",
    "instance-data.ec2.internal",
)
#: The reserved top-level domain that always means loopback (RFC 6761).
LOOPBACK_SUFFIX: Final = ".localhost"


def egress_host_problem(host: str) -> str | None:
    """Why ``host`` may not be an egressAllow entry, or None.

    Static rules, the same everywhere (the CRD carries them as CEL): an entry names a host by a
    fully qualified name, never an IP literal (a literal bypasses every name the host trusts and is
    how metadata endpoints are reached) and never a metadata or loopback name. The egress proxy
    still refuses such addresses after resolving; this refuses the ask before anything runs.
    """
    if "." not in host:
        return (
            f"{host!r} is a single-label name, resolved through the proxy's search domains "
            "(e.g. 'metadata', 'localhost'); name the host in full, e.g. pypi.org"
        )
    if re.search(IP_LITERAL_PATTERN, host):
        return f"{host!r} is an IP literal; name the host, e.g. pypi.org"
    if host in METADATA_HOSTS or host.endswith(LOOPBACK_SUFFIX):
        return f"{host!r} is a cloud metadata or loopback name"
    if host.startswith("*.") and any(m.endswith(host[1:]) for m in METADATA_HOSTS):
        return f"{host!r} would allow a cloud metadata name"
    return None


def _check_egress_host(value: str) -> str:
    problem = egress_host_problem(value)
    if problem is not None:
        raise ValueError(f"egressAllow entry {problem}")
    return value


EgressHost = Annotated[
    str,
    Field(
        min_length=1,
        max_length=HOST_MAX_LENGTH,
        pattern=HOST_PATTERN,
        description=(
            "A lower-case, fully qualified host name; a leading '*.' allows any subdomain. Not an "
            "IP literal, a single label, or a cloud metadata or loopback name."
        ),
    ),
    AfterValidator(_check_egress_host),
]

#: Directories of a posix guest a workDir may not be at or under: the kernel's and the runtime's
#: (mounting a work volume there breaks the guest or hands it host state), the programs' and the
#: libraries' (a work volume mounted there hides the shell and the loader: the pod never starts),
#: and the root.
POSIX_SYSTEM_DIRS: Final[tuple[str, ...]] = (
    "proc",
    "sys",
    "dev",
    "etc",
    "boot",
    "run",
    "var/run",
    "bin",
    "sbin",
    "lib",
    "lib32",
    "lib64",
    "libx32",
    "usr/bin",
    "usr/sbin",
    "usr/lib",
    "usr/lib32",
    "usr/lib64",
    "usr/libx32",
    "usr/libexec",
    "usr/local/bin",
    "usr/local/sbin",
    "usr/local/lib",
)
#: Directories a workDir may not be exactly (what is under them is the workload's to use:
#: ``/usr/src/app``), because a volume mounted there hides every system directory inside.
POSIX_SYSTEM_PARENT_DIRS: Final[tuple[str, ...]] = ("usr", "usr/local", "var")
#: Top directories of a Windows guest a workDir may not be at or under (case-insensitive), and the
#: drive root.
WINDOWS_SYSTEM_DIRS: Final[tuple[str, ...]] = (
    "windows",
    "program files",
    "program files (x86)",
    "programdata",
    "system volume information",
    "$recycle.bin",
    "recovery",
)
#: workDir at or under a posix system directory, exactly a parent of some, or the root itself.
POSIX_SYSTEM_WORK_DIR_PATTERN: Final = (
    r"^/(("
    + "|".join(re.escape(d) for d in POSIX_SYSTEM_DIRS)
    + r")?(/|$)|("
    + "|".join(re.escape(d) for d in POSIX_SYSTEM_PARENT_DIRS)
    + r")/?$)"
)
#: workDir at or under a Windows system directory, or a drive root (any case, either separator).
WINDOWS_SYSTEM_WORK_DIR_PATTERN: Final = (
    r"(?i)^[a-z]:[\\/]("
    + "|".join(re.escape(d).replace("\\ ", " ") for d in WINDOWS_SYSTEM_DIRS)
    + r")?([\\/]|$)"
)
#: A '.' or '..' segment, or an empty one ('//'): a workDir is compared as written, so it must be
#: normalised (``/w/../etc`` is ``/etc``).
UNNORMALISED_WORK_DIR_PATTERN: Final = r"([\\/]\.\.?([\\/]|$)|[\\/][\\/])"
#: Windows spellings that name another directory than they seem to: a ':' after the drive (an
#: alternate stream), an 8.3 short name (``PROGRA~1``), a segment ending in '.' or ' ' (dropped).
WINDOWS_ALIAS_WORK_DIR_PATTERN: Final = r"^[A-Za-z]:(.*:|.*~[0-9]|.*[. ]([\\/]|$))"


def work_dir_problem(value: str) -> str | None:
    """Why ``value`` may not be a workDir, or None. Static rules, carried into the CRD as CEL."""
    if re.search(UNNORMALISED_WORK_DIR_PATTERN, value):
        return f"workDir {value!r} must be a normalised path: no empty, '.' or '..' segments"
    if re.search(WINDOWS_ALIAS_WORK_DIR_PATTERN, value):
        return (
            f"workDir {value!r} uses a Windows spelling that names another directory (a ':' "
            "after the drive, a short name like PROGRA~1, or a segment ending in '.' or ' ')"
        )
    if re.search(POSIX_SYSTEM_WORK_DIR_PATTERN, value) or re.search(
        WINDOWS_SYSTEM_WORK_DIR_PATTERN, value
    ):
        return (
            f"workDir {value!r} is a root or system directory (/, /proc, /sys, /dev, /etc, /boot, "
            r"/run, /var/run, /bin, /lib, /usr/bin, /usr, C:\, C:\Windows, C:\Program Files, "
            "...); use a directory of the workload's own, e.g. /workspace"
        )
    return None


#: Spec fields left off the wire while empty or false (see :meth:`SandboxSpec.to_wire`).
OMITTED_WHEN_UNSET: Final = ("labels", "outputs_named_at_call_time")


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
        if not isinstance(value, str):
            return value
        if not (value.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", value)):
            raise ValueError(f"workDir {value!r} must be an absolute path")
        if _KEY_PART_FORBIDDEN.search(value):
            raise ValueError(
                "workDir must not contain control characters or invisible formatting characters "
                "(bidirectional controls, zero-width characters)"
            )
        problem = work_dir_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

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
