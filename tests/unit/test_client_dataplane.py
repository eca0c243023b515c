"""Pieces of the exec protocol that do not need a pod: status and header parsing."""

from __future__ import annotations

import json

import pytest

from sandbox_operator.client.dataplane import _exit_code, _parse_size, _split_header
from sandbox_operator.client.errors import DataPlaneError


def test_exit_code_from_status_channel() -> None:
    assert _exit_code(json.dumps({"status": "Success"}).encode()) == 0
    failure = {
        "status": "Failure",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "42"}]},
    }
    assert _exit_code(json.dumps(failure).encode()) == 42
    assert _exit_code(b"") is None
    with pytest.raises(DataPlaneError):
        _exit_code(json.dumps({"status": "Failure", "reason": "InternalError"}).encode())
    with pytest.raises(DataPlaneError):
        _exit_code(b"not json")


def test_pid_header() -> None:
    assert _split_header(b"SBX:pid:123:group\nrest") == (123, "group", b"rest")
    assert _split_header(b"SBX:pid:7:process\n") == (7, "process", b"")
    assert _split_header(b"no header") == (None, "nothing", b"no header")


def test_size_line() -> None:
    assert _parse_size(b"SBX:size:1024\n") == 1024
    assert _parse_size(b"") is None
