"""The collector behind ``sandbox_operator_sandboxes``: a gauge computed at each scrape.

Its own module because it is not a metric object that code updates but a collector that calls
the operator back at scrape time, across threads (the scrape runs on the metrics server's
thread, the census on the operator's event loop). The instance the registry holds,
``SANDBOXES``, and ``register_sandbox_census`` are in the package (``metrics/__init__.py``) with
the other metrics, so ``make docs`` finds every metric in one place.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Iterable

from prometheus_client.core import GaugeMetricFamily, Metric

log = logging.getLogger(__name__)

Census = Callable[[], Iterable[tuple[str, str, int]]]


class SandboxCensus:
    """A collector for ``sandbox_operator_sandboxes{reason, backend}``, computed at each scrape.

    The census function returns ``(reason, backend, count)`` rows; rows naming the same pair are
    added up. When it was registered from a running event loop, it is called on that loop (the
    scrape thread waits up to ``timeout`` seconds), so it may read state the loop owns without
    locks; otherwise it is called on the scrape thread. If it raises or times out, the scrape
    gets no ``sandbox_operator_sandboxes`` samples and the failure is logged.
    """

    NAME = "sandbox_operator_sandboxes"
    DOC = "Sandboxes known to the operator, by condition reason and backend."
    LABELS = ("reason", "backend")

    def __init__(self, timeout: float = 5.0) -> None:
        self.timeout = timeout
        self._lock = threading.Lock()
        self._fn: Census | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def register(self, fn: Census, loop: asyncio.AbstractEventLoop | None = None) -> None:
        with self._lock:
            self._fn, self._loop = fn, loop

    def unregister(self) -> None:
        with self._lock:
            self._fn, self._loop = None, None

    def describe(self) -> Iterable[Metric]:
        # Lets the registry learn the name without calling the census function.
        return [GaugeMetricFamily(self.NAME, self.DOC, labels=list(self.LABELS))]

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            fn, loop = self._fn, self._loop
        if fn is None:
            return []
        try:
            rows = self._call(fn, loop)
            totals: dict[tuple[str, str], float] = {}
            for reason, backend, count in rows:
                key = (str(reason), str(backend))
                totals[key] = totals.get(key, 0.0) + float(count)
        except Exception as exc:
            log.warning("sandbox census failed, no %s samples: %r", self.NAME, exc, exc_info=True)
            return []
        family = GaugeMetricFamily(self.NAME, self.DOC, labels=list(self.LABELS))
        for (reason, backend), value in sorted(totals.items()):
            family.add_metric([reason, backend], value)
        return [family]

    def _call(
        self, fn: Census, loop: asyncio.AbstractEventLoop | None
    ) -> list[tuple[str, str, int]]:
        if loop is None or loop.is_closed() or not loop.is_running() or _on_loop(loop):
            return list(fn())
        result: concurrent.futures.Future[list[tuple[str, str, int]]] = concurrent.futures.Future()

        def run() -> None:
            if not result.set_running_or_notify_cancel():
                return
            try:
                result.set_result(list(fn()))
            except BaseException as exc:
                result.set_exception(exc)

        loop.call_soon_threadsafe(run)
        try:
            return result.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError:
            result.cancel()
            raise TimeoutError(
                f"the census did not run on the event loop in {self.timeout}s"
            ) from None


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
