"""Streaming exec over a fake exec channel (#39 item 1): chunks handed over in order with the
wrapper's own lines held back, stdin and its end passed on, the output budget, the timeout, a
lost stream, a setup refusal, an early stop, a terminal's echo; the handle's unclean rule on a
stream whose kill fell short; the sync twin. The kill is the data plane's, over a fake transport
that records it. Then the same rules over local processes (the pods' own scripts, real
processes); the cluster twin is tests/e2e/test_client_streaming.py."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from sandbox_operator.client import (
    ExecCancelled,
    ExecSetupError,
    ExecStreamLost,
    ExecStreamUnsupported,
    ExecTimeout,
    ExitStatus,
    OutputBudgetExceeded,
    OutputChunk,
    Sandbox,
    SandboxUnclean,
)
from sandbox_operator.client.dataplane import scripts
from sandbox_operator.client.dataplane.execplane import ExecDataPlane, RawResult
from sandbox_operator.client.sync import SyncSandbox, _Loop
from sandbox_operator.client.unclean import unclean_reason
from sandbox_operator.contract import Capability, SandboxSpec
from sandbox_operator.testing import local_sandbox

Event = OutputChunk | ExitStatus | None


class FakeChannel:
    """Events are what a test puts in ``events``; what the caller sends is recorded."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.stdin: list[bytes] = []
        self.stdin_closed = False
        self.sizes: list[tuple[int, int]] = []
        self.closed = False

    def put(self, *events: Event) -> None:
        for e in events:
            self.events.put_nowait(e)

    async def receive(self) -> Event:
        return await self.events.get()

    async def send_stdin(self, data: bytes) -> None:
        self.stdin.append(data)

    async def close_stdin(self) -> None:
        self.stdin_closed = True

    async def resize(self, cols: int, rows: int) -> None:
        self.sizes.append((cols, rows))

    async def close(self) -> None:
        self.closed = True


class FakeTransport:
    """Opens :attr:`channel`; a kill (``run`` of a kill script) is recorded and answered with
    ``kill_exit``."""

    def __init__(self, kill_exit: int = 0) -> None:
        self.channel = FakeChannel()
        self.kill_exit = kill_exit
        self.opened: list[tuple[list[str], bool, bool]] = []
        self.kills: list[list[str]] = []

    async def open(self, argv: Sequence[str], *, stdin: bool, tty: bool) -> FakeChannel:
        self.opened.append((list(argv), stdin, tty))
        return self.channel

    async def run(self, argv: Sequence[str], **_: object) -> RawResult:
        self.kills.append(list(argv))
        return RawResult(self.kill_exit, b"", b"")

    async def close(self) -> None:
        return None


def out(data: bytes) -> OutputChunk:
    return OutputChunk("stdout", data)


def err(data: bytes) -> OutputChunk:
    return OutputChunk("stderr", data)


HEAD = err(b"SBX:pid:41:group\nSBX:run\n")


async def test_chunks_in_order_wrapper_lines_held_back_and_callbacks() -> None:
    transport = FakeTransport()
    seen: list[bytes] = []

    async def on_err(data: bytes) -> None:
        seen.append(data)

    plane = ExecDataPlane(transport)
    stream = await plane.open_stream(
        ["sh", "-c", "x"], cwd="/w", env={"A": "1"}, on_stdout=seen.append, on_stderr=on_err
    )
    # stdout may overtake the wrapper's lines on stderr: it waits for them
    transport.channel.put(
        out(b"first\n"),
        err(b"SBX:pid:41:gr"),
        err(b"oup\nSBX:run\nboom\n"),
        out(b"last\n"),
        ExitStatus(3),
    )
    items = [item async for item in stream]
    assert items == [out(b"first\n"), err(b"boom\n"), out(b"last\n"), ExitStatus(3)]
    assert seen == [b"first\n", b"boom\n", b"last\n"]
    assert (stream.pid, stream.reach, stream.exit_code) == (41, "group", 3)
    argv, stdin, tty = transport.opened[0]
    assert argv[2] == scripts.EXEC_OUTER and argv[4] == scripts.STREAM_INNER
    assert argv[5:] == ["0", "/w", "0", "1", "A=1", "sh", "-c", "x"]
    assert (stdin, tty) == (False, False)
    assert transport.kills == []  # it ended: nothing to kill


async def test_stdin_is_passed_on_and_ended() -> None:
    transport = FakeTransport()
    stream = await ExecDataPlane(transport).open_stream(["cat"], cwd="/w", stdin=True)
    assert transport.opened[0][0][7] == "1" and transport.opened[0][1] is True
    await stream.write_stdin(b"one\n")
    await stream.write_stdin("two\n")
    await stream.close_stdin()
    assert transport.channel.stdin == [b"one\n", b"two\n"]
    assert transport.channel.stdin_closed
    transport.channel.put(HEAD, out(b"one\ntwo\n"), ExitStatus(0))
    assert await stream.wait() == 0


