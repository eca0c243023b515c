"""Host names, allowlist patterns and matching.

Rules (documented in docs/egress-proxy.md, "Host patterns"):
- names are compared case-insensitively, with one trailing dot removed;
- ``example.com`` matches exactly ``example.com``;
- ``*.example.com`` matches any name *below* ``example.com`` (``a.example.com``,
  ``a.b.example.com``) and never the apex ``example.com`` itself: list both if both are meant;
- ``*`` may only be the whole leftmost label; ``*`` alone is not a pattern (use egress
  ``unrestricted`` for that);
- an entry without a port admits the proxy's allowed ports, ``host:port`` admits only that port;
- IP literals (``192.0.2.7``, ``[2001:db8::1]``) may be listed and match only themselves; the
  address checks still apply to them.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")


@dataclass(eq=False)
class InvalidHost(ValueError):
    """A host or pattern that is not a DNS name or IP literal; ``.value`` is the input."""

    value: str
    why: str

    def __str__(self) -> str:
        return f"invalid host {self.value[:80]!r}: {self.why}"


def normalize_host(host: str) -> str:
    """Lower-case DNS name or canonical IP literal (IPv6 without brackets); raise InvalidHost."""
    raw = host
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            return str(ipaddress.IPv6Address(host))
        except ValueError:
            raise InvalidHost(raw, "bracketed value is not an IPv6 address") from None
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    host = host.lower()
    if host.endswith("."):
        host = host[:-1]
    if not host or len(host) > 253:
        raise InvalidHost(raw, "empty or longer than 253 characters")
    labels = host.split(".")
    for label in labels:
        if not _LABEL.match(label):
            raise InvalidHost(raw, "not a DNS name")
    if labels[-1].isdigit():
        raise InvalidHost(raw, "numeric top-level label is not an IP address")
    return host


def split_host_port(authority: str, default_port: int) -> tuple[str, int]:
    """Split ``host[:port]`` / ``[v6][:port]`` into a normalised host and a port."""
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise InvalidHost(authority, "unclosed '['")
        host, rest = authority[: end + 1], authority[end + 1 :]
        if rest and not rest.startswith(":"):
            raise InvalidHost(authority, "junk after ']'")
        port_text = rest[1:] if rest else ""
    elif authority.count(":") == 1:
        host, port_text = authority.split(":")
    elif ":" in authority:
        raise InvalidHost(authority, "IPv6 literal must be bracketed")
    else:
        host, port_text = authority, ""
    if port_text:
        if not port_text.isdigit() or len(port_text) > 5 or not 0 < int(port_text) < 65536:
            raise InvalidHost(authority, "port out of range")
        port = int(port_text)
    else:
        port = default_port
    return normalize_host(host), port


@dataclass(frozen=True, slots=True)
class HostPattern:
    """One allowlist entry: exact host or ``*.`` suffix, optional fixed port."""

    host: str  # normalised; for a wildcard the part after "*."
    wildcard: bool = False
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> HostPattern:
        text = text.strip()
        wildcard = text.startswith("*.")
        body = text[2:] if wildcard else text
        if "*" in body:
            raise InvalidHost(text, "'*' is allowed only as the whole leftmost label ('*.x.y')")
        tail = body.rsplit("]", 1)[-1] if body.startswith("[") else body
        has_port = ":" in tail
        host, port = split_host_port(body, 0)
        if wildcard:
            try:
                ipaddress.ip_address(host)
            except ValueError:
                pass
            else:
                raise InvalidHost(text, "a wildcard needs a DNS suffix, not an IP address")
        return cls(host=host, wildcard=wildcard, port=port if has_port else None)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        text = f"*.{host}" if self.wildcard else host
        return f"{text}:{self.port}" if self.port is not None else text

    def matches_host(self, host: str) -> bool:
        """``host`` must already be normalised."""
        if self.wildcard:
            return host.endswith("." + self.host)
        return host == self.host

    def matches(self, host: str, port: int, allowed_ports: Iterable[int]) -> bool:
        if not self.matches_host(host):
            return False
        if self.port is not None:
            return port == self.port
        return port in allowed_ports
