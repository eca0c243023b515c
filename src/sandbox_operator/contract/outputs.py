"""The artifacts a workload declares it produces (``declaredOutputs``): each a literal path
under workDir, with its media type and where it lands.

Its own module because what a declared output may name (one file, relative, no globs, no '.' or
'..' segments, no control or invisible characters) is a rule of its own, which the client's file
transfer and the CRD's schema both rely on.
"""

from __future__ import annotations

import re
from typing import Any, Final

from pydantic import Field, field_validator

from .base import INVISIBLE_CHARACTERS, PATH_MAX_LENGTH, ContractModel
from .enums import Disposition
from .workdir import DRIVE_LETTER_PATTERN

#: A literal relative path: no leading '/', no empty segments, no backslashes, no control
#: characters and no glob characters ('*', '?', '['): a declared output names one file, never a
#: pattern ('.'/'..' segments and drive letters are checked apart, by CEL in the CRD).
_PATH_SEGMENT: Final = r"[^/\\*?\[\x00-\x1f\x7f" + INVISIBLE_CHARACTERS + "]+"
RELATIVE_PATH_PATTERN: Final = f"^{_PATH_SEGMENT}(/{_PATH_SEGMENT})*$"

_SEGMENT_FORBIDDEN = re.compile("[\\x00-\\x1f\\x7f\\\\" + INVISIBLE_CHARACTERS + "]")
_GLOB = re.compile(r"[*?\[]")


def _check_relative_path(value: str, what: str) -> str:
    if not value:
        raise ValueError(f"{what} must not be empty")
    if value.startswith("/") or re.match(DRIVE_LETTER_PATTERN, value):
        raise ValueError(f"{what} {value!r} must be relative to workDir, not absolute")
    if _SEGMENT_FORBIDDEN.search(value):
        raise ValueError(
            f"{what} {value!r} must not contain backslashes, control characters or invisible "
            "formatting characters (bidirectional controls, zero-width characters)"
        )
    if _GLOB.search(value):
        raise ValueError(
            f"{what} {value!r} must be a literal path: glob characters (*, ?, [) are not allowed"
        )
    for segment in value.split("/"):
        if segment in ("", ".", ".."):
            raise ValueError(f"{what} {value!r} must not contain empty, '.' or '..' segments")
    return value


class DeclaredOutput(ContractModel):
    """One artifact a workload produces, named in advance as a literal path under workDir."""

    path: str = Field(
        max_length=PATH_MAX_LENGTH,
        pattern=RELATIVE_PATH_PATTERN,
        description="Literal path of the artifact, relative to workDir (no globs, no '..').",
    )
    media_type: str = Field(
        max_length=255,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*$",
        description="Declared media type (e.g. image/png); declared, never sniffed.",
    )
    required: bool = Field(
        default=True,
        description="When false, the artifact's absence is normal rather than an error.",
    )
    name: str | None = Field(
        default=None,
        max_length=PATH_MAX_LENGTH,
        pattern=RELATIVE_PATH_PATTERN,
        description="Name the artifact lands under; defaults to path.",
    )
    disposition: Disposition = Field(
        default=Disposition.LAND,
        description="land: delivered to the host's sink; consume: parsed by the declaring kind.",
    )

    # Before the pattern constraint, so a person gets the specific reason.
    @field_validator("path", "name", mode="before")
    @classmethod
    def _relative(cls, value: object, info: Any) -> object:
        if isinstance(value, str):
            return _check_relative_path(value, info.field_name)
        return value

    @property
    def landing_name(self) -> str:
        """The name the artifact lands under."""
        return self.name or self.path
