"""``status.egress`` of each Sandbox the proxy serves (contract ``EgressSummary``).

Totals per verdict since this process started, and the newest decisions with time, verdict,
reason, method, host and port only. The resolved address and the client address are left out:
status lives as long as the Sandbox and is read by whoever reads the Sandbox (the client library
too), and the proxy never tells a sandbox which address a name resolved to (an ``AddressRefused``
would otherwise show an internal address); the Events (``events.py``), which expire, keep the
address for whoever debugs the proxy. A summary that changed is written at most once per
``interval`` seconds, as a merge patch of ``status.egress`` alone on the status subresource, so
the operator's own merge patches of other status fields and this one never overwrite each other.

Each record carries ``seq``, its number among the Sandbox's decisions in this process (the
running total at that decision), so a reader that saw up to n and now sees m knows exactly that
m - n - 1 decisions scrolled out of ``recent`` unseen. A Sandbox being deleted gets ``final``,
written at once: nothing is attributed to it afterwards, so that write holds every decision this
process made for it. An admission is written at once too (``admitted``): the operator keeps the
Sandbox's Ready condition False until it is there. So is a re-admission for an egress edit, with
``policyGeneration``, the ``status.egressPolicy.generation`` enforced from then on: a client that
edited the egress waits for it.

Its own module because what a summary says, and when it is written, is a rule of its own apart
from which sandboxes the proxy serves (``kube.py``). Counts live here, not in
``proxy.decisions``: the proxy forgets a sandbox's counters when it leaves the table (a pod
restarting), the Sandbox's summary should not.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sandbox_operator.contract.resources import EGRESS_RECENT_MAX_ITEMS
from sandbox_operator.egress.bodies import EgressRecordBody, EgressStatusPatch, EgressSummaryBody
from sandbox_operator.egress.decisions import Decision, Verdict

log = logging.getLogger(__name__)


@dataclass
class _Summary:
    """What ``status.egress`` of one Sandbox (one uid) says, and whether that is written yet."""

    uid: str
    counts: dict[Verdict, int] = field(default_factory=lambda: dict.fromkeys(Verdict, 0))
    #: the newest decisions with their number (``seq``: the running total at that decision)
    recent: deque[tuple[int, Decision]] = field(
        default_factory=lambda: deque(maxlen=EGRESS_RECENT_MAX_ITEMS)
    )
    version: int = 0  # bumped by every decision and admission
    written: int = 0  # the version last stored
    next_write: float = 0.0  # monotonic time before which it is not written again
    admitted: datetime | None = None  # when this process last admitted the sandbox
    policy_generation: int | None = None  # status.egressPolicy.generation it then enforced
    urgent: bool = False  # an admission or the final state not written yet: do not wait
    final: bool = False  # the Sandbox is being deleted: no longer served, nothing more counted


def _timestamp(value: datetime, *, millis: bool = False) -> str:
    spec = "milliseconds" if millis else "seconds"
    return value.astimezone(UTC).isoformat(timespec=spec).replace("+00:00", "Z")


def _record(seq: int, d: Decision) -> EgressRecordBody:
    """A decision as status may show it: no address, no client (limits as in the CRD). ``seq``
    is its number among the sandbox's decisions in this process, so a reader can tell exactly
    how many it never saw."""
    return {
        "time": _timestamp(d.time, millis=True),
        "verdict": str(d.verdict),
        "reason": str(d.reason),
        "method": d.method[:16],
        "host": d.host[:255],
        "port": d.port,
        "seq": seq,
    }


class EgressSummaries:
    """The summaries of one namespace's Sandboxes, by id (``namespace/name``). ``patch`` merges
    a body into one Sandbox's status (by name); a 404 from it means the Sandbox is gone."""

    def __init__(
        self,
        patch: Callable[[str, EgressStatusPatch], Awaitable[object]],
        *,
        interval: float,
        clock: Callable[[], float],
    ) -> None:
        self._patch_status = patch
        self.interval = interval
        self.clock = clock
        self.started = datetime.now(UTC)
        self._summaries: dict[str, _Summary] = {}
        self.written = 0

    def _summary(self, sandbox_id: str, uid: str) -> _Summary:
        summary = self._summaries.get(sandbox_id)
        if summary is None or summary.uid != uid:  # first admission, or a recreated Sandbox
            summary = self._summaries[sandbox_id] = _Summary(uid=uid)
        return summary

    def admit(self, sandbox_id: str, uid: str, generation: int | None = None) -> None:
        """Record that this process (re-)admitted the sandbox, enforcing the egress of
        ``generation`` (``status.egressPolicy.generation``); written at the next flush."""
        summary = self._summary(sandbox_id, uid)
        summary.admitted = datetime.now(UTC)
        summary.policy_generation = generation
        summary.version += 1
        summary.urgent = True

    def end(self, sandbox_id: str, uid: str) -> None:
        """The Sandbox is being deleted (and out of the table, so nothing more is attributed to
        it): mark its summary final and write it at once, so the last decisions are not left to
        the interval and a reader knows the record is whole. A summary this process does not
        hold (it started after the last admission) is closed as an empty window of its own."""
        summary = self._summary(sandbox_id, uid)
        if summary.final:
            return
        summary.final = True
        summary.version += 1
        summary.urgent = True
        log.info("sandbox %s is being deleted: its egress summary is final", sandbox_id)

    def count(self, decision: Decision, uid: str) -> None:
        summary = self._summary(str(decision.sandbox), uid)
        summary.counts[decision.verdict] = summary.counts.get(decision.verdict, 0) + 1
        summary.recent.append((sum(summary.counts.values()), decision))
        summary.version += 1

    def keep(self, present: Mapping[str, str]) -> None:
        """Drop the summaries of Sandbox objects no longer there (``present``: id -> uid): a
        summary outlives its pod (restarts keep counting) but not its Sandbox object."""
        for sandbox_id, summary in list(self._summaries.items()):
            if present.get(sandbox_id) != summary.uid:
                del self._summaries[sandbox_id]

    def status(self, sandbox_id: str) -> EgressSummaryBody | None:
        """``status.egress`` as it would be written now (None: neither admitted nor decided on
        by this process yet)."""
        summary = self._summaries.get(sandbox_id)
        if summary is None:
            return None
        out: EgressSummaryBody = {
            "allowed": summary.counts[Verdict.ALLOW],
            "denied": summary.counts[Verdict.DENY],
            "unreachable": summary.counts[Verdict.UNREACHABLE],
            # Milliseconds: a reader tells two proxy processes (two counting windows) apart by
            # it, also when one restarts within the second.
            "since": _timestamp(self.started, millis=True),
            "updated": _timestamp(datetime.now(UTC)),
            "recent": [_record(seq, d) for seq, d in summary.recent],
        }
        if summary.admitted is not None:
            out["admitted"] = _timestamp(summary.admitted, millis=True)
        if summary.policy_generation is not None:
            out["policyGeneration"] = summary.policy_generation
        if summary.final:
            out["final"] = True
        return out

    async def flush(self, *, force: bool = False) -> None:
        """Write each changed summary whose interval has passed, or that holds an admission not
        written yet (``force``: also the others, at shutdown, so the last decisions are not
        lost); never raises. A failed admission write is retried at the interval."""
        now = self.clock()
        for sandbox_id, summary in list(self._summaries.items()):
            if summary.written == summary.version:
                continue
            if now < summary.next_write and not (force or summary.urgent):
                continue
            version = summary.version
            body: EgressStatusPatch = {"status": {"egress": self.status(sandbox_id)}}
            summary.next_write = now + self.interval
            summary.urgent = False
            outcome = await self._patch(sandbox_id, body)
            if outcome == "written":
                summary.written = version
                self.written += 1
            elif outcome == "gone" and self._summaries.get(sandbox_id) is summary:
                del self._summaries[sandbox_id]

    async def _patch(self, sandbox_id: str, body: EgressStatusPatch) -> str:
        try:
            await self._patch_status(sandbox_id.split("/", 1)[-1], body)
        except Exception as exc:  # the summary is best effort; never stops the proxy
            status = getattr(exc, "status", None)
            if status == 404:  # the Sandbox is gone: so is its summary
                return "gone"
            # Only the type and HTTP status: an ApiException's text carries response headers.
            log.warning(
                "egress summary for %s not written (%s %s); retrying",
                sandbox_id,
                type(exc).__name__,
                status if isinstance(status, int) else "",
            )
            return "failed"
        return "written"
