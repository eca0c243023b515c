"""The view of a Pod: what classifying, claiming and serving read of it.

Why its own module: pods are read by the reconciler's views, the runtime-class driver, warm
pools and the client; their status (phase, conditions, container states) has a shape of its own.
"""

from __future__ import annotations

from sandbox_operator.views.conditions import Conditions
from sandbox_operator.views.fields import (
    Field,
    mapping,
    mapping_field,
    optional_int,
    text,
    text_field,
    truthy,
)
from sandbox_operator.views.objects import ObjectView, Raw, nested


class WaitingStateView(Raw):
    """A container's ``state.waiting``: why it has not started (empty while it is not waiting)."""

    __slots__ = ()
    reason = text_field()
    message = text_field()


class TerminatedStateView(Raw):
    """A container's ``state.terminated``: why and with which code it exited (empty while it
    runs or waits)."""

    __slots__ = ()
    reason = text_field()
    message = text_field()
    exit_code: Field[int | None] = Field(optional_int)


class ContainerStatusView(Raw):
    """One entry of a pod's ``status.containerStatuses``."""

    __slots__ = ()
    name = text_field()
    ready = Field(truthy)
    image = text_field()
    state = mapping_field()

    @property
    def waiting(self) -> WaitingStateView:
        """``state.waiting``: empty when the container is not waiting."""
        return WaitingStateView(mapping(self.state.get("waiting")))

    @property
    def waiting_reason(self) -> str:
        """``state.waiting.reason``: empty when the container is not waiting or says no why."""
        return self.waiting.reason

    @property
    def terminated(self) -> TerminatedStateView:
        """``state.terminated`` (its ``reason``, ``exitCode``): empty while not terminated."""
        return TerminatedStateView(mapping(self.state.get("terminated")))

    @property
    def running(self) -> bool:
        return self.state.get("running") is not None


class PodStatusView(Raw):
    """A pod's ``status``."""

    __slots__ = ()
    phase = Field(lambda v: text(v) or "Pending")
    reason = text_field()
    message = text_field()
    pod_ip = text_field("podIP")
    conditions = Field(Conditions)

    @property
    def container_statuses(self) -> list[ContainerStatusView]:
        found = self._raw.get("containerStatuses") or ()
        return [ContainerStatusView(cs) for cs in found if cs is not None]


class PodView(ObjectView):
    """A Pod."""

    __slots__ = ()
    status: Field[PodStatusView] = Field(nested(PodStatusView))
    node_name = text_field(under="spec")
    #: Not the wire's: the digest of what confines the pod, which the operator's watch caches
    #: keep in place of its spec (reconcile/slim.py, backends/confinement.py); empty on a pod
    #: read from the API server.
    confinement = text_field(under="spec")
