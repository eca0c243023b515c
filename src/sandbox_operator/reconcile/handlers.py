"""kopf wiring: watches feed the views, watch events and deadlines feed the work queues.

Importing this module registers the handlers with kopf's default registry; ``sandbox-operator
run`` imports it and runs kopf with the validated configuration in kopf's memo
(``kopf.run(memo=kopf.Memo(config=OperatorConfig))``): ``startup`` reads ``memo.config`` and
puts the :class:`~sandbox_operator.reconcile.runtime.Runtime` it builds at ``memo.runtime``,
where every other handler finds it. No environment variable carries configuration.

kopf is used for what it does well (watch streams with reconnection, the initial listing of every
resource before any handler runs, peering, probes); the reconciling itself runs from two
deduplicating work queues (``workqueue.py``), so a burst of events for one object costs one pass
and no object is ever polled.

* ``@kopf.index`` handlers put every Sandbox, SandboxScope, sandbox pod, NetworkPolicy and
  PersistentVolumeClaim (a sandbox's work volume) into the in-memory views while kopf lists them
  (kopf holds every other handler until all of them have been listed); once it has, they leave
  kopf's registry (``drop_view_indexers``) and the event handlers put each object themselves:
  one kopf handler per event instead of two (kopf's machinery around a handler cost as much as
  the handler's own work);
* ``@kopf.on.event`` handlers put objects into the views (after the listing), drop deleted ones
  and enqueue what an event concerns: the Sandbox itself, the Sandbox owning a pod, a scope's
  waiting Sandboxes, the Sandboxes of a key whose earlier holder just went;
* a safety-net resync re-enqueues everything the views hold every ``resyncSeconds`` (jittered),
  which costs no API call for a Sandbox that needs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import kopf

from sandbox_operator import labels as lbl
from sandbox_operator import metrics
from sandbox_operator.backends.runtimeclass.pod_sandbox_failures import (
    watch_pod_sandbox_failures,
)
from sandbox_operator.backends.warmpool import pool_name_of
from sandbox_operator.config import OperatorConfig
from sandbox_operator.contract import (
    GROUP,
    SANDBOX_PLURAL,
    SANDBOX_SCOPE_PLURAL,
    SANDBOX_WARM_POOL_PLURAL,
    VERSION,
    ConditionType,
)
from sandbox_operator.metrics.requests import stop_stream_sampler
from sandbox_operator.reconcile.egress_policies import keep_egress_policy
from sandbox_operator.reconcile.kube import Conflict
from sandbox_operator.reconcile.namespaces import ServedNamespaces
from sandbox_operator.reconcile.pool import reconcile_pool
from sandbox_operator.reconcile.publish import (
    document_text,
    publish_into_served,
    published_backends,
)
from sandbox_operator.reconcile.runtime import FINALIZER, Runtime, make_api_client
from sandbox_operator.reconcile.sandbox import reconcile_sandbox
from sandbox_operator.reconcile.scope import (
    COUNT_DEBOUNCE_SECONDS,
    access_pending,
    reconcile_scope,
)
from sandbox_operator.reconcile.seal import Seal, follow_seal
from sandbox_operator.reconcile.status import CONFLICT_RETRY_SECONDS
from sandbox_operator.reconcile.views import ObjKey, owning_sandbox
from sandbox_operator.reconcile.workqueue import WorkQueue
from sandbox_operator.views import ObjectView, SandboxScopeView, SandboxView

log = logging.getLogger(__name__)

#: Concurrent passes per queue. Passes are short (memory reads, then a write or two), so this
#: bounds in-flight API writes more than CPU.
SANDBOX_WORKERS = 32
SCOPE_WORKERS = 4
POOL_WORKERS = 4

#: A pool looks at its pods at most this long after one of them changed (and at most once per
#: this long while they keep changing): a burst of claims costs the pool one pass (one status
#: write, one round of refills) per interval instead of one per claim, and leaves the API server
#: to the claims first.
POOL_EVENT_DELAY_SECONDS = 1.0

_MANAGED = {lbl.MANAGED_BY_LABEL: lbl.MANAGED_BY_VALUE}

#: kopf's per-object workers alive at once: no limit. With kopf's in-memory indexes (the views'
#: source) any limit is a deadlock at startup once one kind has more objects than the limit
#: (kopf#1243: each object's worker indexes it, then waits until every object of every kind is
#: indexed, holding its slot; the objects past the limit never get one). A restarted operator with
#: 257 Sandboxes (or sandbox pods) in its namespaces then saw no event at all, not even for a new
#: Sandbox elsewhere. Each worker leaves 1 s after its object's last event (``idle_timeout``), so
#: the workers alive are the objects that changed in the last second.
KOPF_WORKERS: int | None = None

#: kopf's default finalizer name (see ``startup``).
KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's memory of "the last handled state", made empty.

    The operator has no change-detecting kopf handlers, so nothing needs remembering between
    events. kopf's default storage would still, on every event of every object, deep-copy the
    body to compare it and parse its ``last-handled-configuration`` annotation, which the agent's
    role may write: a garbage value there made kopf skip that object's handlers. Here nothing is
    read from or written to the object."""

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        return {}

    def fetch(self, *, body: Any) -> Any:
        return None

    def store(self, *, body: Any, patch: Any, essence: Any) -> None:
        return None


