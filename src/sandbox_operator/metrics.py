"""Prometheus metrics of the operator, served at ``GET /metrics`` (``--metrics-port``: 8081).

Built on ``prometheus_client``: the metric objects below live in its default registry (which also
carries its ``process_*``/``python_*`` collectors), and ``start_metrics_server`` serves that
registry from a daemon thread, independent of kopf's event loop.

What feeds them:

* ``RECONCILE_SECONDS``, ``IN_FLIGHT``: the reconcilers, through ``track_reconcile(kind)`` (or by
  hand); ``ADMISSIONS``, ``READY_LATENCY`` and ``DISPOSAL_LATENCY``: the reconcilers, when they
  decide or observe.
* ``SANDBOXES``: not set by anyone; computed at scrape time by the census function given to
  ``register_sandbox_census``.
* ``API_REQUESTS``, ``API_RESPONSE_BYTES``, ``WATCH_RESTARTS``: every request of a
  kubernetes_asyncio ``ApiClient`` passed to ``instrument_api_client``, and every request of kopf
  itself (its watches, lists, patches, events, peering) once ``instrument_kopf`` has given kopf an
  instrumented HTTP session through a login handler (kopf's documented ``kopf.AiohttpSession``);
  the ``client`` label tells the two apart (``operator``, ``kopf``).

Nothing here may break a request: a failure inside a hook is logged at DEBUG and ignored.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, NamedTuple

from prometheus_client import (
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric

from sandbox_operator.apirequest import DISCOVERY as DISCOVERY
from sandbox_operator.apirequest import NONRESOURCE as NONRESOURCE
from sandbox_operator.apirequest import _server_prefix
from sandbox_operator.apirequest import parse_api_request as parse_api_request

log = logging.getLogger(__name__)

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


# ---- the sandbox census (a gauge computed at scrape time) --------------------------------------

Census = Callable[[], Iterable[tuple[str, str, int]]]


class SandboxCensus:
    """A collector for ``sandbox_operator_sandboxes{reason, backend}``, computed at each scrape.

    The census function returns ``(reason, backend, count)`` rows; rows naming the same pair are
    added up. When it was registered from a running event loop, it is called on that loop (the
    scrape thread waits up to ``timeout`` seconds), so it may read state the loop owns without
    locks; otherwise it is called on the scrape thread. If it raises or times out, the scrape
    gets no ``sandbox_operator_sandboxes`` samples and the failure is logged.
    """

    NAME = "sandbox_operator_sandboxes"
    DOC = "Sandboxes known to the operator, by condition reason and backend."
    LABELS = ("reason", "backend")

    def __init__(self, timeout: float = 5.0) -> None:
        self.timeout = timeout
        self._lock = threading.Lock()
        self._fn: Census | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def register(self, fn: Census, loop: asyncio.AbstractEventLoop | None = None) -> None:
        with self._lock:
            self._fn, self._loop = fn, loop

    def unregister(self) -> None:
        with self._lock:
            self._fn, self._loop = None, None

    def describe(self) -> Iterable[Metric]:
        # Lets the registry learn the name without calling the census function.
        return [GaugeMetricFamily(self.NAME, self.DOC, labels=list(self.LABELS))]

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            fn, loop = self._fn, self._loop
        if fn is None:
            return []
        try:
            rows = self._call(fn, loop)
            totals: dict[tuple[str, str], float] = {}
            for reason, backend, count in rows:
                key = (str(reason), str(backend))
                totals[key] = totals.get(key, 0.0) + float(count)
        except Exception as exc:
            log.warning("sandbox census failed, no %s samples: %r", self.NAME, exc, exc_info=True)
            return []
        family = GaugeMetricFamily(self.NAME, self.DOC, labels=list(self.LABELS))
        for (reason, backend), value in sorted(totals.items()):
            family.add_metric([reason, backend], value)
        return [family]

    def _call(
        self, fn: Census, loop: asyncio.AbstractEventLoop | None
    ) -> list[tuple[str, str, int]]:
        if loop is None or loop.is_closed() or not loop.is_running() or _on_loop(loop):
            return list(fn())
        result: concurrent.futures.Future[list[tuple[str, str, int]]] = concurrent.futures.Future()

        def run() -> None:
            if not result.set_running_or_notify_cancel():
                return
            try:
                result.set_result(list(fn()))
            except BaseException as exc:
                result.set_exception(exc)

        loop.call_soon_threadsafe(run)
        try:
            return result.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError:
            result.cancel()
            raise TimeoutError(
                f"the census did not run on the event loop in {self.timeout}s"
            ) from None


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


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


# ---- Kubernetes API requests --------------------------------------------------------------------
# (read as the API server reads them: sandbox_operator.apirequest.parse_api_request, called
# through this module's name so a test can replace it)


class _Request(NamedTuple):
    """The labels of one request, and its recording (never raising: see ``_safely``)."""

    verb: str
    resource: str
    client: str

    def started(self) -> None:
        if self.verb == "watch":
            WATCH_RESTARTS.labels(self.resource).inc()

    def answered(self, code: str) -> None:
        API_REQUESTS.labels(self.verb, self.resource, code, self.client).inc()

    def read(self, n: int) -> None:
        if n >= 0:
            API_RESPONSE_BYTES.labels(self.verb, self.resource, self.client).inc(n)

    def read_at_eof(self, response: Any) -> None:
        """Count a streamed (not preloaded) body as it is received: sampled every second while
        it is open (``_Stream``), the rest at its end.

        aiohttp's StreamReader counts every byte fed into it (``total_bytes``, after content
        decoding) and calls ``on_eof`` callbacks at the end of the body. What a stream closed
        before its end (a watch cancelled at shutdown) received since the last sample is lost.
        """
        content = getattr(response, "content", None)
        on_eof = getattr(content, "on_eof", None)
        if content is None or on_eof is None:
            return
        stream = _Stream(self, content)
        _LIVE_STREAMS.add(stream)
        _ensure_sampler()

        def done() -> None:
            _LIVE_STREAMS.discard(stream)
            _safely(stream.sample)

        on_eof(done)

    def api_exception(self, exc: Any) -> None:
        status = getattr(exc, "status", None)
        self.answered(str(status) if status else CODE_ERROR)
        self.read(_length(getattr(exc, "body", None)))

    def response(self, response: Any) -> None:
        self.answered(str(getattr(response, "status", CODE_ERROR)))
        n = _length(getattr(response, "data", None))
        if n >= 0:
            self.read(n)
        else:
            self.read_at_eof(response)


class _Stream:
    """A streamed body being received (a watch): its bytes are counted as they arrive (sampled
    every ``STREAM_SAMPLE_SECONDS``), not all at its end, so a long watch's traffic shows in the
    interval it flowed in rather than minutes later when the stream closes."""

    def __init__(self, request: _Request, content: Any) -> None:
        self.request = request
        self.content = content
        self.counted = 0

    def sample(self) -> None:
        total = int(getattr(self.content, "total_bytes", 0) or 0)
        if total > self.counted:
            self.request.read(total - self.counted)
            self.counted = total


STREAM_SAMPLE_SECONDS = 1.0
_LIVE_STREAMS: set[_Stream] = set()
_sampler: asyncio.Task[None] | None = None


def _ensure_sampler() -> None:
    global _sampler
    if _sampler is not None and not _sampler.done():
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    _sampler = loop.create_task(_sample_streams(), name="metrics-stream-sampler")


async def stop_stream_sampler() -> None:
    """Cancel the stream sampler (the operator's cleanup): kopf gives tasks it did not start
    five seconds to end on their own before it cancels them, and every stop would wait that."""
    global _sampler
    task, _sampler = _sampler, None
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _sample_streams() -> None:
    while _LIVE_STREAMS:
        await asyncio.sleep(STREAM_SAMPLE_SECONDS)
        for stream in list(_LIVE_STREAMS):
            _safely(stream.sample)


def _label(method: str, url: str, query: Any, prefix: str, client: str) -> _Request | None:
    try:
        req = _Request(*parse_api_request(method, url, query, prefix=prefix), client)
        req.started()
        return req
    except Exception:
        log.debug("metrics: cannot label %s %s", method, url, exc_info=True)
        return None


def _length(data: Any) -> int:
    return len(data) if isinstance(data, bytes | bytearray | str) else -1


def _safely(fn: Callable[..., None], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        log.debug("metrics: recording failed", exc_info=True)


_MARK = "_sandbox_operator_metrics"


def instrument_api_client(api_client: Any, client: str = CLIENT_OPERATOR) -> None:
    """Count every request a kubernetes_asyncio ``ApiClient`` makes (idempotent).

    Wraps ``api_client.rest_client.request``, the one coroutine every generated API method (and
    ``ApiClient.request``, through ``rest_client.GET`` ... ``DELETE``) goes through. Preloaded
    responses count ``len(data)`` bytes (an ``ApiException`` its body); with
    ``_preload_content=False`` the raw aiohttp response is returned, counted at its status
    immediately and its body bytes when the body has been read to its end.
    """
    from kubernetes_asyncio.client.exceptions import ApiException

    rest = api_client.rest_client
    original = rest.request
    if getattr(original, _MARK, False):
        return
    prefix = _server_prefix(getattr(getattr(api_client, "configuration", None), "host", "") or "")

    async def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        query = kwargs.get("query_params", args[0] if args else None)
        req = _label(method, url, query, prefix, client)
        try:
            response = await original(method, url, *args, **kwargs)
        except ApiException as exc:
            if req is not None:
                _safely(req.api_exception, exc)
            raise
        except asyncio.CancelledError:
            if req is not None:
                _safely(req.answered, CODE_CANCELLED)
            raise
        except Exception:
            if req is not None:
                _safely(req.answered, CODE_ERROR)
            raise
        if req is not None:
            _safely(req.response, response)
        return response

    setattr(request, _MARK, True)
    rest.request = request


# ---- kopf's own requests ------------------------------------------------------------------------


def api_trace_config(server: str = "", client: str = CLIENT_KOPF) -> Any:
    """An ``aiohttp.TraceConfig`` counting every request of a session into the API metrics.

    ``server`` is the API server's URL, whose path (if any) is dropped before parsing.
    """
    import aiohttp

    prefix = _server_prefix(server)
    config = aiohttp.TraceConfig()

    async def on_start(_session: Any, ctx: SimpleNamespace, params: Any) -> None:
        ctx.metrics_request = _label(params.method, str(params.url), None, prefix, client)

    async def on_end(_session: Any, ctx: SimpleNamespace, params: Any) -> None:
        req: _Request | None = getattr(ctx, "metrics_request", None)
        if req is not None:
            _safely(req.answered, str(params.response.status))
            _safely(req.read_at_eof, params.response)

    async def on_exception(_session: Any, ctx: SimpleNamespace, params: Any) -> None:
        req: _Request | None = getattr(ctx, "metrics_request", None)
        if req is not None:
            cancelled = isinstance(params.exception, asyncio.CancelledError)
            _safely(req.answered, CODE_CANCELLED if cancelled else CODE_ERROR)

    config.on_request_start.append(on_start)
    config.on_request_end.append(on_end)
    config.on_request_exception.append(on_exception)
    return config


def instrumented_session(info: Any) -> Any:
    """An aiohttp session for kopf from a ``kopf.ConnectionInfo``, built as kopf builds its own
    (kopf/_cogs/clients/auth.py: no connection limit, the info's SSL context, headers, proxy and
    trust_env) plus ``api_trace_config``. Must be called on the event loop."""
    import aiohttp

    extra: dict[str, Any] = {"proxy": info.proxy_url} if info.proxy_url else {}
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ssl=info.as_ssl_context()),
        headers=info.as_http_headers(),
        trust_env=info.trust_env,
        trace_configs=[api_trace_config(info.server)],
        **extra,
    )


async def kopf_login(*, logger: Any, settings: Any, **_: Any) -> Any:
    """kopf login handler: kopf's default credentials (``kopf.login_via_client``, what kopf
    uses when no login handler is declared and the kubernetes library is installed) in an
    instrumented session. If the session cannot be built, the plain credentials (uncounted)."""
    import kopf

    info = await asyncio.to_thread(kopf.login_via_client, logger=logger, settings=settings)
    if info is None:
        return None
    try:
        session = instrumented_session(info)
    except Exception:
        log.warning("metrics: kopf's API requests are not counted", exc_info=True)
        return info
    return kopf.AiohttpSession(
        server=info.server,
        default_namespace=info.default_namespace,
        priority=info.priority,
        expiration=info.expiration,
        aiohttp_session=session,
    )


_kopf_registries: weakref.WeakSet[Any] = weakref.WeakSet()


def instrument_kopf(registry: Any = None) -> bool:
    """Count kopf's own API requests (and its watch restarts): register ``kopf_login`` as the
    login handler of ``registry`` (default: kopf's default registry), once per registry.

    It replaces kopf's implicit login (a declared login handler disables the fallbacks) with the
    same credentials. Returns False, counting nothing, on a kopf without ``kopf.AiohttpSession``.
    """
    import kopf

    if not hasattr(kopf, "AiohttpSession"):
        log.warning("metrics: this kopf has no AiohttpSession; its API requests are not counted")
        return False
    target = registry if registry is not None else kopf.get_default_registry()
    if target in _kopf_registries:
        return True
    kopf.on.login(id="metrics-login", errors=kopf.ErrorsMode.IGNORED, registry=target)(kopf_login)
    _kopf_registries.add(target)
    return True


# ---- the HTTP endpoint --------------------------------------------------------------------------

_server: Any = None


def start_metrics_server(host: str, port: int) -> None:
    """Serve ``GET /metrics`` (the default registry) on ``host:port`` from a daemon thread.

    Raises OSError when the address cannot be bound. A second call stops the first server."""
    global _server
    stop_metrics_server()
    server, _thread = start_http_server(port, addr=host)
    _server = server
    log.info("serving metrics at http://%s:%d/metrics", host, server.server_port)


def stop_metrics_server() -> None:
    global _server
    if _server is not None:
        _server.shutdown()
        _server.server_close()
        _server = None


def metrics_server_port() -> int | None:
    """The bound port of the running metrics server (useful after ``port=0``), else None."""
    return int(_server.server_port) if _server is not None else None
