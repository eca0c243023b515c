"""Views of the core kinds the operator watches beside pods: Events and Namespaces.

Why its own module: the runtime-class driver learns of a node lacking a RuntimeClass's handler
from the kubelet's Events, and the backends document is published into namespaces a watch
reports; each reads a few fields of objects that are not the operator's own.
"""

from __future__ import annotations

from sandbox_operator.views.fields import Field, text_field
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


class NamespaceView(ObjectView):
    """A Namespace: its name (metadata) and whether it is terminating."""

    __slots__ = ()
    phase = text_field(under="status")

    @property
    def terminating(self) -> bool:
        return self.phase == "Terminating"
