"""The acas driver's read cache of the group's remote sandboxes.

One label-filtered list (this operator, this backend) per `observeIntervalSeconds` refills it;
`observe` and `list_by_key` answer from it, and whatever the driver learns from the service
(ensure, dispose, reads by id) is written through at once. A list that started before a write
never undoes it. A cache that could not be refilled for `STALE_AFTER_INTERVALS` intervals no
longer answers. With `start(notify)` a background task lists and reports every Sandbox whose
remote state changed between two lists.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sandbox_operator import labels as lbl
from sandbox_operator.acas.api import AcasClient
from sandbox_operator.acas.config import AcasBackendConfig
from sandbox_operator.acas.errors import AcasError
from sandbox_operator.acas.models import RemoteSandbox
from sandbox_operator.backends.base import SandboxRef

from .remote import (
    NAMESPACE_LABEL,
    OWNER_UID_LABEL,
    SANDBOX_NAME_LABEL,
    classify,
    ref_key,
    sandbox_key,
)

log = logging.getLogger(__name__)

#: A cache whose last good list started more than this many intervals ago no longer answers.
STALE_AFTER_INTERVALS = 3

#: What `start` is given: called with (namespace, Sandbox name) for each changed Sandbox.
Notify = Callable[[str, str], None]


def _fingerprint(remote: RemoteSandbox) -> tuple[str, ...]:
    """What observe would tell of one remote sandbox (owner, phase, state, its reason)."""
    obs = classify(remote)
    return (
        remote.id,
        remote.labels.get(OWNER_UID_LABEL, ""),
        obs.phase.value,
        obs.detail_reason,
        obs.message,
    )


class _Snapshot:
    """The cached remote sandboxes, by id and by the Sandbox they serve."""

    def __init__(self, remotes: Iterable[RemoteSandbox] = ()) -> None:
        self.by_id: dict[str, RemoteSandbox] = {}
        self.by_sandbox: dict[tuple[str, str], dict[str, RemoteSandbox]] = {}
        for remote in remotes:
            self.put(remote)

    def put(self, remote: RemoteSandbox) -> None:
        self.drop(remote.id)
        self.by_id[remote.id] = remote
        self.by_sandbox.setdefault(sandbox_key(remote), {})[remote.id] = remote

    def drop(self, remote_id: str) -> None:
        remote = self.by_id.pop(remote_id, None)
        if remote is None:
            return
        key = sandbox_key(remote)
        group = self.by_sandbox.get(key, {})
        group.pop(remote_id, None)
        if not group:
            self.by_sandbox.pop(key, None)

    def of(self, key: tuple[str, str]) -> list[RemoteSandbox]:
        return list(self.by_sandbox.get(key, {}).values())

    def states(self) -> dict[tuple[str, str], tuple[tuple[str, ...], ...]]:
        return {
            key: tuple(sorted(_fingerprint(r) for r in group.values()))
            for key, group in self.by_sandbox.items()
            if key[0] and key[1]
        }


@dataclass(frozen=True)
class CacheStatus:
    """How the driver's read cache stands (for logs, metrics and tests)."""

    filled: bool  # a list has succeeded at least once
    age_seconds: float | None  # since the last good list started (None: never)
    stale: bool  # too old to answer: observe asks the service per sandbox
    consecutive_failures: int  # lists failed since the last good one
    last_error: str  # what the last failed list said ("" after a good one)
    lists: int  # lists sent so far, good or not
    running: bool  # the periodic task of `start` is running


