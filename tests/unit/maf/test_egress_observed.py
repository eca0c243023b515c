"""maf's ``ObservesEgress`` on the operator backend (#38 item 4): the client's per-decision
egress stream reaches the router's reporter as maf ``EgressObserved`` events, in order, for the
Sandboxes that backend served only, with gaps said; the client's own observer keeps receiving
everything; a router without an observer switches it off. No cluster: the client's feed is
played by calling its observer as the feed does (the feed itself: tests/unit/test_observer*.py
and the e2e egress tests)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

import maf_sandbox as maf

from sandbox_operator.client import SandboxClient
from sandbox_operator.client.observer import EgressObserved, EgressStreamEnded, SandboxObserver
from sandbox_operator.contract import SandboxKey
from sandbox_operator.maf import OperatorBackend, declarations
from sandbox_operator.maf._egress import EgressRelay
from tests.fixtures.maf_translate import GVISOR, RUNC, published

KEY = SandboxKey(scope="tenant", thread_id="t1", agent_dir="agents/a", call_id="")


class Client:
    """What the backend uses of a SandboxClient here: its observer slot."""

    namespace = "ns"

    def __init__(self, observer: SandboxObserver | None = None) -> None:
        self.observer = observer


class Recorder(SandboxObserver):
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def egress_observed(self, event: EgressObserved) -> None:
        self.seen.append(event)

    def egress_stream_ended(self, event: EgressStreamEnded) -> None:
        self.seen.append(event)

    def sandbox_disposed(self, event: Any) -> None:
        self.seen.append(event)


def decision(sandbox: str, seq: int, verdict: str = "ALLOW", missed: int = 0) -> EgressObserved:
    return EgressObserved(
        key=KEY,
        call=None,
        sandbox=sandbox,
        time=datetime.now(UTC),
        verdict=verdict,  # type: ignore[arg-type]
        reason="",
        method="CONNECT",
        host="pypi.org",
        port=443,
        missed_before=missed,
        seq=seq,
    )


def ended(sandbox: str, *, missed: int = 0, complete: bool = True) -> EgressStreamEnded:
    return EgressStreamEnded(
        key=KEY,
        call=None,
        sandbox=sandbox,
        namespace="ns",
        reported=2,
        missed=missed,
        complete=complete,
    )


def allowlist_backend(client: Client, name: str = "runc") -> OperatorBackend:
    doc = published({**RUNC, "name": name}, GVISOR)
    return OperatorBackend(cast(SandboxClient, client), doc, backend=name)


def test_observes_egress_is_declared_where_the_proxy_records_decisions() -> None:
    assert declarations(published(RUNC).backends[0]).observes_egress is True  # allowlist
    assert declarations(published(GVISOR).backends[0]).observes_egress is False  # no modes
    assert isinstance(allowlist_backend(Client()), maf.ObservesEgress)


def test_decisions_reach_the_reporter_in_order_with_gaps_and_the_end_said() -> None:
    inner = Recorder()
    client = Client(inner)
    backend = allowlist_backend(client)
    got: list[maf.EgressObserved] = []
    assert backend.observe_egress(got.append) is None
    relay = client.observer
    assert isinstance(relay, EgressRelay) and relay.inner is inner
    backend._follow_egress("sbx-a")
    relay.egress_observed(decision("sbx-a", 1))
    relay.egress_observed(decision("sbx-a", 4, "DENY", missed=2))
    relay.egress_observed(decision("sbx-other", 1))  # served by no backend here: not reported
    relay.egress_stream_ended(ended("sbx-a", missed=2))
    assert [(e.decisions, e.truncated) for e in got] == [
        ((maf.EgressDecision("ALLOW", "pypi.org", 443),), False),
        ((maf.EgressDecision("DENY", "pypi.org", 443),), True),
        ((), True),  # the stream ended with decisions missed
    ]
    assert {e.backend for e in got} == {"runc"}
    assert got[0].key == maf.SandboxKey("tenant", "t1", "agents/a", "")
    # The client's own observer still gets every event, unchanged, and the rest of its methods.
    assert len(inner.seen) == 4
    relay.sandbox_disposed("disposed")  # type: ignore[arg-type]
    assert inner.seen[-1] == "disposed"
    # The stream is over: a late state of it reports nothing.
    relay.egress_observed(decision("sbx-a", 5))
    assert len(got) == 3


def test_a_complete_stream_ends_silently_and_no_observer_means_no_reports() -> None:
    client = Client()
    backend = allowlist_backend(client)
    got: list[maf.EgressObserved] = []
    backend.observe_egress(got.append)
    relay = client.observer
    assert isinstance(relay, EgressRelay)
    backend._follow_egress("sbx-a")
    relay.egress_observed(decision("sbx-a", 1))
    relay.egress_stream_ended(ended("sbx-a"))
    assert len(got) == 1
    # An unobserved router switches the backend off, and gets back what it replaced.
    backend._follow_egress("sbx-b")
    assert backend.observe_egress(None) == got.append
    relay.egress_observed(decision("sbx-b", 1))
    assert len(got) == 1


def test_two_backends_on_one_client_report_only_their_own_sandboxes() -> None:
    client = Client()
    runc, other = allowlist_backend(client, "runc"), allowlist_backend(client, "runc2")
    mine: list[maf.EgressObserved] = []
    theirs: list[maf.EgressObserved] = []
    runc.observe_egress(mine.append)
    other.observe_egress(theirs.append)
    relay = client.observer
    assert isinstance(relay, EgressRelay) and relay.inner is None  # one relay per client
    runc._follow_egress("sbx-a")
    other._follow_egress("sbx-b")
    relay.egress_observed(decision("sbx-a", 1))
    relay.egress_observed(decision("sbx-b", 1))
    assert [e.backend for e in mine] == ["runc"] and [e.backend for e in theirs] == ["runc2"]
