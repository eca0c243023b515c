# ruff: noqa: ASYNC109
# (ExecTransport.run takes its timeout in seconds and enforces it itself.)
"""The pod data plane: :class:`PodExecTransport` runs the data plane's scripts in a pod's
container over the API server's ``pods/exec`` (kubernetes_asyncio websocket, binary-safe), and
:func:`pod_factory` is the data plane every ``SandboxClient`` has for ``servedBy.kind: Pod``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import aiohttp
from kubernetes_asyncio.client import CoreV1Api

from sandbox_operator.client.dataplane.execplane import ExecDataPlane, RawResult
from sandbox_operator.client.dataplane.protocol import DataPlane
from sandbox_operator.client.dataplane.session import SessionExecTransport
from sandbox_operator.client.dataplane.streaming import ExitStatus, OutputChunk
from sandbox_operator.client.errors import (
    DataPlaneError,
    ExecStreamUnsupported,
    SandboxForbidden,
)
from sandbox_operator.views import ApiStatusView, SandboxView


@dataclass
class PodTarget:
    namespace: str
    pod: str
    container: str | None = None


class _ExecContainer(TypedDict, total=False):
    """The keyword argument of ``connect_get_namespaced_pod_exec`` set only when it applies:
    the container (unset: the pod's only one)."""

    container: str


_STDIN, _STDOUT, _STDERR, _ERROR, _RESIZE = 0, 1, 2, 3, 4
#: ``v5.channel.k8s.io`` adds a close signal (channel 255, then the channel closed): how stdin
#: alone is ended. Asked for first; an API server without it answers ``v4``.
_V5, _V4 = "v5.channel.k8s.io", "v4.channel.k8s.io"
_CLOSE = 255
_CHUNK = 256 * 1024
_ATTEMPTS = 3


class PodExecTransport:
    """Runs argv in a pod's container over ``pods/exec`` (kubernetes_asyncio websocket client).

    Frames are read as raw bytes (channel byte + payload), so stdout/stderr are binary-safe; stdin
    is sent in chunks on channel 0.
    """

    def __init__(self, ws_api_client: Any, target: PodTarget) -> None:
        self._ws = ws_api_client
        self.target = target

    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None,
        timeout: float,
        max_output: int,
        stderr: bytearray | None = None,
        header_wait: float = 0.0,
    ) -> RawResult:
        api = CoreV1Api(self._ws)
        out = bytearray()
        err = stderr if stderr is not None else bytearray()
        status: bytes = b""
        overflowed = False
        # Once the stream is open the command has been started: a failure from then on is a
        # lost stream (reported without an exit code), not a command that never ran.
        started = False

        async def session() -> None:
            nonlocal started
            kwargs: _ExecContainer = {}
            if self.target.container:
                kwargs["container"] = self.target.container
            connect: Any = await api.connect_get_namespaced_pod_exec(
                self.target.pod,
                self.target.namespace,
                command=list(argv),  # type: ignore[arg-type]
                stdin=stdin is not None,
                stdout=True,
                stderr=True,
                tty=False,
                _preload_content=False,
                **kwargs,
            )
            async with connect as ws:
                started = True
                sender = asyncio.ensure_future(_send_stdin(ws, stdin)) if stdin else None
                try:
                    await _receive(ws)
                finally:
                    if sender is not None:
                        sender.cancel()
                        await asyncio.gather(sender, return_exceptions=True)

        async def _receive(ws: Any) -> None:
            nonlocal status, overflowed
            frames = _frames(ws)
            async for channel, payload in frames:
                if channel == _STDOUT:
                    out.extend(payload)
                elif channel == _STDERR:
                    err.extend(payload)
                elif channel == _ERROR:
                    status += payload
                if len(out) + len(err) > max_output:
                    overflowed = True
                    if header_wait > 0 and b"\n" not in err:
                        await _read_stderr_line(frames, err, header_wait)
                    return

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        attempt = 0
        while True:
            attempt += 1
            try:
                await asyncio.wait_for(session(), timeout=max(deadline - loop.time(), 0.001))
                break
            except TimeoutError:
                return RawResult(None, bytes(out), bytes(err), timed_out=True)
            except aiohttp.WSServerHandshakeError as exc:
                # The upgrade failed, so the command never started: a transient server-side
                # failure (API server to kubelet) is safe to retry.
                if exc.status >= 500 and attempt < _ATTEMPTS and deadline - loop.time() > 1:
                    await asyncio.sleep(0.5 * attempt)
                    continue
                raise self._refused(exc) from None
            except aiohttp.ClientError as exc:
                if started:
                    return RawResult(None, bytes(out), bytes(err))  # the stream was lost
                raise DataPlaneError(f"exec transport failed: {type(exc).__name__}") from None
        if overflowed:
            return RawResult(None, bytes(out), bytes(err), overflowed=True)
        return RawResult(_exit_code(status), bytes(out), bytes(err))

    def _refused(self, exc: aiohttp.WSServerHandshakeError) -> Exception:
        """The error of an upgrade the API server refused (the command never started)."""
        if exc.status == 403:
            return SandboxForbidden(namespace=self.target.namespace, action="create pods/exec")
        return DataPlaneError(f"exec refused by the API server (HTTP {exc.status})")

    async def open(self, argv: Sequence[str], *, stdin: bool, tty: bool) -> PodExecChannel:
        """Start ``argv`` and return its open stream (:mod:`.streaming`). On a terminal, stdout
        carries stderr too, as ``kubectl exec -t`` has it. A failed upgrade is retried as
        :meth:`run`'s is (the command never started); the caller bounds the whole."""
        api = CoreV1Api(self._ws)
        # An encoder's output for the API client: its stubs lack the ``_headers`` it takes.
        kwargs: dict[str, Any] = {"_headers": {"sec-websocket-protocol": f"{_V5},{_V4}"}}
        if self.target.container:
            kwargs["container"] = self.target.container
        attempt = 0
        while True:
            attempt += 1
            try:
                connect: Any = await api.connect_get_namespaced_pod_exec(
                    self.target.pod,
                    self.target.namespace,
                    command=list(argv),  # type: ignore[arg-type]
                    stdin=stdin,
                    stdout=True,
                    stderr=not tty,
                    tty=tty,
                    _preload_content=False,
                    **kwargs,
                )
                ws = await connect
                break
            except aiohttp.WSServerHandshakeError as exc:
                if exc.status >= 500 and attempt < _ATTEMPTS:
                    await asyncio.sleep(0.5 * attempt)
                    continue
                raise self._refused(exc) from None
            except aiohttp.ClientError as exc:
                raise DataPlaneError(f"exec transport failed: {type(exc).__name__}") from None
        response = getattr(ws, "_response", None)
        chosen = response.headers.get("Sec-WebSocket-Protocol", "") if response else ""
        return PodExecChannel(ws, can_close_stdin=chosen.strip() == _V5)

    async def close(self) -> None:
        return None


