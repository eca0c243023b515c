"""Waking a suspended Sandbox on traffic: the first request asks for one resume, every request to
it waits (bounded) until the Sandbox is Ready, then goes on.

Its own module because of its two rules: single flight (a flood of requests to a suspended
Sandbox makes one resume, not one per request), and a bounded wait that ends in an answer (the
Sandbox's address, or a 503 with the reason the operator gave: a refused resume's, a timeout).
The resume is asked of the operator as the client asks it (docs/suspend.md): ``spec.suspended``
set back to false when the spec suspended it, else a last-activity stamp newer than the
suspension.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime
from typing import Protocol

from . import metrics
from .errors import Refusal
from .view import SandboxEntry, State, View

log = logging.getLogger(__name__)

Key = tuple[str, str]


class Resumer(Protocol):
    async def resume(self, namespace: str, name: str, entry: SandboxEntry) -> None:
        """Ask the operator to resume this suspended Sandbox (raises when the ask fails)."""


class Waker:
    """The address of a Sandbox's pod once it is Ready, resuming it first when suspended."""

    def __init__(self, view: View, resumer: Resumer, timeout: float) -> None:
        self._view = view
        self._resumer = resumer
        self._timeout = timeout
        self._in_flight: dict[Key, asyncio.Task[None]] = {}
        #: Sandboxes a resume was asked for, by the suspension it answered (suspendedAt): the
        #: view shows a Sandbox suspended until the operator has acted, and that is no reason
        #: to ask again.
        self._asked: dict[Key, datetime | None] = {}
        #: When the last ask for each Sandbox failed (its waiters answer 503 at once).
        self._failed_at: dict[Key, float] = {}
        self.resumes = 0

    async def address(self, namespace: str, name: str) -> str:
        """The pod's address; a :class:`~.errors.Refusal` when there is none to be had in time.
        A request that has to wait is counted parked while it does (the metrics)."""
        parked: list[float] = []
        try:
            return await self._address(namespace, name, parked)
        finally:
            if parked:
                metrics.PARKED.dec()
                metrics.WAKE_SECONDS.observe(asyncio.get_running_loop().time() - parked[0])

    async def _address(self, namespace: str, name: str, parked: list[float]) -> str:
        key = (namespace, name)
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self._timeout
        while True:
            entry = self._view.sandbox(namespace, name)
            if entry is None:
                raise Refusal(404, "SandboxNotFound", "no such Sandbox")
            address = self._view.address(namespace, name)
            if address is not None:
                self._asked.pop(key, None)
                self._failed_at.pop(key, None)
                return address
            if entry.state is State.REFUSED:
                raise Refusal(503, entry.reason or "ResumeRefused", entry.message)
            if entry.state is State.ENDED:
                raise Refusal(503, entry.reason or "Ended", "the Sandbox will not serve again")
            if entry.state is State.SUSPENDED:
                self._resume(key, entry)
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise Refusal(
                    503, "NotReadyInTime", f"the Sandbox was not Ready within {self._timeout:g} s"
                )
            if self._failed_at.get(key, float("-inf")) >= started:
                raise Refusal(503, "ResumeFailed", "the resume could not be asked for")
            if not parked:
                parked.append(started)
                metrics.PARKED.inc()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._view.changed(namespace, name), remaining)

    def _resume(self, key: Key, entry: SandboxEntry) -> None:
        if key in self._in_flight and not self._in_flight[key].done():
            return
        if key in self._asked and self._asked[key] == entry.suspended_at:
            return
        self._asked[key] = entry.suspended_at
        self.resumes += 1
        metrics.WAKEUPS.labels("asked").inc()
        task = asyncio.ensure_future(self._resumer.resume(key[0], key[1], entry))
        self._in_flight[key] = task
        task.add_done_callback(lambda t: self._settled(key, t))

    def _settled(self, key: Key, task: asyncio.Task[None]) -> None:
        if self._in_flight.get(key) is task:
            del self._in_flight[key]
        if task.cancelled() or task.exception() is not None:
            # Asked again on the next request; the waiters answer the failure now.
            self._asked.pop(key, None)
            self._failed_at[key] = asyncio.get_running_loop().time()
            metrics.WAKEUPS.labels("failed").inc()
            self._view.poke(*key)
            log.warning("resume of %s/%s could not be asked for", *key)
