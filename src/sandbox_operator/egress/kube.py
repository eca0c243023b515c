"""The proxy's Kubernetes side, for a proxy that serves one namespace.

:class:`KubeEgressController` keeps an :class:`EgressProxy`'s sandbox table in step with the
``egress: allowlist`` Sandboxes of one namespace (id ``namespace/name``, the allowlist that
admission judged, ``status.admittedEgressAllow``, the IP of the pod named in ``status.servedBy``),
and is the proxy's decision sink: each decision about a sandbox it serves goes to the Sandbox's
Events (``events.py``: folded, rate-limited) and to its ``status.egress`` summary
(``summaries.py``: counts, the newest records, ``admitted`` and ``final``). This module is the
table and when things happen; those two say what is written.

When a Sandbox gets a ``deletionTimestamp`` the proxy drops it from its table and its summary is
made final: nothing is attributed to it afterwards.

Admission is reported at once: when a sandbox enters the table (or re-enters it with another pod
IP, another allowlist, as another Sandbox object, or in a new proxy process), its summary gets
``admitted`` and is written without waiting for the interval, with ``policyGeneration``, the
``status.egressPolicy.generation`` whose allowlist it enforces: an egress edit the operator
accepted is in force from that write on (and the proxy closes the open connections the edit no
longer allows: ``EgressProxy.upsert_sandbox``).
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
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypedDict

from sandbox_operator import kubeobj
from sandbox_operator.contract.resources import GROUP, VERSION
from sandbox_operator.egress.bodies import DecisionEventBody, EgressStatusPatch, EgressSummaryBody
from sandbox_operator.egress.config import SandboxEgress
from sandbox_operator.egress.decisions import Decision
from sandbox_operator.egress.events import DecisionEvents
from sandbox_operator.egress.identity import IdentityConflict
from sandbox_operator.egress.proxy import EgressProxy
from sandbox_operator.egress.summaries import EgressSummaries
from sandbox_operator.labels import MANAGED_BY_LABEL, MANAGED_BY_VALUE
from sandbox_operator.views import SandboxView

log = logging.getLogger(__name__)


class _WatchOptions(TypedDict):
    """The keyword arguments every watch of the proxy's controller passes."""

    timeout_seconds: int
    _request_timeout: int  # a connection that went silent is given up


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
        self._applied: dict[str, SandboxEgress] = {}
        self._applied_uids: dict[str, str] = {}  # the Sandbox object each entry was admitted as
        # status.egressPolicy.generation per sandbox: wanted, and what each admission enforced
        self._generations: dict[str, int | None] = {}
        self._applied_generations: dict[str, int | None] = {}
        self._uids: dict[str, str] = {}
        # ``clock`` paces the Event budgets and summary intervals (tests step it). The API is
        # reached through methods of this object, so a test may replace ``core`` and ``custom``.
        self.events = DecisionEvents(
            namespace,
            self._post_event,
            burst=burst,
            interval=interval,
            max_pending=max_pending,
            clock=clock,
        )
        self.summaries = EgressSummaries(self._patch_status, interval=summary_interval, clock=clock)
        self._present: dict[str, str] = {}  # every Sandbox of the namespace: id -> uid
        # Reachability through the proxy's own Service (see the module docstring).
        self.service = service
        self.reach_timeout = reach_timeout
        self.reach_give_up_seconds = reach_give_up_seconds
        self.reachable = not service
        self._reach_since: float | None = None
        self._unannounced: set[str] = set()  # admitted while not reachable yet
        self._ending: dict[str, str] = {}  # Sandboxes being deleted that have a summary: id -> uid

    # ---- decisions -> Events and status.egress ---------------------------------------------

    def emit(self, decision: Decision) -> None:
        """DecisionSink: never blocks; folds the decision into the Sandbox's pending Events and
        its status summary (only for a sandbox this controller put into the table)."""
        if not decision.sandbox or decision.sandbox not in self._applied:
            return
        self.summaries.count(decision, self._uids.get(decision.sandbox, ""))
        self.events.fold(decision)

    async def flush_events(self) -> None:
        await self.events.flush(lambda s: self._uids.get(s, ""), lambda s: s in self._applied)

    async def flush_summaries(self, *, force: bool = False) -> None:
        await self.summaries.flush(force=force)

    def summary_status(self, sandbox_id: str) -> EgressSummaryBody | None:
        """``status.egress`` of the sandbox as it would be written now (see ``summaries.py``)."""
        return self.summaries.status(sandbox_id)

    @property
    def summaries_written(self) -> int:
        return self.summaries.written

    @property
    def events_posted(self) -> int:
        return self.events.posted

    @property
    def started(self) -> datetime:
        """When this process began counting (the summaries' ``since``)."""
        return self.summaries.started

    def _admit(self, sandbox_id: str) -> None:
        generation = self._applied_generations.get(sandbox_id)
        self.summaries.admit(sandbox_id, self._uids.get(sandbox_id, ""), generation)

    async def _post_event(self, body: DecisionEventBody) -> object:
        create: Any = self.core.create_namespaced_event  # takes the plain body too
        return await create(self.namespace, body)

    async def _patch_status(self, name: str, body: EgressStatusPatch) -> object:
        patch: Any = self.custom.patch_namespaced_custom_object_status  # **kwargs untyped
        return await patch(
            GROUP,
            VERSION,
            self.namespace,
            "sandboxes",
            name,
            body,
            _content_type="application/merge-patch+json",
        )

    # ---- Sandboxes -> proxy table ----------------------------------------------------------

    async def desired(self) -> dict[str, SandboxEgress]:
        listing = await self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "sandboxes"
        )
        out: dict[str, SandboxEgress] = {}
        present: dict[str, str] = {}
        ending: dict[str, str] = {}
        for item in listing.get("items", []):
            view = SandboxView(item)
            meta, status = view.metadata, view.status
            sandbox_id = f"{self.namespace}/{meta.name}"
            present[sandbox_id] = meta.uid
            if view.egress_mode != "allowlist":
                continue
            if meta.deleting:
                # Being deleted: no longer served, and its summary is closed (summaries.end).
                if status.get("egress"):
                    ending[sandbox_id] = meta.uid
                continue
            served = status.served_by
            if served.kind != kubeobj.POD_KIND or not served.name:
                continue
            # What the operator judged (at admission, or an egress edit it accepted), never the
            # live spec: an edit it refused, or has not judged yet, is not enforced.
            allow = status.admitted_egress_allow or []
            generation = status.egress_policy_generation
            rules = [
                {k: r[k] for k in ("host", "methods", "paths", "schemes", "credential") if k in r}
                for r in status.admitted_egress_rules or []
                if isinstance(r, dict)
            ]
            try:
                pod = await self.core.read_namespaced_pod(served.name, self.namespace)
            except Exception:
                continue
            ip = getattr(pod.status, "pod_ip", None)
            if not ip or (pod.metadata.deletion_timestamp is not None):
                continue
            self._uids[sandbox_id] = meta.uid
            self._generations[sandbox_id] = generation
            out[sandbox_id] = SandboxEgress.model_validate(
                {"id": sandbox_id, "allow": allow, "rules": rules, "sourceIPs": [ip]}
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
            self._applied_generations.pop(sandbox_id, None)
            self._uids.pop(sandbox_id, None)
            self._unannounced.discard(sandbox_id)
            log.info("sandbox %s removed", sandbox_id)
        for sandbox_id, entry in want.items():
            uid = self._uids.get(sandbox_id, "")
            generation = self._generations.get(sandbox_id)
            if (
                self._applied.get(sandbox_id) == entry
                and self._applied_uids.get(sandbox_id) == uid
                and self.proxy.table.get(sandbox_id)
            ):
                if self._applied_generations.get(sandbox_id) != generation:
                    # The same lists under a newer egress generation: enforced already, said so.
                    self._applied_generations[sandbox_id] = generation
                    if self.reachable:
                        self._admit(sandbox_id)
                continue
            try:
                self.proxy.upsert_sandbox(entry)
            except (IdentityConflict, ValueError) as exc:
                log.warning("sandbox %s not admitted to the proxy: %s", sandbox_id, exc)
                continue
            self._applied[sandbox_id] = entry
            self._applied_uids[sandbox_id] = uid
            self._applied_generations[sandbox_id] = generation
            if self.reachable:
                self._admit(sandbox_id)
            else:
                self._unannounced.add(sandbox_id)
            log.info("sandbox %s: %d allow entries", sandbox_id, len(entry.allow))
        for sandbox_id, uid in self._ending.items():
            self.summaries.end(sandbox_id, uid)
        self.summaries.keep(self._present)

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
        options: _WatchOptions = {
            "timeout_seconds": timeout,
            "_request_timeout": timeout + 30,
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