class PodExecChannel:
    """One open ``pods/exec`` websocket as an :class:`~.streaming.ExecChannel`: frames in as
    typed events, stdin (channel 0), its end (the ``v5`` close signal) and the window size
    (channel 4, a terminal's) out."""

    def __init__(self, ws: Any, *, can_close_stdin: bool) -> None:
        self._ws = ws
        self.can_close_stdin = can_close_stdin
        self._status = b""

    async def receive(self) -> OutputChunk | ExitStatus | None:
        while True:
            try:
                msg = await self._ws.receive()
            except (aiohttp.ClientError, RuntimeError):
                return None
            if msg.type == aiohttp.WSMsgType.BINARY:
                data: bytes = msg.data
            elif msg.type == aiohttp.WSMsgType.TEXT:
                data = msg.data.encode("utf-8")
            else:
                # Closed: the status that came before it, if any, is the command's end.
                if not self._status:
                    return None
                code = _exit_code(self._status)
                return None if code is None else ExitStatus(code)
            if not data:
                continue
            channel, payload = data[0], data[1:]
            if channel == _STDOUT and payload:
                return OutputChunk("stdout", payload)
            if channel == _STDERR and payload:
                return OutputChunk("stderr", payload)
            if channel == _ERROR:
                self._status += payload

    async def _send(self, frame: bytes) -> None:
        """One frame out; a stream already closed or lost is a :class:`DataPlaneError` (what
        became of the command, the next read says)."""
        try:
            await self._ws.send_bytes(frame)
        except (aiohttp.ClientError, ConnectionError, RuntimeError):
            raise DataPlaneError("the exec stream is closed") from None

    async def send_stdin(self, data: bytes) -> None:
        for i in range(0, len(data), _CHUNK):
            await self._send(bytes([_STDIN]) + data[i : i + _CHUNK])

    async def close_stdin(self) -> None:
        if not self.can_close_stdin:
            raise ExecStreamUnsupported(
                f"the API server speaks {_V4}, which cannot end stdin alone", what="close_stdin"
            )
        await self._send(bytes([_CLOSE, _STDIN]))

    async def resize(self, cols: int, rows: int) -> None:
        size = json.dumps({"Width": int(cols), "Height": int(rows)}).encode()
        await self._send(bytes([_RESIZE]) + size)

    async def close(self) -> None:
        if not self._ws.closed:
            await self._ws.close()


