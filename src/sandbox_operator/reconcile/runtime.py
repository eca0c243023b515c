"""What the handlers share: the validated configuration, the API client, one driver per backend.

Nothing here is state that correctness depends on: availability is a cache of a probe (refreshed
every ``AVAILABILITY_TTL`` seconds), locks only avoid duplicate work inside one process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from sandbox_operator.backends import build_driver
from sandbox_operator.backends.base import BackendDriver
from sandbox_operator.config import OperatorConfig
from sandbox_operator.reconcile.kube import Kube

log = logging.getLogger(__name__)

AVAILABILITY_TTL = 30.0


async def make_api_client() -> Any:
    """A kubernetes_asyncio ApiClient from the in-cluster config or the kubeconfig."""
    from kubernetes_asyncio import client, config

    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    return client.ApiClient()


@dataclass
class Runtime:
    config: OperatorConfig
    kube: Kube
    drivers: dict[str, BackendDriver]
    unavailable: dict[str, str] = field(default_factory=dict)
    _checked_at: float = 0.0
    _locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)

    @classmethod
    async def start(cls, config: OperatorConfig, api: Any) -> Runtime:
        drivers = {
            b.name: build_driver(
                b, api=api, settings=config.operator, egress_proxy=config.egress_proxy
            )
            for b in config.backends
        }
        rt = cls(config=config, kube=Kube(api), drivers=drivers)
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
        self._locks.pop((namespace, name), None)

    async def close(self) -> None:
        for driver in self.drivers.values():
            try:
                await driver.close()
            except Exception:  # closing is best effort
                log.debug("closing driver %s failed", driver.name, exc_info=True)
        await self.kube.api.close()
