"""Suspend and resume on an `acas` backend: the service's stop and resume (reference section 3.8).

The remote sandbox stays, `Stopped`, its state saved as a snapshot; observe reports any stopped
state (the service's own idle stop too) as `SUSPENDED`, with the service's `stoppedReason`.
"""

from __future__ import annotations

from sandbox_operator.acas.errors import AcasConflict, AcasError, AcasNotFound, AcasTimeout
from sandbox_operator.acas.models import RemoteSandbox, SandboxState
from sandbox_operator.backends.base import (
    BackendObject,
    EnsureRequest,
    SandboxRef,
    ServedBy,
    StartupError,
    TransientError,
)
from sandbox_operator.contract import ConditionReason

from .cache import ReadCache
from .remote import (
    PERMANENT,
    STOPPED_STATES,
    backend_object,
    lost_message,
    owned_by,
    recorded_id,
    served_by,
)


class SuspendResume(ReadCache):
    """Mixin of `AcasDriver`: its `Suspendable` side. Resuming a sandbox that never had a
    remote one creates it, through the driver's `_ensure`."""

    async def _ensure(self, request: EnsureRequest) -> ServedBy:
        raise NotImplementedError

    @property
    def suspends(self) -> bool:
        """Suspend is the service's stop (the state saved as a snapshot), resume its resume."""
        return True

    async def _current(self, sandbox: SandboxRef) -> RemoteSandbox | None:
        """The remote sandbox serving `sandbox` as the service reports it now (never the
        cache, since the answer is acted on): by the recorded id (one GET), else by its
        labels. One that another Sandbox owns (an earlier one of the same name) is not it."""
        recorded = recorded_id(sandbox)
        if recorded:
            remote = await self._get_own(sandbox, recorded)
            if remote is not None and owned_by(remote, sandbox):
                return remote
        found = await self._find(sandbox)
        self._write_through(sandbox, found)
        mine = [r for r in found if owned_by(r, sandbox)]
        return mine[0] if mine else None

    async def suspend(self, sandbox: SandboxRef) -> list[BackendObject]:
        """Stop the remote sandbox: the service saves its state as a snapshot and keeps the
        sandbox (id, labels, egress and lifecycle policies) in place, `Stopped`.

        Returns [] once it is stopped (`Stopped` whatever the reason, `Idle`, `Suspended`) or
        when nothing serves the sandbox; the remote sandbox while it is still stopping (or
        still being created, or deleted: not stoppable now). Idempotent: a stopped sandbox
        costs one read and no stop. The stop is the blocking `POST .../stop` (answered within
        `timeouts.stop` once the snapshot is saved) or, with `stopMethod: async`,
        `POST .../stop/async` (202, `Stopping`; a later call reads the end). A 409 (the
        sandbox is not running) and a stop that did not answer in time are settled by reading
        the state again: already stopped is success. A stop that ends `StopFailed` (the state
        was not saved), any service failure and a sandbox still running after a stop are a
        `TransientError` (the stop is sent again on the next call)."""
        self._learn(sandbox)
        try:
            remote = await self._current(sandbox)
            if remote is None:
                return []
            return await self._suspend(remote)
        except AcasError as exc:
            raise TransientError(str(exc), retry_after=exc.retry_after) from None

    async def _suspend(self, remote: RemoteSandbox) -> list[BackendObject]:
        state = remote.state or ""
        if state in STOPPED_STATES:
            return []
        if state in (SandboxState.STOPPING, SandboxState.CREATING, SandboxState.DELETING):
            return [backend_object(remote)]
        if state == SandboxState.FAILED:
            raise TransientError(f"remote sandbox {remote.id} is Failed: it cannot be stopped")
        # Running, StopFailed (stopped again), or a state this client does not know.
        after: RemoteSandbox | None = None
        refused: AcasError | None = None
        try:
            if self._config.stop_method == "async":
                after = await self._client.stop_sandbox_async(remote.id)
            else:
                await self._client.stop_sandbox(remote.id)
        except (AcasConflict, AcasTimeout) as exc:  # not running / no answer in time: look
            refused = exc
        except AcasNotFound:
            self._forget(remote.id)
            return []
        if after is None:
            after = await self._client.find_sandbox(remote.id)
            if after is None:
                self._forget(remote.id)
                return []
        self._remember(after)
        now = after.state or ""
        if now in STOPPED_STATES:
            return []
        if now in (SandboxState.STOPPING, SandboxState.CREATING, SandboxState.DELETING):
            return [backend_object(after)]
        why = f": {refused}" if refused is not None else ""
        if now == SandboxState.STOP_FAILED:
            raise TransientError(
                f"stopping remote sandbox {remote.id} ended StopFailed: the service did not "
                f"save its state (a later suspend stops it again){why}"
            )
        raise TransientError(
            f"remote sandbox {remote.id} is {now or 'in an unknown state'} after the stop{why}"
        )

    async def resume(self, request: EnsureRequest) -> ServedBy:
        """Start the stopped remote sandbox again from its snapshot (`POST .../resume`, sent
        once, answered within `timeouts.resume`); observe then reports it starting / ready.

        `Running` or `Creating` already: served as it is, no call. A 409 (not stopped) is
        settled by reading the state again: running is success. Still `Stopping`, stopped
        with `stoppedReason: Disabled` (a person disabled it at the service), a bare 503 (the
        documented answer of a resume the service cannot do now), 429, 5xx or no answer:
        `TransientError` (with the service's Retry-After, if any). Nothing serves the sandbox:
        when the status recorded a remote id, what held its state is gone (`StartupError`,
        nothing is created in its place); when it never had one (suspended from the start),
        `ensure` creates it. 400: `StartupError`."""
        try:
            return await self._resume(request)
        except PERMANENT as exc:
            raise StartupError(
                ConditionReason.STARTUP_FAILED,
                f"the service refused to resume the sandbox: {exc.detail}",
            ) from None
        except AcasError as exc:
            raise TransientError(str(exc), retry_after=exc.retry_after) from None

    async def _resume(self, request: EnsureRequest) -> ServedBy:
        sandbox = request.sandbox
        self._learn(sandbox)
        remote = await self._current(sandbox)
        if remote is None:
            recorded = recorded_id(sandbox)
            if recorded:
                raise StartupError(ConditionReason.STARTUP_FAILED, lost_message(recorded))
            return await self._ensure(request)
        served = served_by(remote.id)
        if remote.state in (SandboxState.RUNNING, SandboxState.CREATING):
            return served
        if remote.state in (SandboxState.FAILED, SandboxState.DELETING):
            raise StartupError(
                ConditionReason.STARTUP_FAILED,
                f"remote sandbox {remote.id} is {remote.state}: its state cannot be resumed",
            )
        if remote.state == SandboxState.STOPPING:
            raise self._still_stopping(remote)
        try:
            resumed = await self._client.resume_sandbox(remote.id)
        except AcasNotFound:
            self._forget(remote.id)
            raise StartupError(ConditionReason.STARTUP_FAILED, lost_message(remote.id)) from None
        except AcasConflict as exc:
            now = await self._client.find_sandbox(remote.id)
            if now is None:
                self._forget(remote.id)
                raise StartupError(
                    ConditionReason.STARTUP_FAILED, lost_message(remote.id)
                ) from None
            self._remember(now)
            if now.state in (SandboxState.RUNNING, SandboxState.CREATING):
                return served
            if now.state == SandboxState.STOPPING:
                raise self._still_stopping(now) from None
            reason = now.state_details.stopped_reason if now.state_details else None
            if reason == "Disabled":
                raise TransientError(
                    f"remote sandbox {remote.id} was disabled at the service (stoppedReason "
                    f"Disabled): it resumes once enabled there ({exc})"
                ) from None
            raise TransientError(
                f"resume refused while the sandbox is {now.state}: {exc}"
            ) from None
        self._remember(resumed)
        return served

    def _still_stopping(self, remote: RemoteSandbox) -> TransientError:
        return TransientError(
            f"remote sandbox {remote.id} is still stopping: resumed once it is Stopped",
            retry_after=self._config.timeouts.poll_interval,
        )