async def _frames(ws: Any) -> AsyncIterator[tuple[int, bytes]]:
    """A ``pods/exec`` websocket's frames as (channel, payload) until it closes or fails."""
    async for msg in ws:
        if msg.type == aiohttp.WSMsgType.BINARY:
            data: bytes = msg.data
        elif msg.type == aiohttp.WSMsgType.TEXT:
            data = msg.data.encode("utf-8")
        else:
            return  # closed or failed: without a status, the command's end is unknown
        if data:
            yield data[0], data[1:]


async def _read_stderr_line(
    frames: AsyncIterator[tuple[int, bytes]], err: bytearray, wait: float
) -> None:
    """Read on past an overflow, keeping stderr alone, until stderr holds its first whole line
    (the exec wrapper's pid), the stream ends, or ``wait`` seconds pass. stdout and stderr are
    copied apart on the node, so a command that floods stdout can go over the budget before the
    line the wrapper wrote first has arrived; without it the command could not be killed."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(wait):
            async for channel, payload in frames:
                if channel == _STDERR:
                    err.extend(payload)
                    if b"\n" in err:
                        return


async def _send_stdin(ws: Any, data: bytes) -> None:
    """Send stdin concurrently with reading, so a command writing output before it has read all
    of its input cannot deadlock the stream."""
    for i in range(0, len(data), _CHUNK):
        await ws.send_bytes(bytes([_STDIN]) + data[i : i + _CHUNK])


def _exit_code(status: bytes) -> int | None:
    if not status:
        return None
    try:
        doc = ApiStatusView(json.loads(status))
    except ValueError:
        raise DataPlaneError("unreadable exec status") from None
    if doc.succeeded:
        return 0
    exit_code = doc.cause("ExitCode")
    if exit_code is not None:
        return int(exit_code.message or "-1")
    raise DataPlaneError(f"exec failed: {doc.reason or 'unknown'}")


def pod_dataplane(
    ws_api_client: Any,
    namespace: str,
    pod: str,
    container: str | None = None,
    *,
    session: bool = False,
) -> ExecDataPlane:
    """A data plane into one pod's container over ``pods/exec``; ``session``: buffered commands
    and file operations through one exec session (:mod:`.session`, docs/exec-session.md), kills
    and streams over plain ``pods/exec``."""
    direct = PodExecTransport(ws_api_client, PodTarget(namespace, pod, container))
    if not session:
        return ExecDataPlane(direct)
    return ExecDataPlane(SessionExecTransport(direct), kill_transport=direct)


def pod_factory(client: Any, obj: SandboxView, *, session: bool = False) -> DataPlane:
    """The data plane of a Sandbox served by a pod (``servedBy.kind: Pod``) in the client's own
    namespace, over the client's websocket API client (``client.ws_api``)."""
    # A factory is public: a caller outside the type checker may hand a plain dict.
    view = SandboxView.of(obj)
    served = view.status.served_by
    namespace = served.namespace or view.metadata.namespace
    if namespace != client.namespace:
        raise DataPlaneError("the sandbox is served from another namespace")
    return pod_dataplane(client.ws_api, namespace, served.name, session=session)


def pod_session_factory(client: Any, obj: SandboxView) -> DataPlane:
    """:func:`pod_factory` with an exec session per handle (opt-in:
    ``SandboxClient(dataplanes={"Pod": pod_session_factory})``, docs/exec-session.md)."""
    return pod_factory(client, obj, session=True)
