"""Views of the API server's envelopes around objects: a list, a watch event, and the ``Status``
object it answers a failure (or an exec's end) with.

Why its own module: these are not kinds the operator defines but the shapes every list, watch
and exec of the API comes in; the client, the maf backend and the egress observer each read
them, and read them the same way (``items`` and the list's ``resourceVersion``; an event's
``type`` and ``object``; a Status's ``status``, ``reason`` and ``details.causes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandbox_operator.views.fields import EMPTY, Field, sequence, text_field
from sandbox_operator.views.objects import ObjectView, Raw, nested

#: The event types that carry an object's new state (a BOOKMARK or ERROR carries none).
OBJECT_EVENTS = frozenset({"ADDED", "MODIFIED", "DELETED"})


class ListView(ObjectView):
    """A list's answer: its objects (``items``) and the list's ``metadata.resourceVersion``."""

    __slots__ = ()
    #: ``items`` (each a raw object: the caller reads it through its kind's view).
    entries: Field[list[Mapping[str, Any]]] = Field(
        lambda v: [i for i in sequence(v) if isinstance(i, Mapping)], "items"
    )


class WatchEventView(Raw):
    """One event of a watch: its ``type`` and the raw ``object`` (None when it carries none)."""

    __slots__ = ()
    type = text_field()
    object: Field[Mapping[str, Any] | None] = Field(lambda v: v if isinstance(v, Mapping) else None)

    @property
    def changes_object(self) -> bool:
        """An ADDED, MODIFIED or DELETED event with an object (not a bookmark or an error)."""
        return self.type in OBJECT_EVENTS and self.object is not None


class StatusCauseView(Raw):
    """One entry of a Status's ``details.causes``."""

    __slots__ = ()
    reason = text_field()
    message = text_field()
    field = text_field()


class StatusDetailsView(Raw):
    """A Status's ``details``."""

    __slots__ = ()
    name = text_field()
    kind = text_field()

    @property
    def causes(self) -> list[StatusCauseView]:
        return [StatusCauseView(c) for c in sequence(self._raw.get("causes")) if c is not None]


class ApiStatusView(Raw):
    """The API's ``Status`` object as a client reads it: a refused call's body, or the last
    frame of an exec (``status: Success``, else an ``ExitCode`` cause)."""

    __slots__ = ()
    status = text_field()
    reason = text_field()
    message = text_field()
    details: Field[StatusDetailsView] = Field(nested(StatusDetailsView))

    @property
    def succeeded(self) -> bool:
        return self.status == "Success"

    def cause(self, reason: str) -> StatusCauseView | None:
        """The first cause of ``details.causes`` with ``reason`` (None: none has it)."""
        return next((c for c in self.details.causes if c.reason == reason), None)


def on_the_wire(view: Raw) -> bool:
    """Whether a nested view's field was sent as a mapping (an absent, null or mistyped one is
    read through the shared empty mapping, and so says no)."""
    return view.raw is not EMPTY
