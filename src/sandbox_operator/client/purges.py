"""Scope purges: dispose of a conversation's Sandboxes, and what that disposal did.

A scope purge is recorded by the operator in the SandboxScope's ``status.lastPurge`` just before it
lets the scope go, so the scope's last state (the object a watch's DELETED event carries) says how
many Sandboxes were disposed and which were not, with their ``DisposalCode``. A Sandbox whose
disposal did not land says why in its ``Disposed`` condition. :func:`purge_of_scope` and
:func:`undisposed` read those (pure).

:class:`ScopePurges` is the client's side of it: ``dispose_scope`` (the client deletes the scope's
Sandboxes and waits) and ``delete_scope`` (the operator purges, the client waits for its record);
both outcomes are one ``ScopePurge`` and are reported as one ``ScopeDisposed``, and a Sandbox seen
gone ends its egress stream. It is given the client's parts it uses, never the client. Creating a
scope is :mod:`sandbox_operator.client.scopes`'; one Sandbox's disposal,
:mod:`sandbox_operator.client.disposal`'."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence

from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from sandbox_operator.client.egress import EgressFeed
from sandbox_operator.client.kube import SandboxObjects
from sandbox_operator.client.observer import ScopeDisposed, failure_name, notify, record_key
from sandbox_operator.client.status import key_from_object
from sandbox_operator.client.watching import Watches
from sandbox_operator.contract import (
    SANDBOX_PLURAL,
    SANDBOX_SCOPE_PLURAL,
    DisposalCode,
    DisposalFailure,
    ScopePurge,
)
from sandbox_operator.views import SandboxScopeView, SandboxView

#: The operator's DisposalFailed message (reconcile/disposal.py): "disposal failed (<code>) on
#: backend <backend>: <detail>".
_FAILED = re.compile(r"^disposal failed \((?P<code>[a-z_]+)\) on backend (?P<backend>\S*): ")


def purge_of_scope(scope: SandboxScopeView | None) -> ScopePurge | None:
    """The purge a SandboxScope's last state records; None
    when it records none (the scope was never purged by an operator, or its state is
    unreadable)."""
    raw = SandboxScopeView.of(scope).status.last_purge
    if not isinstance(raw, Mapping):
        return None
    try:
        return ScopePurge.model_validate(raw)
    except ValidationError:
        return None


def undisposed(obj: SandboxView, waited: float) -> DisposalFailure:
    """Why a Sandbox is still there after a disposal was asked for
    and ``waited`` seconds passed: its ``Disposed`` condition's code when it failed, else
    ``timeout``."""
    sandbox = SandboxView.of(obj)
    status = sandbox.status
    backend = status.backend[:63]
    for cond in status.conditions:
        if cond.type != "Disposed" or cond.reason != "DisposalFailed":
            continue
        message = cond.message
        found = _FAILED.match(message)
        if found and found["code"] in DisposalCode._value2member_map_:
            return DisposalFailure(
                code=DisposalCode(found["code"]),
                detail=message[found.end() :][:1024],
                backend=found["backend"][:63] or backend,
            )
    name = sandbox.metadata.name
    return DisposalFailure(
        code=DisposalCode.TIMEOUT,
        detail=f"Sandbox {name} still present {waited:g}s after its deletion was asked for",
        backend=backend,
    )


class ScopePurges:
    """The conversations' disposals in one client's namespace (see the module)."""

    def __init__(self, objects: SandboxObjects, watches: Watches, egress_feed: EgressFeed) -> None:
        self.objects = objects
        self.watches = watches
        #: the egress streams, and the observer the client keeps there
        self.egress_feed = egress_feed

    async def dispose_scope(
        self,
        scope_ref: str,
        *,
        timeout: float = 120.0,  # noqa: ASYNC109
    ) -> ScopePurge:
        """:meth:`SandboxClient.dispose_scope
        <sandbox_operator.client.SandboxClient.dispose_scope>`: delete each Sandbox of the scope
        (that very object, by uid) and wait until each is gone."""
        call = record_key(None)
        items: list[SandboxView] = []
        purge = ScopePurge()
        try:
            items = [
                item
                for item in await self.objects.list_objects(SANDBOX_PLURAL, SandboxView)
                if item.scope_ref == scope_ref
            ]
            if self.egress_feed.observer is not None:
                for item in items:
                    self.egress_feed.deliver_quietly(item)
            targets = [(item.metadata.name, item.metadata.uid or None) for item in items]
            for name, uid in targets:
                await self.objects.delete(SANDBOX_PLURAL, name, SandboxView, uid=uid)
            purge = await self._disposed_within(targets, timeout)
        except BaseException as exc:
            await self._scope_disposed(scope_ref, items, call, purge, exc)
            raise
        await self._scope_disposed(scope_ref, items, call, purge, None)
        return purge

    async def _disposed_within(
        self,
        targets: Sequence[tuple[str, str | None]],
        timeout: float,  # noqa: ASYNC109
    ) -> ScopePurge:
        """Wait for the deleted Sandboxes to be gone, together, for at most ``timeout``."""

        async def gone(name: str, uid: str | None) -> bool:
            try:
                last = await self.watches.wait_gone(
                    SANDBOX_PLURAL, name, timeout, SandboxView, uid=uid
                )
            except TimeoutError:
                return False
            self.egress_feed.end_gone(last, None, uid)
            return True

        outcomes = await asyncio.gather(*(gone(name, uid) for name, uid in targets))
        failures: list[DisposalFailure] = []
        for (name, uid), done in zip(targets, outcomes, strict=True):
            if done:
                continue
            try:
                obj = await self.objects.get(SANDBOX_PLURAL, name, SandboxView)
            except ApiException as exc:
                if exc.status == 404:
                    continue  # went just now
                raise
            if uid and obj.metadata.uid != uid:
                continue  # a replacement: the one meant is gone
            failures.append(undisposed(obj, timeout))
        return ScopePurge(disposed=len(targets) - len(failures), undisposed=tuple(failures))

    async def delete_scope(
        self,
        name: str,
        *,
        wait: bool = False,
        timeout: float = 120.0,  # noqa: ASYNC109
    ) -> ScopePurge | None:
        """:meth:`SandboxClient.delete_scope
        <sandbox_operator.client.SandboxClient.delete_scope>`: delete the SandboxScope and, with
        ``wait``, read the purge its last state records."""
        call = record_key(None)
        scope_obj: SandboxScopeView | None = None
        try:
            answer = await self.objects.delete(SANDBOX_SCOPE_PLURAL, name, SandboxScopeView)
            if not wait:
                return None
            scope_obj = answer
            uid = (answer.metadata.uid or None) if answer is not None else None
            scope_obj = await self.watches.wait_gone(
                SANDBOX_SCOPE_PLURAL, name, timeout, SandboxScopeView, uid=uid, seen=answer
            )
        except BaseException as exc:
            if wait:
                await self._scope_disposed(name, [], call, None, exc, scope_obj=scope_obj)
            raise
        purge = purge_of_scope(scope_obj)
        if scope_obj is not None:
            await self._scope_disposed(name, [], call, purge, None, scope_obj=scope_obj)
        return purge

    async def _scope_disposed(
        self,
        scope_ref: str,
        items: Sequence[SandboxView],
        call: str | None,
        purge: ScopePurge | None,
        exc: BaseException | None,
        *,
        scope_obj: SandboxScopeView | None = None,
    ) -> None:
        """Report the outcome as one ``ScopeDisposed`` naming the conversation by its scope and
        thread (read from the SandboxScope, else from a Sandbox's key)."""
        observer = self.egress_feed.observer
        if observer is None:
            return
        scope: str | None = None
        thread_id: str | None = None
        try:
            obj = scope_obj or await self.objects.get(
                SANDBOX_SCOPE_PLURAL, scope_ref, SandboxScopeView
            )
            scope, thread_id = obj.scope or None, obj.thread_id or None
        except Exception:  # gone already, or not readable: fall back to a Sandbox's key
            for item in items:
                key = key_from_object(item)
                if key is not None:
                    scope, thread_id = key.scope, key.thread_id
                    break
        notify(
            observer,
            "scope_disposed",
            lambda: ScopeDisposed(
                scope=scope,
                thread_id=thread_id,
                scope_ref=scope_ref,
                namespace=self.objects.namespace,
                call=call,
                count=purge.disposed if purge is not None else 0,
                failure=failure_name(exc),
                undisposed=purge.undisposed if purge is not None else (),
            ),
        )
