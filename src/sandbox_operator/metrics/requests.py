"""Counting the operator's own Kubernetes API requests: ``sandbox_operator_api_requests_total``,
``sandbox_operator_api_response_bytes_total`` and ``sandbox_operator_watch_restarts_total``.

Every request is labelled as the API server reads it (``sandbox_operator.apirequest``, called
through that module's name so a test can replace it) and counted by a hook: around a
kubernetes_asyncio ``ApiClient`` (:func:`instrument_api_client`), or in an aiohttp session's
trace (``kopf_session.py``, for kopf's own requests). A streamed body (a watch) is counted as it
flows, sampled every ``STREAM_SAMPLE_SECONDS``.

Its own module because it hooks into HTTP clients, apart from what the metrics are
(``metrics/__init__.py``). Nothing here may break a request: a failure inside a hook is logged at
DEBUG and ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from sandbox_operator import apirequest
from sandbox_operator.apirequest import _server_prefix
from sandbox_operator.metrics import (
    API_REQUESTS,
    API_RESPONSE_BYTES,
    CLIENT_OPERATOR,
    CODE_CANCELLED,
    CODE_ERROR,
    WATCH_RESTARTS,
)

log = logging.getLogger(__name__)


class LabelledRequest(NamedTuple):
    """The labels of one request, and its recording (never raising: see ``safely``)."""

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
            safely(stream.sample)

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

    def __init__(self, request: LabelledRequest, content: Any) -> None:
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
            safely(stream.sample)


def label_request(
    method: str, url: str, query: Any, prefix: str, client: str
) -> LabelledRequest | None:
    """The request's labels (its watch restart counted), or None when it cannot be labelled."""
    try:
        req = LabelledRequest(
            *apirequest.parse_api_request(method, url, query, prefix=prefix), client
        )
        req.started()
        return req
    except Exception:
        log.debug("metrics: cannot label %s %s", method, url, exc_info=True)
        return None


def _length(data: Any) -> int:
    return len(data) if isinstance(data, bytes | bytearray | str) else -1


def safely(fn: Callable[..., None], *args: Any) -> None:
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
        req = label_request(method, url, query, prefix, client)
        try:
            response = await original(method, url, *args, **kwargs)
        except ApiException as exc:
            if req is not None:
                safely(req.api_exception, exc)
            raise
        except asyncio.CancelledError:
            if req is not None:
                safely(req.answered, CODE_CANCELLED)
            raise
        except Exception:
            if req is not None:
                safely(req.answered, CODE_ERROR)
            raise
        if req is not None:
            safely(req.response, response)
        return response

    setattr(request, _MARK, True)
    rest.request = request
