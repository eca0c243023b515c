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
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, Unpack

from sandbox_operator.client.dataplane import (
    DataPlane,
    DirEntry,
    ExecOptions,
    ExecResult,
    FileStat,
)
from sandbox_operator.client.errors import DataPlaneError, ExecQueuedTimeout, SandboxSuspended
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.contract.resources import ServedBy

if TYPE_CHECKING:
    from collections.abc import Callable


class ResumesSandboxes(Protocol):
    """What a served plane asks of its client: resume the Sandbox, and tell whether it is
    suspended now."""

    async def resume(self, sandbox: Sandbox | str) -> None: ...

    async def _found_suspended(self, name: str) -> bool: ...


async def _close_quietly(plane: DataPlane | None) -> None:
    if plane is not None:
        with contextlib.suppress(Exception):
            await plane.close()


class ServedPlane:
    """A suspend closes the served plane; the next use resumes the Sandbox and talks to the new
    pod. A data-plane failure on a Sandbox found suspended behind the handle's back (the idle
    timeout, ``kubectl patch``) raises :class:`SandboxSuspended`; the next use resumes it."""

    def __init__(
        self, client: ResumesSandboxes, inner: DataPlane, served_by: ServedBy | None
    ) -> None:
        self.client = client
        self.inner: DataPlane | None = inner
        self.served_by = served_by
        self.handle: Sandbox | None = None
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

    async def _live(self) -> DataPlane:
        async with self._lock:
            if self.inner is None and self.handle is not None:
                await self.client.resume(self.handle)
        if self.inner is None:
            raise DataPlaneError("the sandbox is suspended")
        return self.inner

    async def _call(
        self, method: Callable[[DataPlane], Any], plane: DataPlane | None = None
    ) -> Any:
        if plane is None:
            plane = await self._live()
        try:
            return await method(plane)
        except DataPlaneError as exc:
            handle = self.handle
            if handle is None or not await self.client._found_suspended(handle.name):
                raise
            await self.drop()
            raise SandboxSuspended(
                sandbox=handle.name,
                namespace=handle.namespace,
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
        result: ExecResult = await self._call(lambda p: p.exec(argv, **ran), plane)
        return result

    async def write_file(self, *args: Any, **kwargs: Any) -> None:
        await self._call(lambda p: p.write_file(*args, **kwargs))

    async def read_file(self, *args: Any, **kwargs: Any) -> bytes:
        data: bytes = await self._call(lambda p: p.read_file(*args, **kwargs))
        return data

    async def stat(self, *args: Any, **kwargs: Any) -> FileStat:
        st: FileStat = await self._call(lambda p: p.stat(*args, **kwargs))
        return st

    async def list_dir(self, *args: Any, **kwargs: Any) -> list[DirEntry]:
        entries: list[DirEntry] = await self._call(lambda p: p.list_dir(*args, **kwargs))
        return entries

    async def remove(self, *args: Any, **kwargs: Any) -> bool:
        removed: bool = await self._call(lambda p: p.remove(*args, **kwargs))
        return removed

    async def close(self) -> None:
        await self.drop()


def plane_of(sandbox: Sandbox | str) -> ServedPlane | None:
    """The served plane behind a handle acquired through the client (None for a name)."""
    if isinstance(sandbox, Sandbox) and isinstance(sandbox.dataplane, ServedPlane):
        return sandbox.dataplane
    return None
