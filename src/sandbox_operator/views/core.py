"""Views of the core kinds the operator watches beside pods: Events and Namespaces.

Why its own module: the runtime-class driver learns of a node lacking a RuntimeClass's handler
from the kubelet's Events, and the backends document is published into namespaces a watch
reports; each reads a few fields of objects that are not the operator's own.
"""

from __future__ import annotations

from collections.abc import Mapping

from sandbox_operator.views.fields import Field, mapping, optional_int, sequence, text, text_field
from sandbox_operator.views.objects import ObjectView, Raw, nested


class ObjectRefView(Raw):
    """A reference to another object (an Event's ``involvedObject``)."""

    __slots__ = ()
    kind = text_field()
    name = text_field()
    namespace = text_field()
    uid = text_field()


class EventView(ObjectView):
    """A core/v1 Event: what happened (reason, message) to which object."""

    __slots__ = ()
    reason = text_field()
    message = text_field()
    involved_object: Field[ObjectRefView] = Field(nested(ObjectRefView))


class StatusCauseView(Raw):
    """One entry of a Status's ``details.causes``."""

    __slots__ = ()
    reason = text_field()
    message = text_field()
    field = text_field()


class StatusDetailsView(Raw):
    """A Status answer's ``details``: which object the answer is about, and its causes."""

    __slots__ = ()
    kind = text_field()
    name = text_field()
    uid = text_field()

    @property
    def causes(self) -> list[StatusCauseView]:
        return [StatusCauseView(c) for c in sequence(self._raw.get("causes")) if c is not None]


class ApiStatusView(ObjectView):
    """The API's ``Status`` object: what a refused call's body says (``message``, ``reason``,
    ``code``), what a delete answers once the object is gone (``details``), and the last frame
    of an exec (``status: Success``, else an ``ExitCode`` cause)."""

    __slots__ = ()
    status = text_field()
    message = text_field()
    reason = text_field()
    code: Field[int | None] = Field(optional_int)
    details: Field[StatusDetailsView] = Field(nested(StatusDetailsView))

    @property
    def succeeded(self) -> bool:
        return self.status == "Success"

    def cause(self, reason: str) -> StatusCauseView | None:
        """The first cause of ``details.causes`` with ``reason`` (None: none has it)."""
        return next((c for c in self.details.causes if c.reason == reason), None)


class DeleteAnswerView(ApiStatusView):
    """What a delete answers: a ``Status`` (the object is gone), or the object as it is now
    (being deleted: in its grace period, or held by a finalizer)."""

    __slots__ = ()

    @property
    def is_status(self) -> bool:
        return self.kind == "Status"


class ServiceView(ObjectView):
    """A Service: its cluster IP and first port (the egress proxy's address)."""

    __slots__ = ()
    ports = Field(sequence, under="spec")

    @property
    def cluster_ip(self) -> str:
        """``spec.clusterIP`` ("None" for a headless Service; empty when unset). The client
        model's serialization names it ``cluster_ip``, also read."""
        spec = self.spec
        return text(spec.get("clusterIP") or spec.get("cluster_ip"))

    @property
    def first_port(self) -> int | None:
        """``spec.ports[0].port``: None when the Service declares none."""
        return optional_int(mapping(self.ports[0]).get("port")) if self.ports else None


class ConfigMapView(ObjectView):
    """A ConfigMap: its string ``data``."""

    __slots__ = ()
    data: Field[Mapping[str, str]] = Field(mapping)


class NamespaceView(ObjectView):
    """A Namespace: its name (metadata) and whether it is terminating."""

    __slots__ = ()
    phase = text_field(under="status")

    @property
    def terminating(self) -> bool:
        return self.phase == "Terminating"
