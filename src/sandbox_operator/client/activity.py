"""A handle's use reported to the operator's idle clock (the Sandbox's last-activity stamp).

Its own module because it is a small rule of its own beside what a handle does: reports go in the
background, at most one in flight and one per interval, and a failed one is dropped (the next use
reports again), so a use never waits on the API server.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable


class ActivityReport:
    """A handle's use, reported to ``report`` in the background and at most every ``interval``
    seconds: the operator's idle timeout counts from the last report."""

    def __init__(self, report: Callable[[], Awaitable[None]] | None, interval: float) -> None:
        self._report = report
        self._interval = interval
        self._last = float("-inf")
        self._task: asyncio.Task[None] | None = None

    def __call__(self) -> None:
        if self._report is None:
            return
        now = time.monotonic()
        if now - self._last < self._interval:
            return
        if self._task is not None and not self._task.done():
            return
        self._last = now
        self._task = asyncio.ensure_future(self._send(self._report))

    @staticmethod
    async def _send(report: Callable[[], Awaitable[None]]) -> None:
        with contextlib.suppress(Exception):
            await report()

    async def settle(self) -> None:
        """Give a report in flight a few seconds to land (a closing handle's last use)."""
        if self._task is not None and not self._task.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._task), 5.0)
