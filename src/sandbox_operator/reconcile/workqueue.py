"""A deduplicating work queue with deadlines, in the manner of client-go's workqueue.

Why not one kopf handler per event: a burst of watch events for one object (its own status
writes, its pod's phases) should cost one pass, not one per event, and a pass must never run
twice at once for the same object. Here a key waiting in the queue is queued once however often
it is added; a key being worked on that is added again is worked on once more afterwards.

Deadlines (startup timeout, TTL, idle timeout, disposal retry) are ``add(key, delay)``: only the
earliest pending deadline of a key is kept, since the pass it triggers computes the next one.
Nothing here polls: an idle key with no deadline costs nothing.

Three priorities: ``urgent`` keys (a Sandbox already admitted whose pod changed: one cheap status
write, and someone waits for it) go before the others (a new Sandbox to admit: several writes),
and ``background`` keys (the safety-net resync's pass over everything held) after all of them.
Within a priority, first in, first out. Under a burst of creates this keeps "Ready" close to the
pod's readiness instead of queued behind every admission still to do; and a resync over thousands
of objects (most of them needing nothing, some gone since) never holds up a new Sandbox.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

import aiohttp

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

#: A failing pass is retried after BASE * 2**failures seconds, at most MAX.
ERROR_BACKOFF_BASE = 0.5
ERROR_BACKOFF_MAX = 60.0


#: The priorities a key is queued with (lower goes first).
URGENT, NORMAL, BACKGROUND = 0, 1, 2


#: HTTP statuses of an API server that is overloaded or on its way back: retried, not news.
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})


def is_transient(exc: BaseException) -> bool:
    """Whether a pass failed because the API server could not be reached or answered "later"
    (connection refused or reset, a timeout, 429 or 5xx), rather than because of a fault of
    ours worth a traceback."""
    if isinstance(exc, (ConnectionError, TimeoutError, aiohttp.ClientConnectionError)):
        return True
    status = getattr(exc, "status", None)
    return isinstance(status, int) and status in TRANSIENT_STATUSES


class WorkQueue(Generic[K]):
    """``handler(key)`` returns the delay until the key's next deadline (or None)."""

    def __init__(
        self,
        handler: Callable[[K], Awaitable[float | None]],
        *,
        workers: int = 16,
        name: str = "work",
    ) -> None:
        self._handler = handler
        self._workers = workers
        self._name = name
        self._queue: asyncio.PriorityQueue[tuple[int, int, K]] = asyncio.PriorityQueue()
        self._seq = itertools.count()
        self._queued: dict[K, int] = {}  # key -> the best priority it is queued with
        self._active: set[K] = set()
        self._again: set[K] = set()
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._failures: dict[K, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        #: Passes run so far (the memory trim looks for work done since it last ran).
        self.passes = 0

    def __len__(self) -> int:
        return len(self._queued)

    @property
    def busy(self) -> bool:
        """Whether a pass is running now."""
        return bool(self._active)

    @property
    def pending_deadlines(self) -> int:
        return len(self._timers)

    def add(
        self, key: K, delay: float = 0.0, *, urgent: bool = False, background: bool = False
    ) -> None:
        """Work on ``key`` now, or after ``delay`` seconds (the earliest of its deadlines).

        ``urgent`` puts it before every other key, ``background`` after every other key; a key
        queued already with a lower priority moves up (it still runs once)."""
        if urgent and background:
            raise ValueError("a key is either urgent or background, not both")
        if delay > 0:
            self._add_later(key, delay)
            return
        if key in self._active:
            self._again.add(key)
            return
        priority = URGENT if urgent else BACKGROUND if background else NORMAL
        queued = self._queued.get(key)
        if queued is not None and queued <= priority:
            return
        # New, or now more urgent: (another) entry; the one popped first does the work and the
        # other is skipped as stale.
        self._queued[key] = priority
        self._queue.put_nowait((priority, next(self._seq), key))

    def forget(self, key: K) -> None:
        """Drop a key's deadline and error history (the object is gone)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer[1].cancel()
        self._failures.pop(key, None)

    def _add_later(self, key: K, delay: float) -> None:
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        current = self._timers.get(key)
        if current is not None and current[0] <= when:
            return
        if current is not None:
            current[1].cancel()

        def fire() -> None:
            self._timers.pop(key, None)
            self.add(key, urgent=True)  # a deadline is due now

        self._timers[key] = (when, loop.call_at(when, fire))

    def start(self) -> None:
        for i in range(self._workers):
            self._tasks.append(asyncio.create_task(self._work(), name=f"{self._name}-worker-{i}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        for _, timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    async def drain(self, within: float = 10.0) -> bool:
        """Wait until nothing is queued or being worked on (tests, benchmarks)."""
        deadline = time.monotonic() + within
        while self._queued or self._active:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    async def _work(self) -> None:
        while True:
            priority, _, key = await self._queue.get()
            if self._queued.get(key) != priority:
                continue  # stale: already worked on, or queued again with a better priority
            del self._queued[key]
            self._active.add(key)
            self.passes += 1
            delay: float | None
            try:
                delay = await self._handler(key)
                self._failures.pop(key, None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures = self._failures.get(key, 0)
                self._failures[key] = failures + 1
                delay = min(ERROR_BACKOFF_MAX, ERROR_BACKOFF_BASE * 2**failures)
                delay *= 1 + random.random() * 0.1
                if failures or is_transient(exc):
                    # An API server that is away fails every pass of every key: one line each,
                    # not a traceback each (a 12 s outage made thousands of lines).
                    log.warning(
                        "%s %s: pass failed (%s, %d in a row); retrying in %.1fs",
                        self._name,
                        key,
                        type(exc).__name__,
                        failures + 1,
                        delay,
                    )
                else:
                    log.exception("%s %s: pass failed; retrying in %.1fs", self._name, key, delay)
            finally:
                self._active.discard(key)
            if key in self._again:
                self._again.discard(key)
                self.add(key)
            if delay is not None:
                self.add(key, max(delay, 0.001))
