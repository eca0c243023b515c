"""The sync twins mirror the async API; condition evaluation maps reasons to outcomes."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from sandbox_operator.client import Sandbox, SandboxClient, SyncSandbox, SyncSandboxClient
from sandbox_operator.client.status import evaluate as _evaluate
from sandbox_operator.client.sync import _Loop
from sandbox_operator.testing.fakes import local_sandbox


def _public(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(fn)
        for name, fn in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


@pytest.mark.parametrize(
    ("aio", "sync"), [(Sandbox, SyncSandbox), (SandboxClient, SyncSandboxClient)]
)
def test_sync_twin_has_same_methods_and_parameters(aio: type, sync: type) -> None:
    a, s = _public(aio), _public(sync)
    # ``reach`` hands an async data plane to a tool running its own loop (the shell CLI)
    # ``dispose_soon`` returns a future of the client's own loop: an unclean handle's rule
    # calls it, never a caller
    skip = {"key_for", "reach", "dispose_soon"}
    assert set(a) - skip <= set(s), set(a) - set(s)
    for name in set(a) - skip:
        assert list(a[name].parameters) == list(s[name].parameters), name


def test_sync_sandbox_runs(tmp_path: Path) -> None:
    loop = _Loop()
    try:
        sb = SyncSandbox(local_sandbox(root=str(tmp_path)), loop)
        assert sb.exec(["echo", "x y"]).stdout == b"x y\n"
        sb.write_file("a/b", b"\x00\x01")
        assert sb.read_file("a/b") == b"\x00\x01"
        assert [e.name for e in sb.list_dir("a")] == ["b"]
        assert sb.remove("a", recursive=True) is True
    finally:
        loop.stop()


def obj(*conds: dict[str, Any], generation: int = 1, observed: int | None = 1) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": list(conds)}
    if observed is not None:
        status["observedGeneration"] = observed
    return {"metadata": {"generation": generation}, "status": status}


def c(type_: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


@pytest.mark.parametrize(
    ("o", "want"),
    [
        (obj(), ("pending", "Pending")),
        (
            obj(c("Admitted", "True", "Admitted"), c("Ready", "False", "Creating")),
            ("pending", "Creating"),
        ),
        (obj(c("Admitted", "True", "Admitted"), c("Ready", "True", "Ready")), ("ready", "Ready")),
        (obj(c("Admitted", "False", "IsolationBelowFloor")), ("terminal", "IsolationBelowFloor")),
        (obj(c("Admitted", "False", "ScopeNotFound")), ("terminal", "ScopeNotFound")),
        (
            obj(c("Admitted", "True", "Admitted"), c("Ready", "False", "StartupFailed")),
            ("terminal", "StartupFailed"),
        ),
        (obj(c("Disposed", "True", "Disposed")), ("terminal", "Disposed")),
        # A status computed for an older generation says nothing about this one.
        (obj(c("Ready", "True", "Ready"), generation=2, observed=1), ("pending", "Pending")),
    ],
)
def test_evaluate(o: dict[str, Any], want: tuple[str, str]) -> None:
    state, reason, _ = _evaluate(o)
    assert (state, reason) == want
