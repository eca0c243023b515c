"""The proxy's Kubernetes side, for a proxy that serves one namespace.

:class:`KubeEgressController` keeps an :class:`EgressProxy`'s sandbox table in step with the
``egress: allowlist`` Sandboxes of one namespace (id ``namespace/name``, the allowlist that
admission judged, ``status.admittedEgressAllow``, the IP of the pod named in ``status.servedBy``),
and posts the proxy's decisions as Kubernetes Events on the Sandbox they concern, rate-limited per
Sandbox: repeats of the same (verdict, reason, host, port) are folded into one Event with a count,
at most ``burst`` Events per Sandbox per ``interval`` seconds, and what could not be posted is
counted in the next Event's message. Events carry the decision's one-line summary (verdict, method,
host:port, the address used, reason): nothing secret (no path, query or credential ever reaches a
record).

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

Each record carries ``seq``, its number among the Sandbox's decisions in this process (the
running total at that decision), so a reader that saw up to n and now sees m knows exactly that
m - n - 1 decisions scrolled out of ``recent`` unseen. When a Sandbox gets a
``deletionTimestamp`` the proxy drops it from its table and writes its summary at once with
``final``: nothing is attributed to it afterwards, so that write holds every decision this process
made for it, and a reader that sees it knows its record is whole.

Counts live in the controller, not in ``proxy.decisions``: the proxy forgets a sandbox's counters
when it leaves the table (a pod restarting), the Sandbox's summary should not.

Admission is reported at once: when a sandbox enters the table (or re-enters it with another pod
IP, another allowlist, as another Sandbox object, or in a new proxy process), its summary gets
``admitted`` (when this process admitted it) and is written without waiting for the interval.
The operator keeps the Sandbox's Ready condition False until ``admitted`` is there, so Ready
means "the proxy serves it" and the first request does not meet 403 ``UnknownSandbox``.
Given its Service's name (``service``), a starting proxy reports admissions only once a TCP
connection to that Service's address reaches it: until its pod is ready and kube-proxy has
programmed the endpoint, a sandbox dialling that address would be refused. A cluster where a pod
cannot reach itself through a Service (no hairpin) is given up on after
``reach_give_up_seconds``, with a warning, and admissions are reported from then on.

The table follows watches (Sandboxes and the operator's pods of the namespace): any event makes
the controller resync at once, so a new sandbox is admitted within moments of its pod getting an
IP. A full resync also runs every ``watched_resync_seconds`` while the watches work, and every
``resync_seconds`` while one of them does not (a watch that fails is retried with backoff; the
proxy never stops for it).

Run by ``python -m sandbox_operator.egress --config FILE --kube-namespace NS`` (in-cluster
credentials or $KUBECONFIG); it needs get/list/watch on ``sandboxes.sandbox-operator.dev`` and
``pods``, patch on ``sandboxes/status``, create on ``events`` and, with ``--kube-service``, get
on its Service, in that namespace.
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

from sandbox_operator import kubeobj
from sandbox_operator.contract.resources import EGRESS_RECENT_MAX_ITEMS, GROUP, VERSION
from sandbox_operator.egress.config import SandboxEgress
from sandbox_operator.egress.decisions import Decision, Verdict
from sandbox_operator.egress.identity import IdentityConflict
from sandbox_operator.egress.proxy import EgressProxy
from sandbox_operator.labels import MANAGED_BY_LABEL, MANAGED_BY_VALUE

log = logging.getLogger("sandbox_operator.egress.kube")

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
    #: the newest decisions with their number (``seq``: the running total at that decision)
    recent: deque[tuple[int, Decision]] = field(
        default_factory=lambda: deque(maxlen=EGRESS_RECENT_MAX_ITEMS)
    )
    version: int = 0  # bumped by every decision and admission
    written: int = 0  # the version last stored
    next_write: float = 0.0  # monotonic time before which it is not written again
    admitted: datetime | None = None  # when this process last admitted the sandbox
    urgent: bool = False  # an admission or the final state not written yet: do not wait
    final: bool = False  # the Sandbox is being deleted: no longer served, nothing more counted


def _timestamp(value: datetime, *, millis: bool = False) -> str:
    spec = "milliseconds" if millis else "seconds"
    return value.astimezone(UTC).isoformat(timespec=spec).replace("+00:00", "Z")


def _record(seq: int, d: Decision) -> dict[str, Any]:
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


class KubeEgressController:
    """Table sync + Events for one namespace; also the proxy's decision sink (``emit``)."""

    def __init__(
        self,
        api: Any,  # kubernetes_asyncio.client.ApiClient
        namespace: str,
        *,
        resync_seconds: float = 2.0,
        watched_resync_seconds: float = 30.0,
        watch_timeout_seconds: int = 300,
        burst: int = 5,
        interval: float = 10.0,
        max_pending: int = 50,
        summary_interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        service: str = "",
        reach_timeout: float = 1.0,
        reach_give_up_seconds: float = 30.0,
    ) -> None:
        from kubernetes_asyncio import client  # imported lazily: only this mode needs it

        self.namespace = namespace
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.proxy: EgressProxy | None = None
        self.resync_seconds = resync_seconds
        self.watched_resync_seconds = watched_resync_seconds
        self.watch_timeout_seconds = watch_timeout_seconds
        self._wake = asyncio.Event()  # set by a watch event: resync now
        self._watching: dict[str, bool] = {}  # per watched resource: is its watch working?
        self.syncs = 0
        self.burst = burst
        self.interval = interval
        self.max_pending = max_pending
        self._applied: dict[str, SandboxEgress] = {}
        self._applied_uids: dict[str, str] = {}  # the Sandbox object each entry was admitted as
        self._uids: dict[str, str] = {}
        self._budgets: dict[str, _Budget] = {}
        self.events_posted = 0
        self.clock = clock  # for the Event budgets and summary intervals (tests step it)
        self.summary_interval = summary_interval
        self.started = datetime.now(UTC)
        self._present: dict[str, str] = {}  # every Sandbox of the namespace: id -> uid
        self._summaries: dict[str, _Summary] = {}
        self.summaries_written = 0
        # Reachability through the proxy's own Service (see the module docstring).
        self.service = service
        self.reach_timeout = reach_timeout
        self.reach_give_up_seconds = reach_give_up_seconds
        self.reachable = not service
        self._reach_since: float | None = None
        self._unannounced: set[str] = set()  # admitted while not reachable yet
        self._ending: dict[str, str] = {}  # Sandboxes being deleted that have a summary: id -> uid

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

    def _summary(self, sandbox_id: str) -> _Summary:
        uid = self._uids.get(sandbox_id, "")
        summary = self._summaries.get(sandbox_id)
        if summary is None or summary.uid != uid:  # first admission, or a recreated Sandbox
            summary = self._summaries[sandbox_id] = _Summary(uid=uid)
        return summary

    def _admit(self, sandbox_id: str) -> None:
        """Record that this process (re-)admitted the sandbox; written at the next flush."""
        summary = self._summary(sandbox_id)
        summary.admitted = datetime.now(UTC)
        summary.version += 1
        summary.urgent = True

    def _end(self, sandbox_id: str, uid: str) -> None:
        """The Sandbox is being deleted (and out of the table, so nothing more is attributed to
        it): mark its summary final and write it at once, so the last decisions are not left to
        the interval and a reader knows the record is whole. A summary this process does not
        hold (it started after the last admission) is closed as an empty window of its own."""
        summary = self._summaries.get(sandbox_id)
        if summary is None or summary.uid != uid:
            summary = self._summaries[sandbox_id] = _Summary(uid=uid)
        if summary.final:
            return
        summary.final = True
        summary.version += 1
        summary.urgent = True
        log.info("sandbox %s is being deleted: its egress summary is final", sandbox_id)

    def _count(self, decision: Decision) -> None:
        summary = self._summary(str(decision.sandbox))
        summary.counts[decision.verdict] = summary.counts.get(decision.verdict, 0) + 1
        summary.recent.append((sum(summary.counts.values()), decision))
        summary.version += 1

    def summary_status(self, sandbox_id: str) -> dict[str, Any] | None:
        """``status.egress`` as it would be written now (None: neither admitted nor decided on
        by this process yet)."""
        summary = self._summaries.get(sandbox_id)
        if summary is None:
            return None
        out: dict[str, Any] = {
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
        if summary.final:
            out["final"] = True
        return out

    async def flush_summaries(self, *, force: bool = False) -> None:
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
            body = {"status": {"egress": self.summary_status(sandbox_id)}}
            summary.next_write = now + self.summary_interval
            summary.urgent = False
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
        ending: dict[str, str] = {}
        for obj in listing.get("items", []):
            meta = kubeobj.meta(obj)
            present[f"{self.namespace}/{meta.get('name')}"] = str(meta.get("uid", ""))
            spec = obj.get("spec") or {}
            if spec.get("egress") != "allowlist":
                continue
            if meta.get("deletionTimestamp"):
                # Being deleted: no longer served, and its summary is closed (see _end).
                if (obj.get("status") or {}).get("egress"):
                    ending[f"{self.namespace}/{meta.get('name')}"] = str(meta.get("uid", ""))
                continue
            served = (obj.get("status") or {}).get("servedBy") or {}
            if served.get("kind") != kubeobj.POD_KIND or not served.get("name"):
                continue
            sandbox_id = f"{self.namespace}/{meta.get('name')}"
            # What admission judged, never the live spec: an edit after admission (refused by
            # the CRD's transition rules, but older objects predate them) is not enforced.
            allow = (obj.get("status") or {}).get("admittedEgressAllow") or []
            try:
                pod = await self.core.read_namespaced_pod(served["name"], self.namespace)
            except Exception:
                continue
            ip = getattr(pod.status, "pod_ip", None)
            if not ip or (pod.metadata.deletion_timestamp is not None):
                continue
            self._uids[sandbox_id] = str(meta.get("uid", ""))
            out[sandbox_id] = SandboxEgress.model_validate(
                {"id": sandbox_id, "allow": allow, "sourceIPs": [ip]}
            )
        self._present = present
        self._ending = ending
        return out

    async def sync_once(self) -> None:
        if self.proxy is None:
            raise RuntimeError("controller has no proxy")
        self.syncs += 1
        want = await self.desired()
        # Removals first: a pod IP that moved from a gone sandbox to a new one is free again.
        for sandbox_id in [s for s in self._applied if s not in want]:
            self.proxy.remove_sandbox(sandbox_id)
            del self._applied[sandbox_id]
            self._applied_uids.pop(sandbox_id, None)
            self._uids.pop(sandbox_id, None)
            self._unannounced.discard(sandbox_id)
            log.info("sandbox %s removed", sandbox_id)
        for sandbox_id, entry in want.items():
            uid = self._uids.get(sandbox_id, "")
            if (
                self._applied.get(sandbox_id) == entry
                and self._applied_uids.get(sandbox_id) == uid
                and self.proxy.table.get(sandbox_id)
            ):
                continue
            try:
                self.proxy.upsert_sandbox(entry)
            except (IdentityConflict, ValueError) as exc:
                log.warning("sandbox %s not admitted to the proxy: %s", sandbox_id, exc)
                continue
            self._applied[sandbox_id] = entry
            self._applied_uids[sandbox_id] = uid
            if self.reachable:
                self._admit(sandbox_id)
            else:
                self._unannounced.add(sandbox_id)
            log.info("sandbox %s: %d allow entries", sandbox_id, len(entry.allow))
        for sandbox_id, uid in self._ending.items():
            self._end(sandbox_id, uid)
        # A summary outlives its pod (restarts keep counting) but not its Sandbox object.
        for sandbox_id, summary in list(self._summaries.items()):
            if self._present.get(sandbox_id) != summary.uid:
                del self._summaries[sandbox_id]

    # ---- reachability: report admissions only once sandboxes can reach the proxy -----------

    async def _connect_through_service(self) -> None:
        """Raises unless a TCP connection to the Service's address is accepted (sends nothing,
        so the proxy records no decision for it)."""
        svc = await self.core.read_namespaced_service(self.service, self.namespace)
        ip = svc.spec.cluster_ip
        port = svc.spec.ports[0].port
        async with asyncio.timeout(self.reach_timeout):
            _, writer = await asyncio.open_connection(ip, port)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()

    async def announce(self) -> None:
        """Until reachable, check once; once reachable, report what was admitted meanwhile."""
        if not self.reachable:
            now = time.monotonic()
            if self._reach_since is None:
                self._reach_since = now
            try:
                await self._connect_through_service()
            except Exception as exc:
                if now - self._reach_since < self.reach_give_up_seconds:
                    return
                log.warning(
                    "not reachable through Service %s after %gs (%s); reporting admissions "
                    "anyway (can pods reach themselves through a Service here?)",
                    self.service,
                    self.reach_give_up_seconds,
                    type(exc).__name__,
                )
            else:
                log.info(
                    "reachable through Service %s after %.1fs",
                    self.service,
                    now - self._reach_since,
                )
            self.reachable = True
        for sandbox_id in sorted(self._unannounced):
            if sandbox_id in self._applied:
                self._admit(sandbox_id)
        self._unannounced.clear()

    # ---- watches: resync at once on any change -----------------------------------------------

    #: What is watched: Sandboxes (created, servedBy set, deleted) and the operator's pods (an IP
    #: assigned, a pod gone), each only as a trigger for a full resync.
    WATCHED = ("sandboxes", "pods")

    def _stream(self, resource: str) -> Any:
        """One watch of ``resource`` in the namespace: an async iterator of events that ends when
        the server closes it (``watch_timeout_seconds``) and raises on errors."""
        from kubernetes_asyncio import watch

        # return_type "object": events are only triggers, so nothing is deserialized.
        w = watch.Watch(return_type="object")
        timeout = self.watch_timeout_seconds
        options: dict[str, Any] = {
            "timeout_seconds": timeout,
            "_request_timeout": timeout + 30,  # a connection that went silent is given up
        }
        if resource == "sandboxes":
            return w.stream(
                self.custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                "sandboxes",
                **options,
            )
        return w.stream(
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}",
            **options,
        )

    @property
    def watching(self) -> bool:
        """Every watch has delivered an event since its last failure."""
        return all(self._watching.get(r, False) for r in self.WATCHED)

    async def _watch(self, resource: str) -> None:
        """Keep one watch open (restarting it when the server ends it, backing off after an
        error); each event wakes the sync loop. Never raises but CancelledError."""
        backoff = 1.0
        while True:
            try:
                stream = self._stream(resource)
                async with stream:
                    async for _event in stream:
                        self._watching[resource] = True
                        backoff = 1.0
                        self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._watching.get(resource, True):
                    log.warning(
                        "watching %s failed (%s %s); resyncing every %gs until it works again",
                        resource,
                        type(exc).__name__,
                        getattr(exc, "status", "") or "",
                        self.resync_seconds,
                    )
                self._watching[resource] = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    async def _sleep(self, stop: asyncio.Event, seconds: float) -> None:
        """Until ``stop``, a watch event, or ``seconds``."""
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def run(self, stop: asyncio.Event, *, watch: bool = True) -> None:
        watchers = [asyncio.create_task(self._watch(r)) for r in self.WATCHED] if watch else []
        next_sync = 0.0
        try:
            while not stop.is_set():
                if self._wake.is_set() or time.monotonic() >= next_sync:
                    self._wake.clear()  # events during the sync wake the next one
                    try:
                        await self.sync_once()
                    except Exception as exc:
                        log.warning("sandbox sync failed: %s", type(exc).__name__)
                    period = self.watched_resync_seconds if self.watching else self.resync_seconds
                    next_sync = time.monotonic() + period
                if self._unannounced or not self.reachable:
                    await self.announce()
                await self.flush_events()
                await self.flush_summaries()
                await self._sleep(stop, min(0.5, max(0.0, next_sync - time.monotonic())))
        finally:
            for task in watchers:
                task.cancel()
            for task in watchers:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.flush_events()
        await self.flush_summaries(force=True)


async def kube_api_client(config_file: str | None = None) -> Any:
    """The proxy's ApiClient: :func:`sandbox_operator.kubeapi.new_api_client` (in-cluster
    credentials when there are any, else the kubeconfig file, ``config_file`` or $KUBECONFIG)."""
    from sandbox_operator.kubeapi import new_api_client

    return await new_api_client(kubeconfig=config_file)
