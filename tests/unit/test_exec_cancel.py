"""A cancelled exec kills its process group and says what the kill reached; a sandbox left
running what nobody owns (a cancel or timeout whose kill fell short, a host-tool run not ended,
a run directory not removed) is unclean: its handle refuses every further use and the Sandbox is
disposed (#25 item 1), and so is one whose exec went over its output budget or lost its stream
with a kill that fell short (#37 item 4). On local processes: the wrapper and its kill are the
pods' own scripts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sandbox_operator.client import (
    DataPlaneError,
    ExecCancelled,
    ExecQueuedTimeout,
    ExecStreamLost,
    ExecTimeout,
    OutputBudgetExceeded,
    Sandbox,
    SandboxUnclean,
)
from sandbox_operator.client.dataplane.execplane import ExecDataPlane
from sandbox_operator.client.dataplane.local import LocalExecTransport
from sandbox_operator.client.unclean import unclean_reason
from sandbox_operator.contract import Capability, SandboxSpec
from sandbox_operator.testing import local_sandbox
from tests.fixtures.faulty_transports import KillLate, KillRefused, StreamDrops


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


async def test_a_lost_stream_whose_kill_fails_leaves_the_sandbox_unclean(tmp_path: Path) -> None:
    """#37 item 4: the connection to a running command lost (and the kill after it refused):
    the command may run on, so the sandbox is unclean and disposed. Before, the handle raised a
    bare DataPlaneError and stayed clean."""
    lifecycle = Lifecycle()
    box = handle(StreamDrops(0.5, refuse_kill=True), lifecycle, tmp_path)
    with pytest.raises(ExecStreamLost) as raised:
        await box.exec("sleep 3", timeout=30)
    assert isinstance(raised.value, DataPlaneError)  # a transport failure to a caller
    assert not raised.value.kill_delivered and raised.value.kill_reach == "nothing"
    await asyncio.sleep(0)
    assert box.unclean is not None and "stream was lost" in box.unclean
    assert lifecycle.disposed == [("sbx-a", "uid-a")]
    with pytest.raises(SandboxUnclean):
        await box.exec("echo again", timeout=10)


async def test_a_lost_stream_kills_the_group_and_a_confirmed_kill_leaves_it_clean(
    tmp_path: Path,
) -> None:
    """The kill goes out over a new exec once the stream is lost: neither the command's late
    write nor a background child's appears, and a kill that reached the group keeps the
    sandbox in use."""
    lifecycle = Lifecycle()
    box = handle(StreamDrops(0.5), lifecycle, tmp_path)
    late, child = tmp_path / "late", tmp_path / "child"
    script = f"(sleep 1; touch {child}) & sleep 1; touch {late}"
    with pytest.raises(ExecStreamLost) as raised:
        await box.exec(script, timeout=30)
    assert raised.value.kill_delivered and raised.value.kill_reach == "group"
    assert not await wait_for_file(late, 1.5) and not exists(child)
    assert box.unclean is None and lifecycle.disposed == []


async def test_an_output_budget_kill_that_fails_leaves_the_sandbox_unclean(tmp_path: Path) -> None:
    """#37 item 4: output over the budget while the command runs, and its kill refused: the
    command may run on, so the sandbox is unclean and disposed. Before, it stayed clean."""
    lifecycle = Lifecycle()
    box = handle(KillRefused(), lifecycle, tmp_path)
    with pytest.raises(OutputBudgetExceeded) as raised:
        await box.exec("head -c 200000 /dev/zero; sleep 3", timeout=30, max_output_bytes=1000)
    assert not raised.value.kill_delivered and not raised.value.ended
    await asyncio.sleep(0)
    assert box.unclean is not None and "output budget" in box.unclean
    assert lifecycle.disposed == [("sbx-a", "uid-a")]
    with pytest.raises(SandboxUnclean):
        await box.run_code("print(1)", timeout=10)


async def test_an_output_budget_kill_that_reaches_the_group_or_a_command_that_ended_is_clean(
    tmp_path: Path,
) -> None:
    lifecycle = Lifecycle()
    box = handle(LocalExecTransport(), lifecycle, tmp_path)
    with pytest.raises(OutputBudgetExceeded) as killed:
        await box.exec("head -c 200000 /dev/zero; sleep 3", timeout=30, max_output_bytes=1000)
    assert killed.value.kill_delivered and killed.value.kill_reach == "group"
    # Over the budget by less than the transport's margin: judged once the command had ended.
    with pytest.raises(OutputBudgetExceeded) as ended:
        await box.exec("head -c 1100 /dev/zero", timeout=30, max_output_bytes=1000)
    assert ended.value.ended and not ended.value.kill_delivered
    await asyncio.sleep(0)
    assert box.unclean is None and lifecycle.disposed == []


async def test_a_group_the_kill_finds_already_ended_is_gone_and_clean(tmp_path: Path) -> None:
    """A kill that finds nothing left in the command's group (it ended by itself before the
    kill's exec ran) is ``gone``, no failed kill, so the sandbox stays in use; where the image
    had no process group to offer (``process``), a vanished process proves nothing of its
    children and reaches ``nothing``."""
    plane = ExecDataPlane(LocalExecTransport())
    ended = await asyncio.create_subprocess_exec("true")
    await ended.wait()  # reaped: neither its pid nor a group by that id is left
    assert await plane._kill(ended.pid, "group") == (False, "gone")
    assert await plane._kill(ended.pid, "process") == (False, "nothing")
    assert await ExecDataPlane(KillRefused())._kill(ended.pid, "group") == (False, "nothing")
    # Through a handle: output over the budget from a command that then ends by itself (its
    # pipe closed under it), its kill sent late.
    lifecycle = Lifecycle()
    box = handle(KillLate(1.0), lifecycle, tmp_path)
    with pytest.raises(OutputBudgetExceeded) as raised:
        await box.exec("yes | head -c 3000000", timeout=30, max_output_bytes=100_000)
    assert raised.value.kill_reach in ("gone", "group")  # a leader left a zombie is signalled
    await asyncio.sleep(0)
    assert box.unclean is None and lifecycle.disposed == []


def timeout(delivered: bool, reach: str) -> ExecTimeout:
    return ExecTimeout(
        argv=("x",), timeout=1, stdout=b"", stderr=b"", kill_delivered=delivered, kill_reach=reach
    )


def budget(delivered: bool, reach: str = "nothing", ended: bool = False) -> OutputBudgetExceeded:
    return OutputBudgetExceeded(
        budget=1, received=2, kill_delivered=delivered, kill_reach=reach, ended=ended
    )


@pytest.mark.parametrize(
    ("error", "unclean"),
    [
        (ExecCancelled(argv=("x",), kill_delivered=True, kill_reach="group"), False),
        (ExecCancelled(argv=("x",), kill_delivered=True, kill_reach="process"), True),
        (ExecCancelled(argv=("x",), kill_delivered=False, kill_reach="nothing"), True),
        (timeout(True, "group"), False),
        (timeout(True, "process"), True),
        (timeout(False, "nothing"), True),
        (timeout(False, "gone"), False),
        (budget(True, "group"), False),
        (budget(True, "process"), True),
        (budget(False), True),
        (budget(False, ended=True), False),
        (ExecStreamLost("lost", argv=("x",), kill_delivered=True, kill_reach="group"), False),
        (ExecStreamLost("lost", argv=("x",), kill_delivered=False, kill_reach="nothing"), True),
        (DataPlaneError("never started"), False),
        (ExecQueuedTimeout(argv=("x",), timeout=1, waited=1, waited_for="resume"), False),
    ],
)
def test_the_one_rule(error: BaseException, unclean: bool) -> None:
    """Unclean unless the kill reached the whole group (or nothing was left to kill)."""
    assert (unclean_reason(error) is not None) is unclean
