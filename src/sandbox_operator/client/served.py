"""The data plane of a handle acquired through :class:`~sandbox_operator.client.SandboxClient`:
it talks to whatever serves the Sandbox now, across suspensions and resumes.

An exec's ``timeout`` is wall-clock from the call: a use that first waits for a resume spends
that wait from it, the command gets what is left (the bound its :class:`ExecTimeout`
names), and a wait that uses it all up raises
:class:`ExecQueuedTimeout` (nothing ran) rather than :class:`ExecTimeout` (something overran).
Without that, a command's bound would not bound the call, and a caller could not tell a program
to make smaller from one to retry unchanged."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar, Unpack

from sandbox_operator.client.dataplane import (
    DataPlane,
    DirEntry,
    ExecOptions,
    ExecResult,
    FileStat,
)
from sandbox_operator.client.dataplane.streaming import ExecStream, StreamingPlane, StreamOptions
from sandbox_operator.client.errors import (
    DataPlaneError,
    ExecQueuedTimeout,
    ExecStreamUnsupported,
    SandboxSuspended,
)
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.client.status import served_by as served_by_of
from sandbox_operator.contract.resources import ServedBy
from sandbox_operator.views import SandboxView

T = TypeVar("T")

#: The data plane of what serves a Ready Sandbox (the client's factory for its servedBy kind).
Connect = Callable[[SandboxView], DataPlane]

#: Resume the Sandbox a plane serves and point the plane at what serves it then (the client's
#: ``resume`` of the plane's handle).
Resume = Callable[[], Awaitable[None]]

#: Whether the named Sandbox is suspended now (False when it cannot be read).
IsSuspended = Callable[[str], Awaitable[bool]]


async def _close_quietly(plane: DataPlane | None) -> None:
    if plane is not None:
        with contextlib.suppress(Exception):
            await plane.close()


class ServedPlane:
    """A suspend closes the served plane; the next use resumes the Sandbox and talks to the new
    pod. A data-plane failure on a Sandbox found suspended behind the handle's back (the idle
    timeout, ``kubectl patch``) raises :class:`SandboxSuspended`; the next use resumes it.

    It is a :class:`DataPlane` with the protocol's own signatures, and it is given at
    construction what it asks of the client: the Sandbox's name and namespace, how to reach what
    serves it (``connect``), how to resume it (``resume``) and how to tell whether it is
    suspended (``is_suspended``). It is typed by none of the client's or the handle's classes
    and reaches into neither: the client that builds both decides what those callables do."""

    def __init__(
        self,
        inner: DataPlane,
        served_by: ServedBy | None,
        *,
        sandbox: str,
        namespace: str,
        connect: Connect,
        resume: Resume,
        is_suspended: IsSuspended,
    ) -> None:
        #: the plane of what serves the Sandbox now (None: suspended, the next use resumes)
        self.inner: DataPlane | None = inner
        self.served_by = served_by
        #: the Sandbox served, as named in a :class:`SandboxSuspended`
        self.sandbox = sandbox
        self.namespace = namespace
        # Given, not read from the handle or the client: the plane knows neither.
        self._connect = connect
        self._resume = resume
        self._is_suspended = is_suspended
        self._lock = asyncio.Lock()

    @property
    def suspended(self) -> bool:
        return self.inner is None

    async def drop(self) -> None:
        """The pod is going away: close the served plane; the next use resumes."""
        inner, self.inner = self.inner, None
        await _close_quietly(inner)

    async def serve(self, inner: DataPlane, served_by: ServedBy | None) -> None:
        old, self.inner, self.served_by = self.inner, inner, served_by
        if old is not inner:
            await _close_quietly(old)

    async def reconnect(self, obj: SandboxView) -> bool:
        """Talk to what serves the Ready Sandbox ``obj`` (a new pod after a resume); False when
        this plane already does."""
        served = served_by_of(obj)
        if not self.suspended and served == self.served_by:
            return False
        await self.serve(self._connect(obj), served)
        return True

    async def _live(self) -> DataPlane:
        async with self._lock:
            if self.inner is None:
                await self._resume()
        if self.inner is None:
            raise DataPlaneError("the sandbox is suspended")
        return self.inner

    async def _call(
        self, method: Callable[[DataPlane], Awaitable[T]], plane: DataPlane | None = None
    ) -> T:
        if plane is None:
            plane = await self._live()
        try:
            return await method(plane)
        except DataPlaneError as exc:
            if not await self._is_suspended(self.sandbox):
                raise
            await self.drop()
            raise SandboxSuspended(
                sandbox=self.sandbox,
                namespace=self.namespace,
                message="the sandbox was suspended; the next use of the handle resumes it",
            ) from exc

    async def exec(self, argv: Sequence[str], **options: Unpack[ExecOptions]) -> ExecResult:
        """Run on the live plane, resuming first when suspended; see the module docstring."""
        timeout = options["timeout"]
        started = time.monotonic()
        waiting = asyncio.timeout(timeout)
        plane: DataPlane | None
        try:
            async with waiting:
                plane = await self._live()
        except TimeoutError:
            if not waiting.expired():
                raise  # not this deadline: whatever raised it says why
            plane = None
        waited = time.monotonic() - started
        if plane is None or waited >= timeout:
            raise ExecQueuedTimeout(
                argv=tuple(argv), timeout=timeout, waited=waited, waited_for="resume"
            ) from None
        left = timeout - waited
        ran: ExecOptions = {**options, "timeout": left}
        return await self._call(lambda p: p.exec(argv, **ran), plane)

    async def open_stream(
        self, argv: Sequence[str], **options: Unpack[StreamOptions]
    ) -> ExecStream:
        """Start a stream on the live plane, resuming first when suspended. Its ``timeout``
        counts from the command's start (a person's terminal waits for the resume as it would
        for the connection)."""
        plane = await self._live()
        if not isinstance(plane, StreamingPlane):
            raise ExecStreamUnsupported(
                "this sandbox's data plane runs buffered commands only", what="stream"
            )
        streaming = plane
        return await self._call(lambda _: streaming.open_stream(argv, **options), plane)

    async def write_file(
        self, work_dir: str, relative: str, data: bytes, *, replace: bool = True
    ) -> None:
        await self._call(lambda p: p.write_file(work_dir, relative, data, replace=replace))

    async def read_file(self, work_dir: str, relative: str, *, max_bytes: int) -> bytes:
        return await self._call(lambda p: p.read_file(work_dir, relative, max_bytes=max_bytes))

    async def stat(self, work_dir: str, relative: str) -> FileStat:
        return await self._call(lambda p: p.stat(work_dir, relative))

    async def list_dir(self, work_dir: str, relative: str) -> list[DirEntry]:
        return await self._call(lambda p: p.list_dir(work_dir, relative))

    async def remove(self, work_dir: str, relative: str, *, recursive: bool) -> bool:
        return await self._call(lambda p: p.remove(work_dir, relative, recursive=recursive))

    async def close(self) -> None:
        await self.drop()


def plane_of(sandbox: Sandbox | str) -> ServedPlane | None:
    """The served plane behind a handle acquired through the client (None for a name)."""
    if isinstance(sandbox, Sandbox) and isinstance(sandbox.dataplane, ServedPlane):
        return sandbox.dataplane
    return None
