"""The proxy's Kubernetes side, for a proxy that serves one namespace.

:class:`KubeEgressController` keeps an :class:`EgressProxy`'s sandbox table in step with the
``egress: allowlist`` Sandboxes of one namespace (id ``namespace/name``, the Sandbox's
``spec.egressAllow``, the IP of the pod named in ``status.servedBy``), and posts the proxy's
decisions as Kubernetes Events on the Sandbox they concern, rate-limited per Sandbox: repeats of
the same (verdict, reason, host, port) are folded into one Event with a count, at most ``burst``
Events per Sandbox per ``interval`` seconds, and what could not be posted is counted in the next
Event's message. Events carry the decision's one-line summary (verdict, method, host:port, the
address used, reason): nothing secret (no path, query or credential ever reaches a record).

It also keeps ``status.egress`` of each such Sandbox (contract ``EgressSummary``): totals per
verdict since the controller started, and the newest decisions with time, verdict, reason,
method, host and port only. The resolved address and the client address are left out: status
lives as long as the Sandbox and is read by whoever reads the Sandbox (the client library too),
and the proxy never tells a sandbox which address a name resolved to (an ``AddressRefused``
would otherwise show an internal address); the Events, which expire, keep the address for
whoever debugs the proxy. A Sandbox whose decisions changed is written at most once per
``summary_interval`` seconds, as a merge patch of ``status.egress`` alone on the status
subresource, so the operator's own merge patches of other status fields and this one never
overwrite each other.

Counts live in the controller, not in ``proxy.decisions``: the proxy forgets a sandbox's counters
when it leaves the table (a pod restarting), the Sandbox's summary should not.

Run by ``python -m sandbox_operator.egress --config FILE --kube-namespace NS`` (in-cluster
credentials or $KUBECONFIG); it needs get/list on ``sandboxes.sandbox-operator.dev`` and
``pods``, patch on ``sandboxes/status`` and create on ``events`` in that namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sandbox_operator.contract.resources import EGRESS_RECENT_MAX_ITEMS
from sandbox_operator.egress.config import SandboxEgress
from sandbox_operator.egress.decisions import Decision, Verdict
from sandbox_operator.egress.identity import IdentityConflict
from sandbox_operator.egress.proxy import EgressProxy

log = logging.getLogger("sandbox_operator.egress.kube")

GROUP = "sandbox-operator.dev"
VERSION = "v1alpha1"
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


@dataclass
class _Summary:
    """What ``status.egress`` of one Sandbox (one uid) says, and whether that is written yet."""

    uid: str
    counts: dict[Verdict, int] = field(default_factory=lambda: dict.fromkeys(Verdict, 0))
    recent: deque[Decision] = field(default_factory=lambda: deque(maxlen=EGRESS_RECENT_MAX_ITEMS))
    version: int = 0  # bumped by every decision
    written: int = 0  # the version last stored
    next_write: float = 0.0  # monotonic time before which it is not written again


def _timestamp(value: datetime, *, millis: bool = False) -> str:
    spec = "milliseconds" if millis else "seconds"
    return value.astimezone(UTC).isoformat(timespec=spec).replace("+00:00", "Z")


def _record(d: Decision) -> dict[str, Any]:
    """A decision as status may show it: no address, no client (limits as in the CRD)."""
    return {
        "time": _timestamp(d.time, millis=True),
        "verdict": str(d.verdict),
        "reason": str(d.reason),
        "method": d.method[:16],
        "host": d.host[:255],
        "port": d.port,
    }


class KubeEgressController:
    """Table sync + Events for one namespace; also the proxy's decision sink (``emit``)."""

    def __init__(
        self,
        api: Any,  # kubernetes_asyncio.client.ApiClient
        namespace: str,
        *,
        resync_seconds: float = 2.0,
        burst: int = 5,
        interval: float = 10.0,
        max_pending: int = 50,
        summary_interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from kubernetes_asyncio import client  # imported lazily: only this mode needs it

        self.namespace = namespace
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.proxy: EgressProxy | None = None
        self.resync_seconds = resync_seconds
        self.burst = burst
        self.interval = interval
        self.max_pending = max_pending
        self._applied: dict[str, SandboxEgress] = {}
        self._uids: dict[str, str] = {}
        self._budgets: dict[str, _Budget] = {}
        self.events_posted = 0
        self.clock = clock  # for the Event budgets and summary intervals (tests step it)
        self.summary_interval = summary_interval
        self.started = datetime.now(UTC)
        self._present: dict[str, str] = {}  # every Sandbox of the namespace: id -> uid
        self._summaries: dict[str, _Summary] = {}
        self.summaries_written = 0

    # ---- decisions -> Events ---------------------------------------------------------------

    def emit(self, decision: Decision) -> None:
        """DecisionSink: never blocks; folds the decision into the Sandbox's pending Events and
        its status summary."""
        if not decision.sandbox or decision.sandbox not in self._applied:
            return
        self._count(decision)
        budget = self._budgets.setdefault(
            decision.sandbox, _Budget(tokens=float(self.burst), stamp=self.clock())
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

    async def flush_events(self) -> None:
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
                await self._post(sandbox_id, item, suppressed)
            if not budget.pending and sandbox_id not in self._applied:
                del self._budgets[sandbox_id]

    async def _post(self, sandbox_id: str, item: _Pending, suppressed: int) -> None:
        name = sandbox_id.split("/", 1)[-1]
        uid = self._uids.get(sandbox_id, "")
        d = item.decision
        message = d.summary()
        if item.count > 1:
            message += f" (x{item.count})"
        if suppressed:
            message += f"; {suppressed} other decision(s) not reported (rate limit)"
        now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        body: Any = {
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
            await self.core.create_namespaced_event(self.namespace, body)
            self.events_posted += 1
        except Exception as exc:  # an Event is best effort; never stops the proxy
            log.warning("event for %s not posted: %s", sandbox_id, type(exc).__name__)

    # ---- decisions -> status.egress ---------------------------------------------------------

    def _count(self, decision: Decision) -> None:
        sandbox_id = str(decision.sandbox)
        uid = self._uids.get(sandbox_id, "")
        summary = self._summaries.get(sandbox_id)
        if summary is None or summary.uid != uid:  # first decision, or a recreated Sandbox
            summary = self._summaries[sandbox_id] = _Summary(uid=uid)
        summary.counts[decision.verdict] = summary.counts.get(decision.verdict, 0) + 1
        summary.recent.append(decision)
        summary.version += 1

    def summary_status(self, sandbox_id: str) -> dict[str, Any] | None:
        """``status.egress`` as it would be written now (None: no decision counted yet)."""
        summary = self._summaries.get(sandbox_id)
        if summary is None:
            return None
        return {
            "allowed": summary.counts[Verdict.ALLOW],
            "denied": summary.counts[Verdict.DENY],
            "unreachable": summary.counts[Verdict.UNREACHABLE],
            "since": _timestamp(self.started),
            "updated": _timestamp(datetime.now(UTC)),
            "recent": [_record(d) for d in summary.recent],
        }

    async def flush_summaries(self, *, force: bool = False) -> None:
        """Write each changed summary whose interval has passed (``force``: also the others, at
        shutdown, so the last decisions are not lost); never raises."""
        now = self.clock()
        for sandbox_id, summary in list(self._summaries.items()):
            if summary.written == summary.version or (now < summary.next_write and not force):
                continue
            version = summary.version
            body = {"status": {"egress": self.summary_status(sandbox_id)}}
            summary.next_write = now + self.summary_interval
            outcome = await self._patch_summary(sandbox_id, body)
            if outcome == "written":
                summary.written = version
                self.summaries_written += 1
            elif outcome == "gone" and self._summaries.get(sandbox_id) is summary:
                del self._summaries[sandbox_id]

    async def _patch_summary(self, sandbox_id: str, body: dict[str, Any]) -> str:
        name = sandbox_id.split("/", 1)[-1]
        patch: Any = self.custom.patch_namespaced_custom_object_status  # **kwargs untyped
        try:
            await patch(
                GROUP,
                VERSION,
                self.namespace,
                "sandboxes",
                name,
                body,
                _content_type="application/merge-patch+json",
            )
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

    # ---- Sandboxes -> proxy table ----------------------------------------------------------

    async def desired(self) -> dict[str, SandboxEgress]:
        listing = await self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "sandboxes"
        )
        out: dict[str, SandboxEgress] = {}
        present: dict[str, str] = {}
        for obj in listing.get("items", []):
            meta = obj.get("metadata") or {}
            present[f"{self.namespace}/{meta.get('name')}"] = str(meta.get("uid", ""))
            spec = obj.get("spec") or {}
            if spec.get("egress") != "allowlist":
                continue
            served = (obj.get("status") or {}).get("servedBy") or {}
            if served.get("kind") != "Pod" or not served.get("name"):
                continue
            sandbox_id = f"{self.namespace}/{meta.get('name')}"
            try:
                pod = await self.core.read_namespaced_pod(served["name"], self.namespace)
            except Exception:
                continue
            ip = getattr(pod.status, "pod_ip", None)
            if not ip or (pod.metadata.deletion_timestamp is not None):
                continue
            self._uids[sandbox_id] = str(meta.get("uid", ""))
            out[sandbox_id] = SandboxEgress.model_validate(
                {"id": sandbox_id, "allow": spec.get("egressAllow") or [], "sourceIPs": [ip]}
            )
        self._present = present
        return out

    async def sync_once(self) -> None:
        if self.proxy is None:
            raise RuntimeError("controller has no proxy")
        want = await self.desired()
        for sandbox_id, entry in want.items():
            if self._applied.get(sandbox_id) == entry and self.proxy.table.get(sandbox_id):
                continue
            try:
                self.proxy.upsert_sandbox(entry)
            except (IdentityConflict, ValueError) as exc:
                log.warning("sandbox %s not admitted to the proxy: %s", sandbox_id, exc)
                continue
            self._applied[sandbox_id] = entry
            log.info("sandbox %s: %d allow entries", sandbox_id, len(entry.allow))
        for sandbox_id in [s for s in self._applied if s not in want]:
            self.proxy.remove_sandbox(sandbox_id)
            del self._applied[sandbox_id]
            self._uids.pop(sandbox_id, None)
            log.info("sandbox %s removed", sandbox_id)
        # A summary outlives its pod (restarts keep counting) but not its Sandbox object.
        for sandbox_id, summary in list(self._summaries.items()):
            if self._present.get(sandbox_id) != summary.uid:
                del self._summaries[sandbox_id]

    async def run(self, stop: asyncio.Event) -> None:
        next_sync = 0.0
        while not stop.is_set():
            if time.monotonic() >= next_sync:
                try:
                    await self.sync_once()
                except Exception as exc:
                    log.warning("sandbox sync failed: %s", type(exc).__name__)
                next_sync = time.monotonic() + self.resync_seconds
            await self.flush_events()
            await self.flush_summaries()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await stop.wait()
        await self.flush_events()
        await self.flush_summaries(force=True)


async def kube_api_client() -> Any:
    """In-cluster credentials when there are any, else $KUBECONFIG."""
    from kubernetes_asyncio import client, config

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        await config.load_kube_config()
    return client.ApiClient()
