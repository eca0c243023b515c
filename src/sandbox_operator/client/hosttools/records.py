"""What the host can vouch for about one host-tool call: its record and its answer's delivery.

A module of its own because both the registry that makes these records and the errors that carry
them need it: neither imports the other for it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Delivery(StrEnum):
    """Whether a call's answer is known to have reached the guest."""

    PENDING = "pending"
    """Handled; the channel has not yet reported the write-back."""
    DELIVERED = "delivered"
    """The answer was written where the guest reads it."""
    UNCERTAIN = "delivery_uncertain"
    """The write-back failed or was interrupted: the guest may or may not have it."""


@dataclass(frozen=True)
class HostToolCallRecord:
    """What one call did, as far as the host can vouch for it."""

    sequence: int
    tool: str
    refusal: str | None
    """The refusal's class name (``HostToolFailed`` when the body raised), else ``None``."""
    executed: bool
    """The tool body was entered."""
    completed: bool
    """The tool body returned: its effect committed, as far as the host knows."""
    delivery: Delivery
    response_bytes: int
    """Bytes confirmed delivered; 0 unless ``delivery`` is ``DELIVERED`` (never read 0 as "no
    effect": ``completed`` says that)."""
