# ruff: noqa: ASYNC109
# (ExecTransport.run takes its timeout in seconds and enforces it itself.)
"""The pod data plane: :class:`PodExecTransport` runs the data plane's scripts in a pod's
container over the API server's ``pods/exec`` (kubernetes_asyncio websocket, binary-safe), and
:func:`pod_factory` is the data plane every ``SandboxClient`` has for ``servedBy.kind: Pod``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from kubernetes_asyncio.client import CoreV1Api

from sandbox_operator.client.dataplane.execplane import ExecDataPlane, RawResult
from sandbox_operator.client.dataplane.protocol import DataPlane
from sandbox_operator.client.errors import DataPlaneError, SandboxForbidden


@dataclass
class PodTarget:
    namespace: str
    pod: str
    container: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


_STDIN, _STDOUT, _STDERR, _ERROR = 0, 1, 2, 3
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
            kwargs: dict[str, Any] = {}
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
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.BINARY:
                    data: bytes = msg.data
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    data = msg.data.encode("utf-8")
                else:
                    break  # closed or failed: without a status, the command's end is unknown
                if not data:
                    continue
                channel, payload = data[0], data[1:]
                if channel == _STDOUT:
                    out.extend(payload)
                elif channel == _STDERR:
                    err.extend(payload)
                elif channel == _ERROR:
                    status += payload
                if len(out) + len(err) > max_output:
                    overflowed = True
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
                if exc.status == 403:
                    raise SandboxForbidden(
                        namespace=self.target.namespace, action="create pods/exec"
                    ) from None
                # The upgrade failed, so the command never started: a transient server-side
                # failure (API server to kubelet) is safe to retry.
                if exc.status >= 500 and attempt < _ATTEMPTS and deadline - loop.time() > 1:
                    await asyncio.sleep(0.5 * attempt)
                    continue
                raise DataPlaneError(
                    f"exec refused by the API server (HTTP {exc.status})"
                ) from None
            except aiohttp.ClientError as exc:
                if started:
                    return RawResult(None, bytes(out), bytes(err))  # the stream was lost
                raise DataPlaneError(f"exec transport failed: {type(exc).__name__}") from None
        if overflowed:
            return RawResult(None, bytes(out), bytes(err), overflowed=True)
        return RawResult(_exit_code(status), bytes(out), bytes(err))

    async def close(self) -> None:
        return None


async def _send_stdin(ws: Any, data: bytes) -> None:
    """Send stdin concurrently with reading, so a command writing output before it has read all
    of its input cannot deadlock the stream."""
    for i in range(0, len(data), _CHUNK):
        await ws.send_bytes(bytes([_STDIN]) + data[i : i + _CHUNK])


def _exit_code(status: bytes) -> int | None:
    if not status:
        return None
    try:
        doc = json.loads(status)
    except ValueError:
        raise DataPlaneError("unreadable exec status") from None
    if doc.get("status") == "Success":
        return 0
    for cause in (doc.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            return int(cause.get("message", "-1"))
    raise DataPlaneError(f"exec failed: {doc.get('reason') or 'unknown'}")


def pod_dataplane(
    ws_api_client: Any, namespace: str, pod: str, container: str | None = None
) -> ExecDataPlane:
    """A data plane into one pod's container over ``pods/exec``."""
    return ExecDataPlane(PodExecTransport(ws_api_client, PodTarget(namespace, pod, container)))


def pod_factory(client: Any, obj: Mapping[str, Any]) -> DataPlane:
    """The data plane of a Sandbox served by a pod (``servedBy.kind: Pod``) in the client's own
    namespace, over the client's websocket API client (``client.ws_api``)."""
    served = (obj.get("status") or {}).get("servedBy") or {}
    namespace = served.get("namespace") or obj["metadata"]["namespace"]
    if namespace != client.namespace:
        raise DataPlaneError("the sandbox is served from another namespace")
    return pod_dataplane(client.ws_api, namespace, served["name"])
