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

import importlib
import ipaddress
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from sandbox_operator.contract import (
    BackendDeclarations,
    ConfigurationError,
    HostPolicy,
)
from sandbox_operator.egress.config import IdentityMode, ProxyConfig
from sandbox_operator.policy import BackendProfile, validate_registration

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"

#: Default keep-alive: a POSIX shell that sleeps until told to stop, and stops at once on SIGTERM.
#: The workload itself runs through pods/exec.
DEFAULT_KEEP_ALIVE: tuple[str, ...] = (
    "/bin/sh",
    "-c",
    "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done",
)

#: The unprivileged uid/gid sandbox containers run as unless a backend says otherwise
#: (the conventional "nonroot" id of distroless images; any uid works for the shipped images).
DEFAULT_SANDBOX_UID = 65532


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class PodSettings(_Model):
    """How a runtime-class backend shapes the pods it creates (all fields optional)."""

    run_as_user: int | None = Field(
        default=DEFAULT_SANDBOX_UID,
        ge=0,
        description="uid of the sandbox container; null keeps the image's own user.",
    )
    run_as_group: int | None = Field(default=DEFAULT_SANDBOX_UID, ge=0)
    fs_group: int | None = Field(default=DEFAULT_SANDBOX_UID, ge=0)
    run_as_non_root: bool = Field(
        default=True,
        description="Ask the kubelet to refuse a container that would run as root. Only false "
        "for images that cannot run unprivileged (then runAsUser must be null or 0).",
    )
    read_only_root_filesystem: bool = Field(
        default=True,
        description="Mount the image read-only; the work dir and /tmp are writable emptyDirs.",
    )
    image_pull_policy: Literal["Never", "IfNotPresent", "Always"] = "IfNotPresent"
    keep_alive_command: tuple[str, ...] = Field(default=DEFAULT_KEEP_ALIVE, min_length=1)
    termination_grace_period_seconds: int = Field(default=5, ge=0, le=300)
    tmp_size_limit: str = Field(default="64Mi", description="Size limit of the /tmp emptyDir.")
    work_dir_size_limit: str | None = Field(
        default=None, description="Size limit of the work dir emptyDir (none by default)."
    )
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()

    @model_validator(mode="after")
    def _non_root_consistent(self) -> PodSettings:
        if self.run_as_non_root and self.run_as_user == 0:
            raise ValueError("runAsUser 0 (root) contradicts runAsNonRoot true")
        return self


class EgressProxySettings(_Model):
    """Where a backend's allowlisted sandboxes send their traffic (the proxy enforces the list).

    Two modes, and a backend says which one explicitly:

    * ``managed: true``: the operator runs the proxy itself, one per namespace, as described by
      the operator-level ``egressProxy`` section (:class:`ManagedEgressProxySettings`); the
      sandbox gets the proxy Service's address. Nothing else may be set here (the operator
      chooses address, port and selectors), so a half-managed entry cannot exist.
    * external (default): somebody else runs the proxy. A sandbox with ``egress: allowlist``
      gets ``HTTPS_PROXY``/``HTTP_PROXY`` set to ``url`` and a NetworkPolicy that allows egress
      only to pods matching the selectors on ``port``.
    """

    managed: bool = Field(
        default=False,
        description="true: use the proxy the operator runs per namespace (operator-level "
        "egressProxy); url, port and the selectors then come from the operator.",
    )
    url: str | None = Field(
        default=None, min_length=1, description="Proxy URL given to the sandbox, e.g. http://p:3128"
    )
    port: int | None = Field(default=None, ge=1, le=65535)
    pod_selector: dict[str, str] = Field(default_factory=dict)
    namespace_selector: dict[str, str] | None = Field(
        default=None, description="null: the sandbox's own namespace; {}: any namespace."
    )
    no_proxy: str = Field(default="", description="NO_PROXY value, if any.")

    @model_validator(mode="after")
    def _one_mode(self) -> EgressProxySettings:
        if self.managed:
            given = [
                alias
                for name, alias in (
                    ("url", "url"),
                    ("port", "port"),
                    ("pod_selector", "podSelector"),
                    ("namespace_selector", "namespaceSelector"),
                    ("no_proxy", "noProxy"),
                )
                if name in self.model_fields_set
            ]
            if given:
                raise ValueError(
                    f"managed: true takes the proxy's address from the operator; remove "
                    f"{', '.join(given)}"
                )
            return self
        missing = [a for n, a in (("url", "url"), ("port", "port")) if getattr(self, n) is None]
        if missing:
            raise ValueError(
                f"an external egress proxy needs {' and '.join(missing)} "
                "(or managed: true for the proxy the operator runs)"
            )
        return self


class HostAlias(_Model):
    """One /etc/hosts entry of the proxy pod (e.g. so that test names resolve)."""

    ip: str
    hostnames: tuple[Annotated[str, Field(min_length=1, max_length=253)], ...] = Field(min_length=1)

    @field_validator("ip")
    @classmethod
    def _an_address(cls, value: str) -> str:
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address") from None


ResourceName = Literal["cpu", "memory", "ephemeral-storage"]
_PROXY_REQUESTS: dict[ResourceName, str] = {"cpu": "50m", "memory": "64Mi"}
_PROXY_LIMITS: dict[ResourceName, str] = {"memory": "256Mi"}


class ProxyResources(_Model):
    """Requests and limits of the proxy container (Kubernetes quantities)."""

    requests: dict[ResourceName, str] = Field(default_factory=lambda: dict(_PROXY_REQUESTS))
    limits: dict[ResourceName, str] = Field(default_factory=lambda: dict(_PROXY_LIMITS))


