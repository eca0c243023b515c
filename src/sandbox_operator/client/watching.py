"""Waiting on one object by watching it (the client never polls): until a Sandbox reaches a wait's
goal or a terminal reason, until a SandboxScope is deleted, until an object is gone.

:class:`Watches` holds the :class:`~sandbox_operator.client.kube.SandboxObjects` it watches
through (to read an object afresh after a relist) and nothing else: every wait of the client,
its suspensions' and its scopes' included, goes through :meth:`Watches.next_event`, the one
place a test puts a fake watch."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from kubernetes_asyncio import watch as k8s_watch
from kubernetes_asyncio.client.exceptions import ApiException

from sandbox_operator.client.errors import (
    SandboxAcquireError,
    SandboxForbidden,
    SandboxGone,
    SandboxScopeNotFound,
    acquire_error_for,
)
from sandbox_operator.client.kube import SandboxObjects
from sandbox_operator.client.status import Goal, evaluate_for
from sandbox_operator.contract import GROUP, SANDBOX_PLURAL, SANDBOX_SCOPE_PLURAL, VERSION
from sandbox_operator.views import ObjectView, SandboxScopeView, SandboxView, WatchEvent

#: How long one watch request may stay open before it is re-issued.
_WATCH_SECONDS = 60


#: How long a watch of a Sandbox the client just applied may be refused (403) before the refusal
#: stands: an agent bound to its conversation (docs/concepts.md) reads a Sandbox by name once
#: the operator has added the name to the conversation's Role, moments after the create.
READ_GRANT_WAIT_SECONDS = 15.0


class _ReadGrant:
    """The wait for a read grant: retries with a growing pause, until ``READ_GRANT_WAIT_SECONDS``
    after the first refusal, then raises :class:`SandboxForbidden`."""

    def __init__(self) -> None:
        self._since: float | None = None
        self._pause = 0.05

    async def wait(self, namespace: str) -> None:
        now = time.monotonic()
        if self._since is None:
            self._since = now
        if now - self._since >= READ_GRANT_WAIT_SECONDS:
            raise SandboxForbidden(namespace=namespace, action="watch sandboxes")
        await asyncio.sleep(self._pause)
        self._pause = min(self._pause * 2, 1.0)


@dataclass
class WaitNotes:
    """What a wait saw, for its caller's error: the last reason the object reported, and the uid
    of the object when the caller's own apply created it (an acquire's)."""

    reason: str = ""
    created: str = ""


#: The view a wait reads its object through.
V = TypeVar("V", bound=ObjectView)


def _resource_version(obj: ObjectView) -> str | None:
    return obj.metadata.resource_version or None


class Watches:
    """Watches on one namespace's objects (see the module)."""

    def __init__(self, objects: SandboxObjects) -> None:
        self.objects = objects

    async def next_event(
        self, plural: str, name: str, resource_version: str | None
    ) -> tuple[str, Mapping[str, Any]] | None:
        """The next event on one object after ``resource_version`` (None: relist needed): its
        type and the object as decoded (the wire boundary: each wait reads it through its
        view)."""
        w = k8s_watch.Watch()
        try:
            stream = w.stream(
                self.objects.custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                self.objects.namespace,
                plural,
                field_selector=f"metadata.name={name}",
                resource_version=resource_version,
                timeout_seconds=_WATCH_SECONDS,
                allow_watch_bookmarks=False,
            )
            async for raw in stream:
                event = WatchEvent(raw)
                if (obj := event.object) is not None and event.changes_object:
                    return event.type, obj
        except ApiException as exc:
            if exc.status == 410:
                return None
            raise
        finally:
            w.stop()
            await w.close()
        return None

    async def until_gone(
        self,
        plural: str,
        name: str,
        read: Callable[[], Awaitable[V | None]],
        view: type[V],
        *,
        marked: bool,
        seen: V | None = None,
    ) -> V | None:
        """Return once the object is deleted (with ``marked``: or marked for deletion), with
        the last state of it seen (a DELETED event carries the object's final state), or None
        when it was gone before any was seen. ``read`` reads it afresh, None when it is gone; it
        is called again after a relist. ``seen``: a state already in hand (a delete's answer),
        watched from instead of a first read, so no change after it is missed."""
        last: V | None = None
        while True:
            obj = seen if seen is not None else await read()
            seen = None
            if obj is None:
                return last
            last = obj
            rv = _resource_version(obj)
            while (event := await self.next_event(plural, name, rv)) is not None:
                kind, new = event[0], view(event[1])
                last = new
                if kind == "DELETED" or (marked and new.metadata.deleting):
                    return last
                rv = _resource_version(new)

    async def wait_gone(
        self,
        plural: str,
        name: str,
        timeout: float | None,  # noqa: ASYNC109
        view: type[V],
        *,
        uid: str | None = None,
        seen: V | None = None,
    ) -> V | None:
        """Return once the object is gone; with ``uid``, once that very object is (a
        replacement under the same name does not keep the wait going). Returns its last state
        seen (None: gone before any was); ``seen`` as for :meth:`until_gone`."""

        async def read() -> V | None:
            try:
                obj = await self.objects.get(plural, name, view)
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise
            if uid and obj.metadata.uid != uid:
                return None
            return obj

        async with asyncio.timeout(timeout):
            return await self.until_gone(plural, name, read, view, marked=False, seen=seen)

    async def scope_deleted(self, scope_ref: str) -> None:
        """Return when the SandboxScope is deleted or marked for deletion."""

        async def read() -> SandboxScopeView | None:
            try:
                return await self.objects.read_scope(scope_ref)
            except (SandboxScopeNotFound, SandboxGone):
                return None

        await self.until_gone(SANDBOX_SCOPE_PLURAL, scope_ref, read, SandboxScopeView, marked=True)

    def _raise_terminal(self, name: str, reason: str, message: str) -> NoReturn:
        cls = acquire_error_for(reason) or SandboxAcquireError
        raise cls(sandbox=name, namespace=self.objects.namespace, reason=reason, message=message)

    def _deleted(self, name: str, message: str) -> SandboxGone:
        return SandboxGone(
            sandbox=name, namespace=self.objects.namespace, reason="Deleted", message=message
        )

    async def until_goal(
        self, name: str, obj: SandboxView, last: WaitNotes, *, goal: Goal = "ready"
    ) -> SandboxView:
        """Return the object once Ready (or, for ``goal="suspended"``, Suspended); raise on a
        terminal reason or deletion."""
        grant = _ReadGrant()
        while True:
            state, reason, message = evaluate_for(obj, goal)
            last.reason = reason
            if state == "ready":
                return obj
            if state == "terminal":
                self._raise_terminal(name, reason, message)
            if obj.metadata.deleting:
                raise self._deleted(name, "the Sandbox is being deleted")
            try:
                event = await self.next_event(SANDBOX_PLURAL, name, _resource_version(obj))
            except ApiException as exc:
                if exc.status != 403:
                    raise
                await grant.wait(self.objects.namespace)
                continue
            if event is None:  # relist
                try:
                    obj = await self.objects.get(SANDBOX_PLURAL, name, SandboxView)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                    raise self._deleted(name, "the Sandbox was deleted while waiting") from None
                continue
            kind, obj = event[0], SandboxView(event[1])
            if kind == "DELETED":
                raise self._deleted(name, "the Sandbox was deleted while waiting")
