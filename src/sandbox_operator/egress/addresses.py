"""Name resolution and the post-resolution address check.

The proxy resolves a name once, checks every address it got, and connects only to an address
that passed, by number (``AI_NUMERICHOST``), so a second lookup can never hand it a different
answer (no DNS rebinding between check and connect).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class ResolveError(Exception):
    """The name did not resolve; ``.host`` is the name, ``.why`` a short cause."""

    def __init__(self, host: str, why: str) -> None:
        super().__init__(f"cannot resolve {host}: {why}")
        self.host = host
        self.why = why


class Resolver(Protocol):
    """Turns a host name into addresses. Injectable so tests never touch system DNS."""

    async def resolve(self, host: str, port: int) -> Sequence[IPAddress]: ...


class SystemResolver:
    """The event loop's getaddrinfo (the pod's resolv.conf)."""

    async def resolve(self, host: str, port: int) -> Sequence[IPAddress]:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise ResolveError(host, exc.strerror or "lookup failed") from None
        out: list[IPAddress] = []
        for _family, _type, _proto, _canon, sockaddr in infos:
            addr = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
            if addr not in out:
                out.append(addr)
        if not out:
            raise ResolveError(host, "no addresses")
        return out


class StaticResolver:
    """A fixed name -> addresses table; unknown names fail. For tests and probes."""

    def __init__(self, table: Mapping[str, Iterable[str | IPAddress]]) -> None:
        self._table = {
            name.lower().rstrip("."): [ipaddress.ip_address(a) for a in addrs]
            for name, addrs in table.items()
        }

    async def resolve(self, host: str, port: int) -> Sequence[IPAddress]:
        try:
            addrs = self._table[host]
        except KeyError:
            raise ResolveError(host, "not in static table") from None
        if not addrs:
            raise ResolveError(host, "no addresses")
        return list(addrs)


@dataclass(frozen=True, slots=True)
class AddressVerdict:
    address: IPAddress
    refused: bool
    network: Network | None  # the refused (or metadata) network that matched, if any
    metadata: bool = False


@dataclass(frozen=True, slots=True)
class AddressPolicy:
    """refused = (refused_networks - admitted_networks) + metadata_networks."""

    refused_networks: tuple[Network, ...]
    admitted_networks: tuple[Network, ...] = ()
    metadata_networks: tuple[Network, ...] = ()

    def check(self, address: IPAddress) -> AddressVerdict:
        for net in self.metadata_networks:
            if address.version == net.version and address in net:
                return AddressVerdict(address, True, net, metadata=True)
        hit: Network | None = None
        for net in self.refused_networks:
            if address.version == net.version and address in net:
                hit = net
                break
        if hit is None:
            return AddressVerdict(address, False, None)
        for net in self.admitted_networks:
            if address.version == net.version and address in net:
                return AddressVerdict(address, False, None)
        return AddressVerdict(address, True, hit)

    def partition(
        self, addresses: Iterable[IPAddress]
    ) -> tuple[list[IPAddress], list[AddressVerdict]]:
        """(addresses that may be connected to, verdicts of the refused ones)."""
        ok: list[IPAddress] = []
        refused: list[AddressVerdict] = []
        for addr in addresses:
            verdict = self.check(addr)
            if verdict.refused:
                refused.append(verdict)
            else:
                ok.append(addr)
        return ok, refused
