"""Async HTTP client for the ACA sandboxes data-plane API: one `httpx.AsyncClient` per backend.

Behaviour every call shares:
* timeouts on every call (connect/read/write/pool; executions use `timeouts.execute` as read);
* retries with exponential backoff (jittered) honouring `Retry-After` on 429/503 and on
  connection failures, for idempotent requests only: a command execution, a create, a file
  write, mkdir, stop or resume is sent exactly once (`transport.RetryTransport`);
* a 401 makes the token provider forget its token; an idempotent call is then tried once more
  (`transport.BearerAuth`, an `httpx.Auth` flow);
* non-success statuses become typed `AcasError`s (status and service code as fields);
* neither the endpoint nor a token appears in any exception message or log line: the
  `httpx.AsyncClient` is addressed to a placeholder origin that `transport.EndpointTransport`
  maps to the endpoint, so httpx's own log lines never hold it, and this package's log lines
  name only the operation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Self, Unpack
from urllib.parse import urlsplit

import httpx

from sandbox_operator.views import (
    AcasCountView,
    AcasEgressDecisionsView,
    AcasEgressPolicyView,
    AcasPageView,
    AcasSnapshotView,
)

from .auth import TokenProvider
from .config import AcasBackendConfig, AcasTimeouts
from .errors import (
    AcasNotFound,
    AcasPayloadTooLarge,
    AcasProtocolError,
    AcasStillPresent,
    AcasTimeout,
    AcasUnreachable,
    error_for_status,
)
from .models import DirListing, ExecResult, FileInfo, FileOpStatus, RemoteSandbox, WriteFileResult
from .operations import AcasOperations, ApiRequest, ExecOptions
from .transport import (
    EXTENSION,
    PLACEHOLDER_ORIGIN,
    RETRYABLE_STATUSES,
    BearerAuth,
    CallState,
    EndpointTransport,
    RetryTransport,
    Sleep,
    backoff_delay,
    parse_retry_after,
)

__all__ = [
    "RETRYABLE_STATUSES",
    "AcasClient",
    "Sleep",
    "backoff_delay",
    "parse_retry_after",
]

log = logging.getLogger(__name__)

#: Largest list page asked for when walking the label listing.
LIST_PAGE_SIZE = 100
LIST_MAX_PAGES = 1000


def _timeout(t: AcasTimeouts, read: float) -> httpx.Timeout:
    return httpx.Timeout(connect=t.connect, read=read, write=t.write, pool=t.pool)


class AcasClient:
    """The data-plane API of one sandbox group. Create one per backend and `aclose()` it."""

    def __init__(
        self,
        config: AcasBackendConfig,
        tokens: TokenProvider,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.config = config
        self.ops = AcasOperations(
            subscription=config.subscription,
            resource_group=config.resource_group,
            sandbox_group=config.sandbox_group,
            api_version=config.api_version,
            create_method=config.create_method,
            file_write_method=config.file_write_method,
        )
        self._tokens = tokens
        self._timeouts: AcasTimeouts = config.timeouts
        self._sleep = sleep
        host = urlsplit(config.endpoint).hostname or ""
        self._secrets: tuple[str, ...] = tuple(s for s in (config.endpoint, host) if s)
        inner = transport if transport is not None else httpx.AsyncHTTPTransport()
        endpoint = EndpointTransport(inner, config.endpoint.rstrip("/") + self.ops.prefix)
        self._http = httpx.AsyncClient(
            base_url=PLACEHOLDER_ORIGIN,
            timeout=_timeout(self._timeouts, self._timeouts.read),
            transport=RetryTransport(endpoint, config.retries, sleep=sleep),
            auth=BearerAuth(tokens),
            follow_redirects=False,
            headers={"User-Agent": "sandbox-operator-acas/0.1"},
        )

    def __repr__(self) -> str:
        return f"AcasClient(backend={self.config.name!r})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._tokens.aclose()

    # -- core --------------------------------------------------------------------------------

    async def send(self, req: ApiRequest, *, read_timeout: float | None = None) -> httpx.Response:
        """Send `req` (re-sent only if it is idempotent); the successful response, or raise."""
        if read_timeout is None:
            read_timeout = self._timeouts.execute if req.long_running else self._timeouts.read
        call = CallState(operation=req.operation, idempotent=req.idempotent)
        try:
            response = await self._http.request(
                req.method,
                req.path.removeprefix(self.ops.prefix),
                params=req.params,
                headers=req.headers(),
                json=req.json,
                content=req.content,
                timeout=_timeout(self._timeouts, read_timeout),
                extensions={EXTENSION: call},
            )
        except httpx.TransportError as exc:
            kind = type(exc).__name__
            attempts = max(1, call.attempts)
            if isinstance(exc, httpx.TimeoutException) and not isinstance(
                exc, httpx.ConnectTimeout
            ):
                raise AcasTimeout(req.operation, attempts=attempts, what=kind) from None
            raise AcasUnreachable(req.operation, attempts=attempts, what=kind) from None
        status = response.status_code
        if status in req.success:
            return response
        error = error_for_status(
            req.operation,
            status,
            response.content,
            attempts=call.attempts,
            retry_after=parse_retry_after(response.headers.get("Retry-After")),
            secrets=self._secrets,
        )
        log.info("acas %s: %s", req.operation, error)
        raise error

    async def _json(self, req: ApiRequest) -> Any:
        return self._body(req, await self.send(req))

    def _body(self, req: ApiRequest, response: httpx.Response) -> Any:
        """The JSON of a response (None when empty)."""
        if not response.content:
            return None
        try:
            return response.json()
        except (ValueError, UnicodeDecodeError):
            raise AcasProtocolError(
                req.operation, status=response.status_code, what="response is not JSON"
            ) from None

    def _model(self, req: ApiRequest, cls: type[Any], data: Any) -> Any:
        try:
            return cls.model_validate(data)
        except ValueError:
            raise AcasProtocolError(req.operation, what=f"unreadable {cls.__name__}") from None

    # -- sandboxes ---------------------------------------------------------------------------

    async def create_sandbox(self, content: Mapping[str, object]) -> RemoteSandbox:
        """Create a sandbox (sent once; the caller finds a lost one again by its labels)."""
        req = self.ops.create_sandbox(content)
        result: RemoteSandbox = self._model(req, RemoteSandbox, await self._json(req))
        return result

    async def get_sandbox(self, sandbox_id: str) -> RemoteSandbox:
        req = self.ops.get_sandbox(sandbox_id)
        result: RemoteSandbox = self._model(req, RemoteSandbox, await self._json(req))
        return result

    async def find_sandbox(self, sandbox_id: str) -> RemoteSandbox | None:
        """The sandbox, or None when the service says 404."""
        try:
            return await self.get_sandbox(sandbox_id)
        except AcasNotFound:
            return None

    async def list_sandboxes(
        self,
        labels: Mapping[str, str] | None = None,
        *,
        page_size: int = LIST_PAGE_SIZE,
        max_pages: int = LIST_MAX_PAGES,
    ) -> list[RemoteSandbox]:
        """Every sandbox carrying all `labels` (exact match), filtered by the service.

        Walks `page`/`pageSize` until a short page (at most `max_pages`); tolerates the
        `{value: [...]}` shape too.
        """
        seen: dict[str, RemoteSandbox] = {}
        for page in range(1, max_pages + 1):
            req = self.ops.list_sandboxes(labels, page=page, page_size=page_size)
            data = await self._json(req)
            items = AcasPageView(data).value if isinstance(data, dict) else data
            if not isinstance(items, list):
                raise AcasProtocolError(req.operation, what="list response is not an array")
            fresh = 0
            for item in items:
                sandbox: RemoteSandbox = self._model(req, RemoteSandbox, item)
                if sandbox.id not in seen:
                    fresh += 1
                seen[sandbox.id] = sandbox
            if len(items) < page_size or fresh == 0:
                break
        return list(seen.values())

    async def delete_sandbox(self, sandbox_id: str) -> bool:
        """Ask the service to delete; False when it was already gone (404)."""
        try:
            await self.send(self.ops.delete_sandbox(sandbox_id))
        except AcasNotFound:
            return False
        return True

    async def wait_gone(self, sandbox_id: str, *, within: float | None = None) -> None:
        """Poll GET until 404; raise `AcasStillPresent` (a timeout) after `within` seconds
        (default `timeouts.delete`)."""
        deadline = time.monotonic() + (self._timeouts.delete if within is None else within)
        polls = 0
        while True:
            polls += 1
            if await self.find_sandbox(sandbox_id) is None:
                return
            if time.monotonic() >= deadline:
                raise AcasStillPresent(
                    "AzureSandboxes_Delete", attempts=polls, what="sandbox still present"
                )
            await self._sleep(
                min(self._timeouts.poll_interval, max(0.0, deadline - time.monotonic()))
            )

    async def delete_and_wait(self, sandbox_id: str, *, within: float | None = None) -> None:
        """Delete, then wait until the service no longer has the sandbox."""
        await self.delete_sandbox(sandbox_id)
        await self.wait_gone(sandbox_id, within=within)

    async def count_sandboxes(self) -> int:
        """Accepts a bare integer (text or JSON) or `{"count": n}` (reference section 3.9)."""
        req = self.ops.count_sandboxes()
        response = await self.send(req)
        text = response.text.strip()
        try:
            data = json.loads(text)
        except ValueError:
            data = text
        if isinstance(data, dict):
            data = AcasCountView(data).count
        try:
            return int(data)
        except (TypeError, ValueError):
            raise AcasProtocolError(req.operation, what="count is not an integer") from None

    async def set_lifecycle(self, sandbox_id: str, policy: Mapping[str, object]) -> RemoteSandbox:
        req = self.ops.set_lifecycle(sandbox_id, policy)
        result: RemoteSandbox = self._model(req, RemoteSandbox, await self._json(req))
        return result

    async def stop_sandbox(self, sandbox_id: str) -> AcasSnapshotView:
        """Blocking stop (sent once); returns the Snapshot the service made. The answer is
        awaited up to `timeouts.stop` (the service answers once the state is saved)."""
        req = self.ops.stop_sandbox(sandbox_id)
        response = await self.send(req, read_timeout=self._timeouts.stop)
        data = self._body(req, response)
        return AcasSnapshotView(data if isinstance(data, dict) else {})

    async def stop_sandbox_async(self, sandbox_id: str) -> RemoteSandbox:
        """Non-blocking stop (sent once): 202 with the sandbox, normally `Stopping`."""
        req = self.ops.stop_sandbox_async(sandbox_id)
        result: RemoteSandbox = self._model(req, RemoteSandbox, await self._json(req))
        return result

    async def resume_sandbox(self, sandbox_id: str) -> RemoteSandbox:
        """Resume (sent once), the answer awaited up to `timeouts.resume`."""
        req = self.ops.resume_sandbox(sandbox_id)
        response = await self.send(req, read_timeout=self._timeouts.resume)
        result: RemoteSandbox = self._model(req, RemoteSandbox, self._body(req, response))
        return result

    # -- execution ---------------------------------------------------------------------------

    async def execute_command(
        self,
        sandbox_id: str,
        argv: Sequence[str],
        *,
        read_timeout: float | None = None,
        **options: Unpack[ExecOptions],
    ) -> ExecResult:
        """Run argv (no shell) once. `read_timeout` bounds the wait for the response;
        the API has no timeout field, so the caller bounds the command itself if it must."""
        if not argv:
            raise ValueError("argv must not be empty")
        req = self.ops.execute_command(sandbox_id, argv[0], argv[1:], **options)
        return await self._exec_result(req, read_timeout)

    async def execute_shell_command(
        self,
        sandbox_id: str,
        command: str,
        *,
        shell: str | None = None,
        read_timeout: float | None = None,
        **options: Unpack[ExecOptions],
    ) -> ExecResult:
        req = self.ops.execute_shell_command(sandbox_id, command, shell=shell, **options)
        return await self._exec_result(req, read_timeout)

    async def _exec_result(self, req: ApiRequest, read_timeout: float | None) -> ExecResult:
        data = await self._json_with_timeout(req, read_timeout)
        result: ExecResult = self._model(req, ExecResult, data)
        return result

    async def _json_with_timeout(self, req: ApiRequest, read_timeout: float | None) -> Any:
        response = await self.send(req, read_timeout=read_timeout)
        try:
            return response.json()
        except (ValueError, UnicodeDecodeError):
            raise AcasProtocolError(req.operation, what="response is not JSON") from None

    # -- files -------------------------------------------------------------------------------

    async def write_file(
        self,
        sandbox_id: str,
        path: str,
        data: bytes,
        *,
        create_dirs: bool = True,
        mode: int | None = None,
    ) -> int:
        """Write `data` at absolute `path`; returns the bytes written."""
        req = self.ops.write_file(sandbox_id, path, data, create_dirs=create_dirs, mode=mode)
        body = await self._json(req)
        if body is None:
            return len(data)
        result: WriteFileResult = self._model(req, WriteFileResult, body)
        if not result.success:
            raise AcasProtocolError(req.operation, what="service reported write failure")
        return len(data) if result.bytes_written is None else result.bytes_written

    async def read_file(self, sandbox_id: str, path: str, *, max_bytes: int | None = None) -> bytes:
        """Raw bytes of the file; `AcasPayloadTooLarge` (status None) past `max_bytes`."""
        req = self.ops.read_file(sandbox_id, path)
        response = await self.send(req)
        data = response.content
        if max_bytes is not None and len(data) > max_bytes:
            raise AcasPayloadTooLarge(req.operation, what=f"file exceeds {max_bytes} bytes")
        return data

    async def stat_file(self, sandbox_id: str, path: str) -> FileInfo:
        req = self.ops.stat_file(sandbox_id, path)
        result: FileInfo = self._model(req, FileInfo, await self._json(req))
        return result

    async def list_files(self, sandbox_id: str, path: str) -> list[FileInfo]:
        req = self.ops.list_files(sandbox_id, path)
        listing: DirListing = self._model(req, DirListing, await self._json(req))
        return listing.entries

    async def delete_file(self, sandbox_id: str, path: str, *, recursive: bool = False) -> None:
        await self._file_op(self.ops.delete_file(sandbox_id, path, recursive=recursive), "delete")

    async def mkdir(self, sandbox_id: str, path: str, *, create_parents: bool = True) -> None:
        await self._file_op(
            self.ops.mkdir(sandbox_id, path, create_parents=create_parents), "mkdir"
        )

    async def _file_op(self, req: ApiRequest, what: str) -> None:
        """Send a file operation whose answer, when it is a JSON object, must report success."""
        body = await self._json(req)
        if isinstance(body, dict):
            status: FileOpStatus = self._model(req, FileOpStatus, body)
            if not status.success:
                raise AcasProtocolError(req.operation, what=f"service reported {what} failure")

    # -- egress ------------------------------------------------------------------------------

    async def set_egress_policy(
        self, sandbox_id: str, policy: Mapping[str, object]
    ) -> AcasEgressPolicyView:
        data = await self._json(self.ops.set_egress_policy(sandbox_id, policy))
        return AcasEgressPolicyView(data if isinstance(data, dict) else {})

    async def get_egress_decisions(self, sandbox_id: str) -> AcasEgressDecisionsView:
        data = await self._json(self.ops.get_egress_decisions(sandbox_id))
        return AcasEgressDecisionsView(data if isinstance(data, dict) else {})
