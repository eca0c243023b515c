"""Pydantic models of the contract: what a workload asks for, what a backend declares, what the
host mandates. Attributes are snake_case; the wire (YAML, JSON, Kubernetes) spelling is camelCase.

Invalid values and invalid combinations raise at construction, and the error names the field.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, localcontext
from typing import Annotated, Any, Final

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from .enums import (
    DEFAULT_CAPABILITIES,
    AccessMode,
    Capability,
    DisposalCode,
    Disposition,
    Egress,
    IdleAction,
    Isolation,
    IsolationScope,
    OsFamily,
    Selection,
    parse_isolation,
)

MiB: Final = 1024 * 1024

#: Longest string the key fields may carry (a DNS subdomain's length).
KEY_MAX_LENGTH: Final = 253
#: Most hosts an egress allowlist may name.
EGRESS_ALLOW_MAX_ITEMS: Final = 64
#: Most outputs a spec may declare.
DECLARED_OUTPUTS_MAX_ITEMS: Final = 64
#: Longest host name (DNS).
HOST_MAX_LENGTH: Final = 253
#: Longest relative output path.
PATH_MAX_LENGTH: Final = 1024

#: A string without C0 control characters or DEL (key parts, workDir, output paths). A pattern,
#: not only a validator, so the CRD carries it and the API server refuses such a spec with a 422
#: instead of the operator failing it after it was accepted. The same text is a Python and an RE2
#: (Go, the API server's) expression.
NO_CONTROL_PATTERN: Final = r"^[^\x00-\x1f\x7f]*$"
#: As :data:`NO_CONTROL_PATTERN`, and not empty.
NON_EMPTY_NO_CONTROL_PATTERN: Final = r"^[^\x00-\x1f\x7f]+$"


class ContractModel(BaseModel):
    """Base of every contract model: camelCase aliases, unknown fields refused, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """JSON-ready dict in the camelCase wire spelling, without unset optional fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def _parse_isolation_input(value: object) -> object:
    if isinstance(value, str):
        return parse_isolation(value)
    return value


#: An ``Isolation`` field: strings are parsed strictly (unknown and retired spellings refused).
IsolationValue = Annotated[Isolation, BeforeValidator(_parse_isolation_input)]


def _ordered_values(values: frozenset[Any]) -> list[str]:
    """Serialize an enum set in the enum's definition order, so output is deterministic."""
    if not values:
        return []
    enum_type = type(next(iter(values)))
    return [member.value for member in enum_type if member in values]


_SetSerializer = PlainSerializer(_ordered_values, return_type=list[str], when_used="json")

CapabilitySet = Annotated[frozenset[Capability], _SetSerializer]
EgressSet = Annotated[frozenset[Egress], _SetSerializer]
OsFamilySet = Annotated[frozenset[OsFamily], _SetSerializer]
IsolationScopeSet = Annotated[frozenset[IsolationScope], _SetSerializer]


class TransferLimits(ContractModel):
    """Ceilings on one direction of file transfer. All three bound a transfer together."""

    max_bytes_per_file: int = Field(
        default=8 * MiB,
        ge=0,
        le=1 << 40,
        description="Largest single file, in bytes.",
    )
    max_total_bytes: int = Field(
        default=32 * MiB,
        ge=0,
        le=1 << 42,
        description="Largest sum of all files in one transfer, in bytes.",
    )
    max_files: int = Field(
        default=64,
        ge=0,
        le=100_000,
        description="Most files in one transfer.",
    )

    @model_validator(mode="after")
    def _per_file_within_total(self) -> TransferLimits:
        if self.max_bytes_per_file > self.max_total_bytes:
            raise ValueError(
                f"maxBytesPerFile ({self.max_bytes_per_file}) exceeds maxTotalBytes "
                f"({self.max_total_bytes})"
            )
        return self


#: The default ceilings, also what a backend that declares no limits is held to.
DEFAULT_TRANSFER_LIMITS: Final = TransferLimits()

