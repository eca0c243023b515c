"""Typed configuration of the egress proxy (pydantic v2).

The same model is used by the operator when it runs the proxy in-process and by
``python -m sandbox_operator.egress --config FILE`` when the proxy runs in a pod; and
:class:`ManagedEgressProxySettings`, the operator configuration's ``egressProxy`` section that
says how the operator runs that pod.
"""

from __future__ import annotations

import ipaddress
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sandbox_operator.contract.base import ContractModel
from sandbox_operator.contract.egressrules import EgressCredential, EgressMethod, EgressPath
from sandbox_operator.egress.credentials import CredentialRef
from sandbox_operator.egress.hostmatch import HostPattern
from sandbox_operator.egress.requestrules import RequestRule

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Every address range that is not "somewhere on the public internet": IANA special-purpose
# registries (RFC 6890 and successors) plus the cloud-metadata endpoints. A resolved address in
# one of these is refused unless an ``admitted_networks`` entry carves it out.
DEFAULT_REFUSED_NETWORKS: tuple[str, ...] = (
    # IPv4
    "0.0.0.0/8",  # "this network", includes the unspecified address
    "10.0.0.0/8",  # private
    "100.64.0.0/10",  # carrier-grade NAT (shared address space)
    "127.0.0.0/8",  # loopback
    "169.254.0.0/16",  # link-local (includes 169.254.169.254 metadata)
    "172.16.0.0/12",  # private
    "192.0.0.0/24",  # IETF protocol assignments
    "192.0.2.0/24",  # documentation
    "192.88.99.0/24",  # 6to4 relay anycast
    "192.168.0.0/16",  # private
    "198.18.0.0/15",  # benchmarking
    "198.51.100.0/24",  # documentation
    "203.0.113.0/24",  # documentation
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, includes 255.255.255.255 broadcast
    # IPv6
    "::/96",  # unspecified, loopback, IPv4-compatible (deprecated)
    "::ffff:0:0/96",  # IPv4-mapped: refused outright rather than unwrapped
    "64:ff9b::/96",  # NAT64 well-known prefix (embeds an IPv4 address)
    "64:ff9b:1::/48",  # local-use NAT64
    "100::/64",  # discard-only
    "2001::/23",  # IETF protocol assignments (includes Teredo 2001::/32)
    "2001:db8::/32",  # documentation
    "2002::/16",  # 6to4 (embeds an IPv4 address)
    "fc00::/7",  # unique local (includes fd00:ec2::254 metadata)
    "fe80::/10",  # link-local
    "fec0::/10",  # site-local (deprecated)
    "ff00::/8",  # multicast
)

# Cloud instance-metadata endpoints. Refused even when an admitted network covers them, so a
# test or operator that admits e.g. 169.254.0.0/16 still cannot reach instance credentials.
DEFAULT_METADATA_NETWORKS: tuple[str, ...] = (
    "169.254.169.254/32",  # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle
    "169.254.170.2/32",  # AWS ECS task metadata
    "169.254.169.123/32",  # AWS time sync (same host family)
    "100.100.100.200/32",  # Alibaba Cloud
    "192.0.0.192/32",  # Oracle Cloud (legacy)
    "fd00:ec2::254/128",  # AWS IMDS over IPv6
    "fd00:ec2::123/128",  # AWS time sync over IPv6
)


class IdentityMode(StrEnum):
    """How the proxy decides which sandbox a connection belongs to."""

    SOURCE_IP = "sourceIP"  # the connection's source address is in the sandbox's source_ips
    TOKEN = "token"  # Proxy-Authorization carries the sandbox's token
    SOURCE_IP_AND_TOKEN = "sourceIPAndToken"  # both must name the same sandbox


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class Limits(_Model):
    """Bounds on what one client connection may cost the proxy."""

    max_header_bytes: Annotated[int, Field(ge=1024, le=1 << 20, alias="maxHeaderBytes")] = 16384
    header_timeout_seconds: Annotated[float, Field(gt=0, le=300, alias="headerTimeoutSeconds")] = (
        10.0
    )
    connect_timeout_seconds: Annotated[
        float, Field(gt=0, le=300, alias="connectTimeoutSeconds")
    ] = 10.0
    idle_timeout_seconds: Annotated[float, Field(gt=0, le=86400, alias="idleTimeoutSeconds")] = (
        300.0
    )
    max_connection_seconds: Annotated[
        float, Field(gt=0, le=7 * 86400, alias="maxConnectionSeconds")
    ] = 3600.0
    max_connections: Annotated[int, Field(ge=1, le=1_000_000, alias="maxConnections")] = 4096
    max_connections_per_sandbox: Annotated[
        int, Field(ge=1, le=1_000_000, alias="maxConnectionsPerSandbox")
    ] = 512
    # Per source address, counted from accept (so also while a head is still arriving).
    max_connections_per_client: Annotated[
        int, Field(ge=1, le=1_000_000, alias="maxConnectionsPerClient")
    ] = 1024