async def test_output_over_budget_is_not_handed_over_and_kills_the_group() -> None:
    transport = FakeTransport()
    stream = await ExecDataPlane(transport).open_stream(["yes"], cwd="/w", max_output_bytes=10)
    transport.channel.put(HEAD, out(b"12345678"), out(b"901"))
    assert await anext(stream) == out(b"12345678")
    with pytest.raises(OutputBudgetExceeded) as info:
        await anext(stream)
    assert (info.value.received, info.value.budget) == (11, 10)
    assert (info.value.kill_delivered, info.value.kill_reach) == (True, "group")
    assert transport.kills == [[*scripts.KILL, "41"]]
    assert transport.channel.closed


async def test_timeout_kills_the_group() -> None:
    transport = FakeTransport()
    stream = await ExecDataPlane(transport).open_stream(["sleep", "9"], cwd="/w", timeout=0.3)
    transport.channel.put(HEAD, out(b"first\n"))
    assert await anext(stream) == out(b"first\n")
    with pytest.raises(ExecTimeout) as info:
        await anext(stream)
    assert (info.value.kill_delivered, info.value.kill_reach) == (True, "group")
    assert transport.kills == [[*scripts.KILL, "41"]]


async def test_a_stream_lost_before_the_exit_kills_the_group() -> None:
    transport = FakeTransport()
    stream = await ExecDataPlane(transport).open_stream(["sleep", "9"], cwd="/w")
    transport.channel.put(HEAD, None)
    with pytest.raises(ExecStreamLost) as info:
        await anext(stream)
    assert info.value.kill_reach == "group"
    assert transport.kills == [[*scripts.KILL, "41"]]


async def test_a_setup_refusal_is_exec_setup_error_and_kills_nothing() -> None:
    transport = FakeTransport()
    stream = await ExecDataPlane(transport).open_stream(["true"], cwd="/nope")
    transport.channel.put(err(b"SBX:pid:41:group\nSBX:err:cwd\n"), ExitStatus(125))
    with pytest.raises(ExecSetupError) as info:
        await anext(stream)
    assert info.value.what == "cwd"
    assert transport.kills == []


async def test_leaving_early_kills_and_says_what_the_kill_reached() -> None:
    transport = FakeTransport()
    async with await ExecDataPlane(transport).open_stream(["sleep", "9"], cwd="/w") as stream:
        transport.channel.put(HEAD, out(b"x"))
        assert await anext(stream) == out(b"x")
    assert stream.stopped == (True, "group")
    assert transport.kills == [[*scripts.KILL, "41"]]


async def test_leaving_before_reading_learns_the_pid_first() -> None:
    transport = FakeTransport()
    stream = await ExecDataPlane(transport).open_stream(["sleep", "9"], cwd="/w")
    transport.channel.put(HEAD)
    await stream.aclose()
    assert stream.stopped == (True, "group")
    assert transport.kills == [[*scripts.KILL, "41"]]


async def test_cancelled_while_waiting_kills_then_raises_exec_cancelled() -> None:
    transport = FakeTransport()
    stream = await ExecDataPlane(transport).open_stream(["sleep", "9"], cwd="/w")
    transport.channel.put(HEAD)
    task = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(ExecCancelled) as info:
        await task
    assert info.value.kill_reach == "group"


async def test_a_terminal_keeps_the_echo_and_kills_the_session() -> None:
    transport = FakeTransport()
    plane = ExecDataPlane(transport)
    term = await plane.open_stream(["sh"], cwd="/w", tty=True, timeout=None)
    argv, stdin, tty = transport.opened[0]
    assert argv[2] == scripts.STREAM_TTY_OUTER and stdin and tty
    await term.resize(100, 30)
    assert transport.channel.sizes == [(100, 30)]
    transport.channel.put(out(b"SBX:pid:7:session\r\necho hi\r\nSBX:run\r\n$ "), out(b"hi\r\n$ "))
    assert await anext(term) == out(b"echo hi\r\n$ ")
    assert await anext(term) == out(b"hi\r\n$ ")
    await term.aclose()
    assert term.stopped == (True, "session")
    assert transport.kills == [[*scripts.KILL_SESSION, "7"]]
    # a kill that reached the whole session leaves the sandbox clean; one that fell short not
    reached = ExecCancelled(argv=("sh",), kill_delivered=True, kill_reach="session")
    assert unclean_reason(reached) is None
    short = ExecCancelled(argv=("sh",), kill_delivered=False, kill_reach="nothing")
    assert unclean_reason(short) is not None


