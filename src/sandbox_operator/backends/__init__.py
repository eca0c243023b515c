"""Backend drivers: what serves a sandbox once the policy has chosen a backend.

``build_driver`` turns one configured backend into its driver. A backend type other than
``runtimeClass`` provides ``sandbox_operator.backends.<type>.driver.build_driver(config, *, api,
settings) -> BackendDriver`` (``api`` is the operator's kubernetes_asyncio ApiClient, ``settings``
the :class:`~sandbox_operator.config.OperatorSettings`). ``egress_proxy`` is the operator-level
:class:`~sandbox_operator.config.ManagedEgressProxySettings`, for runtime-class backends that use
the proxy the operator runs.
"""

from __future__ import annotations

import importlib
from typing import Any

from sandbox_operator.backends.base import BackendDriver


def build_driver(entry: Any, *, api: Any, settings: Any, egress_proxy: Any = None) -> BackendDriver:
    from sandbox_operator.config import RuntimeClassBackendConfig

    if isinstance(entry, RuntimeClassBackendConfig):
        from sandbox_operator.backends.runtimeclass import RuntimeClassDriver

        return RuntimeClassDriver(
            entry,
            api,
            dispose_timeout=settings.dispose_timeout_seconds,
            egress_proxy=egress_proxy,
        )
    module = importlib.import_module(f"sandbox_operator.backends.{entry.type}.driver")
    driver: BackendDriver = module.build_driver(entry, api=api, settings=settings)
    return driver


__all__ = ["BackendDriver", "build_driver"]
