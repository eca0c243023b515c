"""One client's egress streams: what the proxy decided for each Sandbox, delivered to the observer
in order, each decision once, without the host asking.

The namespace's egress proxy writes ``status.egress`` on each allowlist Sandbox (its totals and
its newest ten decisions, each numbered with ``seq``). :class:`EgressFeed` turns those states into
``EgressObserved`` events through one :class:`EgressWatermark` per Sandbox object (name and uid),
whoever hands it a state: the host's ``report_egress``, a ``dispose`` reading the Sandbox before
deleting it, or the feed's own watch. Because every path goes through the same watermark, nothing
is delivered twice and the numbers never go back.

With an observer, a Sandbox the client acquired is *followed*: the client's one watch on the
namespace's Sandboxes (label ``app.kubernetes.io/managed-by=sandbox-operator``), started at the
first such acquire and stopped when the client closes, delivers the new records of every event on
a followed Sandbox as it arrives. There is one watch per client, never one per Sandbox and never a
poll: its cost does not grow with the number of Sandboxes followed. A watch that ends is resumed
from the last resourceVersion it saw; one the server refuses as too old (410), or that fails, is
started again from a fresh list (after a backoff, for a failure), which delivers what changed
meanwhile: no state is skipped for good, and the numbering makes any records that scrolled out of
``recent`` meanwhile an exact ``missed_before``.

A stream ends when the client sees its Sandbox gone (the watch's ``DELETED``, a relist without it,
or a disposal that waited): the last state's records are delivered, then one
``EgressStreamEnded`` says how many were delivered and missed, and whether that is the whole
record (the last state was the proxy's ``final`` write, in the one counting window seen).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from kubernetes_asyncio import watch as k8s_watch
from kubernetes_asyncio.client import CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException

from sandbox_operator import labels as lbl
from sandbox_operator.client.observer import (
    EgressObserved,
    EgressStreamEnded,
    EgressWatermark,
    SandboxObserver,
    notify,
)
from sandbox_operator.client.status import key_from_object, read_status
from sandbox_operator.contract import GROUP, SANDBOX_PLURAL, VERSION, SandboxKey
from sandbox_operator.views import ListView, SandboxView, WatchEvent

log = logging.getLogger("sandbox_operator.client.observer")

#: The fields of a status egress decision an ``EgressObserved`` carries as they are.
_RECORD_FIELDS: set[str] = {"time", "verdict", "reason", "method", "host", "port", "seq"}

#: How long one watch request may stay open before it is re-issued.
_WATCH_SECONDS = 300

#: The longest wait before a failed watch is tried again.
_BACKOFF_MAX = 30.0

#: How many ended streams a client remembers (so a late state of one delivers nothing again).
_ENDED_KEPT = 4096

#: A Sandbox object: (name, uid).
ObjectId = tuple[str, str]


def object_id(obj: SandboxView) -> ObjectId:
    meta = obj.metadata
    return meta.name, meta.uid


@dataclass
class _Stream:
    """One Sandbox object's egress stream as this client knows it."""

    mark: EgressWatermark = field(default_factory=EgressWatermark)
    key: SandboxKey | None = None
    followed: bool = False  # acquired by this client: its watch delivers it


class WatchedNamespace(Protocol):
    """Where the feed lists and watches Sandboxes: an API and a namespace, read at each use (the
    client's :class:`~sandbox_operator.client.kube.SandboxObjects`, whose API a test may swap)."""

    @property
    def custom(self) -> CustomObjectsApi: ...

    @property
    def namespace(self) -> str: ...


