"""The router's server: one request head per connection, judged in a fixed order, then the
connection spliced to the one pod and port it was judged for.

Its own module because the order is the security argument: the target is parsed (400) before
anything else, the caller authenticated (401) and authorized on the named Sandbox (403) before
the router says whether that Sandbox or port exists (404), and only a declared http port of a
Sandbox whose pod is Ready is ever dialled. After the head, bytes flow both ways unread (a body,
a WebSocket's frames) until either side closes or stays silent past the idle timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sandbox_operator.contract.ports import PortProtocol

from . import metrics
from .activity import ActivityStamps
from .errors import Refusal
from .head import HEAD_MAX_BYTES, RequestHead, read_head, upstream_head
from .reviews import Reviewer
from .target import Route, parse_target
from .view import View
from .wake import Waker

log = logging.getLogger(__name__)

_PHRASES = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    431: "Request Header Fields Too Large",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}
_CHUNK = 64 * 1024
#: Connections the kernel may queue before the router accepts them: a flood of callers (a
#: woken Sandbox's parked requests are answered at once) must not meet SYN retries (the kernel
#: caps it at net.core.somaxconn).
BACKLOG = 4096


@dataclass(frozen=True)
class Timeouts:
    """Seconds: the head's arrival, dialling the pod, the pod's first answer, and silence both
    ways once spliced."""

    head: float = 30.0
    connect: float = 10.0
    response: float = 60.0
    idle: float = 300.0


class Router:
    def __init__(
        self,
        view: View,
        reviewer: Reviewer,
        waker: Waker,
        activity: ActivityStamps,
        timeouts: Timeouts = Timeouts(),
        synced: Callable[[], bool] = lambda: True,
    ) -> None:
        self._synced = synced
        self._view = view
        self._reviewer = reviewer
        self._waker = waker
        self._activity = activity
        self._timeouts = timeouts

    async def serve(self, host: str, port: int) -> asyncio.Server:
        return await asyncio.start_server(
            self.handle, host, port, limit=HEAD_MAX_BYTES, backlog=BACKLOG
        )

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            started = time.monotonic()
            try:
                head = await asyncio.wait_for(read_head(reader), self._timeouts.head)
                started = time.monotonic()
                if head.target == "/healthz" and head.method == "GET":
                    if self._synced():
                        await _answer(writer, 200, "OK", "the router is serving")
                    else:
                        await _answer(writer, 503, "Syncing", "the router's view is not listed yet")
                    return
                route = parse_target(head.target)
                await self._forward(head, route, reader, writer, started)
            except Refusal as refusal:
                log.debug("refused: %s", refusal)
                await self._refuse(writer, refusal, started)
            except TimeoutError:
                late = Refusal(400, "HeadTimeout", "the request head did not arrive")
                await self._refuse(writer, late, started)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    @staticmethod
    async def _refuse(writer: asyncio.StreamWriter, refusal: Refusal, started: float) -> None:
        elapsed = time.monotonic() - started
        metrics.answered(refusal.status, elapsed, forwarded=False, reason=refusal.reason)
        await _answer(writer, refusal.status, refusal.reason, refusal.message)

    async def _judge(self, head: RequestHead, route: Route) -> None:
        token = head.bearer_token()
        if token is None:
            raise Refusal(401, "Unauthenticated", "a bearer token is required")
        try:
            who = await self._reviewer.authenticate(token)
        except Exception as exc:
            raise Refusal(503, "ReviewFailed", "the token could not be reviewed") from exc
        if who is None:
            raise Refusal(401, "Unauthenticated", "the token is not valid")
        try:
            allowed = await self._reviewer.authorize(who, route.namespace, route.sandbox)
        except Exception as exc:
            raise Refusal(503, "ReviewFailed", "the access could not be reviewed") from exc
        if not allowed:
            raise Refusal(
                403, "Forbidden", "connect on sandboxes/ports of this Sandbox is not allowed"
            )

    async def _forward(
        self,
        head: RequestHead,
        route: Route,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        started: float,
    ) -> None:
        await self._judge(head, route)
        entry = self._view.sandbox(route.namespace, route.sandbox)
        if entry is None:
            raise Refusal(404, "SandboxNotFound", "no such Sandbox")
        port = entry.port(route.port)
        if port is None:
            raise Refusal(404, "PortNotDeclared", "the Sandbox declares no such port")
        if port.protocol is not PortProtocol.HTTP:
            raise Refusal(501, "ProtocolNotForwarded", "only http ports are forwarded")
        address = await self._waker.address(route.namespace, route.sandbox)
        self._activity.touch(route.namespace, route.sandbox)
        up_reader, up_writer = await self._dial(address, port.port)
        host = f"[{address}]" if ":" in address else address
        try:
            up_writer.write(
                upstream_head(head, route.upstream_target, f"{host}:{port.port}", route.prefix)
            )
            await up_writer.drain()
            await self._splice(reader, writer, up_reader, up_writer, started)
        finally:
            up_writer.close()
            with contextlib.suppress(Exception):
                await up_writer.wait_closed()

    async def _dial(
        self, address: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the pod. A refused connect is tried again (50 ms, doubling to 1 s)
        until the connect timeout: a pod is Ready before its workload listens (a Sandbox woken
        by this very request starts its server after the pod starts), and that is no reason to
        answer 502 at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeouts.connect
        pause = 0.05
        while True:
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(address, port), max(deadline - loop.time(), 0.001)
                )
            except TimeoutError as exc:
                raise Refusal(504, "ConnectTimeout", "the sandbox did not accept in time") from exc
            except OSError as exc:
                if loop.time() + pause >= deadline:
                    raise Refusal(
                        502, "ConnectFailed", "the sandbox refused the connection"
                    ) from exc
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)

    async def _splice(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
        started: float,
    ) -> None:
        first = asyncio.ensure_future(up_reader.read(_CHUNK))
        upload = asyncio.ensure_future(_copy(reader, up_writer, self._timeouts.idle, eof=True))
        try:
            try:
                data = await asyncio.wait_for(asyncio.shield(first), self._timeouts.response)
            except TimeoutError as exc:
                first.cancel()
                raise Refusal(504, "ResponseTimeout", "the sandbox did not answer in time") from exc
            if not data:
                raise Refusal(502, "NoResponse", "the sandbox closed without answering")
            metrics.answered(metrics.status_of(data), time.monotonic() - started, forwarded=True)
            writer.write(data)
            await writer.drain()
            await _copy(up_reader, writer, self._timeouts.idle, eof=False)
        finally:
            upload.cancel()
            with contextlib.suppress(BaseException):
                await upload


async def _copy(
    src: asyncio.StreamReader, dst: asyncio.StreamWriter, idle: float, *, eof: bool
) -> None:
    """Copy until ``src`` ends or is silent ``idle`` seconds; then half-close ``dst`` (``eof``)."""
    with contextlib.suppress(TimeoutError, ConnectionError, OSError):
        while data := await asyncio.wait_for(src.read(_CHUNK), idle):
            dst.write(data)
            await dst.drain()
        if eof and dst.can_write_eof():
            dst.write_eof()


async def _answer(writer: asyncio.StreamWriter, status: int, reason: str, message: str) -> None:
    body = json.dumps({"reason": reason, "message": message}).encode()
    lines = [
        f"HTTP/1.1 {status} {_PHRASES.get(status, 'Error')}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if status == 401:
        lines.append('WWW-Authenticate: Bearer realm="sandbox-operator"')
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + body)
    with contextlib.suppress(ConnectionError, OSError):
        await writer.drain()
