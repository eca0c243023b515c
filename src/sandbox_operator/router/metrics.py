"""The router's Prometheus metrics (docs/metrics.md, "The ports router"), in a registry of their
own (:data:`REGISTRY`, with the process collector: its memory), served on the router's metrics
port (``metricsPort``, 9090; 0: none) apart from the request port, so a scrape never competes
with the routes and no route reaches the metrics.

Its own module because what is counted is the router's contract with whoever watches it: every
request ends in exactly one :func:`answered` (forwarded, or answered by the router itself with a
reason), wake-ups are counted where they are asked (:mod:`.wake`), and ``make docs`` renders the
table from :data:`METRIC_DOCS` (sandbox_operator.docgen) as it does the operator's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    start_http_server,
)

from sandbox_operator.metrics import MetricDoc

REGISTRY: Final = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)

#: ``outcome`` of a request: the pod answered it (its status in ``code``, 101 for an upgrade),
#: the router refused it (4xx), or the router could not have it answered (5xx: not Ready in
#: time, the pod refusing or silent).
FORWARDED: Final = "forwarded"
REFUSED: Final = "refused"
FAILED: Final = "failed"
OUTCOMES: Final = (FORWARDED, REFUSED, FAILED)
#: ``result`` of a wake-up: the resume was asked of the operator, or the ask failed.
WAKE_RESULTS: Final = ("asked", "failed")

LATENCY_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120,
)  # fmt: skip
WAKE_BUCKETS: Final = (0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 300)

REQUESTS = Counter(
    "sandbox_operator_router_requests_total",
    "Requests through the ports router, by outcome and the HTTP status the caller got.",
    ["outcome", "code"],
    registry=REGISTRY,
)
REQUEST_SECONDS = Histogram(
    "sandbox_operator_router_request_seconds",
    "Time from a request's head read to the first byte of its answer, by outcome.",
    ["outcome"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
REFUSALS = Counter(
    "sandbox_operator_router_refusals_total",
    "Requests the router answered itself instead of forwarding, by the answer's reason.",
    ["reason"],
    registry=REGISTRY,
)
WAKEUPS = Counter(
    "sandbox_operator_router_wakeups_total",
    "Resumes of suspended Sandboxes asked by traffic (one per suspension, however many "
    "requests), by result.",
    ["result"],
    registry=REGISTRY,
)
WAKE_SECONDS = Histogram(
    "sandbox_operator_router_wait_seconds",
    "Time a request waited for its Sandbox to be Ready (requests that waited only).",
    buckets=WAKE_BUCKETS,
    registry=REGISTRY,
)
PARKED = Gauge(
    "sandbox_operator_router_parked_requests",
    "Requests waiting now for their Sandbox to be Ready.",
    registry=REGISTRY,
)

for _outcome in OUTCOMES:
    REQUEST_SECONDS.labels(_outcome)
for _result in WAKE_RESULTS:
    WAKEUPS.labels(_result)


def _values(values: tuple[str, ...]) -> str:
    return ", ".join(f"`{v}`" for v in values)


#: One entry per metric above, in the order of the docs' table (``make docs``).
METRIC_DOCS: Mapping[str, MetricDoc] = {
    "sandbox_operator_router_requests_total": MetricDoc(
        {
            "outcome": f"{_values(OUTCOMES)}: the pod answered; the router refused (4xx); the "
            "router could not have it answered (5xx)",
            "code": "the status the caller got: the pod's (`101` for an upgrade), else the "
            "router's",
        },
        "requests, each counted once when its answer begins (`/healthz` is not counted)",
    ),
    "sandbox_operator_router_request_seconds": MetricDoc(
        {"outcome": _values(OUTCOMES)},
        "from the request head read to the first byte of the answer (a wake-up's wait "
        "included; a WebSocket's life not)",
    ),
    "sandbox_operator_router_refusals_total": MetricDoc(
        {
            "reason": "the answer's `reason`: `BadRequest`, `Unauthenticated`, `Forbidden`, "
            "`SandboxNotFound`, `PortNotDeclared`, `NotReadyInTime`, `ResponseTimeout`, a "
            "refused resume's Admitted reason, ..."
        },
        "requests the router answered itself",
    ),
    "sandbox_operator_router_wakeups_total": MetricDoc(
        {"result": _values(WAKE_RESULTS)},
        "resumes asked because of traffic (a flood to one suspension asks once)",
    ),
    "sandbox_operator_router_wait_seconds": MetricDoc(
        {}, "one request that found its Sandbox suspended or starting, until it was Ready"
    ),
    "sandbox_operator_router_parked_requests": MetricDoc(
        {}, "requests waiting now for their Sandbox to be Ready"
    ),
}


def answered(status: int | None, seconds: float, *, forwarded: bool, reason: str = "") -> None:
    """Count one request's answer: ``status`` the caller got (None: the pod's answer was no
    HTTP status line), ``seconds`` until it began, ``reason`` the router's own answer's (when
    not ``forwarded``)."""
    if forwarded:
        outcome = FORWARDED
    else:
        outcome = FAILED if (status or 0) >= 500 else REFUSED
        REFUSALS.labels(reason or "Unknown").inc()
    REQUESTS.labels(outcome, str(status) if status is not None else "other").inc()
    REQUEST_SECONDS.labels(outcome).observe(seconds)


def status_of(first_bytes: bytes) -> int | None:
    """The status code of an HTTP/1.x answer's first bytes, or None when they are not one."""
    if not first_bytes.startswith(b"HTTP/1.") or len(first_bytes) < 12:
        return None
    code = first_bytes[9:12]
    return int(code) if code.isdigit() else None


def serve_metrics(host: str, port: int) -> int:
    """Serve ``GET /metrics`` of :data:`REGISTRY` from a daemon thread; the bound port."""
    server, _thread = start_http_server(port, addr=host, registry=REGISTRY)
    return int(server.server_port)
