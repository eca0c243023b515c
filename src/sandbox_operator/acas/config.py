"""Configuration of one `acas` backend (Azure Container Apps sandboxes) in the operator config.

It sits beside the driver that reads it; `sandbox_operator.config.OperatorConfig` takes
`AcasBackendConfig` into its backends union, discriminated by `type`. The models are contract
models (`ContractModel`): camelCase on the wire, unknown fields refused, immutable.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, field_validator, model_validator

from sandbox_operator.contract import (
    BackendDeclarations,
    Capability,
    Egress,
    IsolationScope,
    OsFamily,
    TransferLimits,
)
from sandbox_operator.contract.base import ContractModel

from .operations import API_VERSION, TOKEN_SCOPE

MiB = 1024 * 1024

#: Capabilities the backend really serves through the data-plane API.
ACAS_CAPABILITIES = frozenset(
    {
        Capability.EXEC,
        Capability.RUN_CODE,
        Capability.FILES_IN,
        Capability.FILES_OUT,
        Capability.FILES_LIST,
        Capability.FILES_DELETE,
        Capability.HOST_TOOLS,  # the client's channel over exec + files (docs/host-tools.md)
    }
)
#: Egress modes the service's inline egress policy enforces (default Deny + host allow rules).
ACAS_EGRESS_MODES = frozenset({Egress.CLOSED, Egress.ALLOWLIST})


def default_declarations() -> BackendDeclarations:
    """What an `acas` backend declares when the config says nothing."""
    return BackendDeclarations(
        capabilities=ACAS_CAPABILITIES,
        limits=TransferLimits(max_bytes_per_file=8 * MiB, max_total_bytes=32 * MiB, max_files=64),
        egress_modes=ACAS_EGRESS_MODES,
        os_families=frozenset({OsFamily.POSIX}),
        isolation_scopes=frozenset({IsolationScope.CONVERSATION, IsolationScope.CALL}),
        # No: the service keeps no per-request egress record this backend could read, so it
        # produces none, and a backend that produces none does not declare it.
        observes_egress=False,
        # Reference section 3.8: `POST .../stop` "saves state as a snapshot" (the 200 answer is
        # that Snapshot) and `POST .../resume` "resumes a stopped sandbox from a snapshot"; the
        # remote sandbox (its id, labels, egress and lifecycle policies) stays in place while
        # Stopped. So the work directory's files survive a suspend (the whole sandbox disk
        # does). Processes and memory are not promised: the reference does not say a stop keeps
        # them. `spec.storage.size` becomes the disk asked of the service (`resources.disk`,
        # section 3.2); storageClassName and accessMode have no meaning there (docs/backends/
        # acas.md, "Suspend and resume"). The kept state lasts as long as the remote sandbox:
        # its auto-delete lifetime counts from creation, suspended or not.
        persistent_storage=True,
    )


class SecretCredentialSource(ContractModel):
    """A Kubernetes Secret (in the operator's namespace unless `namespace` is set) holding a
    service principal (`tenantId`, `clientId`, `clientSecret` by default), or a ready bearer
    token under `tokenKey` (loopback stand-in and tests only)."""

    source: Literal["secret"] = "secret"
    secret_name: str = Field(min_length=1, max_length=253)
    namespace: str | None = Field(default=None, min_length=1, max_length=63)
    tenant_id_key: str = "tenantId"
    client_id_key: str = "clientId"
    client_secret_key: str = "clientSecret"
    token_key: str | None = Field(
        default=None, description="Key of a static bearer token; for the stand-in, not Azure."
    )


class WorkloadIdentityCredentialSource(ContractModel):
    """Azure workload identity: the projected service-account token is exchanged for an Entra
    token (`AZURE_TENANT_ID`, `AZURE_CLIENT_ID`, `AZURE_FEDERATED_TOKEN_FILE` fill what is
    not set here, as the workload-identity webhook injects them)."""

    source: Literal["workloadIdentity"] = "workloadIdentity"
    tenant_id: str | None = None
    client_id: str | None = None
    token_file_path: str | None = None


CredentialSource = Annotated[
    SecretCredentialSource | WorkloadIdentityCredentialSource, Field(discriminator="source")
]


def _seconds(default: float, *, le: float, doc: str | None = None) -> Any:
    """A field of seconds: positive, at most ``le``."""
    return Field(default=default, gt=0, le=le, description=doc)


class AcasTimeouts(ContractModel):
    """Seconds. Every HTTP call has connect/read/write/pool timeouts; `execute` replaces the read
    timeout of command executions; the rest bound the waits of the driver."""

    connect: float = _seconds(5.0, le=120)
    read: float = _seconds(30.0, le=600)
    write: float = _seconds(30.0, le=600)
    pool: float = _seconds(5.0, le=120)
    execute: float = _seconds(600.0, le=3600)
    delete: float = _seconds(300.0, le=3600, doc="How long to wait for a deleted sandbox to go.")
    poll_interval: float = _seconds(3.0, le=60)
    stop: float = _seconds(180.0, le=3600, doc="Bound on a blocking stop (the SDK waits 180 s).")
    resume: float = _seconds(300.0, le=3600, doc="Bound on a resume (the SDK waits 300 s).")


class AcasRetries(ContractModel):
    """Retries of idempotent calls on 429/503 and connection failures (never of executions or
    other non-idempotent POSTs). `Retry-After` is honoured up to `maxRetryAfterSeconds`."""

    max_attempts: int = Field(default=4, ge=1, le=10)
    base_delay_seconds: float = Field(default=0.5, ge=0, le=30)
    max_delay_seconds: float = Field(default=10.0, ge=0, le=120)
    max_retry_after_seconds: float = Field(default=60.0, ge=0, le=600)


class AcasLifetime(ContractModel):
    """What bounds an orphan (a remote sandbox whose Sandbox resource or operator is gone).

    Every sandbox is created with the service's lifecycle policy: auto-delete `maxLifetimeSeconds`
    after creation (clamped to the Sandbox's own ttl plus `graceSeconds` when it has one), and
    auto-suspend after `idleSuspendSeconds` without activity. The service enforces both even
    when no operator runs.
    """

    max_lifetime_seconds: int = Field(default=24 * 3600, ge=60, le=30 * 24 * 3600)
    grace_seconds: int = Field(default=600, ge=0, le=24 * 3600)
    idle_suspend_seconds: int = Field(default=900, ge=30, le=7 * 24 * 3600)


class AcasBackendConfig(ContractModel):
    """One `acas` backend entry of the operator configuration."""

    # Validation errors must not echo the endpoint (or anything else) back into logs.
    model_config = ContractModel.model_config | ConfigDict(hide_input_in_errors=True)

    #: No reset: the service offers no way to replace a sandbox's compute under its id.
    resets: ClassVar[bool] = False

    type: Literal["acas"]
    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    endpoint: str = Field(
        description="Data-plane base URL, e.g. https://management.<region>.azuredevcompute.io. "
        "https is required except for loopback (the test stand-in)."
    )
    subscription: str = Field(min_length=1, max_length=128)
    resource_group: str = Field(min_length=1, max_length=90)
    sandbox_group: str = Field(min_length=1, max_length=128)
    api_version: str = Field(default=API_VERSION, min_length=1)
    isolation: Literal["microvm"] = Field(
        default="microvm", description="Declared rung: each sandbox is a hardware-isolated microVM."
    )
    declarations: BackendDeclarations = Field(default_factory=default_declarations)
    credential: CredentialSource
    token_scope: str = Field(default=TOKEN_SCOPE, min_length=1)
    create_method: Literal["PUT", "POST"] = Field(
        default="PUT",
        description="PUT on the collection (live service and SDK) or POST (Swagger 01868f55).",
    )
    file_write_method: Literal["PUT", "POST"] = "POST"
    stop_method: Literal["blocking", "async"] = Field(
        default="blocking",
        description="Suspend with the blocking POST .../stop (Swagger 01868f55, answers when "
        "the snapshot is saved) or POST .../stop/async (202 Stopping; TypeSpec only, not in "
        "that Swagger), whose end the driver learns by reading the sandbox again.",
    )
    default_image: str = Field(
        default="ubuntu", min_length=1, description="Public disk image for specs without a map."
    )
    images: dict[str, str] = Field(
        default_factory=dict,
        description="Spec image -> public disk image name; unmapped images are used as named.",
    )
    lifetime: AcasLifetime = Field(default_factory=AcasLifetime)
    timeouts: AcasTimeouts = Field(default_factory=AcasTimeouts)
    retries: AcasRetries = Field(default_factory=AcasRetries)
    observe_interval_seconds: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="The driver reads the group's remote sandboxes with one label-filtered list "
        "per interval; observe answers from that list, and changes seen between two lists are "
        "reported to the operator. A list older than 3 intervals is no longer trusted.",
    )

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise ValueError("endpoint must be an absolute http(s) URL")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError("endpoint must not carry a query, fragment or user info")
        if parts.scheme == "http" and not _is_loopback(parts.hostname):
            raise ValueError("endpoint must use https (plain http only for loopback)")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _declarations_served(self) -> AcasBackendConfig:
        extra_caps = self.declarations.capabilities - ACAS_CAPABILITIES
        if extra_caps:
            raise ValueError(
                "declarations.capabilities names what the acas backend does not serve: "
                + ", ".join(sorted(c.value for c in extra_caps))
            )
        extra_egress = self.declarations.egress_modes - ACAS_EGRESS_MODES - {Egress.UNRESTRICTED}
        if extra_egress:  # pragma: no cover - the enum has no other members today
            raise ValueError("declarations.egressModes names an unknown mode")
        if OsFamily.WINDOWS in self.declarations.os_families:
            raise ValueError("declarations.osFamilies: acas sandboxes are posix guests")
        if self.declarations.observes_egress:
            raise ValueError(
                "declarations.observesEgress: the acas backend produces no egress records"
            )
        declared = self.declarations
        if declared.egress_rules or declared.egress_rules_https or declared.egress_credentials:
            raise ValueError(
                "declarations.egressRules: the service's egress policy names hosts only"
            )
        return self

    def image_for(self, spec_image: str) -> str:
        """Public disk image name for a spec's image."""
        if not spec_image:
            return self.default_image
        return self.images.get(spec_image, spec_image)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
