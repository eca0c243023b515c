"""The operator's configuration: the host policy and the backends the platform registers.

The platform owns this file (the Helm chart renders it into a ConfigMap). It is validated as a
whole before the operator starts: a malformed file, an unknown isolation rung or a fixed backend
below the floor raise :class:`~sandbox_operator.contract.ConfigurationError` naming the entry, and
the operator refuses to start. ``sandbox-operator check-config FILE`` runs the same validation
without a cluster.

Example (see ``examples/config-local.yaml`` and ``docs/operator.md``)::

    hostPolicy:
      minIsolation: hardened_container
      selection: perSpec
    backends:
      - name: gvisor
        type: runtimeClass
        runtimeClassName: gvisor
        isolation: hardened_container
        declarations:
          capabilities: [exec, run_code, files_in, files_out, files_list, files_delete, host_tools]
          egressModes: [closed]
          osFamilies: [posix]
          isolationScopes: [conversation, call]
          persistentStorage: true
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, get_args

import yaml
from pydantic import Field, TypeAdapter, ValidationError, field_validator, model_validator

from sandbox_operator.acas.config import AcasBackendConfig
from sandbox_operator.backends.runtimeclass.config import (
    DEFAULT_KEEP_ALIVE,
    DEFAULT_SANDBOX_UID,
    EGRESS_WINDOW_WARNING,
    NAME_PATTERN,
    EgressProxySettings,
    PodSettings,
    RuntimeClassBackendConfig,
)
from sandbox_operator.contract import ConfigurationError, HostPolicy
from sandbox_operator.contract.base import ContractModel
from sandbox_operator.egress.config import (
    HostAlias,
    ManagedEgressProxySettings,
    ProxyResources,
)
from sandbox_operator.policy import BackendProfile, validate_registration

#: One entry of ``backends``: the model is chosen by ``type``. Each backend's model sits beside its
#: driver (``sandbox_operator.backends.<package>.config``); a new backend type adds its model here.
BackendConfig = Annotated[
    RuntimeClassBackendConfig | AcasBackendConfig, Field(discriminator="type")
]
_BACKEND = TypeAdapter[RuntimeClassBackendConfig | AcasBackendConfig](BackendConfig)
#: The ``type`` values the union knows (for the error that names them), in its order.
BACKEND_TYPES: tuple[str, ...] = tuple(
    str(get_args(model.model_fields["type"].annotation)[0])
    for model in get_args(get_args(BackendConfig)[0])
)


class OperatorSettings(ContractModel):
    """Operator timings; the defaults suit a real cluster."""

    resync_seconds: float = Field(
        default=300.0,
        gt=0,
        le=86400,
        description="The safety-net resync: how often every Sandbox and SandboxScope the "
        "operator holds is passed over again (jittered by up to 10%). Passes are driven by watch "
        "events and deadlines; this only catches what a lost watch event would have missed, and "
        "costs no API call for an object that needs nothing.",
    )
    dispose_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description="How long one disposal may wait for the objects to be gone before it is "
        "reported as DisposalFailed (code timeout) and retried.",
    )
    disposal_retry_seconds: float = Field(default=10.0, gt=0, le=3600)
    scope_purge_attempts: int = Field(
        default=3,
        ge=1,
        le=100,
        description="Attempts at purging a deleted SandboxScope before the scope is let go with "
        "PurgeIncomplete (undisposed Sandboxes keep their own finalizers and keep retrying).",
    )


class RouterSettings(ContractModel):
    """The ports router the chart installs (docs/ports.md): only its external address is the
    operator's business, to show each declared port's URL in the Sandbox's status."""

    base_url: str = Field(
        min_length=1,
        max_length=1024,
        pattern=r"^https?://[^/?#\s]+(/[^?#\s]*)?$",
        description="The router's external base URL, e.g. https://sandboxes.example.com (no "
        "query or fragment); a port's URL is <baseUrl>/<namespace>/<sandbox>/<port>/.",
    )


class OperatorConfig(ContractModel):
    """The whole configuration file."""

    host_policy: HostPolicy = Field(default_factory=HostPolicy)
    backends: tuple[BackendConfig, ...] = Field(min_length=1)
    operator: OperatorSettings = Field(default_factory=OperatorSettings)
    router: RouterSettings | None = Field(
        default=None,
        description="The ports router, when the chart installs one (router.enabled).",
    )
    egress_proxy: ManagedEgressProxySettings | None = Field(
        default=None,
        description="The egress proxy the operator runs per namespace, for backends whose "
        "egressProxy says managed: true.",
    )

    @model_validator(mode="after")
    def _managed_proxy_is_described(self) -> OperatorConfig:
        if self.egress_proxy is not None:
            intercepting = self.egress_proxy.config.interception.enabled
            for index, backend in enumerate(self.backends):
                if backend.declarations.egress_rules_https and not intercepting:
                    raise ConfigurationError(
                        f"backends[{index}].declarations.egressRulesHttps",
                        "the operator's egress proxy does not terminate TLS: set "
                        "egressProxy.config.interception.enabled",
                    )
                if backend.declarations.egress_credentials and not (
                    intercepting
                    and backend.declarations.egress_rules_https
                    and self.egress_proxy.credentials_cluster_role
                ):
                    raise ConfigurationError(
                        f"backends[{index}].declarations.egressCredentials",
                        "credentials are attached inside TLS the proxy terminates, from Secrets "
                        "it may read: declare egressRulesHttps and set "
                        "egressProxy.config.interception.enabled and "
                        "egressProxy.credentialsClusterRole (the chart: egressCredentials)",
                    )
            return self
        for index, backend in enumerate(self.backends):
            proxy = getattr(backend, "egress_proxy", None)
            if isinstance(proxy, EgressProxySettings) and proxy.managed:
                raise ConfigurationError(
                    f"backends[{index}].egressProxy.managed",
                    "the operator runs no egress proxy: add the top-level egressProxy section "
                    "(at least its image), or point this backend at an external proxy (url, "
                    "port, podSelector)",
                )
        return self

    @field_validator("backends", mode="before")
    @classmethod
    def _parse_backends(cls, value: object) -> object:
        if not isinstance(value, list | tuple):
            raise ValueError("backends must be a list")
        return tuple(_parse_backend(index, entry) for index, entry in enumerate(value))

    def backend(self, name: str) -> BackendConfig | None:
        for b in self.backends:
            if b.name == name:
                return b
        return None

    @property
    def backend_names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.backends)