class ManagedEgressProxySettings(_Model):
    """The egress proxy the operator runs, one per namespace that has allowlisted sandboxes.

    The pod runs ``python3 -m sandbox_operator.egress`` from ``image`` (the chart defaults it to
    the operator's own image, which contains the proxy), keeps its sandbox table from the
    namespace's Sandboxes itself (``--kube-namespace``) and reads ``config`` - the proxy's own
    :class:`~sandbox_operator.egress.config.ProxyConfig` (allowedPorts, admittedNetworks,
    refusedNetworks, metadataNetworks, limits, decisionBuffer) - from a ConfigMap. What the
    operator decides (listen port, identity, the sandboxes) is refused there, so the file says
    only what the platform chose.
    """

    image: str = Field(min_length=1, description="Image with sandbox_operator (the operator's).")
    image_pull_policy: Literal["Never", "IfNotPresent", "Always"] = "IfNotPresent"
    port: int = Field(default=3128, ge=1, le=65535, description="Proxy and Service port.")
    runtime_class_name: str | None = Field(
        default=None,
        pattern=NAME_PATTERN,
        description="Run the proxy itself on this RuntimeClass (e.g. gvisor: it parses "
        "untrusted input); null: the cluster default.",
    )
    resources: ProxyResources = Field(default_factory=ProxyResources)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    host_aliases: tuple[HostAlias, ...] = ()
    config: ProxyConfig = Field(default_factory=ProxyConfig)

    @field_validator("config")
    @classmethod
    def _operator_decides(cls, value: ProxyConfig, info: ValidationInfo) -> ProxyConfig:
        if value.sandboxes:
            raise ValueError(
                "sandboxes must be empty: the managed proxy keeps its own table from the "
                "namespace's allowlist Sandboxes"
            )
        if value.identity is not IdentityMode.SOURCE_IP:
            raise ValueError(
                f"identity {value.identity} is not supported by the managed proxy (it tells "
                "sandboxes apart by pod IP; token modes need per-sandbox Secrets): use sourceIP"
            )
        port = info.data.get("port")
        if "listen_port" in value.model_fields_set and value.listen_port != port:
            raise ValueError(
                f"listenPort {value.listen_port} differs from egressProxy.port {port}; "
                "set only egressProxy.port"
            )
        return value

    def proxy_config(self) -> ProxyConfig:
        """The proxy's config file content: ``config`` listening on ``port``, no sandboxes."""
        return self.config.model_copy(update={"listen_port": self.port})


class RuntimeClassBackendConfig(_Model):
    """A backend served by pods on a Kubernetes RuntimeClass (runc, gVisor, Kata, ...)."""

    type: Literal["runtimeClass"]
    name: str = Field(pattern=NAME_PATTERN, description="Backend name used in status and policy.")
    runtime_class_name: str = Field(pattern=NAME_PATTERN)
    isolation: str = Field(
        description="The isolation rung this runtime truly provides (validated against the "
        "ladder; an unknown rung is refused, never guessed)."
    )
    declarations: BackendDeclarations = Field(default_factory=BackendDeclarations)
    pod: PodSettings = Field(default_factory=PodSettings)
    egress_proxy: EgressProxySettings | None = Field(
        default=None,
        description="Required for serving egress allowlist (declare allowlist only with it).",
    )


def _acas_model() -> type[BaseModel] | None:
    """The acas backend's config model, when that backend is part of this build."""
    try:
        module = importlib.import_module("sandbox_operator.backends.acas.config")
    except ImportError:
        return None
    for attr in ("AcasBackendConfig", "AcasConfig"):
        model = getattr(module, attr, None)
        if isinstance(model, type) and issubclass(model, BaseModel):
            return model
    return None


class OperatorSettings(_Model):
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


class OperatorConfig(_Model):
    """The whole configuration file."""

    host_policy: HostPolicy = Field(default_factory=HostPolicy)
    backends: tuple[Any, ...] = Field(min_length=1)
    operator: OperatorSettings = Field(default_factory=OperatorSettings)
    egress_proxy: ManagedEgressProxySettings | None = Field(
        default=None,
        description="The egress proxy the operator runs per namespace, for backends whose "
        "egressProxy says managed: true.",
    )

    @model_validator(mode="after")
    def _managed_proxy_is_described(self) -> OperatorConfig:
        if self.egress_proxy is not None:
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
        parsed: list[BaseModel] = []
        for index, entry in enumerate(value):
            parsed.append(_parse_backend(index, entry))
        return tuple(parsed)

    def backend(self, name: str) -> Any | None:
        for b in self.backends:
            if b.name == name:
                return b
        return None

    @property
    def backend_names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.backends)


def _parse_backend(index: int, entry: object) -> BaseModel:
    entry_name = f"backends[{index}]"
    if isinstance(entry, BaseModel):
        return entry
    if not isinstance(entry, dict):
        raise ConfigurationError(entry_name, "must be a mapping")
    btype = entry.get("type")
    if btype == "runtimeClass":
        model: type[BaseModel] = RuntimeClassBackendConfig
    elif btype == "acas":
        acas = _acas_model()
        if acas is None:
            raise ConfigurationError(
                f"{entry_name}.type", "acas backends are not available in this build"
            )
        model = acas
    else:
        raise ConfigurationError(
            f"{entry_name}.type", f"unknown backend type {btype!r}; allowed: runtimeClass, acas"
        )
    try:
        return model.model_validate(entry)
    except ValidationError as exc:
        raise _config_error(exc, prefix=entry_name) from None


def _loc(loc: Sequence[int | str], prefix: str = "") -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(file)"


def _config_error(exc: ValidationError, prefix: str = "") -> ConfigurationError:
    first = exc.errors()[0]
    loc = [p for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
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
    return config, tuple(warnings)


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
