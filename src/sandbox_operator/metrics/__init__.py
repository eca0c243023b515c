"""Prometheus metrics of the operator, served at ``GET /metrics`` (``--metrics-port``: 8081).

Built on ``prometheus_client``: the metric objects below live in its default registry (which also
carries its ``process_*``/``python_*`` collectors). This package's root holds what the metrics
are: every metric object, what the docs say of each (``METRIC_DOCS``: ``make docs`` reads this
module), and the reconcile timing. What feeds them from elsewhere is a module of its own:

* ``RECONCILE_SECONDS``, ``IN_FLIGHT``: the reconcilers, through ``track_reconcile(kind)`` (or by
  hand); ``ADMISSIONS``, ``READY_LATENCY``, ``DISPOSAL_LATENCY`` and ``WARM_CLAIMS``: the
  reconcilers, when they decide or observe.
* ``SANDBOXES``: not set by anyone; computed at scrape time (``census.py``) by the census function
  given to ``register_sandbox_census``.
* ``API_REQUESTS``, ``API_RESPONSE_BYTES``, ``WATCH_RESTARTS``: every request of a
  kubernetes_asyncio ``ApiClient`` passed to ``requests.instrument_api_client``, and every request
  of kopf itself (its watches, lists, patches, events, peering) once
  ``kopf_session.instrument_kopf`` has given kopf an instrumented HTTP session through a login
  handler (kopf's documented ``kopf.AiohttpSession``); the ``client`` label tells the two apart
  (``operator``, ``kopf``).

``server.py`` serves the registry from a daemon thread, independent of kopf's event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

from prometheus_client import (
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

from sandbox_operator.metrics.census import Census, SandboxCensus

#: Label values of ``kind`` and ``outcome`` (RECONCILE_SECONDS, IN_FLIGHT).
KINDS = ("sandbox", "scope")
OUTCOMES = ("ok", "requeue", "conflict", "error")

#: ``client`` label: the operator's kubernetes_asyncio client(s), or kopf's own HTTP session.
CLIENT_OPERATOR = "operator"
CLIENT_KOPF = "kopf"

#: ``code`` label of a request that got no HTTP status: a transport failure (connection refused or
#: reset, TLS, timeout, or a request that could not even be built), or a cancelled request.
CODE_ERROR = "error"
CODE_CANCELLED = "cancelled"

RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
READY_BUCKETS = (
    0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600,
)  # fmt: skip

# No ``*_created`` series next to every counter and histogram: they double the series count and
# Prometheus's text-format scrape has no use for them.
disable_created_metrics()  # type: ignore[no-untyped-call]

RECONCILE_SECONDS = Histogram(
    "sandbox_operator_reconcile_duration_seconds",
    "Time one reconcile of a Sandbox or SandboxScope took, by how it ended.",
    ["kind", "outcome"],
    buckets=RECONCILE_BUCKETS,
)
ADMISSIONS = Counter(
    "sandbox_operator_admissions_total",
    "Admission decisions on Sandboxes: result admitted|refused, reason = the condition's reason.",
    ["result", "reason"],
)
READY_LATENCY = Histogram(
    "sandbox_operator_create_to_ready_seconds",
    "Time from a Sandbox's creation to its first Ready=True, by the backend that serves it.",
    ["backend"],
    buckets=READY_BUCKETS,
)
DISPOSAL_LATENCY = Histogram(
    "sandbox_operator_deletion_to_release_seconds",
    "Time from the operator's first pass over a deleted Sandbox to the removal of its finalizer "
    "(the Sandbox then goes from the API server), by the backend that served it.",
    ["backend"],
    buckets=RECONCILE_BUCKETS,
)
WARM_CLAIMS = Counter(
    "sandbox_operator_warm_pool_claims_total",
    "Sandboxes that looked for a warm pod, by pool: result warm (served from the pool) or "
    "exhausted (a pool for the Sandbox's spec had no idle Ready pod; it started cold).",
    ["pool", "result"],
)
API_REQUESTS = Counter(
    "sandbox_operator_api_requests_total",
    "Requests to the Kubernetes API server, by Kubernetes verb, resource (plural[/subresource]), "
    "HTTP status code ('error': transport failure, 'cancelled': cancelled before a status) and "
    "client ('operator': the operator's kubernetes_asyncio client, 'kopf': kopf's own session).",
    ["verb", "resource", "code", "client"],
)
API_RESPONSE_BYTES = Counter(
    "sandbox_operator_api_response_bytes_total",
    "Bytes of response bodies (after content decoding) received from the Kubernetes API server.",
    ["verb", "resource", "client"],
)
IN_FLIGHT = Gauge(
    "sandbox_operator_reconciles_in_flight",
    "Reconciles running right now.",
    ["kind"],
)
WATCH_RESTARTS = Counter(
    "sandbox_operator_watch_restarts_total",
    "Watch requests started, per resource: the first one of each stream and every reconnect.",
    ["resource"],
)

for _kind in KINDS:
    IN_FLIGHT.labels(_kind)
    for _outcome in OUTCOMES:
        RECONCILE_SECONDS.labels(_kind, _outcome)


class MetricDoc(NamedTuple):
    """What the metrics table of docs/metrics.md says of one metric beyond what the metric object
    itself knows (name, type, label names, buckets): what its labels' values are and what it
    counts. Kept next to the metrics so that a metric cannot be added without saying what it
    counts: ``make docs`` refuses a metric without an entry, and the docs' drift test fails
    until the table is regenerated. The strings are Markdown."""

    #: Each label of the metric, in its order: its values or meaning ("" when the name says it).
    labels: Mapping[str, str]
    #: What one observation or increment is.
    counts: str


def _values(values: Iterable[str]) -> str:
    return ", ".join(f"`{v}`" for v in values)


#: One entry per metric this module defines, in the order of the docs' table.
METRIC_DOCS: Mapping[str, MetricDoc] = {
    "sandbox_operator_reconcile_duration_seconds": MetricDoc(
        {"kind": _values(KINDS), "outcome": _values(OUTCOMES)},
        "one reconcile of one object, from start to end",
    ),
    "sandbox_operator_reconciles_in_flight": MetricDoc({"kind": ""}, "reconciles running now"),
    "sandbox_operator_admissions_total": MetricDoc(
        {
            "result": _values(("admitted", "refused")),
            "reason": "the `Admitted` condition's reason, e.g. `IsolationBelowFloor` for a refusal",
        },
        "admission decisions",
    ),
    "sandbox_operator_sandboxes": MetricDoc(
        {
            "reason": "the reason of the Sandbox's `Ready` condition: `Ready`, `StartupFailed`, a "
            "refusal reason, ...; `Pending` before it has one",
            "backend": "`status.backend`, empty when none was chosen",
        },
        "Sandboxes the operator knows, counted at each scrape (not kept between scrapes)",
    ),
    "sandbox_operator_create_to_ready_seconds": MetricDoc(
        {"backend": ""},
        "from a Sandbox's `creationTimestamp` to its first `Ready=True`",
    ),
    "sandbox_operator_deletion_to_release_seconds": MetricDoc(
        {"backend": "`status.backend`, empty when none was chosen"},
        "one deleted Sandbox: from the first pass that saw it deleted to its finalizer's removal, "
        "what a caller's disposal waits for (docs/disposal.md); what the node does after that "
        "is not in it",
    ),
    "sandbox_operator_warm_pool_claims_total": MetricDoc(
        {
            "pool": "",
            "result": "`warm`: served from the pool; `exhausted`: a pool of its shape had no idle "
            "Ready pod, it started cold",
        },
        "Sandboxes that met a warm pool of their shape",
    ),
    "sandbox_operator_api_requests_total": MetricDoc(
        {"verb": "", "resource": "", "code": "", "client": ""},
        "requests to the Kubernetes API server (below)",
    ),
    "sandbox_operator_api_response_bytes_total": MetricDoc(
        {"verb": "", "resource": "", "client": ""},
        "bytes of their response bodies (after content decoding)",
    ),
    "sandbox_operator_watch_restarts_total": MetricDoc(
        {"resource": ""},
        "watch requests started: each stream's first and every reconnect",
    ),
}


# ---- the sandbox census (a gauge computed at scrape time: census.py) ----------------------------

SANDBOXES = SandboxCensus()
REGISTRY.register(SANDBOXES)


def register_sandbox_census(fn: Census) -> None:
    """Make ``fn`` the source of ``sandbox_operator_sandboxes`` (replacing any earlier one).

    ``fn() -> Iterable[(reason, backend, count)]`` is called at every scrape. Called from a
    running event loop (e.g. a kopf startup handler), ``fn`` runs on that loop.
    """
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    SANDBOXES.register(fn, loop)


# ---- reconciles ---------------------------------------------------------------------------------


@dataclass
class ReconcileTimer:
    """What ``track_reconcile`` yields: the reconcile's ``outcome``, ``ok`` unless set
    (``requeue``, ``conflict``, ``error``)."""

    kind: str
    outcome: str = "ok"


@contextmanager
def track_reconcile(kind: str) -> Iterator[ReconcileTimer]:
    """``with track_reconcile("sandbox") as r: ...``: counts the reconcile in flight while it
    runs, then observes its duration under ``r.outcome``. An exception leaving the block with the
    outcome still ``ok`` makes it ``error`` (so set ``r.outcome = "requeue"`` before raising a
    retry)."""
    timer = ReconcileTimer(kind)
    IN_FLIGHT.labels(kind).inc()
    start = time.perf_counter()
    try:
        yield timer
    except BaseException:
        if timer.outcome == "ok":
            timer.outcome = "error"
        raise
    finally:
        elapsed = time.perf_counter() - start
        IN_FLIGHT.labels(kind).dec()
        RECONCILE_SECONDS.labels(kind, timer.outcome).observe(elapsed)
