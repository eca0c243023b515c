"""Acquire: get or create a key's Sandbox with server-side apply, wait until it is Ready, and
build the handle that works in it.

Its own topic because it is the one path from a key to a served handle, and all of it turns on
one object: the apply body (name from the key and kind, the key's labels and annotations, a
spec without ``suspended`` or ``resets``), the wait that watches that Sandbox and its
SandboxScope together (a scope deleted while a caller waits raises at once), the resume of a
suspended Sandbox on the way, and the handle's plane, whose resume is the handle's. Its outcome,
whatever it is, is reported to the observer as one ``SandboxAcquired``.

:class:`Acquisitions` is given the client's parts it uses and the ``lifecycle`` a handle is
handed (the client, as :class:`~sandbox_operator.client.sandbox.SuspendsSandboxes`); it never
imports the client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from types import MappingProxyType
from typing import Protocol

from sandbox_operator import labels as lbl
from sandbox_operator import naming
from sandbox_operator.client.egress import EgressFeed
from sandbox_operator.client.errors import SandboxGone, SandboxNotReadyInTime
from sandbox_operator.client.kube import Body, SandboxObjects
from sandbox_operator.client.observer import (
    EffectiveState,
    SandboxAcquired,
    failure_name,
    notify,
    record_key,
)
from sandbox_operator.client.planes import DataPlanes
from sandbox_operator.client.sandbox import Sandbox, SuspendsSandboxes
from sandbox_operator.client.scopes import Scopes
from sandbox_operator.client.served import ServedPlane
from sandbox_operator.client.status import Goal, effective_state, is_suspended, served_by
from sandbox_operator.client.suspension import Suspensions
from sandbox_operator.client.watching import WaitNotes, Watches
from sandbox_operator.contract import (
    API_VERSION,
    SANDBOX_KIND,
    SANDBOX_PLURAL,
    SPEC_EDIT_FIELDS,
    SandboxKey,
    SandboxResourceSpec,
    SandboxSpec,
)
from sandbox_operator.views import SandboxView


class CarriesHostTools(Protocol):
    """What :meth:`SandboxClient.acquire` reads from a host-tool registry: sealing it (a served
    sandbox's record must not change under it) and the names it carries."""

    def aggregate(self) -> object: ...

    @property
    def names(self) -> tuple[str, ...]: ...


class Acquisitions:
    """The acquires of one client (see the module)."""

    def __init__(
        self,
        objects: SandboxObjects,
        watches: Watches,
        suspensions: Suspensions,
        egress_feed: EgressFeed,
        planes: DataPlanes,
        lifecycle: SuspendsSandboxes,
        *,
        settled: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        #: waits for a background disposal of a name to end (the client's ``Disposals``)
        self.settled = settled
        self.objects = objects
        self.watches = watches
        self.suspensions = suspensions
        #: the egress streams, and the observer the client keeps there
        self.egress_feed = egress_feed
        self.planes = planes
        #: what suspends, resumes and disposes of a handle's sandbox (the client)
        self.lifecycle = lifecycle

    async def acquire(
        self,
        scope_ref: str,
        agent_dir: str,
        spec: SandboxSpec,
        call_id: str,
        *,
        deadline: float,
        host_tools: CarriesHostTools | None,
    ) -> Sandbox:
        """:meth:`SandboxClient.acquire <sandbox_operator.client.SandboxClient.acquire>`, with
        its timeout resolved to ``deadline`` seconds."""
        scope_obj = await self.objects.read_scope(scope_ref)
        key = Scopes.key_for(scope_obj, agent_dir, call_id)
        name = naming.sandbox_name(key, spec.kind)
        call = record_key(key)
        started = time.monotonic()
        observer = self.egress_feed.observer
        try:
            sandbox = await self._serve(
                key, name, scope_ref, agent_dir, spec, call_id, deadline, host_tools, call
            )
        except BaseException as exc:
            refusal = failure_name(exc)
            notify(
                observer,
                "sandbox_acquired",
                lambda: self._acquired(key, call, name, started, spec, refusal=refusal),
            )
            raise
        notify(
            observer,
            "sandbox_acquired",
            lambda: self._acquired(key, call, name, started, spec, state=sandbox.effective_state),
        )
        if sandbox.resource is not None:
            self.egress_feed.follow(sandbox.view, key)  # without an observer: nothing
        return sandbox

    def _acquired(
        self,
        key: SandboxKey,
        call: str | None,
        name: str,
        started: float,
        spec: SandboxSpec,
        *,
        refusal: str | None = None,
        state: EffectiveState | None = None,
    ) -> SandboxAcquired:
        """The event of one acquire's outcome (built only when an observer is registered)."""
        return SandboxAcquired(
            key=key,
            call=call,
            sandbox=name,
            namespace=self.objects.namespace,
            refusal=refusal,
            state=state,
            seconds=time.monotonic() - started,
            labels=MappingProxyType(dict(spec.labels)),
        )

    def _body(
        self,
        key: SandboxKey,
        name: str,
        scope_ref: str,
        agent_dir: str,
        spec: SandboxSpec,
        call_id: str,
    ) -> dict[str, object]:
        """What the acquire applies: the Sandbox of ``key`` and ``spec.kind``."""
        resource = SandboxResourceSpec.model_validate(
            {
                **spec.model_dump(exclude_unset=True),
                "scope_ref": scope_ref,
                "agent_dir": agent_dir,
                "call_id": call_id,
            }
        )
        return {
            "apiVersion": API_VERSION,
            "kind": SANDBOX_KIND,
            "metadata": {
                "name": name,
                "namespace": self.objects.namespace,
                "labels": lbl.key_labels(key, spec.kind),
                "annotations": lbl.key_annotations(key),
            },
            # ``suspended`` and ``resets`` are not the acquirer's to own: suspend/resume and reset
            # (and kubectl) change them, and an apply that owned them would conflict with them.
            "spec": {k: v for k, v in resource.to_wire().items() if k not in SPEC_EDIT_FIELDS},
        }

    async def _serve(
        self,
        key: SandboxKey,
        name: str,
        scope_ref: str,
        agent_dir: str,
        spec: SandboxSpec,
        call_id: str,
        deadline: float,
        host_tools: CarriesHostTools | None,
        call: str | None,
    ) -> Sandbox:
        """Apply, wait until Ready within ``deadline``, and build the handle."""
        body = self._body(key, name, scope_ref, agent_dir, spec, call_id)
        last = WaitNotes()
        try:
            async with asyncio.timeout(deadline):
                obj = await self.wait_ready(name, scope_ref, body, last)
        except TimeoutError:
            raise SandboxNotReadyInTime(
                sandbox=name,
                namespace=self.objects.namespace,
                timeout=deadline,
                last_reason=last.reason,
            ) from None
        tools: tuple[str, ...] = ()
        if host_tools is not None:
            host_tools.aggregate()  # seal: what the sandbox carries cannot change under it
            tools = tuple(host_tools.names)

        async def touch() -> None:
            await self.suspensions.touch(name)

        async def resume() -> None:
            # The plane's resume is the handle's (built below): a resume by handle is what
            # points the plane at the new pod and refreshes the handle's effective state.
            await self.lifecycle.resume(sandbox, wait=True, timeout=None)

        dataplane = ServedPlane(
            self.planes.connect(obj),
            served_by(obj),
            sandbox=name,
            namespace=self.objects.namespace,
            connect=self.planes.connect,
            resume=resume,
            is_suspended=self.suspensions.is_suspended,
        )
        sandbox = Sandbox(
            spec,
            dataplane,
            name=name,
            namespace=self.objects.namespace,
            key=key,
            scope_ref=scope_ref,
            on_activity=touch,
            observer=self.egress_feed.observer,
            effective_state=lambda: effective_state(obj, spec, host_tools=tools, call=call),
            lifecycle=self.lifecycle,
            resource=obj,
            created=bool(last.created) and last.created == obj.metadata.uid,
        )
        return sandbox

    async def wait_ready(
        self, name: str, scope_ref: str, body: Body, last: WaitNotes
    ) -> SandboxView:
        """Apply ``body`` (after any previous Sandbox under the name is gone), resume it when
        suspended, and watch it until Ready or a terminal reason, and its SandboxScope until
        deleted, whichever comes first. ``last`` records the last reason seen and, when this
        apply created the object, its uid (``created``)."""
        if self.settled is not None:
            # An unclean handle's disposal of this name, started in the background: its DELETE
            # lands first, so this apply meets the Sandbox going (or gone), never the old one.
            await self.settled(name)
        obj, created = await self.objects.apply_created(SANDBOX_PLURAL, name, body, SandboxView)
        while obj.metadata.deleting:
            # A previous sandbox under this key is still going away: wait, then recreate.
            await self.watches.wait_gone(SANDBOX_PLURAL, name, None, SandboxView)
            obj, created = await self.objects.apply_created(SANDBOX_PLURAL, name, body, SandboxView)
        if created:
            last.created = obj.metadata.uid
        goal: Goal = "ready"
        if is_suspended(obj):
            # Suspended (by spec, kubectl or the idle timeout): acquiring it resumes it.
            obj = await self.suspensions.start_resume(name, obj)
            goal = "resumed"
        sandbox_watch = asyncio.ensure_future(self.watches.until_goal(name, obj, last, goal=goal))
        scope_watch = asyncio.ensure_future(self.watches.scope_deleted(scope_ref))
        try:
            done, _ = await asyncio.wait(
                {sandbox_watch, scope_watch}, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in (sandbox_watch, scope_watch):
                task.cancel()
            await asyncio.gather(sandbox_watch, scope_watch, return_exceptions=True)
        if sandbox_watch in done:
            return sandbox_watch.result()
        scope_watch.result()
        raise SandboxGone(
            sandbox=name,
            namespace=self.objects.namespace,
            reason="ScopeDeleted",
            message=f"SandboxScope {scope_ref!r} was deleted while waiting",
        )