#: A literal relative path: no leading '/', no empty segments, no backslashes, no control
#: characters and no glob characters ('*', '?', '['): a declared output names one file, never a
#: pattern ('.'/'..' segments and drive letters are checked apart, by CEL in the CRD).
RELATIVE_PATH_PATTERN: Final = r"^[^/\\*?\[\x00-\x1f\x7f]+(/[^/\\*?\[\x00-\x1f\x7f]+)*$"
#: A path that starts with a drive letter (``C:``): absolute on Windows, never relative.
DRIVE_LETTER_PATTERN: Final = r"^[A-Za-z]:"

_SEGMENT_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f\\]")
_GLOB = re.compile(r"[*?\[]")


def _check_relative_path(value: str, what: str) -> str:
    if not value:
        raise ValueError(f"{what} must not be empty")
    if value.startswith("/") or re.match(DRIVE_LETTER_PATTERN, value):
        raise ValueError(f"{what} {value!r} must be relative to workDir, not absolute")
    if _SEGMENT_FORBIDDEN.search(value):
        raise ValueError(f"{what} {value!r} must not contain backslashes or control characters")
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


_KEY_PART_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f]")


def _check_key_part(value: str, field: str, *, allow_empty: bool = False) -> str:
    if not value and not allow_empty:
        raise ValueError(f"{field} must not be empty")
    if _KEY_PART_FORBIDDEN.search(value):
        raise ValueError(f"{field} must not contain control characters")
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


QUANTITY_PATTERN: Final = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?$"
_QUANTITY_RE: Final = re.compile(QUANTITY_PATTERN)
_SUFFIX: Final[dict[str, Decimal]] = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
}


#: Longest quantity string (the CRD's maxLength, so the API server and the model agree).
QUANTITY_MAX_LENGTH: Final = 64
#: Largest amount Kubernetes represents: a larger quantity is capped to it (apimachinery's
#: ``ParseQuantity``), so ``10^30`` and ``10^31`` compare equal on the API server.
QUANTITY_MAX: Final = Decimal(2**63 - 1)
#: Kubernetes rounds a quantity up to a whole nano unit.
_NANO: Final = Decimal("1e-9")


def parse_quantity(value: str) -> Decimal:
    """Value of a Kubernetes quantity in the subset this API accepts (e.g. ``500m``, ``1Gi``).

    Capped at :data:`QUANTITY_MAX` and rounded up to a nano unit exactly as the API server's
    ``quantity()`` does, so a comparison here (requests <= limits) agrees with the CRD's CEL rule.
    """
    match = _QUANTITY_RE.fullmatch(value)  # not .match: "$" also matches before a final "\n"
    if match is None:
        raise ValueError(f"{value!r} is not a quantity like 500m, 2, 256Mi or 1Gi")
    number = value[: len(value) - len(match.group(2) or "")]
    with localcontext() as ctx:
        ctx.prec = 2 * QUANTITY_MAX_LENGTH + 32  # exact for every string the pattern admits
        amount = min(Decimal(number) * _SUFFIX[match.group(2) or ""], QUANTITY_MAX)
        return amount.quantize(_NANO, rounding=ROUND_CEILING)


def _quantity_input(value: object) -> object:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        # The API server stores a whole JSON number (3.0) within int64 as the integer (3).
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value <= QUANTITY_MAX:
            raise ValueError(f"{value} is not a quantity: an integer amount is 0 to 2^63-1")
        value = str(value)
    if isinstance(value, str):
        if len(value) > QUANTITY_MAX_LENGTH:
            raise ValueError(f"a quantity is at most {QUANTITY_MAX_LENGTH} characters")
        parse_quantity(value)
    return value


Quantity = Annotated[
    str,
    BeforeValidator(_quantity_input),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "maxLength": QUANTITY_MAX_LENGTH},
            ],
            "pattern": QUANTITY_PATTERN,
        }
    ),
]


class ResourceList(ContractModel):
    """CPU and memory amounts (Kubernetes quantities)."""

    cpu: Quantity | None = Field(default=None, description="CPU, e.g. 500m or 2.")
    memory: Quantity | None = Field(default=None, description="Memory, e.g. 256Mi or 1Gi.")


#: Names of the resources a ResourceList carries, in the order they are reported.
RESOURCE_NAMES: Final[tuple[str, ...]] = ("cpu", "memory")