class SandboxRule(_Model):
    """One host reachable only for some methods and paths (a Sandbox's admitted egressRules)."""

    host: str
    methods: tuple[EgressMethod, ...] | None = Field(default=None, min_length=1)
    paths: tuple[EgressPath, ...] | None = Field(default=None, min_length=1)
    #: ``http``: judged on plain requests; ``https``: judged inside TLS the proxy terminates
    #: (only where it holds an interception CA; without one a CONNECT to the host is refused).
    schemes: tuple[Literal["http", "https"], ...] = Field(default=("http",), min_length=1)
    #: A Secret's value the proxy attaches as a header to the https requests this rule admits
    #: (``credentials.py``); only a reference, as admission judged it.
    credential: EgressCredential | None = None

    @model_validator(mode="after")
    def _credential_for_one_origin(self) -> SandboxRule:
        if self.credential is not None and (self.schemes != ("https",) or "*" in self.host):
            raise ValueError("a rule's credential needs schemes [https] only and an exact host")
        return self

    @field_validator("host")
    @classmethod
    def _parse_pattern(cls, value: str) -> str:
        pattern = HostPattern.parse(value)
        if pattern.port is not None:
            raise ValueError("a rule's host has no port: it admits the proxy's allowedPorts")
        return str(pattern)

    def request_rule(self) -> RequestRule:
        return RequestRule(
            host=HostPattern.parse(self.host),
            methods=frozenset(self.methods) if self.methods is not None else None,
            paths=self.paths,
            schemes=frozenset(self.schemes),
            credential=(
                CredentialRef(c.secret_name, c.key, c.header, c.prefix)
                if (c := self.credential) is not None
                else None
            ),
        )


