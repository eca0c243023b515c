"""Traffic through the router counts as use for the idle timeout: the Sandbox's last-activity
stamp (``sandbox-operator.dev/last-activity``, docs/suspend.md), written at most once per
interval per Sandbox, in the background, and dropped when it fails (the next request stamps
again), so a request never waits on the API server for it.

Its own module because it is a rule of its own beside routing: bounded in-flight writes and a
bounded memory of when each Sandbox was last stamped."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Final

#: Most Sandboxes whose last stamp is remembered (the oldest are forgotten, and stamped again).
REMEMBERED_MAX: Final = 10_000

Stamp = Callable[[str, str], Awaitable[None]]


class ActivityStamps:
    def __init__(self, stamp: Stamp, interval: float) -> None:
        self._stamp = stamp
        self._interval = interval
        self._last: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()

    def touch(self, namespace: str, name: str) -> None:
        """Note a request to this Sandbox: stamped now unless stamped within the interval."""
        key = (namespace, name)
        now = time.monotonic()
        if now - self._last.get(key, float("-inf")) < self._interval:
            return
        self._last[key] = now
        self._last.move_to_end(key)
        while len(self._last) > REMEMBERED_MAX:
            self._last.popitem(last=False)
        task = asyncio.ensure_future(self._send(namespace, name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, namespace: str, name: str) -> None:
        with contextlib.suppress(Exception):
            await self._stamp(namespace, name)

    async def settle(self) -> None:
        """Wait for the stamps in flight (shutdown, tests)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