class NoProgress(kopf.ProgressStorage):
    """kopf's per-handler progress (retries, start times), kept nowhere.

    kopf keeps it in ``status.kopf`` and in annotations (``kopf.zalando.org/<handler id>``) for
    its change-detecting handlers, and parses it back as JSON: annotations the agent's role may
    write. The operator has none of those handlers (its watch and index handlers keep no
    progress), so this storage makes sure none is ever read from or written to an object, even
    if one is added: garbage there can never stall a Sandbox or its deletion."""

    def fetch(self, *, key: Any, body: Any) -> Any:
        return None

    def store(self, *, key: Any, record: Any, body: Any, patch: Any) -> None:
        return None

    def purge(self, *, key: Any, body: Any, patch: Any) -> None:
        return None

    def touch(self, *, body: Any, patch: Any, value: str | None) -> None:
        return None

    def clear(self, *, essence: Any) -> Any:
        return essence


def _runtime(memo: Any) -> Runtime:
    rt: Runtime = memo.runtime
    return rt


def _timed(rt: Runtime, kind: str, fn: Any) -> Any:
    async def run(key: ObjKey) -> float | None:
        started = time.perf_counter()
        metrics.IN_FLIGHT.labels(kind).inc()
        outcome = "ok"
        try:
            delay: float | None = await fn(rt, key[0], key[1])
            if delay is not None:
                outcome = "requeue"
            return delay
        except Conflict:
            outcome = "conflict"  # a write lost a race: look again soon, on the newer object
            return CONFLICT_RETRY_SECONDS
        except Exception:
            outcome = "error"
            raise
        finally:
            metrics.IN_FLIGHT.labels(kind).dec()
            metrics.RECONCILE_SECONDS.labels(kind, outcome).observe(time.perf_counter() - started)

    return run


def census(rt: Runtime) -> Iterable[tuple[str, str, int]]:
    """Sandboxes by Ready reason and backend, from the views' summaries (for the metrics scrape:
    nothing is decoded)."""
    counts: Counter[tuple[str, str]] = Counter(
        (summary[0], summary[1]) for summary in rt.views.sandboxes.summaries() if summary
    )
    return [(reason, backend, n) for (reason, backend), n in counts.items()]