def _handle(transport: object) -> Sandbox:
    spec = SandboxSpec(kind="shell", image="busybox", requires=frozenset({Capability.EXEC}))
    return Sandbox(spec, ExecDataPlane(transport))  # type: ignore[arg-type]


@pytest.mark.parametrize(("kill_exit", "unclean"), [(0, False), (1, True)])
async def test_the_handle_judges_a_stream_by_the_unclean_rule(
    kill_exit: int, unclean: bool
) -> None:
    transport = FakeTransport(kill_exit=kill_exit)
    handle = _handle(transport)
    transport.channel.put(HEAD)
    with pytest.raises(ExecTimeout):
        async with handle.exec_stream(["sleep", "9"], timeout=0.2) as stream:
            async for _ in stream:
                pass
    assert (handle.unclean is not None) is unclean
    if unclean:
        with pytest.raises(SandboxUnclean):
            await handle.exec_stream(["true"])


async def test_an_early_stop_whose_kill_fell_short_leaves_the_handle_unclean() -> None:
    transport = FakeTransport(kill_exit=1)
    handle = _handle(transport)
    transport.channel.put(HEAD)
    async with handle.exec_stream(["sleep", "9"]):
        pass
    assert handle.unclean is not None and "cancelled" in handle.unclean


class RunsOnly:
    """A transport that can only run buffered commands."""

    async def run(self, argv: Sequence[str], **_: object) -> RawResult:
        raise AssertionError("nothing may run")

    async def close(self) -> None:
        return None


async def test_a_plane_that_cannot_stream_refuses_before_anything_runs() -> None:
    handle = _handle(RunsOnly())
    with pytest.raises(ExecStreamUnsupported) as info:
        await handle.exec_stream(["true"])
    assert info.value.what == "stream"
    assert handle.unclean is None


def test_the_sync_twin_iterates_feeds_and_stops() -> None:
    loop = _Loop()
    try:
        transport = FakeTransport()
        sb = SyncSandbox(_handle(transport), loop)
        loop.loop.call_soon_threadsafe(transport.channel.put, HEAD, out(b"one\n"), ExitStatus(0))
        with sb.exec_stream(["cat"], stdin=True) as stream:
            stream.write_stdin("one\n")
            stream.close_stdin()
            assert list(stream) == [out(b"one\n"), ExitStatus(0)]
            assert stream.exit_code == 0
        assert transport.channel.stdin == [b"one\n"] and transport.channel.stdin_closed
        assert transport.kills == []

        transport = FakeTransport()
        sb = SyncSandbox(_handle(transport), loop)
        loop.loop.call_soon_threadsafe(transport.channel.put, HEAD)
        with sb.exec_stream(["sleep", "9"]) as stream:
            pass
        assert stream.aio.stopped == (True, "group")
    finally:
        loop.stop()


async def test_on_local_processes_the_rules_hold_with_the_pods_own_scripts(
    tmp_path: Path,
) -> None:
    """The same stream over local processes (``sandbox_operator.testing``): the wrapper and the
    kill are the pods' scripts, the processes real."""
    sb = local_sandbox(root=str(tmp_path))
    work = Path(sb.work_dir)
    command = "echo first; while [ ! -e go ]; do sleep 0.05; done; echo last >&2"
    async with sb.exec_stream(command, timeout=30) as stream:
        assert await anext(stream) == out(b"first\n")
        (work / "go").touch()
        assert [item async for item in stream] == [err(b"last\n"), ExitStatus(0)]

    async with sb.exec_stream(["cat"], stdin=True, timeout=30) as stream:
        await stream.write_stdin(b"one\n")
        assert await anext(stream) == out(b"one\n")
        await stream.close_stdin()
        assert await stream.wait() == 0

    async with sb.exec_stream("echo up; sleep 1; touch late", timeout=30) as stream:
        assert await anext(stream) == out(b"up\n")
    assert stream.stopped == (True, "group")
    await asyncio.sleep(1.5)
    assert not (work / "late").exists(), "the stopped command ran on"

    with pytest.raises(OutputBudgetExceeded) as over:
        async with sb.exec_stream("head -c 200000 /dev/zero; sleep 3", max_output_bytes=1000) as s:
            async for _ in s:
                pass
    assert (over.value.kill_delivered, over.value.kill_reach) == (True, "group")
    assert sb.unclean is None

    with pytest.raises(ExecStreamUnsupported) as refused:
        await sb.exec_stream(["sh"], tty=True)
    assert refused.value.what == "tty"
