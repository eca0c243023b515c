"""The base of every view: a read-only mapping over one wire dict, and its ``metadata``.

Why its own module: every kind's view (Sandbox, SandboxScope, SandboxWarmPool, Pod) reads the
same metadata the same way; the fields are named here once. ``kubeobj.meta`` stays the one
place an absent or null ``metadata`` is answered for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Self, TypeVar

from sandbox_operator import kubeobj
from sandbox_operator.views.fields import (
    EMPTY,
    Field,
    count_field,
    mapping,
    mapping_field,
    optional_int,
    raw_field,
    sequence,
    text_field,
    timestamp,
    truthy,
)


class Raw(Mapping[str, Any]):
    """A read-only mapping over a dict of the wire (the dict itself, not a copy)."""

    __slots__ = ("_raw",)

    def __init__(self, raw: Mapping[str, Any] | None) -> None:
        self._raw: Mapping[str, Any] = EMPTY if raw is None else raw

    @classmethod
    def of(cls, obj: Mapping[str, Any] | None) -> Self:
        """``obj`` when it is already this view, else a view over it."""
        return obj if isinstance(obj, cls) else cls(obj)

    @property
    def raw(self) -> Mapping[str, Any]:
        """The wire dict under the view (to encode, or to hand to a model's validation)."""
        return self._raw

    def __getitem__(self, key: str) -> Any:
        return self._raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._raw!r})"


R = TypeVar("R", bound=Raw)


class OwnerRef(Raw):
    """One entry of ``metadata.ownerReferences``."""

    __slots__ = ()
    kind = text_field()
    name = text_field()
    uid = text_field()
    controller = Field(lambda v: v is True)


class ManagedFieldsEntry(Raw):
    """One entry of ``metadata.managedFields``: who wrote, when, and to which subresource."""

    __slots__ = ()
    manager = text_field()
    subresource = text_field()
    #: ``time`` parsed (memoised per string).
    time = Field(timestamp)


class MetaView(Raw):
    """An object's ``metadata``: identity, version, labels, annotations, owners, finalizers and
    the two timestamps (each parsed once for this view)."""

    __slots__ = ("_times",)
    name = text_field()
    namespace = text_field()
    uid = text_field()
    resource_version = text_field()
    generation = count_field()
    labels: Field[Mapping[str, str]] = mapping_field()
    annotations: Field[Mapping[str, str]] = mapping_field()
    finalizers: Field[Sequence[str]] = Field(sequence)
    #: As the wire says it (RFC 3339 UTC: string order is time order).
    creation_timestamp = text_field()
    #: Whether the object is being deleted (its ``deletionTimestamp`` is set).
    deleting = Field(truthy, "deletionTimestamp")
    #: Not the wire's: the size of the annotations, as the operator's watch caches record it
    #: when it is large (reconcile/slim.py); 0 when not recorded.
    annotations_size = count_field("annotationsSize")
    #: ``deletionGracePeriodSeconds``: None when not being deleted (or not said).
    deletion_grace_period_seconds: Field[int | None] = Field(optional_int)

    def __init__(self, raw: Mapping[str, Any] | None) -> None:
        super().__init__(raw)
        self._times: dict[str, datetime | None] = {}

    @property
    def owner_references(self) -> list[OwnerRef]:
        return [OwnerRef(o) for o in sequence(self._raw.get("ownerReferences")) if o is not None]

    @property
    def managed_fields(self) -> list[ManagedFieldsEntry]:
        found = sequence(self._raw.get("managedFields"))
        return [ManagedFieldsEntry(m) for m in found if m is not None]

    @property
    def created(self) -> datetime | None:
        return self._time("creationTimestamp")

    @property
    def deleted_at(self) -> datetime | None:
        return self._time("deletionTimestamp")

    def _time(self, key: str) -> datetime | None:
        if key not in self._times:
            self._times[key] = timestamp(self._raw.get(key))
        return self._times[key]


class ObjectView(Raw):
    """A whole object: its ``metadata`` (a view, made once) and its raw ``spec``/``status``."""

    __slots__ = ("_meta",)
    api_version = text_field()
    kind = text_field()
    #: The raw spec (for a contract model's validation: the wire boundary).
    spec = mapping_field()
    raw_status = mapping_field("status")

    def __init__(self, raw: Mapping[str, Any] | None) -> None:
        super().__init__(raw)
        self._meta: MetaView | None = None

    @property
    def metadata(self) -> MetaView:
        if self._meta is None:
            self._meta = MetaView(kubeobj.meta(self._raw))
        return self._meta

    @property
    def key(self) -> tuple[str, str]:
        """(namespace, name)."""
        return self.metadata.namespace, self.metadata.name


class ListView(ObjectView):
    """A list answer (``…List``): its items as the wire holds them, and the list's
    ``metadata.resourceVersion`` a watch starts from."""

    __slots__ = ()
    objects: Field[Sequence[Any]] = Field(sequence, "items")


#: The event types that carry an object's new state (a BOOKMARK or ERROR carries none).
OBJECT_EVENTS = frozenset({"ADDED", "MODIFIED", "DELETED"})


class WatchEvent(Raw):
    """One event of a watch stream: its type (ADDED, MODIFIED, DELETED, BOOKMARK, ERROR) and
    the object as the stream decoded it."""

    __slots__ = ()
    type = text_field()
    object = raw_field()

    @property
    def changes_object(self) -> bool:
        """An ADDED, MODIFIED or DELETED event with an object (not a bookmark or an error)."""
        return self.type in OBJECT_EVENTS and isinstance(self.object, Mapping)


def on_the_wire(view: Raw) -> bool:
    """Whether a nested view's field was sent as a mapping (an absent, null or mistyped one is
    read through the shared empty mapping, and so says no)."""
    return view.raw is not EMPTY


def nested(view: type[R]) -> Callable[[object], R]:
    """A reader making ``view`` over a nested mapping (absent: over an empty one)."""
    return lambda value: view(mapping(value))
