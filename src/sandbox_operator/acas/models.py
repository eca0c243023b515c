"""Response models of the ACA sandboxes API, read leniently (unknown fields ignored, open enums).

Only the fields this backend reads are modelled; the service may send many more (reference
section 3.1), and states outside the declared enum (`Failed`, `Deleting`, `Suspended`) are kept
as plain strings.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

#: The ``servedBy.kind`` of a Sandbox served by an ACA sandbox (the driver writes it, the
#: client's data plane is chosen by it).
REMOTE_KIND = "AcasSandbox"


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class SandboxState:
    """Known values of the open `state` string."""

    CREATING = "Creating"
    RUNNING = "Running"
    IDLE = "Idle"
    STOPPING = "Stopping"
    STOPPED = "Stopped"
    STOP_FAILED = "StopFailed"
    # outside the declared enum, tolerated like the SDK does
    FAILED = "Failed"
    DELETING = "Deleting"
    SUSPENDED = "Suspended"


class StateDetails(_Wire):
    stopped_reason: str | None = None
    stopped_at: datetime | None = None


class RemoteSandbox(_Wire):
    """A sandbox as the service reports it."""

    id: str
    labels: dict[str, str] = Field(default_factory=dict)
    state: str | None = None
    state_details: StateDetails | None = None
    created_at: datetime | None = None
    resources: dict[str, Any] | None = None
    lifecycle: dict[str, Any] | None = None
    egress_policy: dict[str, Any] | None = None

    @field_validator("labels", mode="before")
    @classmethod
    def _labels(cls, value: Any) -> Any:
        return {} if value is None else value


class ExecResult(_Wire):
    """`SandboxExecuteCommandResponse`: a non-zero exit code is still HTTP 200."""

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    execution_time_ms: int = 0


class FileInfo(_Wire):
    name: str
    path: str
    size: int = 0
    mode: int = 0
    is_dir: bool = False
    is_symlink: bool = False
    symlink_target: str = ""
    modified_time: int = 0

    @field_validator("symlink_target", mode="before")
    @classmethod
    def _target(cls, value: Any) -> Any:
        return "" if value is None else value


class DirListing(_Wire):
    path: str = ""
    entries: list[FileInfo] = Field(default_factory=list)


class FileOpStatus(_Wire):
    success: bool
    error: str | None = None
    message: str | None = None


class WriteFileResult(_Wire):
    success: bool
    error: str | None = None
    bytes_written: int | None = None
