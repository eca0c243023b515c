"""Backend drivers: what serves a sandbox once the policy has chosen a backend.

``build_driver`` turns one typed backend entry of the operator configuration (a member of
:data:`sandbox_operator.config.BackendConfig`, the union discriminated by ``type``) into its
driver. Each backend keeps its config model beside the code that reads it
(``backends/runtimeclass/config.py``, ``sandbox_operator/acas/config.py``); adding a backend
type is one model in the union and one branch here. ``api`` is the operator's kubernetes_asyncio
ApiClient, ``settings`` the operator's timings (a :class:`~.base.DriverSettings`, which
:class:`~sandbox_operator.config.OperatorSettings` is); ``egress_proxy`` is the operator-level
:class:`~sandbox_operator.egress.config.ManagedEgressProxySettings`, for
runtime-class backends that use the proxy the operator runs.

The drivers are imported when a driver is built, not with this package: validating a
configuration needs the config models only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandbox_operator.backends.base import BackendDriver, DriverSettings

if TYPE_CHECKING:
    from sandbox_operator.acas.config import AcasBackendConfig
    from sandbox_operator.backends.runtimeclass.config import RuntimeClassBackendConfig
    from sandbox_operator.egress.config import ManagedEgressProxySettings


def build_driver(
    entry: RuntimeClassBackendConfig | AcasBackendConfig,
    *,
    api: Any,
    settings: DriverSettings,
    egress_proxy: ManagedEgressProxySettings | None = None,
    operator_namespace: str | None = None,
) -> BackendDriver:
    """The driver serving one configured backend (the entry's model picks it).
    ``operator_namespace`` is the namespace the operator runs in (None outside a pod)."""
    from sandbox_operator.acas.config import AcasBackendConfig
    from sandbox_operator.backends.runtimeclass.config import RuntimeClassBackendConfig

    if isinstance(entry, RuntimeClassBackendConfig):
        from sandbox_operator.backends.runtimeclass import RuntimeClassDriver

        return RuntimeClassDriver(
            entry,
            api,
            dispose_timeout=settings.dispose_timeout_seconds,
            egress_proxy=egress_proxy,
        )
    if isinstance(entry, AcasBackendConfig):
        from sandbox_operator.backends.acas.driver import build_driver as build_acas_driver

        return build_acas_driver(
            entry,
            api=api,
            dispose_timeout=settings.dispose_timeout_seconds,
            operator_namespace=operator_namespace,
        )
    raise TypeError(f"no driver for backend entry {type(entry).__name__}")


__all__ = ["BackendDriver", "build_driver"]