def _trim_memory() -> None:
    """Return freed memory to the system: after a burst of thousands of objects the heap is
    mostly free but stays mapped (glibc keeps it); malloc_trim gives it back."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


async def _trim_when_quiet(rt: Runtime) -> None:
    """Trim the heap (gc and malloc_trim: tens of ms with thousands of objects held) once after
    each stretch of work: checked every TRIM_SECONDS, done when passes ran since the last trim
    and none is queued or running now. Memory a burst used goes back within seconds of its end;
    an idle operator never trims (nothing was freed)."""
    trimmed_at = 0
    while True:
        await asyncio.sleep(TRIM_SECONDS)
        queue = rt.sandbox_queue
        if queue is None:
            continue
        if queue.passes != trimmed_at and len(queue) == 0 and not queue.busy:
            trimmed_at = queue.passes
            _trim_memory()


TRIM_SECONDS = 5.0


async def _resync_forever(rt: Runtime) -> None:
    """The safety net: every interval (jittered by up to 10%), pass over everything held, after
    any other work (``background``): a resync of thousands never holds up a new Sandbox."""
    interval = rt.config.operator.resync_seconds
    while True:
        await asyncio.sleep(interval * (1 + random.random() * 0.1))
        resync_all(rt)


def resync_all(rt: Runtime) -> None:
    """Queue a background pass for every Sandbox, SandboxScope and warm pool the views hold."""
    for ns, name in rt.views.sandboxes.names():
        rt.enqueue_sandbox(ns, name, background=True)
    for ns, name in rt.views.scopes.names():
        rt.enqueue_scope(ns, name, background=True)
    for ns, name in rt.views.pools.names():
        rt.enqueue_pool(ns, name, background=True)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # The operator manages its finalizer (runtime.FINALIZER) itself. kopf removes *its own*
    # finalizer from any object none of its handlers needs one on, so kopf's must never be ours:
    # it keeps its default marker, which no object carries (no kopf handler asks for one).
    if settings.persistence.finalizer == FINALIZER:
        settings.persistence.finalizer = KOPF_FINALIZER
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.persistence.progress_storage = NoProgress()
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    # kopf keeps one worker per object that had an event, for idle_timeout after its last one.
    # Our handlers only update the views and enqueue, so workers can leave soon. No limit on
    # their number (see KOPF_WORKERS: a limit deadlocks the initial indexing).
    settings.queueing.worker_limit = KOPF_WORKERS
    settings.queueing.idle_timeout = 1.0
    config = getattr(memo, "config", None)
    if not isinstance(config, OperatorConfig):
        # The configuration arrives validated in the memo: ``sandbox-operator run --config``
        # (cli.py) loads it and hands it to kopf.run(memo=kopf.Memo(config=...)).
        raise kopf.PermanentError(
            "no configuration in the operator's memo: start it with `sandbox-operator run "
            "--config FILE` (or pass memo=kopf.Memo(config=OperatorConfig) to kopf.run)"
        )
    api = await make_api_client()
    rt = await Runtime.start(config, api)
    rt.sandbox_queue = WorkQueue(
        _timed(rt, "sandbox", reconcile_sandbox), workers=SANDBOX_WORKERS, name="sandbox"
    )
    rt.scope_queue = WorkQueue(
        _timed(rt, "scope", reconcile_scope), workers=SCOPE_WORKERS, name="scope"
    )
    rt.pool_queue = WorkQueue(_timed(rt, "pool", reconcile_pool), workers=POOL_WORKERS, name="pool")
    rt.sandbox_queue.start()
    rt.scope_queue.start()
    rt.pool_queue.start()
    for driver in rt.drivers.values():
        if hasattr(driver, "on_pool_change"):
            driver.on_pool_change = lambda ns, name: rt.enqueue_pool(ns, name)
        start = getattr(driver, "start", None)
        if start is not None:
            await start(lambda ns, name: rt.enqueue_sandbox(ns, name))
    metrics.register_sandbox_census(lambda: census(rt))
    memo.runtime = rt
    memo.failures_tasks = watch_pod_sandbox_failures_in(rt, getattr(memo, "namespaces", None))
    memo.resync_task = asyncio.create_task(_resync_forever(rt), name="resync")
    memo.trim_task = asyncio.create_task(_trim_when_quiet(rt), name="trim")
    # What this operator serves, for clients that must know before any sandbox exists (in the
    # background: publishing never holds up serving Sandboxes; see reconcile/publish.py).
    memo.publish_task = asyncio.create_task(
        publish_into_served(
            api,
            getattr(memo, "served", None) or ServedNamespaces(),  # none: publish nowhere
            document_text(published_backends(config)),
        ),
        name="publish",
    )
    # Whether idle pool pods are sealed until claimed (reconcile/seal.py): judged from a watch on
    # the chart's policies, recorded by each claim; without --pool-seal, nothing is vouched for.
    seal_policy = getattr(memo, "pool_seal", None)
    if seal_policy:

        def sealed(seal: Seal) -> None:
            rt.pool_seal = seal

        memo.seal_task = asyncio.create_task(follow_seal(api, seal_policy, sealed), name="seal")


def watch_pod_sandbox_failures_in(
    rt: Runtime, namespaces: tuple[str, ...] | None
) -> list[asyncio.Task[None]]:
    """With a runtime-class backend: watch the kubelet's FailedCreatePodSandBox events in each
    served namespace (``None``: in all of them, one watch), and wake the Sandbox (or pool) whose
    pod the node cannot run."""
    if not any(hasattr(d, "use_pod_sandbox_failures") for d in rt.drivers.values()):
        return []

    def failed(namespace: str, pod_name: str) -> None:
        pod = rt.views.pods.get(namespace, pod_name)
        if pod is None:
            return
        owner = owning_sandbox(pod)
        if owner:
            rt.enqueue_sandbox(namespace, owner, urgent=True)
        pool = pool_name_of(pod)
        if pool:
            rt.enqueue_pool(namespace, pool)

    return [
        asyncio.create_task(
            watch_pod_sandbox_failures(rt.kube.api, ns, rt.pod_sandbox_failures, failed),
            name=f"pod-sandbox-failures-{ns or 'all'}",
        )
        for ns in (namespaces if namespaces else (None,))
    ]


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    names = ("resync_task", "trim_task", "publish_task", "seal_task")
    tasks = [getattr(memo, a, None) for a in names]
    for task in [*tasks, *(getattr(memo, "failures_tasks", None) or ())]:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    rt = getattr(memo, "runtime", None)
    if rt is not None:
        await rt.close()
    await stop_stream_sampler()


@kopf.on.probe(id="backends")
def probe_backends(memo: kopf.Memo, **_: Any) -> dict[str, str]:
    rt = getattr(memo, "runtime", None)
    if rt is None:
        return {}
    return {name: rt.unavailable.get(name, "available") for name in rt.drivers}


def _ns_name(body: kopf.Body) -> tuple[str, str, str]:
    meta = ObjectView(body).metadata
    return meta.namespace, meta.name, meta.uid


def _wake_key(rt: Runtime, namespace: str, labels: Mapping[str, str]) -> None:
    """Something of a key went away: Sandboxes held back by KeyUnclean may go ahead now."""
    value = labels.get(lbl.KEY_LABEL)
    if value:
        for other in rt.views.sandboxes.select_names(namespace, lbl.KEY_LABEL, value):
            if not _admitted(rt, namespace, other):
                rt.enqueue_sandbox(namespace, other)


def _admitted(rt: Runtime, namespace: str, name: str) -> bool:
    summary = rt.views.sandboxes.summary_of(namespace, name)
    return bool(summary and summary[2])


# ---- views ------------------------------------------------------------------------------------
# Every handler here is a coroutine: kopf runs plain functions in a thread pool, and the views and
# the queues are touched only from the event loop.


@kopf.index(GROUP, VERSION, SANDBOX_PLURAL)
async def sandbox_view(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _runtime(memo).views.put_sandbox(body)


@kopf.index(GROUP, VERSION, SANDBOX_SCOPE_PLURAL)
async def scope_view(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _runtime(memo).views.scopes.upsert(body)


@kopf.index(GROUP, VERSION, SANDBOX_WARM_POOL_PLURAL)
async def pool_view(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _runtime(memo).views.pools.upsert(body)


@kopf.index("", "v1", "pods", labels=_MANAGED)
async def pod_view(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _runtime(memo).views.pods.upsert(body)


@kopf.index("networking.k8s.io", "v1", "networkpolicies", labels=_MANAGED)
async def network_policy_view(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _runtime(memo).views.network_policies.upsert(body)


@kopf.index("", "v1", "persistentvolumeclaims", labels=_MANAGED)
async def persistent_volume_claim_view(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _runtime(memo).views.persistent_volume_claims.upsert(body)


#: The index handlers above: kopf's registry drops them once every watched kind was listed.
VIEW_INDEXERS: tuple[Callable[..., Any], ...] = (
    sandbox_view,
    scope_view,
    pool_view,
    pod_view,
    network_policy_view,
    persistent_volume_claim_view,
)


def drop_view_indexers(registry: Any, indexers: Collection[Callable[..., Any]]) -> bool:
    """Take ``indexers`` out of kopf's ``registry`` (its indexing handlers); False, changing
    nothing, when this kopf keeps them elsewhere: then both handlers keep running, as before.

    Called from the first event handler: kopf runs none before every indexed kind has been
    listed and indexed, so the views are whole by then, and what the index handlers did for
    each later event the event handlers do (``_fed``). kopf holds no value of theirs (they
    return None), so dropping them forgets nothing."""
    indexing = getattr(registry, "_indexing", None)
    held = getattr(indexing, "_handlers", None)
    if not isinstance(held, list):
        return False
    # A new list: an iteration in progress (there is none between awaits) keeps the old one.
    indexing._handlers = [h for h in held if getattr(h, "fn", None) not in indexers]  # type: ignore[union-attr]
    return True


def _fed(rt: Runtime, type: str, body: kopf.Body, put: Callable[[kopf.Body], Any]) -> None:
    """Put the event's object into the views, once the index handlers are gone (before, they
    did)."""
    if rt.views_from_events is None:
        rt.views_from_events = drop_view_indexers(kopf.get_default_registry(), VIEW_INDEXERS)
    if rt.views_from_events and type != "DELETED":
        put(body)


# ---- events -----------------------------------------------------------------------------------


@kopf.on.event(GROUP, VERSION, SANDBOX_PLURAL)
async def sandbox_event(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    rt = _runtime(memo)
    _fed(rt, type, body, rt.views.put_sandbox)
    namespace, name, uid = _ns_name(body)
    view = SandboxView(body)
    scope_ref = view.scope_ref
    if type == "DELETED":
        labels = dict(view.metadata.labels)
        rt.views.drop_sandbox(namespace, name, uid)
        rt.forget(namespace, name)
        _wake_key(rt, namespace, labels)
        if scope_ref:
            # Its count, with the other deletions of a cleanup (one write for them all), unless the
            # scope is being deleted and waits for its last member to go.
            scope = rt.views.scopes.get(namespace, scope_ref)
            purging = scope is not None and SandboxScopeView(scope).metadata.deleting
            rt.enqueue_scope(namespace, scope_ref, 0.0 if purging else COUNT_DEBOUNCE_SECONDS)
        return
    # Admitted already (a Ready transition, an edit, a deletion): before new admissions.
    admitted = view.status.conditions.is_true(ConditionType.ADMITTED)
    deleting = view.metadata.deleting
    rt.enqueue_sandbox(namespace, name, urgent=admitted or deleting)
    if scope_ref:
        # At once when the scope's bound agents cannot read this Sandbox yet (they wait for it).
        pending = access_pending(rt, namespace, scope_ref, name)
        rt.enqueue_scope(namespace, scope_ref, 0.0 if pending else COUNT_DEBOUNCE_SECONDS)


@kopf.on.event(GROUP, VERSION, SANDBOX_SCOPE_PLURAL)
async def scope_event(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    rt = _runtime(memo)
    _fed(rt, type, body, rt.views.scopes.upsert)
    namespace, name, uid = _ns_name(body)
    # Other SandboxScopes of its conversation: one refused (ScopeConflict) while this one held
    # it may hold it now, and its Sandboxes go ahead.
    peers = [n for n in rt.views.conversation_of(SandboxScopeView(body)) if n != name]
    if type == "DELETED":
        rt.views.scopes.remove(namespace, name, uid)
        rt.purges.pop((namespace, name), None)
    else:
        rt.enqueue_scope(namespace, name)
    for scope in (name, *peers):
        if scope != name:
            rt.enqueue_scope(namespace, scope)
        # Sandboxes that waited for this scope (ScopeNotFound, ScopeConflict) go ahead now.
        for other in rt.views.naming_scope_names(namespace, scope):
            if not _admitted(rt, namespace, other):
                rt.enqueue_sandbox(namespace, other)


@kopf.on.event(GROUP, VERSION, SANDBOX_WARM_POOL_PLURAL)
async def pool_event(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    rt = _runtime(memo)
    _fed(rt, type, body, rt.views.pools.upsert)
    namespace, name, uid = _ns_name(body)
    if type == "DELETED":
        rt.views.pools.remove(namespace, name, uid)
        return
    rt.enqueue_pool(namespace, name)


@kopf.on.event("", "v1", "pods", labels=_MANAGED)
async def pod_event(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A sandbox pod changed: re-judge its Sandbox at once (startup, readiness, death)."""
    rt = _runtime(memo)
    _fed(rt, type, body, rt.views.pods.upsert)
    _child_event(rt, type, body, rt.views.pods)


