"""Declared fields of a view: one line names a field, its wire key and how it is read.

Why its own module: a view is a list of fields, and writing each as a property spelled the key
and the absent-field answer again each time. A ``Field`` is a descriptor: its wire key is the
attribute's name in camelCase (the contract models' alias rule, so a view's field and the
model's field share a name) unless given, and reading it applies one reader to the raw value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Final, Generic, Protocol, Self, TypeVar, overload

from pydantic.alias_generators import to_camel

from sandbox_operator.kubeapi import parse_time

T = TypeVar("T")

#: A shared empty mapping for an absent or null field (never written into).
EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})


class HasRaw(Protocol):
    @property
    def raw(self) -> Mapping[str, Any]: ...


class Field(Generic[T]):
    """One field of a view: ``read(raw.get(key))`` on each access (nothing is copied); with
    ``under``, the key is read inside that mapping of the object (``spec``)."""

    __slots__ = ("key", "read", "under")

    def __init__(
        self, read: Callable[[object], T], key: str | None = None, *, under: str | None = None
    ) -> None:
        self.read = read
        self.key = key or ""
        self.under = under

    def __set_name__(self, owner: type, name: str) -> None:
        if not self.key:
            self.key = to_camel(name)

    @overload
    def __get__(self, obj: None, owner: type) -> Self: ...
    @overload
    def __get__(self, obj: HasRaw, owner: type) -> T: ...
    def __get__(self, obj: HasRaw | None, owner: type) -> T | Self:
        if obj is None:
            return self
        where = obj.raw if self.under is None else mapping(obj.raw.get(self.under))
        return self.read(where.get(self.key))


def field_keys(view: type, under: str | None = None) -> dict[str, str]:
    """The view's declared fields (those directly in the object, or ``under`` one of its
    mappings): attribute name -> wire key."""
    return {
        name: attr.key
        for klass in reversed(view.__mro__)
        for name, attr in vars(klass).items()
        if isinstance(attr, Field) and attr.under == under
    }


# ---- readers: the answer for an absent, null or mistyped value included -------------------------


@lru_cache(maxsize=8192)
def _parse_text(value: str) -> datetime | None:
    return parse_time(value)


def timestamp(value: object) -> datetime | None:
    """A wire timestamp as an aware datetime, ``None`` when absent or unreadable; the parse of a
    given string is done once (memoised), whichever view asks."""
    if isinstance(value, str):
        return _parse_text(value)
    return parse_time(value)


def mapping(value: object) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else the shared empty one (an absent or null field)."""
    return value if isinstance(value, Mapping) else EMPTY


def sequence(value: object) -> Sequence[Any]:
    """``value`` when it is a list, else an empty one."""
    return value if isinstance(value, list) else ()


def text(value: object) -> str:
    """A string field: empty when absent or null."""
    return "" if value is None else str(value)


def count(value: object) -> int:
    """An integer field: 0 when absent, null or not a number."""
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str | float):
        try:
            return int(value)
        except ValueError:
            return 0
    return 0


def optional_int(value: object) -> int | None:
    """An integer field: None when absent or not an integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def flag(value: object) -> bool:
    """A boolean field: true only when the wire says ``true``."""
    return value is True


def truthy(value: object) -> bool:
    return bool(value)


def raw(value: object) -> Any:
    """The value as the wire holds it (a field whose shape its reader judges)."""
    return value


def text_field(key: str | None = None, *, under: str | None = None) -> Field[str]:
    return Field(text, key, under=under)


def count_field(key: str | None = None, *, under: str | None = None) -> Field[int]:
    return Field(count, key, under=under)


def time_field(key: str | None = None, *, under: str | None = None) -> Field[datetime | None]:
    return Field(timestamp, key, under=under)


def mapping_field(key: str | None = None, *, under: str | None = None) -> Field[Mapping[str, Any]]:
    return Field(mapping, key, under=under)


def raw_field(key: str | None = None, *, under: str | None = None) -> Field[Any]:
    return Field(raw, key, under=under)