def _parse_backend(index: int, entry: object) -> object:
    """One ``backends`` entry through the union, its errors named ``backends[index]...`` (the
    union's tag left out of the path: the entry names its own type)."""
    entry_name = f"backends[{index}]"
    if not isinstance(entry, dict):
        if isinstance(entry, RuntimeClassBackendConfig | AcasBackendConfig):
            return entry
        raise ConfigurationError(entry_name, "must be a mapping")
    btype = entry.get("type")
    if btype not in BACKEND_TYPES:
        raise ConfigurationError(
            f"{entry_name}.type",
            f"unknown backend type {btype!r}; allowed: {', '.join(BACKEND_TYPES)}",
        )
    try:
        return _BACKEND.validate_python(entry)
    except ValidationError as exc:
        raise _config_error(exc, prefix=entry_name, tag=str(btype)) from None


def _loc(loc: Sequence[int | str], prefix: str = "") -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(file)"


def _config_error(exc: ValidationError, prefix: str = "", tag: str = "") -> ConfigurationError:
    first = exc.errors()[0]
    loc = [p for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
    if tag and loc[:1] == [tag]:
        loc = loc[1:]  # a discriminated union puts the tag first
    msg = first["msg"]
    # Do not echo possibly secret input values; pydantic's msg carries none.
    return ConfigurationError(_loc(loc, prefix), msg)


def profiles(
    config: OperatorConfig, unavailable: dict[str, str] | None = None
) -> tuple[BackendProfile, ...]:
    """The policy's view of the configured backends, with availability applied."""
    unavailable = unavailable or {}
    out = []
    for b in config.backends:
        out.append(
            BackendProfile(
                name=b.name,
                isolation=b.isolation,
                declarations=b.declarations,
                available=b.name not in unavailable,
                unavailable_reason=unavailable.get(b.name, ""),
            )
        )
    return tuple(out)


def parse_config(data: object) -> tuple[OperatorConfig, tuple[str, ...]]:
    """Validate a parsed YAML document; returns the config and policy warnings.

    Raises :class:`ConfigurationError` naming the offending entry.
    """
    if not isinstance(data, dict):
        raise ConfigurationError("(file)", "the configuration must be a YAML mapping")
    try:
        config = OperatorConfig.model_validate(data)
    except ConfigurationError:
        raise
    except ValidationError as exc:
        # A ConfigurationError raised inside a validator arrives wrapped; unwrap it.
        for err in exc.errors():
            ctx_error = (err.get("ctx") or {}).get("error")
            if isinstance(ctx_error, ConfigurationError):
                raise ctx_error from None
        raise _config_error(exc) from None
    names = [b.name for b in config.backends]
    for index, name in enumerate(names):
        if name in names[:index]:
            raise ConfigurationError(f"backends[{index}].name", f"duplicate backend name {name!r}")
    warnings = validate_registration(config.host_policy, profiles(config))
    return config, (*warnings, *_disposal_warnings(config))


def _disposal_warnings(config: OperatorConfig) -> tuple[str, ...]:
    """A backend whose disposals delete pods with no grace period opens an egress window at
    every disposal on some policy engines: allowed (the cluster's operator opted in), named."""
    return tuple(
        EGRESS_WINDOW_WARNING.format(index=index, name=backend.name)
        for index, backend in enumerate(config.backends)
        if isinstance(backend, RuntimeClassBackendConfig)
        and backend.pod.disposal_grace_period_seconds == 0
    )


def load_config(path: str | Path) -> tuple[OperatorConfig, tuple[str, ...]]:
    """Read and validate a configuration file (see :func:`parse_config`)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigurationError("(file)", f"cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigurationError("(file)", f"not valid YAML{where}") from None
    return parse_config(data)


__all__ = [
    "BACKEND_TYPES",
    "DEFAULT_KEEP_ALIVE",
    "DEFAULT_SANDBOX_UID",
    "NAME_PATTERN",
    "AcasBackendConfig",
    "BackendConfig",
    "EgressProxySettings",
    "HostAlias",
    "ManagedEgressProxySettings",
    "OperatorConfig",
    "OperatorSettings",
    "PodSettings",
    "ProxyResources",
    "RuntimeClassBackendConfig",
    "load_config",
    "parse_config",
    "profiles",
]


#: Where a pod's service account mounts its namespace (read when ``POD_NAMESPACE`` is not set).
SERVICE_ACCOUNT_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@functools.cache
def operator_namespace() -> str | None:
    """The namespace this operator process runs in, or None outside a pod.

    ``$POD_NAMESPACE`` (the chart sets it from the downward API), else the namespace file of the
    pod's service account, else None. Read once per process, here only: a pod's namespace never
    changes under it, and the peering identity (``cli``) and the namespace of an ``acas``
    credential Secret named without one (``backends.build_driver``) must agree on it."""
    value = os.environ.get("POD_NAMESPACE")
    if value:
        return value
    try:
        return SERVICE_ACCOUNT_NAMESPACE_FILE.read_text().strip() or None
    except OSError:
        return None
