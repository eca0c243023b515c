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
    raw_field,
    sequence,
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


class ContainerSpecView(Raw):
    """One container of a pod's ``spec`` (``containers``, ``initContainers`` or
    ``ephemeralContainers``): the fields that decide what it can reach, each as the wire holds
    it (backends/confinement.py compares and digests them as they are)."""

    __slots__ = ()
    name = raw_field()
    image = raw_field()
    command = raw_field()
    args = raw_field()
    working_dir = raw_field()
    env = raw_field()
    env_from = raw_field()
    security_context = raw_field()
    volume_mounts = raw_field()
    volume_devices = raw_field()


class PodSpecView(Raw):
    """A pod's ``spec``, from the API server or as a backend builds it: the fields that confine
    the pod (backends/confinement.py), each as it is held (absent: None), and its containers."""

    __slots__ = ()
    runtime_class_name = raw_field()
    service_account_name = raw_field()
    automount_service_account_token = raw_field()
    host_network = raw_field()
    host_pid = raw_field("hostPID")
    host_ipc = raw_field("hostIPC")
    host_users = raw_field()
    share_process_namespace = raw_field()
    security_context = raw_field()
    volumes = raw_field()

    @property
    def containers(self) -> list[ContainerSpecView]:
        return self._containers("containers")

    @property
    def init_containers(self) -> list[ContainerSpecView]:
        return self._containers("initContainers")

    @property
    def ephemeral_containers(self) -> list[ContainerSpecView]:
        return self._containers("ephemeralContainers")

    def _containers(self, key: str) -> list[ContainerSpecView]:
        return [ContainerSpecView(c) for c in sequence(self._raw.get(key))]