class ReadCache:
    """Mixin of `AcasDriver`: the read cache and the label selectors it lists by.

    The driver sets `_config` and `_client` and calls `_init_cache()` in its constructor.
    """

    _config: AcasBackendConfig
    _client: AcasClient

    def _init_cache(self) -> None:
        # The read cache (see the module docstring). Times are `_clock()` readings.
        self._interval = self._config.observe_interval_seconds
        self._clock: Callable[[], float] = time.monotonic
        self._snapshot: _Snapshot | None = None  # None until a list has succeeded
        self._listed_at = 0.0  # when the list that filled the snapshot started
        self._attempted_at: float | None = None  # when the last list (good or not) started
        self._failures = 0
        self._last_error = ""
        self._lists = 0
        # Write-through since the last good list started: id -> (remote, or None if gone; when).
        # A list that started before a write must not undo it.
        self._writes: dict[str, tuple[RemoteSandbox | None, float]] = {}
        # Sandbox names the sandbox label cannot give back (dotted/long names of sandboxes
        # created without SANDBOX_NAME_LABEL), learned from the refs the operator passes.
        self._names: dict[tuple[str, str], str] = {}
        self._inflight: asyncio.Future[bool] | None = None
        self._task: asyncio.Task[None] | None = None
        self._notify: Notify | None = None

    @property
    def observe_interval(self) -> float:
        return self._interval

    def cache_status(self) -> CacheStatus:
        now = self._clock()
        filled = self._snapshot is not None
        age = now - self._listed_at if filled else None
        return CacheStatus(
            filled=filled,
            age_seconds=age,
            stale=age is None or age > self._interval * STALE_AFTER_INTERVALS,
            consecutive_failures=self._failures,
            last_error=self._last_error,
            lists=self._lists,
            running=self._running(),
        )

    def _running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self, notify: Notify) -> None:
        """Start the periodic refresh: one label-filtered list every `observeIntervalSeconds`.

        After each good list, `notify(namespace, sandbox_name)` is called (synchronously, in
        this event loop; it must not block) once for every Sandbox whose remote state as
        observe reports it (remote id, owner, phase, state, reason) differs from what the cache
        held just before, including remote sandboxes that appeared or vanished. Changes the
        operator made itself through `ensure`/`dispose` are already in the cache and are not
        reported again. The first good list reports nothing (there is nothing to compare). A
        failed list reports nothing and keeps the cache. Returns at once; calling it again only
        replaces `notify`. `close()` stops the task.
        """
        self._notify = notify
        if not self._running():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"acas-observe-{self._config.name}"
            )

    async def _run(self) -> None:
        while True:
            last = self._attempted_at
            if last is None or self._clock() - last >= self._interval:
                try:
                    await self.refresh()
                except Exception:  # refresh records list failures; anything else must not
                    log.exception("acas %s: refreshing the sandbox cache failed", self._config.name)
            last = self._attempted_at
            since = 0.0 if last is None else self._clock() - last
            await asyncio.sleep(max(self._interval - since, self._interval / 10))

    async def refresh(self) -> bool:
        """List the group's sandboxes now and replace the cache; False if the list failed (the
        last good cache is kept, the failure recorded). Concurrent callers share one list."""
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.ensure_future(self._list_and_apply())
        return await asyncio.shield(self._inflight)

    async def _list_and_apply(self) -> bool:
        started = self._clock()
        self._attempted_at = started
        self._lists += 1
        try:
            try:
                listed = await self._client.list_sandboxes(self._selector())
            except Exception as exc:  # AcasError, or anything else: keep no text of the latter
                self._failures += 1
                self._last_error = str(exc) if isinstance(exc, AcasError) else type(exc).__name__
                age = self._clock() - self._listed_at if self._snapshot is not None else None
                log.log(
                    logging.WARNING if self._failures == 1 else logging.INFO,
                    "acas %s: listing sandboxes failed (%d in a row; cache age %s): %s",
                    self._config.name,
                    self._failures,
                    "none" if age is None else f"{age:.0f}s",
                    self._last_error,
                )
                return False
        finally:
            self._inflight = None
        fresh = _Snapshot(listed)
        for remote_id, (remote, at) in self._writes.items():
            if at >= started:  # written while the list was under way: newer than the list
                if remote is None:
                    fresh.drop(remote_id)
                else:
                    fresh.put(remote)
        self._writes.clear()
        previous, self._snapshot = self._snapshot, fresh
        self._listed_at = started
        self._failures = 0
        self._last_error = ""
        if previous is not None:
            self._announce(previous, fresh)
        return True

    def _announce(self, before: _Snapshot, after: _Snapshot) -> None:
        notify = self._notify
        if notify is None:
            return
        old, new = before.states(), after.states()
        for key in sorted(old.keys() | new.keys()):
            if old.get(key) == new.get(key):
                continue
            name = self._sandbox_name(key, after.of(key) + before.of(key))
            try:
                notify(key[0], name)
            except Exception:
                log.exception(
                    "acas %s: change notification for %s/%s failed", self._config.name, *key
                )

    def _sandbox_name(self, key: tuple[str, str], remotes: list[RemoteSandbox]) -> str:
        for remote in remotes:
            name = remote.labels.get(SANDBOX_NAME_LABEL)
            if name:
                return name
        # Sandboxes from before the name label: the sandbox label is the name itself for every
        # DNS-1123 label name (all names the client gives); others were learned from refs.
        return self._names.get(key, key[1])

    def _learn(self, sandbox: SandboxRef) -> None:
        key = ref_key(sandbox)
        if sandbox.name and key[1] != sandbox.name:
            self._names[key] = sandbox.name

    async def _cache(self) -> _Snapshot | None:
        """The cache when it may answer, else None (the caller asks the service).

        The first call (and, without the periodic task, the first after an interval) lists
        once for everyone; after a failed list the next attempt waits an interval."""
        now = self._clock()
        due = self._snapshot is None or (
            not self._running() and now - self._listed_at >= self._interval
        )
        if due and (
            self._inflight is not None
            or self._attempted_at is None
            or now - self._attempted_at >= self._interval
        ):
            await self.refresh()
        if self._snapshot is None:
            return None
        if self._clock() - self._listed_at > self._interval * STALE_AFTER_INTERVALS:
            return None
        return self._snapshot

    def _remember(self, remote: RemoteSandbox) -> None:
        self._writes[remote.id] = (remote, self._clock())
        if self._snapshot is not None:
            self._snapshot.put(remote)

    def _forget(self, remote_id: str) -> None:
        self._writes[remote_id] = (None, self._clock())
        if self._snapshot is not None:
            self._snapshot.drop(remote_id)

    def _write_through(self, sandbox: SandboxRef, found: list[RemoteSandbox]) -> None:
        """The service just listed exactly `found` for `sandbox`: the cache says so too."""
        keep = {r.id for r in found}
        if self._snapshot is not None:
            for remote in self._snapshot.of(ref_key(sandbox)):
                if remote.id not in keep:
                    self._forget(remote.id)
        for remote in found:
            self._remember(remote)

    def _selector(self, **extra: str) -> dict[str, str]:
        return {
            lbl.MANAGED_BY_LABEL: lbl.MANAGED_BY_VALUE,
            lbl.BACKEND_LABEL: self._config.name,
            **extra,
        }

    def _sandbox_selector(self, sandbox: SandboxRef) -> dict[str, str]:
        return self._selector(
            **{
                lbl.SANDBOX_LABEL: lbl.sandbox_label_value(sandbox.name),
                NAMESPACE_LABEL: sandbox.namespace,
            }
        )

    async def _find(self, sandbox: SandboxRef) -> list[RemoteSandbox]:
        return await self._client.list_sandboxes(self._sandbox_selector(sandbox))

    async def _get_own(self, sandbox: SandboxRef, remote_id: str) -> RemoteSandbox | None:
        """The remote sandbox by id if it still exists and carries `sandbox`'s labels."""
        remote = await self._client.find_sandbox(remote_id)
        if remote is None:
            self._forget(remote_id)
            return None
        if sandbox_key(remote) != ref_key(sandbox):
            return None
        self._remember(remote)
        return remote
