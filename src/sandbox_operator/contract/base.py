"""The base of every contract model (camelCase wire spelling, unknown fields refused, frozen),
the shared bounds and patterns, the enum-set field types and the transfer limits: what the spec,
the backend declarations and the host policy all build on."""

from __future__ import annotations

import re
from typing import Annotated, Any, Final

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

from .enums import (
    Capability,
    Egress,
    Isolation,
    IsolationScope,
    OsFamily,
    parse_isolation,
)

MiB: Final = 1024 * 1024

#: Longest string the key fields may carry (a DNS subdomain's length).
KEY_MAX_LENGTH: Final = 253
#: Most hosts an egress allowlist may name.
EGRESS_ALLOW_MAX_ITEMS: Final = 64
#: Most outputs a spec may declare.
DECLARED_OUTPUTS_MAX_ITEMS: Final = 64
#: Most entries a spec's ``labels`` may hold, and the longest key and value: bounds for the API
#: server's validation cost, never a judgement of what a host's vocabulary says.
LABELS_MAX_ITEMS: Final = 64
LABEL_KEY_MAX_LENGTH: Final = 253
LABEL_VALUE_MAX_LENGTH: Final = 1024
#: Longest host name (DNS).
HOST_MAX_LENGTH: Final = 253
#: Longest relative output path.
PATH_MAX_LENGTH: Final = 1024

#: Characters that change how a string reads without being seen: C1 controls, the soft hyphen,
#: bidirectional controls (embeddings, overrides, isolates, marks: "Trojan Source"), zero-width
#: spaces and joiners, invisible operators and the byte-order mark. Two keys that look alike must
#: be alike, so key parts (and paths) refuse them. The C1 range is a regex escape, the rest are
#: literal characters: the pattern below is then the same text for Python, pydantic's engine and
#: RE2 (the API server's), and survives YAML (Go's YAML reads an escaped "\x80" as a raw byte).
INVISIBLE_CHARACTERS: Final = (
    "\\x80-\\x9f\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064"
    "\u2066-\u206f\ufeff\ufff9-\ufffb"
)
#: A string without C0 control characters, DEL or :data:`INVISIBLE_CHARACTERS` (key parts,
#: workDir, output paths). A pattern, not only a validator, so the CRD carries it and the API
#: server refuses such a spec with a 422 instead of the operator failing it after it was
#: accepted.
NO_CONTROL_PATTERN: Final = "^[^\\x00-\\x1f\\x7f" + INVISIBLE_CHARACTERS + "]*$"
#: As :data:`NO_CONTROL_PATTERN`, and not empty.
NON_EMPTY_NO_CONTROL_PATTERN: Final = "^[^\\x00-\\x1f\\x7f" + INVISIBLE_CHARACTERS + "]+$"
#: One C0 control character, DEL or :data:`INVISIBLE_CHARACTERS`: what the validators of key
#: parts and workDir search for, to say which rule a value broke before the pattern would.
CONTROL_OR_INVISIBLE: Final = re.compile("[\\x00-\\x1f\\x7f" + INVISIBLE_CHARACTERS + "]")


class ContractModel(BaseModel):
    """Base of every contract model: camelCase aliases, unknown fields refused, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """JSON-ready dict in the camelCase wire spelling, without unset optional fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def _parse_isolation_input(value: object) -> object:
    if isinstance(value, str):
        return parse_isolation(value)
    return value


#: An ``Isolation`` field: strings are parsed strictly (unknown and retired spellings refused).
IsolationValue = Annotated[Isolation, BeforeValidator(_parse_isolation_input)]


def _ordered_values(values: frozenset[Any]) -> list[str]:
    """Serialize an enum set in the enum's definition order, so output is deterministic."""
    if not values:
        return []
    enum_type = type(next(iter(values)))
    return [member.value for member in enum_type if member in values]


_SetSerializer = PlainSerializer(_ordered_values, return_type=list[str], when_used="json")

CapabilitySet = Annotated[frozenset[Capability], _SetSerializer]
EgressSet = Annotated[frozenset[Egress], _SetSerializer]
OsFamilySet = Annotated[frozenset[OsFamily], _SetSerializer]
IsolationScopeSet = Annotated[frozenset[IsolationScope], _SetSerializer]


class TransferLimits(ContractModel):
    """Ceilings on one direction of file transfer. All three bound a transfer together."""

    max_bytes_per_file: int = Field(
        default=8 * MiB,
        ge=0,
        le=1 << 40,
        description="Largest single file, in bytes.",
    )
    max_total_bytes: int = Field(
        default=32 * MiB,
        ge=0,
        le=1 << 42,
        description="Largest sum of all files in one transfer, in bytes.",
    )
    max_files: int = Field(
        default=64,
        ge=0,
        le=100_000,
        description="Most files in one transfer.",
    )

    @model_validator(mode="after")
    def _per_file_within_total(self) -> TransferLimits:
        if self.max_bytes_per_file > self.max_total_bytes:
            raise ValueError(
                f"maxBytesPerFile ({self.max_bytes_per_file}) exceeds maxTotalBytes "
                f"({self.max_total_bytes})"
            )
        return self


#: The default ceilings, also what a backend that declares no limits is held to.
DEFAULT_TRANSFER_LIMITS: Final = TransferLimits()
