"""What the reconcilers share: the configuration, the API client, one driver per backend, the
watched views and the work queues.

Nothing here is state that correctness depends on beyond one process's lifetime: the views are
rebuilt from the watches on start, availability is a cache of a probe (refreshed every
``AVAILABILITY_TTL`` seconds), and the bookkeeping dicts (disposal clocks, create retries) only
pace retries; a restarted operator starts them afresh and converges all the same.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from sandbox_operator.backends import build_driver
from sandbox_operator.backends.base import BackendDriver, WatchedObjects, suspends
from sandbox_operator.backends.runtimeclass.pod_sandbox_failures import PodSandboxFailures
from sandbox_operator.config import OperatorConfig, operator_namespace
from sandbox_operator.contract import GROUP, ConfigurationError, DisposalFailure
from sandbox_operator.reconcile.access import ConversationAccess
from sandbox_operator.reconcile.kube import Kube
from sandbox_operator.reconcile.seal import NOT_CONFIGURED, Seal
from sandbox_operator.reconcile.views import ObjKey, Views
from sandbox_operator.reconcile.workqueue import WorkQueue
from sandbox_operator.views import ObjectView, PodView

log = logging.getLogger(__name__)

AVAILABILITY_TTL = 30.0

#: The operator's finalizer on Sandboxes and SandboxScopes (the name kopf used before, so
#: objects created under earlier versions are released the same way).
FINALIZER = f"{GROUP}/finalizer"


async def make_api_client() -> Any:
    """The operator's ApiClient (:func:`~sandbox_operator.kubeapi.new_api_client`), with every
    request counted in ``sandbox_operator_api_requests_total``."""
    from sandbox_operator.kubeapi import new_api_client
    from sandbox_operator.metrics.requests import instrument_api_client

    api = await new_api_client()
    instrument_api_client(api)
    return api


@dataclass
class Runtime:
    config: OperatorConfig
    kube: Kube
    drivers: dict[str, BackendDriver]
    views: Views = field(default_factory=Views)
    unavailable: dict[str, str] = field(default_factory=dict)
    #: Sandboxes whose scope's purge has deleted their children: a pod gone is no failure.
    purging: set[ObjKey] = field(default_factory=set)
    #: When the disposal of a Sandbox was first requested and not seen landed (timeout clock).
    disposal_started: dict[ObjKey, float] = field(default_factory=dict)
    #: When a pass first saw a Sandbox deleted (``sandbox_operator_deletion_to_release_seconds``).
    deletion_seen: dict[ObjKey, float] = field(default_factory=dict)
    #: When a deleted Sandbox's finalizer began waiting for the egress proxy's final write.
    egress_final_started: dict[ObjKey, float] = field(default_factory=dict)
    #: Transiently failed creates per Sandbox (backoff).
    ensure_attempts: dict[ObjKey, int] = field(default_factory=dict)
    #: Scope purges under way: when they started, and how many attempts were made.
    #: (started or None to start again, attempts made, members at the start, failures so far).
    purges: dict[ObjKey, tuple[float | None, int, int, tuple[DisposalFailure, ...]]] = field(
        default_factory=dict
    )
    #: What each bound scope's Role and RoleBinding say, as this process last wrote them.
    access_written: dict[ObjKey, ConversationAccess] = field(default_factory=dict)
    #: When each Sandbox's status was last written (message-only changes are debounced).
    status_written: dict[ObjKey, float] = field(default_factory=dict)
    #: Validated specs by Sandbox, stamped with (uid, generation).
    spec_cache: OrderedDict[ObjKey, tuple[tuple[str, Any], Any]] = field(
        default_factory=OrderedDict
    )
    #: Warm pool pods a pass of this process is claiming right now (skipped by other passes).
    claiming: set[ObjKey] = field(default_factory=set)
    #: What the watch of the kubelet's FailedCreatePodSandBox events said (runtime-class pods
    #: whose node lacks the handler), shared by every runtime-class driver.
    pod_sandbox_failures: PodSandboxFailures = field(default_factory=PodSandboxFailures)
    #: Whether idle pool pods are sealed until claimed, as last judged (reconcile/seal.py).
    pool_seal: Seal = NOT_CONFIGURED
    #: Whether the views are fed by the event handlers alone (kopf's index handlers dropped once
    #: every watched kind was listed: reconcile/handlers.py); None until the first event handler.
    views_from_events: bool | None = None
    sandbox_queue: WorkQueue[ObjKey] | None = None
    scope_queue: WorkQueue[ObjKey] | None = None
    pool_queue: WorkQueue[ObjKey] | None = None
    _checked_at: float = 0.0
    _locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)

    @classmethod
    async def start(cls, config: OperatorConfig, api: Any) -> Runtime:
        drivers = {
            b.name: build_driver(
                b,
                api=api,
                settings=config.operator,
                egress_proxy=config.egress_proxy,
                operator_namespace=operator_namespace(),
            )
            for b in config.backends
        }
        for b in config.backends:
            if b.declarations.persistent_storage and not suspends(drivers[b.name]):
                # Storage is admitted on the declaration; suspending it must then be possible.
                raise ConfigurationError(
                    f"backends[{b.name}].declarations.persistentStorage",
                    "is declared, but this backend's driver cannot suspend and resume",
                )
        rt = cls(config=config, kube=Kube(api), drivers=drivers)
        for driver in drivers.values():
            use_views = getattr(driver, "use_views", None)
            if use_views is not None:
                # Typed so mypy holds the views to the shape drivers declare (WatchedObjects).
                watched: tuple[
                    WatchedObjects[PodView], WatchedObjects[ObjectView], WatchedObjects[ObjectView]
                ] = (
                    rt.views.pods,
                    rt.views.network_policies,
                    rt.views.persistent_volume_claims,
                )
                use_views(*watched)
            use_failures = getattr(driver, "use_pod_sandbox_failures", None)
            if use_failures is not None:
                use_failures(rt.pod_sandbox_failures)
        await rt.refresh_availability(force=True)
        for name, reason in rt.unavailable.items():
            log.warning("backend %s is unavailable: %s", name, reason)
        return rt

    async def refresh_availability(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked_at < AVAILABILITY_TTL:
            return
        unavailable: dict[str, str] = {}
        for name, driver in self.drivers.items():
            try:
                availability = await driver.check_available()
            except Exception as exc:
                unavailable[name] = f"availability probe failed: {type(exc).__name__}"
                continue
            if not availability.available:
                unavailable[name] = availability.reason or "unavailable"
        self.unavailable = unavailable
        self._checked_at = now

    def lock(self, namespace: str, name: str) -> asyncio.Lock:
        key = (namespace, name)
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def forget(self, namespace: str, name: str) -> None:
        """A Sandbox is gone: drop everything kept about it."""
        key = (namespace, name)
        self._locks.pop(key, None)
        self.purging.discard(key)
        self.disposal_started.pop(key, None)
        self.deletion_seen.pop(key, None)
        self.egress_final_started.pop(key, None)
        self.ensure_attempts.pop(key, None)
        self.spec_cache.pop(key, None)
        self.status_written.pop(key, None)
        if self.sandbox_queue is not None:
            self.sandbox_queue.forget(key)

    def enqueue_sandbox(
        self,
        namespace: str,
        name: str,
        delay: float = 0.0,
        *,
        urgent: bool = False,
        background: bool = False,
    ) -> None:
        if self.sandbox_queue is not None:
            self.sandbox_queue.add((namespace, name), delay, urgent=urgent, background=background)

    def enqueue_scope(
        self, namespace: str, name: str, delay: float = 0.0, *, background: bool = False
    ) -> None:
        if self.scope_queue is not None:
            self.scope_queue.add((namespace, name), delay, background=background)

    def enqueue_pool(
        self, namespace: str, name: str, delay: float = 0.0, *, background: bool = False
    ) -> None:
        if self.pool_queue is not None:
            self.pool_queue.add((namespace, name), delay, background=background)

    async def close(self) -> None:
        for queue in (self.sandbox_queue, self.scope_queue, self.pool_queue):
            if queue is not None:
                await queue.stop()
        for driver in self.drivers.values():
            try:
                await driver.close()
            except Exception:  # closing is best effort
                log.debug("closing driver %s failed", driver.name, exc_info=True)
        await self.kube.api.close()