#: Requests a sandbox gets for what neither its spec nor the host policy states. Sized for an idle
#: sandbox (a sleeping shell holds ~2 MiB, an idle Python ~14 MiB) so that a node is not "full"
#: of sandboxes that do nothing: 100 of them reserve 1 CPU and 3.2 GiB. Runtime overhead (gVisor's
#: Sentry, a microVM) belongs in the RuntimeClass's ``overhead``, which Kubernetes adds on top.
DEFAULT_RESOURCE_REQUESTS: Final = ResourceList(cpu="10m", memory="32Mi")
#: Limits a sandbox gets for what neither its spec nor the host policy states: what one busy
#: sandbox may use at most.
DEFAULT_RESOURCE_LIMITS: Final = ResourceList(cpu="1", memory="512Mi")
#: Ceilings for a resource the host policy sets no ``maxLimits`` for (raised to the host's default
#: limit when that is larger): so an unconfigured host still refuses a spec asking 10^18 CPUs,
#: which the API server and the scheduler would otherwise take (the pod just never schedules).
#: A host that wants larger sandboxes says so in ``hostPolicy.resources.maxLimits``.
DEFAULT_RESOURCE_CEILING: Final = ResourceList(cpu="8", memory="16Gi")


def _amounts(rl: ResourceList) -> str:
    return " and ".join(f"{getattr(rl, r)} {r}" for r in RESOURCE_NAMES)


class ResourceRequirements(ContractModel):
    """CPU and memory requests and limits of the sandbox, as the spec states them.

    Anything left out is filled at admission from the host policy's defaults (see
    ``sandbox_operator.policy.resolve_resources``); the pod runs with the resolved values.
    """

    requests: ResourceList = Field(
        default_factory=ResourceList,
        description=(
            "Amounts reserved for the sandbox on its node; each at most its limit. What is left "
            "out gets the host's default request (unless configured: "
            f"{_amounts(DEFAULT_RESOURCE_REQUESTS)}), capped at the limit."
        ),
    )
    limits: ResourceList = Field(
        default_factory=ResourceList,
        description=(
            "Upper bounds the sandbox may not exceed. What is left out gets the host's default "
            f"limit (unless configured: {_amounts(DEFAULT_RESOURCE_LIMITS)}), raised to a "
            "larger stated request."
        ),
    )

    @model_validator(mode="after")
    def _requests_within_limits(self) -> ResourceRequirements:
        for resource in RESOURCE_NAMES:
            request = getattr(self.requests, resource)
            limit = getattr(self.limits, resource)
            if (
                request is not None
                and limit is not None
                and parse_quantity(request) > parse_quantity(limit)
            ):
                raise ValueError(
                    f"requests.{resource} ({request}) exceeds limits.{resource} ({limit})"
                )
        return self


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

#: Top directories of a posix guest a workDir may not be at or under: the kernel's and the
#: runtime's (mounting a work volume there breaks the guest or hands it host state), and the root.
POSIX_SYSTEM_DIRS: Final[tuple[str, ...]] = ("proc", "sys", "dev", "etc", "boot", "run", "var/run")
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
#: workDir at or under a posix system directory, or the root itself.
POSIX_SYSTEM_WORK_DIR_PATTERN: Final = (
    r"^/(" + "|".join(re.escape(d) for d in POSIX_SYSTEM_DIRS) + r")?(/|$)"
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
            r"/run, /var/run, C:\, C:\Windows, C:\Program Files, ...); use a directory of the "
            "workload's own, e.g. /workspace"
        )
    return None


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
        pattern=r"^(/|[A-Za-z]:[\\/])[^\x00-\x1f\x7f]*$",
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
    storage: Storage | None = Field(
        default=None,
        description=(
            "A persistent work directory (a PersistentVolumeClaim on runtime-class backends), "
            "kept while the sandbox is suspended; unset: the work directory lives and dies with "
            "the sandbox's compute."
        ),
    )

    @field_validator("work_dir", mode="before")
    @classmethod
    def _work_dir_absolute(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        if not (value.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", value)):
            raise ValueError(f"workDir {value!r} must be an absolute path")
        if _KEY_PART_FORBIDDEN.search(value):
            raise ValueError("workDir must not contain control characters")
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
