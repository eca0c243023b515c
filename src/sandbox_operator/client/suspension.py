"""Suspend and resume, and the last-activity stamp the operator's idle timeout counts from.

A suspend sets ``spec.suspended`` and waits for the operator to report ``Ready=False`` reason
``Suspended`` for that spec; a resume undoes whatever suspended the Sandbox (the spec, or the idle
timeout: activity newer than the suspension) and points a handle at the new pod.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sandbox_operator import labels as lbl
from sandbox_operator.client.errors import (
    SandboxNotReadyInTime,
    SandboxNotSuspendable,
    SandboxNotSuspendedInTime,
)
from sandbox_operator.client.kube import MERGE_PATCH
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.client.served import ServedPlane, plane_of
from sandbox_operator.client.status import (
    Goal,
    effective_state,
    is_suspended,
    read_status,
    served_by,
)
from sandbox_operator.client.watching import WatchCalls
from sandbox_operator.contract import GROUP, SANDBOX_PLURAL, VERSION
from sandbox_operator.kubeapi import parse_time

if TYPE_CHECKING:
    from sandbox_operator.client.dataplane import DataPlane


def _name(sandbox: Sandbox | str) -> str:
    return sandbox if isinstance(sandbox, str) else sandbox.name


class SuspendCalls(WatchCalls):
    """:meth:`suspend`, :meth:`resume` and :meth:`touch` of the client (see the module)."""

    #: the newest last-activity stamp written per Sandbox: stamps never go back
    _activity_stamps: dict[str, datetime]

    if TYPE_CHECKING:

        def _dataplane(self, obj: Mapping[str, Any]) -> DataPlane: ...

    async def _wait_goal(
        self,
        name: str,
        obj: Mapping[str, Any],
        goal: Goal,
        timeout: float | None,  # noqa: ASYNC109
        late: type[SandboxNotReadyInTime | SandboxNotSuspendedInTime],
    ) -> Mapping[str, Any]:
        """Watch until ``goal``; ``late`` (with the last reason seen) after ``timeout``."""
        deadline = timeout if timeout is not None else self.default_timeout
        last = {"reason": ""}
        try:
            async with asyncio.timeout(deadline):
                return await self._watch_sandbox(name, obj, last, goal=goal)
        except TimeoutError:
            raise late(
                sandbox=name, namespace=self.namespace, timeout=deadline, last_reason=last["reason"]
            ) from None

    async def suspend(
        self,
        sandbox: Sandbox | str,
        *,
        wait: bool = True,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        """Suspend a Sandbox (by handle or name): ``spec.suspended: true``; the operator deletes
        its pod and keeps its work volume, NetworkPolicy and identity. Processes and memory are
        not kept; files in the work dir are.

        Raises :class:`SandboxNotSuspendable` when the Sandbox declares no ``spec.storage`` (read
        first; the API server refuses it too). With ``wait``, returns once the operator reports
        ``Ready=False`` reason ``Suspended`` for this spec, raises the typed error of a terminal
        reason (e.g. :class:`SandboxGone`), or :class:`SandboxNotSuspendedInTime` after
        ``timeout`` (default: the client's ``default_timeout``). A handle's next use resumes."""
        name = _name(sandbox)
        obj = await self._get_sandbox(name)
        spec = obj.get("spec") or {}
        if not spec.get("storage"):
            raise SandboxNotSuspendable(sandbox=name, namespace=self.namespace)
        if not spec.get("suspended"):
            obj = await self._patch_suspended(name, True)
        plane = plane_of(sandbox)
        if plane is not None:
            await plane.drop()
        if wait:
            await self._wait_goal(name, obj, "suspended", timeout, SandboxNotSuspendedInTime)

    async def resume(
        self,
        sandbox: Sandbox | str,
        *,
        wait: bool = True,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        """Resume a Sandbox (by handle or name), whatever suspended it: ``spec.suspended`` back
        to false when it is true, and the last-activity annotation stamped when the idle timeout
        suspended it (``status.suspendedBy: idle``). The operator starts a new pod on the same
        work volume after judging the spec again. A Sandbox that is not suspended is left as is.

        With ``wait``, returns once it is Ready (a handle then talks to the new pod); raises the
        refusal's typed error when the operator refuses the resume (e.g.
        :class:`SandboxIsolationBelowFloor`: the floor was raised meanwhile; it stays
        suspended), :class:`SandboxSuspended` when it is suspended again meanwhile, or
        :class:`SandboxNotReadyInTime`. Without ``wait``, a handle's next use waits."""
        name = _name(sandbox)
        obj = await self._get_sandbox(name)
        was_suspended = is_suspended(obj)
        if was_suspended:
            obj = await self._start_resume(name, obj)
        plane = plane_of(sandbox)
        if not wait:
            if plane is not None and was_suspended:
                await plane.drop()
            return
        obj = await self._wait_goal(name, obj, "resumed", timeout, SandboxNotReadyInTime)
        if plane is not None and isinstance(sandbox, Sandbox):
            await self._serve_again(sandbox, plane, obj)

    async def _serve_again(
        self, sandbox: Sandbox, plane: ServedPlane, obj: Mapping[str, Any]
    ) -> None:
        """Point a handle at what serves its Sandbox now (a new pod after a resume)."""
        served = served_by(obj)
        if not plane.suspended and served == plane.served_by:
            return
        await plane.serve(self._dataplane(obj), served)
        old = sandbox.effective_state
        if old is not None:
            fresh = effective_state(obj, sandbox.spec, host_tools=old.host_tools, call=old.call)
            sandbox._effective_state = fresh

    async def _start_resume(self, name: str, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        """Ask for a suspended Sandbox to be resumed; returns the object to watch from."""
        status = read_status(obj)
        if (obj.get("spec") or {}).get("suspended"):
            obj = await self._patch_suspended(name, False)
        elif status.suspended_by != "spec":
            # Suspended by the idle timeout (spec.suspended is false): activity newer than the
            # suspension resumes it. (By spec with spec.suspended already false: on its way.)
            await self._touch_after(name, parse_time(status.suspended_at))
        return obj

    async def _found_suspended(self, name: str) -> bool:
        """Whether the Sandbox is suspended now (False when it cannot be read)."""
        try:
            return is_suspended(await self._get_sandbox(name))
        except Exception:
            return False

    # -- activity ---------------------------------------------------------------------------

    async def touch(self, name: str) -> None:
        """Stamp the Sandbox's last-activity annotation (the operator's idle timeout counts from
        it). The handle does this by itself, at most every 30 seconds, while it is used."""
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
        when = max(when, self._activity_stamps.get(name, when))
        self._activity_stamps[name] = when
        stamp = when.strftime("%Y-%m-%dT%H:%M:%SZ")
        await self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            SANDBOX_PLURAL,
            name,
            {"metadata": {"annotations": {lbl.LAST_ACTIVITY_ANNOTATION: stamp}}},
            field_manager=f"{self.field_manager}-activity",
            _content_type=MERGE_PATCH,  # type: ignore[call-arg]
        )
