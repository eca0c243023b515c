"""How a client reaches what serves a Sandbox: the data-plane factory of each ``status.servedBy``
kind, and ``reach`` (a Sandbox's plane without a handle).

Its own topic because two paths need it and neither owns it: an acquire builds a handle's plane
(and rebuilds it after a resume) through :meth:`DataPlanes.connect`, and a tool that reaches a
Sandbox it did not acquire (``sandbox-operator shell``) goes through :meth:`DataPlanes.reach`.
A factory is called with the client (the ``dataplanes=`` contract, docs/client.md), which this
object is handed as an opaque value: it never imports or types the client."""

from __future__ import annotations

from collections.abc import Mapping

from sandbox_operator import kubeobj
from sandbox_operator.client.dataplane import DataPlane, DataPlaneFactory, pod_factory
from sandbox_operator.client.errors import DataPlaneError, SandboxSuspended
from sandbox_operator.client.kube import SandboxObjects
from sandbox_operator.client.status import evaluate, is_suspended, served_by
from sandbox_operator.views import SandboxView

#: The data planes every client has, keyed by ``status.servedBy.kind``: the pod exec one.
#: ``SandboxClient(dataplanes=...)`` adds to (or overrides) these.
DEFAULT_DATAPLANES: Mapping[str, DataPlaneFactory] = {kubeobj.POD_KIND: pod_factory}


class DataPlanes:
    """The data planes of one client (see the module): ``factories`` by ``servedBy.kind``
    (:data:`DEFAULT_DATAPLANES` and the client's own), each called with ``handed``."""

    def __init__(
        self,
        objects: SandboxObjects,
        factories: Mapping[str, DataPlaneFactory],
        handed: object,
    ) -> None:
        self.objects = objects
        #: how the client reaches a Ready sandbox, per ``servedBy.kind`` (``client.dataplanes``)
        self.factories: dict[str, DataPlaneFactory] = {**DEFAULT_DATAPLANES, **factories}
        #: what a factory is called with: the client
        self.handed = handed

    def connect(self, obj: SandboxView) -> DataPlane:
        """The data plane into what serves the Ready Sandbox ``obj`` now."""
        served = obj.status.served_by
        factory = self.factories.get(served.kind)
        if factory is None:
            raise DataPlaneError(f"no data plane for servedBy kind {served.kind or None!r}")
        return factory(self.handed, obj)

    async def reach(self, name: str) -> tuple[SandboxView, DataPlane]:
        """:meth:`SandboxClient.reach <sandbox_operator.client.SandboxClient.reach>`: read the
        Sandbox and connect to what serves it, refusing one suspended or not Ready."""
        obj = await self.objects.get_sandbox(name)
        if is_suspended(obj):
            raise SandboxSuspended(
                sandbox=name, namespace=self.objects.namespace, message="resume it to reach it"
            )
        state, reason, _ = evaluate(obj)
        if state != "ready" or served_by(obj) is None:
            raise DataPlaneError(f"the sandbox is not Ready ({reason or 'no status yet'})")
        return obj, self.connect(obj)
