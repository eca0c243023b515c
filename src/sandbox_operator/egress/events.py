"""The proxy's decisions as Kubernetes Events on the Sandbox they concern, rate-limited.

Repeats of the same (verdict, reason, host, port) are folded into one Event with a count, at most
``burst`` Events per Sandbox per ``interval`` seconds are posted, and what could not be kept
(more than ``max_pending`` distinct decisions waiting) is counted in the next Event's message.
An Event carries the decision's one-line summary (verdict, method, host:port, the address used,
reason): nothing secret, since no path, query or credential ever reaches a record.

Its own module because the folding and the per-Sandbox budget are a rule of their own, apart from
which sandboxes the proxy serves (``kube.py``) and what their status says (``summaries.py``).
Posting is best effort: a failed Event is logged by its type alone and never stops the proxy.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sandbox_operator.contract.resources import GROUP, VERSION
from sandbox_operator.egress.bodies import DecisionEventBody
from sandbox_operator.egress.decisions import Decision, Verdict

log = logging.getLogger(__name__)

#: The Events' ``source.component`` and ``reportingComponent``.
COMPONENT = "sandbox-egress-proxy"
EVENT_REASONS = {
    Verdict.ALLOW: "EgressAllowed",
    Verdict.DENY: "EgressDenied",
    Verdict.UNREACHABLE: "EgressUnreachable",
}


@dataclass
class _Pending:
    decision: Decision
    count: int = 1
    first: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass
class _Budget:
    tokens: float
    stamp: float
    suppressed: int = 0
    pending: dict[tuple[str, str, str, int], _Pending] = field(default_factory=dict)


class DecisionEvents:
    """The pending Events and the budget of each Sandbox of one namespace. ``post`` creates one
    Event (``CoreV1Api.create_namespaced_event`` for the namespace)."""

    def __init__(
        self,
        namespace: str,
        post: Callable[[DecisionEventBody], Awaitable[object]],
        *,
        burst: int,
        interval: float,
        max_pending: int,
        clock: Callable[[], float],
    ) -> None:
        self.namespace = namespace
        self._post_event = post
        self.burst = burst
        self.interval = interval
        self.max_pending = max_pending
        self.clock = clock
        self._budgets: dict[str, _Budget] = {}
        self.posted = 0

    def fold(self, decision: Decision) -> None:
        """Never blocks: the decision joins its Sandbox's pending Events (a repeat adds to the
        count of the one it repeats)."""
        sandbox_id = str(decision.sandbox)
        budget = self._budgets.setdefault(
            sandbox_id, _Budget(tokens=float(self.burst), stamp=self.clock())
        )
        key = (str(decision.verdict), str(decision.reason), decision.host, decision.port)
        pending = budget.pending.get(key)
        if pending is not None:
            pending.count += 1
            pending.decision = decision
        elif len(budget.pending) >= self.max_pending:
            budget.suppressed += 1
        else:
            budget.pending[key] = _Pending(decision)

    async def flush(self, uid_of: Callable[[str], str], served: Callable[[str], bool]) -> None:
        """Post what each Sandbox's budget allows now; forget the budget of a Sandbox no longer
        served once nothing of it is pending."""
        now = self.clock()
        for sandbox_id, budget in list(self._budgets.items()):
            rate = self.burst / self.interval
            budget.tokens = min(float(self.burst), budget.tokens + (now - budget.stamp) * rate)
            budget.stamp = now
            while budget.pending and budget.tokens >= 1:
                key = next(iter(budget.pending))
                item = budget.pending.pop(key)
                budget.tokens -= 1
                suppressed, budget.suppressed = budget.suppressed, 0
                await self._post(sandbox_id, uid_of(sandbox_id), item, suppressed)
            if not budget.pending and not served(sandbox_id):
                del self._budgets[sandbox_id]

    async def _post(self, sandbox_id: str, uid: str, item: _Pending, suppressed: int) -> None:
        name = sandbox_id.split("/", 1)[-1]
        d = item.decision
        message = d.summary()
        if item.count > 1:
            message += f" (x{item.count})"
        if suppressed:
            message += f"; {suppressed} other decision(s) not reported (rate limit)"
        now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        body: DecisionEventBody = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.egress.{secrets.token_hex(6)}"},
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Sandbox",
                "name": name,
                "namespace": self.namespace,
                "uid": uid,
            },
            "reason": EVENT_REASONS.get(d.verdict, "Egress"),
            "message": message[:1000],
            "type": "Normal" if d.verdict is Verdict.ALLOW else "Warning",
            "count": item.count,
            "firstTimestamp": item.first.isoformat(timespec="seconds").replace("+00:00", "Z"),
            "lastTimestamp": now,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
        }
        try:
            await self._post_event(body)
            self.posted += 1
        except Exception as exc:  # an Event is best effort; never stops the proxy
            log.warning("event for %s not posted: %s", sandbox_id, type(exc).__name__)
