"""A cancelled exec kills its process group and says what the kill reached; a sandbox left
running what nobody owns (a cancel or timeout whose kill fell short, a host-tool run not ended,
a run directory not removed) is unclean: its handle refuses every further use and the Sandbox is
disposed (#25 item 1). On local processes: the wrapper and its kill are the pods' own scripts."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from sandbox_operator.client import ExecCancelled, ExecTimeout, Sandbox, SandboxUnclean
from sandbox_operator.client.dataplane import scripts
from sandbox_operator.client.dataplane.execplane import ExecDataPlane, RawResult
from sandbox_operator.client.dataplane.local import LocalExecTransport
from sandbox_operator.contract import Capability, SandboxSpec
from sandbox_operator.testing import local_sandbox


def exists(path: Path) -> bool:
    return path.exists()


async def wait_for_file(path: Path, seconds: float) -> bool:
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        if exists(path):
            return True
        await asyncio.sleep(0.02)
    return exists(path)


async def started(path: Path) -> None:
    assert await wait_for_file(path, 10), "the command never started"


async def test_a_cancelled_exec_kills_its_group_and_nothing_it_started_writes_after(
    tmp_path: Path,
) -> None:
    """The reported reproduction: a file the command writes after the cancel never appears,
    nor one a child it started writes; the handle stays usable (the kill reached the group)."""
    box = local_sandbox()
    began, late, child = tmp_path / "began", tmp_path / "late", tmp_path / "child"
    script = f"touch {began}; (sleep 0.6; touch {child}) & sleep 0.6; touch {late}"
    call = asyncio.ensure_future(box.exec(script, timeout=30))
    await started(began)
    call.cancel()
    with pytest.raises(ExecCancelled) as raised:
        await call
    assert call.cancelled()  # still a cancellation, to asyncio and to the caller's task
    assert raised.value.kill_delivered and raised.value.kill_reach == "group"
    assert not await wait_for_file(late, 1.5) and not exists(child)
    assert box.unclean is None
    assert (await box.exec("echo ok", timeout=10)).stdout == b"ok\n"


class Lifecycle:
    """Records the disposals a handle asks for."""

    def __init__(self) -> None:
        self.disposed: list[tuple[str, str | None]] = []

    async def dispose(self, sandbox: Any, *, wait: bool = False, uid: str | None = None) -> None:
        self.disposed.append((sandbox if isinstance(sandbox, str) else sandbox.name, uid))

    async def suspend(self, sandbox: Any, *, wait: bool, timeout: float | None) -> None:  # noqa: ASYNC109
        raise AssertionError("not used")

    async def resume(self, sandbox: Any, *, wait: bool, timeout: float | None) -> None:  # noqa: ASYNC109
        raise AssertionError("not used")


class KillRefused(LocalExecTransport):
    """Local processes whose kill exec fails (a sandbox that refuses, a broken stream)."""

    async def run(self, argv: Sequence[str], **kw: Any) -> RawResult:
        if tuple(argv[: len(scripts.KILL)]) == scripts.KILL:
            return RawResult(1, b"", b"kill refused")
        return await super().run(argv, **kw)


def handle(transport: LocalExecTransport, lifecycle: Lifecycle, root: Path) -> Sandbox:
    spec = SandboxSpec.model_validate(
        {
            "kind": "local",
            "image": "local",
            "work_dir": str(root / "work"),
            "requires": frozenset(Capability),
        }
    )
    resource = {"metadata": {"name": "sbx-a", "uid": "uid-a"}}
    return Sandbox(
        spec,
        ExecDataPlane(transport),
        name="sbx-a",
        namespace="ns",
        lifecycle=lifecycle,  # type: ignore[arg-type]
        resource=resource,
    )


async def test_a_cancel_whose_kill_fails_leaves_the_sandbox_unclean_and_disposed(
    tmp_path: Path,
) -> None:
    lifecycle = Lifecycle()
    box = handle(KillRefused(), lifecycle, tmp_path)
    began = tmp_path / "began"
    call = asyncio.ensure_future(box.exec(f"touch {began}; sleep 5", timeout=30))
    await started(began)
    call.cancel()
    with pytest.raises(ExecCancelled) as raised:
        await call
    assert not raised.value.kill_delivered and raised.value.kill_reach == "nothing"
    assert box.unclean is not None and "cancelled" in box.unclean
    await asyncio.sleep(0)  # the disposal runs in the background
    assert lifecycle.disposed == [("sbx-a", "uid-a")]  # that very object, by uid
    with pytest.raises(SandboxUnclean) as refused:
        await box.exec("echo again", timeout=10)
    assert refused.value.sandbox == "sbx-a" and "cancelled" in refused.value.reason
    with pytest.raises(SandboxUnclean):
        await box.read_file("anything")
    # Told once: a second failure does not dispose twice.
    box._become_unclean("again")
    await asyncio.sleep(0)
    assert len(lifecycle.disposed) == 1


async def test_a_timeout_whose_kill_fails_leaves_the_sandbox_unclean(tmp_path: Path) -> None:
    lifecycle = Lifecycle()
    box = handle(KillRefused(), lifecycle, tmp_path)
    with pytest.raises(ExecTimeout) as raised:
        await box.exec("sleep 3", timeout=0.3)
    assert not raised.value.kill_delivered
    await asyncio.sleep(0)
    assert box.unclean is not None and lifecycle.disposed == [("sbx-a", "uid-a")]
    # A timeout whose kill reached the group leaves it clean.
    clean = handle(LocalExecTransport(), Lifecycle(), tmp_path)
    with pytest.raises(ExecTimeout) as reached:
        await clean.exec("sleep 3", timeout=0.3)
    assert reached.value.kill_reach == "group" and clean.unclean is None


async def test_a_run_directory_that_cannot_be_removed_leaves_the_sandbox_unclean(
    tmp_path: Path,
) -> None:
    """A failed reclaim leaves a run's files readable to every later run there: the sandbox is
    not handed to another call."""
    from sandbox_operator.client.hosttools import reclaim_run
    from sandbox_operator.client.hosttools.layout import guest_run_layout

    lifecycle = Lifecycle()
    box = handle(LocalExecTransport(), lifecycle, tmp_path)

    async def refuse(directory: str) -> None:
        raise OSError("read-only file system")

    box.reclaim = refuse  # type: ignore[method-assign]
    assert await reclaim_run(box, guest_run_layout(box)) is False
    await asyncio.sleep(0)
    assert box.unclean is not None and "not removed" in box.unclean
    assert lifecycle.disposed == [("sbx-a", "uid-a")]