class EgressFeed:
    """The egress streams of one client (see the module): it lists and watches through
    ``source`` and delivers to ``observer`` (without one, nothing is read or built). It is given
    those two, not the client."""

    def __init__(self, source: WatchedNamespace, observer: SandboxObserver | None) -> None:
        self.source = source
        #: who the streams are delivered to (the client's observer: the client keeps it here)
        self.observer = observer
        self._streams: dict[ObjectId, _Stream] = {}
        #: streams already ended, oldest first: a uid is never reused, so one seen again (the
        #: watch's DELETED after a disposal's wait ended it, or the other way round) is ignored
        self._ended: OrderedDict[ObjectId, None] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self.watches_started = 0  # watch requests issued
        self.lists = 0  # full lists (a start, a 410, a failure)
        self.first_backoff = 1.0  # seconds before a failed watch is tried again, doubling
        #: the API server refused the watch (403): this identity reads Sandboxes by name only
        self.refused = False

    # ---- delivering one state ------------------------------------------------------------

    def deliver(self, obj: SandboxView, key: SandboxKey | None = None) -> int:
        """Deliver the egress decisions of ``obj`` (a Sandbox as read) not yet delivered; returns
        how many. Never awaits, so two paths handing states in cannot interleave."""
        observer = self.observer
        if observer is None or not obj.status.egress:
            return 0
        ident = object_id(obj)
        if ident in self._ended:
            return 0
        stream = self._streams.get(ident)
        key = key or (stream.key if stream is not None else None) or key_from_object(obj)
        summary = read_status(obj).egress
        if key is None or summary is None:
            return 0
        if stream is None:
            stream = self._streams[ident] = _Stream(key=key)
        total = summary.allowed + summary.denied + summary.unreachable
        fresh = stream.mark.advance(summary.since, total, summary.recent, final=summary.final)
        for missed, record in fresh:
            notify(
                observer,
                "egress_observed",
                functools.partial(
                    EgressObserved,
                    key=key,
                    call=None,
                    sandbox=ident[0],
                    missed_before=missed,
                    **record.model_dump(include=_RECORD_FIELDS),
                ),
            )
        return len(fresh)

    def forget(self, name: str, uid: str) -> None:
        """Drop a stream that is not followed (the host disposed a Sandbox it did not acquire
        here); a followed one stays until its end is seen."""
        stream = self._streams.get((name, uid))
        if stream is not None and not stream.followed:
            del self._streams[(name, uid)]

    # ---- following: one watch per client -------------------------------------------------

    def follow(self, obj: SandboxView, key: SandboxKey) -> None:
        """Follow an acquired Sandbox: deliver what ``obj`` already shows, and start the client's
        watch if it is not running yet. Without an observer, nothing."""
        if self.observer is None:
            return
        ident = object_id(obj)
        if not ident[0] or not ident[1]:
            return
        stream = self._streams.setdefault(ident, _Stream(key=key))
        stream.followed = True
        stream.key = stream.key or key
        self.deliver(obj, key)
        if not self.refused and (self._task is None or self._task.done()):
            self._task = asyncio.ensure_future(self._run())

    @property
    def following(self) -> tuple[ObjectId, ...]:
        return tuple(ident for ident, s in self._streams.items() if s.followed)

    @property
    def watching(self) -> bool:
        return self._task is not None and not self._task.done()

    async def close(self) -> None:
        """Stop the watch (the client is closing)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def end(self, obj: SandboxView, key: SandboxKey | None = None) -> None:
        """The Sandbox ``obj`` is gone and ``obj`` is the last state of it seen: deliver what it
        adds, then report how the stream ended (once: a later call for it does nothing)."""
        self.deliver(obj, key)
        self._end(object_id(obj))

    # ---- at a disposal: never raising ---------------------------------------------------

    def deliver_quietly(self, obj: SandboxView, key: SandboxKey | None = None) -> None:
        """:meth:`deliver` for a disposal, before its delete: a failure to report is logged (by
        its type only) and never raised, since reporting must not stop the delete."""
        try:
            self.deliver(obj, key)
        except Exception as exc:
            _report_failed(exc)

    def end_gone(self, last: SandboxView | None, key: SandboxKey | None, uid: str | None) -> None:
        """A disposed Sandbox is gone and ``last`` is the last state of it seen: :meth:`end` its
        stream (with an observer), unless ``last`` is another object under the name than
        ``uid``. Never raises, like :meth:`deliver_quietly`."""
        if self.observer is None or last is None:
            return
        if uid and last.metadata.uid != uid:
            return  # a state of another object under the name
        try:
            self.end(last, key)
        except Exception as exc:
            _report_failed(exc)

    def _on(self, kind: str, obj: SandboxView) -> None:
        """One watch event: deliver what a followed Sandbox's state adds; a deleted one's
        stream ends (its last state delivered)."""
        ident = object_id(obj)
        stream = self._streams.get(ident)
        if stream is None or not stream.followed:
            return
        if kind == "DELETED":
            self.end(obj, stream.key)
        else:
            self.deliver(obj, stream.key)

    def _end(self, ident: ObjectId) -> None:
        """Close one stream: an ``EgressStreamEnded`` when the proxy ever wrote a summary for it
        (a Sandbox without one, not on an allowlist, has no stream to end)."""
        stream = self._streams.pop(ident, None)
        if ident[1] and ident not in self._ended:
            self._ended[ident] = None
            while len(self._ended) > _ENDED_KEPT:
                self._ended.popitem(last=False)
        if stream is None or stream.key is None or not stream.mark.windows:
            return
        key, mark = stream.key, stream.mark
        notify(
            self.observer,
            "egress_stream_ended",
            lambda: EgressStreamEnded(
                key=key,
                call=None,
                sandbox=ident[0],
                namespace=self.source.namespace,
                reported=mark.delivered,
                missed=mark.missed,
                complete=mark.complete,
            ),
        )

    async def _list(self) -> tuple[list[SandboxView], str | None]:
        """The operator's Sandboxes of the namespace (each a view over the list's item) and the
        list's resourceVersion."""
        listing = await self.source.custom.list_namespaced_custom_object(
            GROUP,
            VERSION,
            self.source.namespace,
            SANDBOX_PLURAL,
            label_selector=lbl.managed_selector(),
        )
        self.lists += 1
        answer = ListView(listing)
        return [SandboxView(o) for o in answer.objects], answer.metadata.resource_version or None

    async def _events(self, resource_version: str | None) -> AsyncIterator[WatchEvent]:
        """The watch's events after ``resource_version`` until the server ends the request, each
        a view over the event as decoded."""
        w = k8s_watch.Watch()
        self.watches_started += 1
        try:
            stream = w.stream(
                self.source.custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                self.source.namespace,
                SANDBOX_PLURAL,
                label_selector=lbl.managed_selector(),
                resource_version=resource_version,
                timeout_seconds=_WATCH_SECONDS,
                allow_watch_bookmarks=True,
                _request_timeout=_WATCH_SECONDS + 30,
            )
            async for event in stream:
                yield WatchEvent(event)
        finally:
            w.stop()
            await w.close()

    def _relisted(self, items: list[SandboxView]) -> None:
        """After a (re)list: deliver each followed Sandbox's state; a followed one the list no
        longer holds went while no watch was open, so its stream ends."""
        present = set()
        for obj in map(SandboxView.of, items):  # .of: a stand-in feed may list plain dicts
            ident = object_id(obj)
            present.add(ident)
            self._on("MODIFIED", obj)
        for ident in self.following:
            if ident not in present:
                self._end(ident)

    async def _run(self) -> None:
        """List, then watch from the list's resourceVersion, resuming after each request; a 410
        or a failure starts again from a list. Never raises but CancelledError."""
        backoff = self.first_backoff
        rv: str | None = None
        while True:
            try:
                if rv is None:
                    items, rv = await self._list()
                    self._relisted(items)
                async for raw in self._events(rv):
                    event = WatchEvent.of(raw)
                    if event.object is None:
                        continue
                    obj = SandboxView(event.object)
                    rv = obj.metadata.resource_version or rv
                    if event.changes_object:
                        self._on(event.type, obj)
                backoff = self.first_backoff
            except asyncio.CancelledError:
                raise
            except ApiException as exc:
                rv = None
                if exc.status == 403:
                    # An agent bound to its conversation reads its Sandboxes by name only
                    # (docs/concepts.md): no namespace watch will ever be allowed, so stop.
                    log.warning(
                        "sandbox observer: not allowed to watch the namespace's Sandboxes (403); "
                        "egress is delivered when reported (report_egress) and at dispose"
                    )
                    self.refused = True
                    return
                if exc.status != 410:
                    await self._back_off(exc, backoff)
                    backoff = min(backoff * 2, _BACKOFF_MAX)
            except Exception as exc:
                rv = None
                await self._back_off(exc, backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)

    async def _back_off(self, exc: BaseException, seconds: float) -> None:
        # The class name and HTTP status only: an ApiException's text carries response headers.
        log.warning(
            "sandbox observer: watching Sandboxes for egress failed (%s %s); retrying in %gs",
            type(exc).__name__,
            getattr(exc, "status", "") or "",
            seconds,
        )
        await asyncio.sleep(seconds)


def _report_failed(exc: Exception) -> None:
    log.warning("sandbox observer: reporting egress failed (%s)", type(exc).__name__)
