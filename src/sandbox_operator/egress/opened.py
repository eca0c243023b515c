"""The proxy's open connections per sandbox, so that an egress edit that narrows a sandbox's
allowlist closes what it no longer allows instead of leaving it running.

Its own module because it is a rule of its own beside the per-connection checks (``proxy.py``):
a connection is judged once, when it opens; a tunnel may then run for up to
``maxConnectionSeconds``. When the operator accepts a narrowing (docs/egress.md, "Editing egress
on a live Sandbox") the proxy's table changes (``EgressProxy.upsert_sandbox``), and every open
connection of that sandbox is judged again as it was judged when it opened: its host and port
against the new entry, and the method and path rules naming its host. One that the new entry
would not let through the same way (a host gone, a plain host now ruled, a ruled host's rules
changed) is closed at once. Its decision record stays what it was (one record per connection);
the closing is logged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from sandbox_operator.egress.decisions import DecisionReason
from sandbox_operator.egress.identity import SandboxEntry
from sandbox_operator.egress.requestrules import RequestRule, rules_for


@dataclass(eq=False)
class OpenConnection:
    """One connection a sandbox's allowlist let through: the task serving it, what it asked
    for, and the rules naming its host when it was judged (empty: a plain host)."""

    task: asyncio.Task[None]
    host: str
    port: int
    rules: tuple[RequestRule, ...]


class OpenConnections:
    """The connections each sandbox has open past the allowlist check."""

    def __init__(self) -> None:
        self._by_sandbox: dict[str, set[OpenConnection]] = {}

    def add(self, sandbox_id: str, conn: OpenConnection) -> None:
        self._by_sandbox.setdefault(sandbox_id, set()).add(conn)

    def discard(self, sandbox_id: str, conn: OpenConnection) -> None:
        held = self._by_sandbox.get(sandbox_id)
        if held is None:
            return
        held.discard(conn)
        if not held:
            del self._by_sandbox[sandbox_id]

    def count(self, sandbox_id: str) -> int:
        return len(self._by_sandbox.get(sandbox_id, ()))

    def disallowed(self, entry: SandboxEntry, allowed_ports: Iterable[int]) -> list[OpenConnection]:
        """Those of the sandbox's open connections that ``entry`` would not let through as they
        were: their host or port no longer allowed, or other rules naming their host."""
        ports = tuple(allowed_ports)
        return [
            conn
            for conn in self._by_sandbox.get(entry.id, ())
            if entry.check(conn.host, conn.port, ports) is not DecisionReason.ALLOWED
            or rules_for(entry.rules, conn.host) != conn.rules
        ]
