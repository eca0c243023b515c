"""The httpx plumbing under `AcasClient`: per-call state, the retry transport, the endpoint
transport and the bearer-token auth flow.

The client wraps the caller's transport (or httpx's default one) as
`RetryTransport(EndpointTransport(inner))` and attaches `BearerAuth`:

* `RetryTransport` re-sends an idempotent request after 429/503 (honouring `Retry-After` up to
  `retries.maxRetryAfterSeconds`) or after a connection failure, with jittered exponential backoff;
  a timeout once the exchange is under way, and any non-idempotent request, is sent exactly once.
* `EndpointTransport` turns the placeholder origin the `httpx.AsyncClient` is addressed to into
  the real endpoint and sandbox-group prefix. httpx's own log line ("HTTP Request: ...") thus
  never names the endpoint or the subscription path: nothing is logged that a filter would have
  to remove, and no process-wide logger is touched.
* `BearerAuth` attaches a token and, on a 401, makes the provider forget it; an idempotent call
  is then sent once more with a fresh token.

Each request carries its `CallState` (operation, idempotence, attempts so far) in
`request.extensions`, so the layers agree on what may be re-sent and the client can report
how many attempts a failure took.
"""

from __future__ import annotations

import email.utils
import logging
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

import httpx

from .auth import TokenProvider
from .config import AcasRetries
from .errors import AcasAuthError, AcasError

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]

#: Statuses a retry may cure (only for idempotent requests).
RETRYABLE_STATUSES = frozenset({429, 503})
#: The origin the `httpx.AsyncClient` is addressed to; `EndpointTransport` maps it to the endpoint.
PLACEHOLDER_ORIGIN = "https://acas-endpoint.invalid"
#: Key of the `CallState` in `request.extensions`.
EXTENSION = "sandbox_operator.acas"


@dataclass(eq=False)
class CallState:
    """What the transport and auth layers need to know about one client call."""

    operation: str
    idempotent: bool
    attempts: int = 0


def call_state(request: httpx.Request) -> CallState:
    """The request's `CallState`; a request sent without one is never re-sent."""
    state = request.extensions.get(EXTENSION)
    if not isinstance(state, CallState):
        state = CallState(operation=request.method, idempotent=False)
        request.extensions[EXTENSION] = state
    return state


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a `Retry-After` header (delta-seconds or HTTP-date), or None."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def backoff_delay(attempt: int, retries: AcasRetries) -> float:
    """Jittered exponential delay before retry number `attempt` (1-based)."""
    ceiling = min(
        retries.max_delay_seconds, retries.base_delay_seconds * float(2 ** max(0, attempt - 1))
    )
    return ceiling * (0.5 + random.random() / 2)


def _broke_under_way(exc: httpx.TransportError) -> bool:
    """A timeout after connecting: the request may be running, so it is never re-sent."""
    return isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout)


class RetryTransport(httpx.AsyncBaseTransport):
    """Re-sends idempotent requests the service or the network may let through next time."""

    def __init__(
        self, inner: httpx.AsyncBaseTransport, retries: AcasRetries, *, sleep: Sleep
    ) -> None:
        self._inner = inner
        self._retries = retries
        self._sleep = sleep

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        call = call_state(request)
        while True:
            call.attempts += 1
            may_retry = call.idempotent and call.attempts < self._retries.max_attempts
            try:
                response = await self._inner.handle_async_request(request)
                # Read here, so a connection that breaks mid-body counts as a failed attempt.
                await response.aread()
            except httpx.TransportError as exc:
                if not may_retry or _broke_under_way(exc):
                    raise
                delay = backoff_delay(call.attempts, self._retries)
                kind = type(exc).__name__
                log.info(
                    "acas %s: %s, retry %d in %.2fs", call.operation, kind, call.attempts, delay
                )
                await self._sleep(delay)
                continue
            log.debug(
                "acas %s: %s [endpoint]%s -> HTTP %d (attempt %d)",
                call.operation,
                request.method,
                request.url.path,
                response.status_code,
                call.attempts,
            )
            wait = self._retry_delay(call, response) if may_retry else None
            if wait is None:
                return response
            await response.aclose()
            await self._sleep(wait)

    def _retry_delay(self, call: CallState, response: httpx.Response) -> float | None:
        """Seconds to wait before re-sending, or None when this answer is final."""
        status = response.status_code
        if status not in RETRYABLE_STATUSES:
            return None
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        cap = self._retries.max_retry_after_seconds
        if retry_after is not None and retry_after > cap:
            log.warning(
                "acas %s: HTTP %d with Retry-After %.0fs beyond the %.0fs cap",
                call.operation,
                status,
                retry_after,
                cap,
            )
            return None
        delay = (
            retry_after if retry_after is not None else backoff_delay(call.attempts, self._retries)
        )
        log.info(
            "acas %s: HTTP %d, retry %d in %.2fs", call.operation, status, call.attempts, delay
        )
        return delay

    async def aclose(self) -> None:
        await self._inner.aclose()


class EndpointTransport(httpx.AsyncBaseTransport):
    """Sends a request addressed to `PLACEHOLDER_ORIGIN` to `base` (endpoint + path prefix)."""

    def __init__(self, inner: httpx.AsyncBaseTransport, base: str) -> None:
        self._inner = inner
        self._base = base.rstrip("/")

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = httpx.URL(self._base + request.url.raw_path.decode("ascii"))
        headers = request.headers.copy()
        headers["Host"] = url.netloc.decode("ascii")
        real = httpx.Request(
            request.method,
            url,
            headers=headers,
            stream=request.stream,
            extensions=request.extensions,
        )
        return await self._inner.handle_async_request(real)

    async def aclose(self) -> None:
        await self._inner.aclose()


class BearerAuth(httpx.Auth):
    """Attaches the provider's token; after a 401 forgets it and re-sends an idempotent call once.

    A provider failure that is not an `AcasError` (azure-identity raises its own types) becomes
    an `AcasAuthError` carrying no text of the original.
    """

    def __init__(self, tokens: TokenProvider) -> None:
        self._tokens = tokens

    async def async_auth_flow(
        self, request: httpx.Request
    ) -> AsyncGenerator[httpx.Request, httpx.Response]:
        call = call_state(request)
        await self._attach(request, call)
        response = yield request
        refreshed = False
        while response.status_code == 401:
            self._tokens.invalidate()
            if refreshed or not call.idempotent:
                return
            refreshed = True
            log.info("acas %s: HTTP 401, retrying once with a fresh token", call.operation)
            await self._attach(request, call)
            response = yield request

    async def _attach(self, request: httpx.Request, call: CallState) -> None:
        try:
            token = await self._tokens.get_token()
        except AcasError:
            raise
        except Exception as exc:
            kind = type(exc).__name__
            log.warning("acas %s: token acquisition failed (%s)", call.operation, kind)
            raise AcasAuthError(call.operation, what="token acquisition failed") from None
        request.headers["Authorization"] = f"Bearer {token}"
