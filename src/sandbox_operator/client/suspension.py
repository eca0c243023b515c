"""Suspend and resume, and the last-activity stamp the operator's idle timeout counts from.

A suspend sets ``spec.suspended`` and waits for the operator to report ``Ready=False`` reason
``Suspended`` for that spec; a resume undoes whatever suspended the Sandbox (the spec, or the idle
timeout: activity newer than the suspension) and points a handle at the new pod.

:class:`Suspensions` holds what that needs and nothing more: the namespace's
:class:`~sandbox_operator.client.kube.SandboxObjects` (to read and patch), the client's
:class:`~sandbox_operator.client.watching.Watches` (to wait) and the newest activity stamp
written per Sandbox. A handle's :class:`~sandbox_operator.client.served.ServedPlane` connects
itself to the new pod after a resume, and timeouts arrive resolved (the client's
``default_timeout`` is the client's to apply).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from sandbox_operator.client.errors import (
    SandboxNotReadyInTime,
    SandboxNotSuspendable,
    SandboxNotSuspendedInTime,
)
from sandbox_operator.client.kube import SandboxObjects
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.client.served import ServedPlane, plane_of
from sandbox_operator.client.status import (
    Goal,
    effective_state,
    is_suspended,
    read_status,
)
from sandbox_operator.client.watching import WaitNotes, Watches
from sandbox_operator.kubeapi import parse_time
from sandbox_operator.views import SandboxView


async def serve_again(sandbox: Sandbox, plane: ServedPlane, obj: SandboxView) -> None:
    """Point a handle at what serves its Sandbox now (a new pod after a resume or a reset)."""
    if not await plane.reconnect(obj):
        return
    old = sandbox.effective_state
    if old is not None:
        fresh = effective_state(obj, sandbox.spec, host_tools=old.host_tools, call=old.call)
        sandbox.effective_state = fresh


def _name(sandbox: Sandbox | str) -> str:
    return sandbox if isinstance(sandbox, str) else sandbox.name


class Suspensions:
    """Suspend, resume and touch Sandboxes of one namespace (see the module)."""

    def __init__(self, objects: SandboxObjects, watches: Watches) -> None:
        self.objects = objects
        self.watches = watches
        #: the newest last-activity stamp written per Sandbox: stamps never go back
        self.activity_stamps: dict[str, datetime] = {}

    async def _wait_goal(
        self,
        name: str,
        obj: SandboxView,
        goal: Goal,
        timeout: float,  # noqa: ASYNC109
        late: type[SandboxNotReadyInTime | SandboxNotSuspendedInTime],
    ) -> SandboxView:
        """Watch until ``goal``; ``late`` (with the last reason seen) after ``timeout``."""
        last = WaitNotes()
        try:
            async with asyncio.timeout(timeout):
                return await self.watches.until_goal(name, obj, last, goal=goal)
        except TimeoutError:
            raise late(
                sandbox=name,
                namespace=self.objects.namespace,
                timeout=timeout,
                last_reason=last.reason,
            ) from None

    async def suspend(
        self,
        sandbox: Sandbox | str,
        *,
        wait: bool,
        timeout: float,  # noqa: ASYNC109
    ) -> None:
        """:meth:`SandboxClient.suspend <sandbox_operator.client.SandboxClient.suspend>`, with
        ``timeout`` in seconds."""
        name = _name(sandbox)
        obj = await self.objects.get_sandbox(name)
        if not obj.storage:
            raise SandboxNotSuspendable(sandbox=name, namespace=self.objects.namespace)
        if not obj.suspended:
            obj = await self.objects.patch_suspended(name, True)
        plane = plane_of(sandbox)
        if plane is not None:
            await plane.drop()
        if wait:
            await self._wait_goal(name, obj, "suspended", timeout, SandboxNotSuspendedInTime)

    async def resume(
        self,
        sandbox: Sandbox | str,
        *,
        wait: bool,
        timeout: float,  # noqa: ASYNC109
    ) -> None:
        """:meth:`SandboxClient.resume <sandbox_operator.client.SandboxClient.resume>`, with
        ``timeout`` in seconds."""
        name = _name(sandbox)
        obj = await self.objects.get_sandbox(name)
        was_suspended = is_suspended(obj)
        if was_suspended:
            obj = await self.start_resume(name, obj)
        plane = plane_of(sandbox)
        if not wait:
            if plane is not None and was_suspended:
                await plane.drop()
            return
        obj = await self._wait_goal(name, obj, "resumed", timeout, SandboxNotReadyInTime)
        if plane is not None and isinstance(sandbox, Sandbox):
            await serve_again(sandbox, plane, obj)

    async def start_resume(self, name: str, obj: SandboxView) -> SandboxView:
        """Ask for a suspended Sandbox to be resumed; returns the object to watch from."""
        status = read_status(obj)
        if obj.suspended:
            obj = await self.objects.patch_suspended(name, False)
        elif status.suspended_by != "spec":
            # Suspended by the idle timeout (spec.suspended is false): activity newer than the
            # suspension resumes it. (By spec with spec.suspended already false: on its way.)
            await self._touch_after(name, parse_time(status.suspended_at))
        return obj

    async def is_suspended(self, name: str) -> bool:
        """Whether the Sandbox is suspended now (False when it cannot be read)."""
        try:
            return is_suspended(await self.objects.get_sandbox(name))
        except Exception:
            return False

    # -- activity ---------------------------------------------------------------------------

    async def touch(self, name: str) -> None:
        """Stamp the Sandbox's last-activity annotation now (the operator's idle timeout counts
        from it)."""
        await self._stamp_activity(name, datetime.now(UTC))

    async def _touch_after(self, name: str, after: datetime | None) -> None:
        """Stamp activity strictly newer than ``after`` (the operator's suspension time): now,
        or the second after ``after`` when this clock is not past it (the stamp has whole
        seconds, and the operator's clock may be ahead of this one)."""
        when = datetime.now(UTC).replace(microsecond=0)
        if after is not None:
            when = max(when, after.replace(microsecond=0) + timedelta(seconds=1))
        await self._stamp_activity(name, when)

    async def _stamp_activity(self, name: str, when: datetime) -> None:
        # A stamp written late (the handle's background touch) must not undo a newer one (a
        # resume's, which may be ahead of this clock).
        when = max(when, self.activity_stamps.get(name, when))
        self.activity_stamps[name] = when
        await self.objects.annotate_activity(name, when.strftime("%Y-%m-%dT%H:%M:%SZ"))