class SandboxEgress(_Model):
    """One sandbox's identity and allowlist.

    ``allow`` entries are ``host``, ``*.domain`` or either with ``:port``. Without a port an
    entry admits the proxy's ``allowed_ports``; with one it admits exactly that port. ``rules``
    name hosts reachable only for some methods and paths, on the ``allowed_ports``: a host a
    rule names is judged by the rules alone (``requestrules``).
    """

    id: Annotated[str, Field(min_length=1, max_length=253)]
    allow: tuple[str, ...] = ()
    rules: tuple[SandboxRule, ...] = ()
    source_ips: tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, ...] = Field(
        default=(), alias="sourceIPs"
    )
    token_sha256: str | None = Field(default=None, alias="tokenSHA256")

    @field_validator("allow")
    @classmethod
    def _parse_patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # Normalised spelling; raises ValueError (-> ValidationError) on a malformed entry.
        return tuple(str(HostPattern.parse(v)) for v in value)

    def patterns(self) -> tuple[HostPattern, ...]:
        return tuple(HostPattern.parse(v) for v in self.allow)

    def request_rules(self) -> tuple[RequestRule, ...]:
        return tuple(r.request_rule() for r in self.rules)

    @field_validator("token_sha256")
    @classmethod
    def _hex_digest(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.lower()
        if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
            raise ValueError("tokenSHA256 must be 64 hex digits (the SHA-256 of the token)")
        return value


#: The interception CA's certificate in the proxy's ConfigMap (``ca.crt``; ``bundle.crt``: the
#: operator image's public roots and the CA), mounted read-only in sandbox pods at
#: ``CA_MOUNT_DIR``; its key in the proxy's Secret (``ca.key``), mounted in the proxy pod only.
CA_CERT_KEY: Final = "ca.crt"
CA_BUNDLE_KEY: Final = "bundle.crt"
CA_KEY_KEY: Final = "ca.key"
CA_MOUNT_DIR: Final = "/etc/sandbox-egress-ca"


class Interception(_Model):
    """TLS terminated at the proxy for hosts whose egressRules name https (egress/inspected.py).

    ``enabled``: the proxy makes a CA at start (its key only in the proxy's memory) and, with
    ``--kube-namespace``, publishes the CA's certificate in the ConfigMap the sandbox pods mount.
    ``extraUpstreamRoots``: PEM certificates the proxy trusts for upstreams besides the system's
    roots (a private CA of the platform's own services; tests).
    """

    enabled: bool = False
    extra_upstream_roots: str | None = Field(default=None, alias="extraUpstreamRoots")

    @field_validator("extra_upstream_roots")
    @classmethod
    def _pem(cls, value: str | None) -> str | None:
        if value is not None and "-----BEGIN CERTIFICATE-----" not in value:
            raise ValueError("extraUpstreamRoots must hold PEM certificates")
        return value


class ProxyConfig(_Model):
    """Everything the proxy needs; ``sandboxes`` is the part the operator changes at run time."""

    listen_host: str = Field(default="0.0.0.0", alias="listenHost")
    listen_port: Annotated[int, Field(ge=0, le=65535, alias="listenPort")] = 3128
    identity: IdentityMode = IdentityMode.SOURCE_IP
    allowed_ports: tuple[Annotated[int, Field(ge=1, le=65535)], ...] = Field(
        default=(80, 443), alias="allowedPorts"
    )
    refused_networks: tuple[Network, ...] = Field(
        default=tuple(ipaddress.ip_network(n) for n in DEFAULT_REFUSED_NETWORKS),
        alias="refusedNetworks",
    )
    admitted_networks: tuple[Network, ...] = Field(default=(), alias="admittedNetworks")
    metadata_networks: tuple[Network, ...] = Field(
        default=tuple(ipaddress.ip_network(n) for n in DEFAULT_METADATA_NETWORKS),
        alias="metadataNetworks",
    )
    limits: Limits = Limits()
    decision_buffer: Annotated[int, Field(ge=1, le=1_000_000, alias="decisionBuffer")] = 4096
    interception: Interception = Interception()
    sandboxes: tuple[SandboxEgress, ...] = ()

    @model_validator(mode="after")
    def _unique_identities(self) -> ProxyConfig:
        ids: set[str] = set()
        ips: dict[str, str] = {}
        tokens: set[str] = set()
        for sb in self.sandboxes:
            if sb.id in ids:
                raise ValueError(f"sandbox id {sb.id!r} appears twice")
            ids.add(sb.id)
            for ip in sb.source_ips:
                other = ips.setdefault(str(ip), sb.id)
                if other != sb.id:
                    raise ValueError(f"source IP {ip} is claimed by {other!r} and {sb.id!r}")
            if sb.token_sha256 is not None:
                if sb.token_sha256 in tokens:
                    raise ValueError(f"sandbox {sb.id!r} reuses another sandbox's token")
                tokens.add(sb.token_sha256)
            if self.identity is not IdentityMode.TOKEN and not sb.source_ips:
                raise ValueError(f"sandbox {sb.id!r} has no sourceIPs (identity {self.identity})")
            if self.identity is not IdentityMode.SOURCE_IP and sb.token_sha256 is None:
                raise ValueError(f"sandbox {sb.id!r} has no tokenSHA256 (identity {self.identity})")
        return self


# ---- the proxy the operator runs --------------------------------------------------------------
# The operator-level ``egressProxy`` section of the operator configuration: how the operator runs
# this proxy per namespace, and the ProxyConfig it hands it. It lives here, not in
# ``sandbox_operator.config``, so the backends that deploy the proxy import it without importing
# the operator configuration (which imports the backends' own config models).

#: A RuntimeClass name (a DNS-1123 label, as the backends' ``runtimeClassName``).
_RUNTIME_CLASS_NAME = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


class HostAlias(ContractModel):
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


class ProxyResources(ContractModel):
    """Requests and limits of the proxy container (Kubernetes quantities)."""

    requests: dict[ResourceName, str] = Field(default_factory=lambda: dict(_PROXY_REQUESTS))
    limits: dict[ResourceName, str] = Field(default_factory=lambda: dict(_PROXY_LIMITS))


class ManagedEgressProxySettings(ContractModel):
    """The egress proxy the operator runs, one per namespace that has allowlisted sandboxes.

    The pod runs ``python3 -m sandbox_operator.egress`` from ``image`` (the chart defaults it to
    the operator's own image, which contains the proxy), keeps its sandbox table from the
    namespace's Sandboxes itself (``--kube-namespace``) and reads ``config`` - the proxy's own
    :class:`ProxyConfig` (allowedPorts, admittedNetworks, refusedNetworks, metadataNetworks,
    limits, decisionBuffer) - from a ConfigMap. What the operator decides (listen port,
    identity, the sandboxes) is refused there, so the file says only what the platform chose.
    """

    image: str = Field(min_length=1, description="Image with sandbox_operator (the operator's).")
    image_pull_policy: Literal["Never", "IfNotPresent", "Always"] = "IfNotPresent"
    port: int = Field(default=3128, ge=1, le=65535, description="Proxy and Service port.")
    runtime_class_name: str | None = Field(
        default=None,
        pattern=_RUNTIME_CLASS_NAME,
        description="Run the proxy itself on this RuntimeClass (e.g. gvisor: it parses "
        "untrusted input); null: the cluster default.",
    )
    resources: ProxyResources = Field(default_factory=ProxyResources)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    host_aliases: tuple[HostAlias, ...] = ()
    credentials_cluster_role: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="A ClusterRole granting get on Secrets, which the operator binds to the "
        "proxy's ServiceAccount in each proxy namespace (RoleBinding "
        "sandbox-egress-proxy-credentials) so the proxy can read the Secrets egressRules "
        "credentials name; the chart makes it with egressCredentials.enabled. Null: the proxy "
        "reads no Secret.",
    )
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