@kopf.on.event("networking.k8s.io", "v1", "networkpolicies", labels=_MANAGED)
async def network_policy_event(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    rt = _runtime(memo)
    _fed(rt, type, body, rt.views.network_policies.upsert)
    if type == "DELETED":
        _child_event(rt, type, body, rt.views.network_policies)
    # A namespace's egress policy deleted under live pods, or changed: made what it should be.
    await keep_egress_policy(rt, type, ObjectView(body))


@kopf.on.event("", "v1", "persistentvolumeclaims", labels=_MANAGED)
async def persistent_volume_claim_event(
    type: str, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    """A sandbox's work volume went: a disposal waiting for it may land now."""
    rt = _runtime(memo)
    _fed(rt, type, body, rt.views.persistent_volume_claims.upsert)
    if type == "DELETED":
        _child_event(rt, type, body, rt.views.persistent_volume_claims)


def _child_event(rt: Runtime, type: str, body: kopf.Body, store: Any) -> None:
    namespace, name, uid = _ns_name(body)
    child = ObjectView(body)
    owner = owning_sandbox(child)
    if type == "DELETED":
        store.remove(namespace, name, uid)
        _wake_key(rt, namespace, child.metadata.labels)
    if owner:
        rt.enqueue_sandbox(namespace, owner, urgent=True)
    pool = pool_name_of(child)
    if pool:  # a pool's pod started, was claimed or went: the pool counts (and refills) again
        rt.enqueue_pool(namespace, pool, POOL_EVENT_DELAY_SECONDS)
