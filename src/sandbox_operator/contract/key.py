"""The key of a sandbox: ``(scope, thread_id, agent_dir, call_id)``, the one sandbox a caller may
reach.

Its own module because the key is what the operator, the client and the labels agree on, apart
from any spec: every part is refused when it holds a control or invisible character (two keys
that look alike must be alike).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator
from pydantic.alias_generators import to_camel

from .base import CONTROL_OR_INVISIBLE, KEY_MAX_LENGTH, ContractModel


def check_key_part(value: str, field: str, *, allow_empty: bool = False) -> str:
    """``value`` as a part of a key named ``field``: not empty (unless allowed) and free of
    control and invisible characters, so a key part that reads like another is another."""
    if not value and not allow_empty:
        raise ValueError(f"{field} must not be empty")
    if CONTROL_OR_INVISIBLE.search(value):
        raise ValueError(
            f"{field} must not contain control characters or invisible formatting characters "
            "(bidirectional controls, zero-width characters)"
        )
    return value


class SandboxKey(ContractModel):
    """The one sandbox a caller may reach: ``(scope, thread_id, agent_dir, call_id)``.

    ``call_id`` is empty unless the workload runs one sandbox per call.
    """

    scope: str = Field(max_length=KEY_MAX_LENGTH, description="Tenant or scope of the caller.")
    thread_id: str = Field(max_length=KEY_MAX_LENGTH, description="Conversation thread.")
    agent_dir: str = Field(max_length=KEY_MAX_LENGTH, description="Agent the sandbox belongs to.")
    call_id: str = Field(
        default="",
        max_length=KEY_MAX_LENGTH,
        description="Call the sandbox serves; empty unless the isolation scope is call.",
    )

    @field_validator("scope", "thread_id", "agent_dir")
    @classmethod
    def _non_empty(cls, value: str, info: Any) -> str:
        return check_key_part(value, to_camel(info.field_name))

    @field_validator("call_id")
    @classmethod
    def _call_id_clean(cls, value: str) -> str:
        return check_key_part(value, "callId", allow_empty=True)
