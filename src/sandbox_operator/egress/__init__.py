"""Allowlist egress proxy for sandboxes: config, proxy server, decision records.

See docs/egress-proxy.md and docs/egress-managed.md. Typical in-process use by the operator::

    proxy = EgressProxy(ProxyConfig(listen_port=3128), sink=CallbackSink(on_decision))
    await proxy.start()
    proxy.upsert_sandbox(SandboxEgress(id="ns/name", allow=("pypi.org",), source_ips=(pod_ip,)))
"""

from sandbox_operator.egress.addresses import (
    AddressPolicy,
    ResolveError,
    Resolver,
    StaticResolver,
    SystemResolver,
)
from sandbox_operator.egress.config import (
    DEFAULT_METADATA_NETWORKS,
    DEFAULT_REFUSED_NETWORKS,
    IdentityMode,
    Limits,
    ProxyConfig,
    SandboxEgress,
)
from sandbox_operator.egress.decisions import (
    CallbackSink,
    Decision,
    DecisionReason,
    DecisionSink,
    FanoutSink,
    JsonLinesSink,
    RateLimiter,
    RingBufferSink,
    Verdict,
)
from sandbox_operator.egress.hostmatch import HostPattern, InvalidHost, normalize_host
from sandbox_operator.egress.identity import IdentityConflict, SandboxTable, token_digest
from sandbox_operator.egress.proxy import EgressProxy

__all__ = [
    "DEFAULT_METADATA_NETWORKS",
    "DEFAULT_REFUSED_NETWORKS",
    "AddressPolicy",
    "CallbackSink",
    "Decision",
    "DecisionReason",
    "DecisionSink",
    "EgressProxy",
    "FanoutSink",
    "HostPattern",
    "IdentityConflict",
    "IdentityMode",
    "InvalidHost",
    "JsonLinesSink",
    "Limits",
    "ProxyConfig",
    "RateLimiter",
    "ResolveError",
    "Resolver",
    "RingBufferSink",
    "SandboxEgress",
    "SandboxTable",
    "StaticResolver",
    "SystemResolver",
    "Verdict",
    "normalize_host",
    "token_digest",
]
