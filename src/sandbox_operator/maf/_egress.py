"""maf's ``ObservesEgress`` over the client's egress streams: the operator's recorded decisions
reach maf's observers as ``EgressObserved`` events, in order, with gaps said.

The egress proxy numbers every decision it makes for an ``egress: allowlist`` Sandbox and writes
the newest ones to its status; the client's :class:`~sandbox_operator.client.egress.EgressFeed`
delivers them to the client's observer once each, in order, with ``missed_before`` counting any
that scrolled out unseen (docs/observability.md). :class:`EgressRelay` sits in the client's observer
slot (forwarding every event to the observer it replaced) and hands each decision of a Sandbox
an :class:`~sandbox_operator.maf.OperatorBackend` served to that backend's reporter, as one
``maf_sandbox.EgressObserved``: one decision per event, ``truncated`` when decisions were
missed before it, and one last decision-less event, ``truncated``, for a stream that ended with
decisions missed or without the proxy's final record.

One relay per client, shared by every backend built on it: each Sandbox is routed to the backend
that served it, so two backends on one client never report each other's sandboxes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import maf_sandbox as maf

from sandbox_operator.client import SandboxClient
from sandbox_operator.client.observer import (
    EgressObserved,
    EgressStreamEnded,
    SandboxObserver,
)
from sandbox_operator.contract import SandboxKey

#: The observer methods a relay forwards unchanged to the observer it replaced.
_FORWARDED: Final = tuple(
    name
    for name in vars(SandboxObserver)
    if not name.startswith("_") and name not in ("egress_observed", "egress_stream_ended")
)

#: Where a routed Sandbox's decisions go: the backend's name and its reporter (read at delivery:
#: a router may hand the backend another reporter, or None, at any time).
Route = tuple[str, Callable[[], maf.EgressReporter | None]]


def maf_key(key: SandboxKey) -> maf.SandboxKey:
    """The maf key of a Sandbox's contract key (agentDir is maf's agent id)."""
    return maf.SandboxKey(key.scope, key.thread_id, key.agent_dir, key.call_id)


def decision_of(event: EgressObserved) -> maf.EgressDecision:
    return maf.EgressDecision(event.verdict, event.host, event.port)


class EgressRelay(SandboxObserver):
    """The client's observer while a backend reports egress (see the module)."""

    def __init__(self, inner: SandboxObserver | None) -> None:
        self.inner = inner
        self.routes: dict[str, Route] = {}
        if inner is not None:
            for name in _FORWARDED:
                setattr(self, name, getattr(inner, name))

    @classmethod
    def on(cls, client: SandboxClient) -> EgressRelay:
        """The relay in ``client``'s observer slot, put there (around the observer it held)
        when none is."""
        held: Any = client.observer
        if isinstance(held, EgressRelay):
            return held
        relay = cls(held)
        client.observer = relay
        return relay

    def route(self, sandbox: str, backend: str, reporter: Callable[[], Any]) -> None:
        """Report Sandbox ``sandbox``'s decisions to ``reporter()`` as backend ``backend``'s."""
        self.routes[sandbox] = (backend, reporter)

    def egress_observed(self, event: EgressObserved) -> None:
        if self.inner is not None:
            self.inner.egress_observed(event)
        report, backend = self._target(event.sandbox)
        if report is None:
            return
        report(
            maf.EgressObserved(
                key=maf_key(event.key),
                backend=backend,
                decisions=(decision_of(event),),
                truncated=event.missed_before > 0,
                unreadable=None,
                seconds=0.0,
            )
        )

    def egress_stream_ended(self, event: EgressStreamEnded) -> None:
        if self.inner is not None:
            self.inner.egress_stream_ended(event)
        report, backend = self._target(event.sandbox)
        self.routes.pop(event.sandbox, None)
        if report is None or (event.complete and event.missed == 0):
            return
        # Decisions the client was told of but never shown, or a last record that was not the
        # proxy's final one: the record may be short, and says so.
        report(
            maf.EgressObserved(
                key=maf_key(event.key),
                backend=backend,
                decisions=(),
                truncated=True,
                unreadable=None,
                seconds=0.0,
            )
        )

    def _target(self, sandbox: str) -> tuple[maf.EgressReporter | None, str]:
        route = self.routes.get(sandbox)
        if route is None:
            return None, ""
        backend, reporter = route
        return reporter(), backend


__all__ = ["EgressRelay", "maf_key"]
