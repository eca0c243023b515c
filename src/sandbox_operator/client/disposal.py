"""Dispose of one Sandbox: delete it (only that very object when its uid is given), report the
disposal, and, when asked, wait until it is gone and end its egress stream.

Its own topic because a disposal is more than the delete: with an observer the Sandbox is read
first, so the egress decisions not yet reported are delivered and a dispose by name learns the
key to report (``SandboxDisposed``); the wait ends the stream with the last state seen
(``EgressStreamEnded``); and the handle's activity stamp and an unfollowed stream are dropped.
A conversation's disposal is :mod:`sandbox_operator.client.purges`'.

:class:`Disposals` is given the client's parts it uses; it never imports the client."""

from __future__ import annotations

import asyncio
import contextlib

from sandbox_operator.client.egress import EgressFeed
from sandbox_operator.client.kube import SandboxObjects
from sandbox_operator.client.observer import SandboxDisposed, failure_name, notify, record_key
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.client.status import key_from_object
from sandbox_operator.client.suspension import Suspensions
from sandbox_operator.client.watching import Watches
from sandbox_operator.contract import SANDBOX_PLURAL, SandboxKey
from sandbox_operator.views import SandboxView

#: How long a ``dispose(wait=True)`` waits for the Sandbox to be gone.
WAIT_GONE_SECONDS = 120.0


class Disposals:
    """The disposals of one client's Sandboxes (see the module)."""

    def __init__(
        self,
        objects: SandboxObjects,
        watches: Watches,
        suspensions: Suspensions,
        egress_feed: EgressFeed,
    ) -> None:
        self.objects = objects
        self.watches = watches
        #: whose activity stamp of a disposed Sandbox is dropped
        self.suspensions = suspensions
        #: the egress streams, and the observer the client keeps there
        self.egress_feed = egress_feed
        #: Disposals started in the background (an unclean handle's), by Sandbox name: an
        #: acquire of that name waits for its own (:meth:`settled`), so it never races the
        #: DELETE and gets the sandbox being disposed.
        self.in_flight: dict[str, asyncio.Future[None]] = {}

    def dispose_soon(self, name: str, uid: str | None = None) -> asyncio.Future[None]:
        """Dispose of ``name`` in the background, registered at once (before any await) so
        that a later acquire of the name waits for it."""
        future = asyncio.ensure_future(self.dispose(name, uid=uid))
        self.in_flight[name] = future

        def done(f: asyncio.Future[None]) -> None:
            if self.in_flight.get(name) is f:
                del self.in_flight[name]
            if not f.cancelled():
                f.exception()  # retrieved: its failure is the handle's to tell, not the loop's

        future.add_done_callback(done)
        return future

    async def settled(self, name: str) -> None:
        """Once a background disposal of ``name`` has ended (whatever its outcome: the apply
        after it sees what is left)."""
        future = self.in_flight.get(name)
        if future is not None:
            await asyncio.wait({future})

    async def dispose(
        self, sandbox: Sandbox | str, *, wait: bool = False, uid: str | None = None
    ) -> None:
        """:meth:`SandboxClient.dispose <sandbox_operator.client.SandboxClient.dispose>`."""
        name = sandbox if isinstance(sandbox, str) else sandbox.name
        key = None if isinstance(sandbox, str) else sandbox.key
        if not isinstance(sandbox, str):
            with contextlib.suppress(Exception):
                await sandbox.close()
        seen: SandboxView | None = None
        if self.egress_feed.observer is not None:
            with contextlib.suppress(Exception):  # reporting must not stop the delete
                seen = await self.objects.get(SANDBOX_PLURAL, name, SandboxView)
            if seen is not None:
                key = key or key_from_object(seen)
                self.egress_feed.deliver_quietly(seen, key)
        call = record_key(key)
        try:
            await self.objects.delete(SANDBOX_PLURAL, name, SandboxView, uid=uid)
        except BaseException as exc:
            self._disposed(key, call, name, exc)
            raise
        self._disposed(key, call, name, None)
        self.suspensions.activity_stamps.pop(name, None)
        seen_uid = seen.metadata.uid if seen is not None else ""
        try:
            if wait:
                last = await self.watches.wait_gone(
                    SANDBOX_PLURAL, name, WAIT_GONE_SECONDS, SandboxView, uid=uid
                )
                self.egress_feed.end_gone(last or seen, key, uid)
        finally:
            self.egress_feed.forget(name, seen_uid)

    def _disposed(
        self, key: SandboxKey | None, call: str | None, name: str, exc: BaseException | None
    ) -> None:
        if key is None:
            return
        notify(
            self.egress_feed.observer,
            "sandbox_disposed",
            lambda: SandboxDisposed(
                key=key,
                call=call,
                sandbox=name,
                namespace=self.objects.namespace,
                failure=failure_name(exc),
            ),
        )
