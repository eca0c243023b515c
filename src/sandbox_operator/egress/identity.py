"""Which sandbox a connection belongs to, and what that sandbox may reach.

The table is owned by whoever runs the proxy (the operator) and changed with ``upsert`` /
``remove`` / ``replace`` on the proxy's event loop. Tokens are held only as SHA-256 digests.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from sandbox_operator.egress.config import IdentityMode, SandboxEgress
from sandbox_operator.egress.decisions import DecisionReason
from sandbox_operator.egress.hostmatch import HostPattern
from sandbox_operator.egress.requestrules import RequestRule

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class IdentityConflict(ValueError):
    """An IP or token already belongs to another sandbox; fields name both sandboxes."""

    def __init__(self, what: str, sandbox: str, other: str) -> None:
        super().__init__(f"{what} of sandbox {sandbox!r} already belongs to {other!r}")
        self.what = what
        self.sandbox = sandbox
        self.other = other


def token_digest(token: str) -> str:
    """What the table stores for a token (and what ``tokenSHA256`` in the config holds)."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_from_proxy_authorization(value: str | None) -> str | None:
    """The token in ``Basic base64(user:token)`` (user ignored) or ``Bearer token``."""
    if not value:
        return None
    scheme, _, rest = value.strip().partition(" ")
    rest = rest.strip()
    if scheme.lower() == "bearer":
        return rest or None
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(rest, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        _user, sep, password = decoded.partition(":")
        return password if sep and password else None
    return None


@dataclass(frozen=True, slots=True)
class SandboxEntry:
    id: str
    patterns: tuple[HostPattern, ...]
    source_ips: frozenset[IPAddress]
    token_sha256: str | None
    rules: tuple[RequestRule, ...] = ()

    @classmethod
    def from_config(cls, sb: SandboxEgress) -> SandboxEntry:
        return cls(
            sb.id, sb.patterns(), frozenset(sb.source_ips), sb.token_sha256, sb.request_rules()
        )

    def check(self, host: str, port: int, allowed_ports: Iterable[int]) -> DecisionReason:
        """Host and port only; a ruled host's requests are judged after (``requestrules``)."""
        ports = tuple(allowed_ports)
        host_seen = False
        for pattern in self.patterns + tuple(r.host for r in self.rules):
            if pattern.matches(host, port, ports):
                return DecisionReason.ALLOWED
            host_seen = host_seen or pattern.matches_host(host)
        return DecisionReason.PORT_NOT_ALLOWED if host_seen else DecisionReason.HOST_NOT_ALLOWED


@dataclass(frozen=True, slots=True)
class Identified:
    entry: SandboxEntry | None
    reason: DecisionReason  # ALLOWED when entry is set


class SandboxTable:
    """Source IP / token digest -> sandbox entry."""

    def __init__(self, sandboxes: Iterable[SandboxEgress] = ()) -> None:
        self._by_id: dict[str, SandboxEntry] = {}
        self._by_ip: dict[IPAddress, str] = {}
        self._by_token: dict[str, str] = {}
        self.replace(sandboxes)

    def __len__(self) -> int:
        return len(self._by_id)

    def ids(self) -> list[str]:
        return sorted(self._by_id)

    def get(self, sandbox_id: str) -> SandboxEntry | None:
        return self._by_id.get(sandbox_id)

    def replace(self, sandboxes: Iterable[SandboxEgress]) -> None:
        """Swap the whole table (atomically: on conflict the old table stays)."""
        fresh = SandboxTable.__new__(SandboxTable)
        fresh._by_id, fresh._by_ip, fresh._by_token = {}, {}, {}
        for sb in sandboxes:
            fresh.upsert(sb)
        self._by_id, self._by_ip, self._by_token = fresh._by_id, fresh._by_ip, fresh._by_token

    def upsert(self, sb: SandboxEgress) -> None:
        """Add or change one sandbox. Raises IdentityConflict, leaving the table unchanged."""
        entry = SandboxEntry.from_config(sb)
        for ip in entry.source_ips:
            other = self._by_ip.get(ip)
            if other is not None and other != sb.id:
                raise IdentityConflict(f"source IP {ip}", sb.id, other)
        if entry.token_sha256 is not None:
            other = self._by_token.get(entry.token_sha256)
            if other is not None and other != sb.id:
                raise IdentityConflict("token", sb.id, other)
        self.remove(sb.id)
        self._by_id[sb.id] = entry
        for ip in entry.source_ips:
            self._by_ip[ip] = sb.id
        if entry.token_sha256 is not None:
            self._by_token[entry.token_sha256] = sb.id

    def remove(self, sandbox_id: str) -> bool:
        entry = self._by_id.pop(sandbox_id, None)
        if entry is None:
            return False
        for ip in entry.source_ips:
            if self._by_ip.get(ip) == sandbox_id:
                del self._by_ip[ip]
        if entry.token_sha256 is not None and self._by_token.get(entry.token_sha256) == sandbox_id:
            del self._by_token[entry.token_sha256]
        return True

    def by_ip(self, ip: IPAddress | None) -> SandboxEntry | None:
        if ip is None:
            return None
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # dual-stack listener reports IPv4 peers as ::ffff:a.b.c.d
        sid = self._by_ip.get(ip)
        return self._by_id.get(sid) if sid is not None else None

    def by_token(self, token: str | None) -> SandboxEntry | None:
        if token is None:
            return None
        sid = self._by_token.get(token_digest(token))
        return self._by_id.get(sid) if sid is not None else None

    def identify(
        self, mode: IdentityMode, client_ip: IPAddress | None, proxy_authorization: str | None
    ) -> Identified:
        if mode is IdentityMode.SOURCE_IP:
            entry = self.by_ip(client_ip)
            if entry is None:
                return Identified(None, DecisionReason.UNKNOWN_SANDBOX)
            return Identified(entry, DecisionReason.ALLOWED)
        token = token_from_proxy_authorization(proxy_authorization)
        if token is None:
            return Identified(self.by_ip(client_ip), DecisionReason.AUTH_REQUIRED)
        by_token = self.by_token(token)
        if by_token is None:
            return Identified(self.by_ip(client_ip), DecisionReason.AUTH_REQUIRED)
        if mode is IdentityMode.TOKEN:
            return Identified(by_token, DecisionReason.ALLOWED)
        by_ip = self.by_ip(client_ip)
        if by_ip is None or by_ip.id != by_token.id:
            # Record under the token's sandbox: it is the one whose credential is being misused.
            return Identified(by_token, DecisionReason.IDENTITY_MISMATCH)
        return Identified(by_token, DecisionReason.ALLOWED)
