"""The host-tool channel over exec and files, on the local data plane (real processes, python3).

Every test runs a real guest program that imports the generated shim; the host side is the same
code that serves a pod. What is checked: answers and typed refusals reach the guest, an overrun is
signalled with its session's children, the transport goes on every exit path, reserved names are
refused, and a completed call whose answer could not be written back is ``delivery_uncertain``
and never executed twice.
"""

from __future__ import annotations

import asyncio
import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from sandbox_operator.client.dataplane import ExecResult
from sandbox_operator.client.errors import (
    CapabilityNotRequired,
    DataPlaneError,
    PathRefused,
    TransferCapExceeded,
)
from sandbox_operator.client.hosttools import (
    Delivery,
    HostToolRegistry,
    HostToolRun,
    HostToolsWarning,
    Identity,
    host_tool,
)
from sandbox_operator.client.hosttools.channel import reclaim_run, run_with_host_tools
from sandbox_operator.client.hosttools.errors import (
    HostToolDeliveryUncertain,
    HostToolFileNameReserved,
    HostToolRunTimeout,
    HostToolRunUnclean,
    SignalOutcome,
)
from sandbox_operator.client.hosttools.guest import host_tool_shim
from sandbox_operator.client.hosttools.layout import (
    RESERVED_NAMES,
    SHIM_MODULE,
    GuestRunLayout,
    guest_run_layout,
)
from sandbox_operator.client.observer import HostToolCalled, SandboxObserver, StoreFileRead
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.contract import Capability, TransferLimits
from sandbox_operator.testing.fakes import DefectiveDataPlane, local_sandbox
from tests.fixtures.guest_programs import LEAVES_AN_INJECTOR

SMALL = TransferLimits(max_bytes_per_file=256, max_total_bytes=1024, max_files=4)


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostToolsWarning)
        yield


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    return local_sandbox(root=str(tmp_path))


class Counter:
    """A host effect the tests can count."""

    def __init__(self) -> None:
        self.value = 0


def registry_with(counter: Counter | None = None, **kw: Any) -> HostToolRegistry:
    registry = HostToolRegistry(**kw)

    @host_tool(source=None, sink=None, identity=None)
    def add(a: int, b: int) -> int:
        return a + b

    @host_tool(source="host-counter", sink="host-counter", identity=Identity.APP)
    def bump() -> int:
        assert counter is not None
        counter.value += 1
        return counter.value

    @host_tool(source=None, sink=None, identity=None)
    def boom() -> None:
        raise KeyError("not for the guest")

    @host_tool(source="test", sink=None, identity=None)
    def big(n: int) -> str:
        return "x" * n

    for fn in (add, bump, boom, big):
        registry.register(fn)
    return registry


def start(
    registry: HostToolRegistry, sandbox: Sandbox, *, limits_in: TransferLimits | None = None
) -> HostToolRun:
    return registry.start_run(
        limits_in=limits_in or sandbox.spec.files_in, limits_out=sandbox.spec.files_out
    )


def transport_exists(layout: GuestRunLayout) -> bool:
    return os.path.exists(layout.transport_path)


def root_exists(layout: GuestRunLayout) -> bool:
    return os.path.exists(layout.root_path)


def work_file(layout: GuestRunLayout, name: str) -> str:
    return Path(layout.work_path, name).read_text()


# A guest program that reports each refusal's class name on stdout.
REFUSALS = """
import sandbox_host_tools as host

def attempt(label, tool, **arguments):
    try:
        print(label, "ok", host.call(tool, **arguments))
    except host.HostToolError as exc:
        print(label, type(exc).__name__, isinstance(exc, Exception))

attempt("unregistered", "nope")
attempt("arguments", "add", a="not a number", b=1)
attempt("failed", "boom")
attempt("response", "big", n=10_000)
attempt("request", "add", a=1, b=2, pad="y" * 10_000)
attempt("cap", "add", a=1, b=2)
"""


# -- answers --------------------------------------------------------------------------------


async def test_a_program_calls_a_tool_and_gets_its_answer(sandbox: Sandbox) -> None:
    counter = Counter()
    run = start(registry_with(counter), sandbox)
    program = """
import sandbox_host_tools as host
print(host.call("add", a=2, b=40), host.add(a=1, b=1), host.bump(), host.TOOLS)
"""
    result = await run_with_host_tools(sandbox, program, run)
    assert result.ok, result.stderr_text
    assert result.stdout_text == "42 2 1 ('add', 'big', 'boom', 'bump')\n"
    assert counter.value == 1
    assert [(r.tool, r.executed, r.completed, r.delivery) for r in result.records] == [
        ("add", True, True, Delivery.DELIVERED),
        ("add", True, True, Delivery.DELIVERED),
        ("bump", True, True, Delivery.DELIVERED),
    ]
    assert all(r.response_bytes > 0 for r in result.records)
    assert result.transport_removed and not transport_exists(result.layout)


async def test_files_land_in_the_work_directory_the_program_runs_in(sandbox: Sandbox) -> None:
    run = start(registry_with(), sandbox)
    program = """
import os
print(open("data/in.txt").read(), os.path.basename(os.getcwd()))
open("out.txt", "w").write("artifact")
"""
    result = await run_with_host_tools(sandbox, program, run, files={"data/in.txt": "hello"})
    assert result.stdout_text == "hello work\n"
    # work/ is the caller's to collect; only reclaim_run removes it.
    assert (await sandbox.read_file(f"{result.layout.work}/out.txt")) == b"artifact"
    assert await reclaim_run(sandbox, result.layout)
    assert not root_exists(result.layout)


async def test_refusals_reach_the_guest_by_type_name(sandbox: Sandbox) -> None:
    registry = registry_with(max_calls_per_run=5)
    run = registry.start_run(limits_in=SMALL, limits_out=SMALL)
    result = await run_with_host_tools(sandbox, REFUSALS, run)
    assert result.ok, result.stderr_text
    lines = dict(line.split(" ", 1) for line in result.stdout_text.splitlines())
    assert lines == {
        "unregistered": "HostToolNotRegistered True",
        "arguments": "HostToolArgumentsInvalid True",
        "failed": "HostToolFailed True",
        "response": "HostToolResponseTooLarge True",
        "request": "HostToolRequestTooLarge True",
        "cap": "HostToolCallCapExceeded True",
    }
    refusals = [(r.refusal, r.executed, r.completed) for r in result.records]
    assert refusals == [
        ("HostToolNotRegistered", False, False),
        ("HostToolArgumentsInvalid", False, False),
        ("HostToolFailed", True, False),
        ("HostToolResponseTooLarge", True, True),  # it ran: the effect is not denied
        ("HostToolRequestTooLarge", False, False),
        ("HostToolCallCapExceeded", False, False),
    ]
    assert all(r.delivery is Delivery.DELIVERED for r in result.records)
    assert "not for the guest" not in result.stdout_text


async def test_user_identity_without_minting_callback_is_refused(sandbox: Sandbox) -> None:
    registry = HostToolRegistry(allowed_identities=frozenset({Identity.APP, Identity.USER}))

    @host_tool(source="mail", sink="mail", identity=Identity.USER)
    def send(to: str, user_identity: object) -> str:
        return to

    registry.register(send)
    program = """
import sandbox_host_tools as host
try:
    host.send(to="a")
except host.HostToolError as exc:
    print(type(exc).__name__)
"""
    result = await run_with_host_tools(sandbox, program, start(registry, sandbox))
    assert result.stdout_text == "UserIdentityUnavailable\n"
    assert result.records[0].executed is False


async def test_the_shim_is_not_a_control(sandbox: Sandbox) -> None:
    # A program that writes its own request file is served exactly like the shim.
    run = start(registry_with(), sandbox)
    program = """
import json, os, time
calls = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls")
with open(os.path.join(calls, "t"), "w") as fh:
    fh.write(json.dumps({"tool": "add", "arguments": {"a": 3, "b": 4}}))
os.rename(os.path.join(calls, "t"), os.path.join(calls, "1.req"))
while not os.path.exists(os.path.join(calls, "1.resp")):
    time.sleep(0.01)
print(open(os.path.join(calls, "1.resp")).read())
"""
    result = await run_with_host_tools(sandbox, program, run)
    assert result.stdout_text.strip() == '{"ok":true,"result":7}'


def test_shim_embeds_names_as_data() -> None:
    hostile = "x'); import os; os.system('boom') #"
    text = host_tool_shim(["add", hostile, "call"])
    namespace: dict[str, Any] = {"__file__": "/nonexistent/sandbox_host_tools.py"}
    exec(compile(text, "sandbox_host_tools.py", "exec"), namespace)
    assert namespace["TOOLS"] == ("add", "call", hostile)
    assert callable(namespace["add"])
    assert namespace["call"].__name__ == "call"  # a tool named like the shim's own is not bound


# -- overrun --------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for a reaper."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_overrun_is_signalled_with_its_session_children(sandbox: Sandbox) -> None:
    layout = guest_run_layout(sandbox)
    run = start(registry_with(), sandbox)
    program = """
import subprocess, time, sandbox_host_tools as host
child = subprocess.Popen(["sleep", "300"])
open("child.pid", "w").write(str(child.pid))
print("before", host.add(a=1, b=1), flush=True)
time.sleep(300)
"""
    with pytest.raises(HostToolRunTimeout) as info:
        await run_with_host_tools(sandbox, program, run, timeout=3, layout=layout)
    err = info.value
    assert err.signal is SignalOutcome.GROUP
    assert err.stdout == b"before 2\n"
    assert "was sent SIGKILL" in str(err) and "died" not in str(err)
    assert [r.delivery for r in err.records] == [Delivery.DELIVERED]
    assert err.transport_removed is True and not transport_exists(layout)
    child = int(work_file(layout, "child.pid"))
    for _ in range(50):
        if not _alive(child):
            break
        await asyncio.sleep(0.1)
    assert not _alive(child)
    assert await reclaim_run(sandbox, layout)


async def test_timeout_message_when_the_signal_could_not_be_sent() -> None:
    err = HostToolRunTimeout(timeout=1, stdout=b"", stderr=b"", signal=SignalOutcome.NOT_SENT)
    assert "could not be signalled, so it may still be running" in str(err)
    alone = HostToolRunTimeout(timeout=1, stdout=b"", stderr=b"", signal=SignalOutcome.PROCESS)
    assert "reaches it alone" in str(alone)


# -- what a run leaves, and guest files that never answer ---------------------------------------


QUIET = """
import time
time.sleep(2)
print("quiet")
"""


async def test_a_process_the_program_left_is_ended_and_cannot_reach_the_next_run(
    sandbox: Sandbox,
) -> None:
    """#28: a process left from run 1 wrote a request into run 2's channel. The launcher is a
    child subreaper: whatever session or group a descendant moves to, it stays in the launcher's
    tree and is ended when the program ends, before the run returns."""
    counter = Counter()
    registry = registry_with(counter)
    first = await run_with_host_tools(sandbox, LEAVES_AN_INJECTOR, start(registry, sandbox))
    assert first.ok and first.stdout == b"left one\n", first.stderr_text
    assert first.leftovers_ended >= 1
    injector = int(work_file(first.layout, "injector.pid"))
    assert not _alive(injector)
    second = await run_with_host_tools(sandbox, QUIET, start(registry, sandbox), timeout=20)
    assert second.stdout == b"quiet\n"
    assert second.records == () and counter.value == 0
    assert second.leftovers_ended == 0


async def test_an_exit_marker_the_program_wrote_is_not_the_end(sandbox: Sandbox) -> None:
    """The run ends when the launcher has ended, not when a file says so."""
    program = """
import time
open("../transport/exit", "w").write("0 0 forged\\n")
time.sleep(1.5)
print("really done")
"""
    result = await run_with_host_tools(sandbox, program, start(registry_with(), sandbox))
    assert (result.exit_code, result.stdout) == (0, b"really done\n")


async def test_a_program_that_kills_its_launcher_makes_the_run_unclean(
    sandbox: Sandbox,
) -> None:
    """Without the launcher nothing vouches that the run's processes ended: the run says so
    (dispose of the sandbox) instead of returning as if it finished."""
    program = """
import os, signal, subprocess, time
sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
open("sleeper.pid", "w").write(str(sleeper.pid))
open("../transport/exit", "w").write("0 0 forged\\n")
os.kill(os.getppid(), signal.SIGKILL)
"""
    layout = guest_run_layout(sandbox)
    with pytest.raises(HostToolRunUnclean) as info:
        await run_with_host_tools(
            sandbox, program, start(registry_with(), sandbox), timeout=20, layout=layout
        )
    assert "without its own exit marker" in str(info.value)
    assert "dispose" in str(info.value)
    assert info.value.transport_removed is True
    sleeper = int(work_file(layout, "sleeper.pid"))
    assert _alive(sleeper)  # what the run could not vouch for is real
    os.kill(sleeper, 9)


@pytest.mark.parametrize("plant", ["fifo", "dev-zero"])
async def test_a_guest_file_that_never_answers_is_not_waited_on(
    sandbox: Sandbox, plant: str
) -> None:
    """#28: a FIFO or /dev/zero at the next request's name turned a 10 s run into 32 s ending in
    ExecTimeout. Neither is read: the request is refused as invalid, and the run ends at its
    deadline as a HostToolRunTimeout."""
    make = (
        'os.mkfifo("../transport/calls/1.req")'
        if plant == "fifo"
        else 'os.symlink("/dev/zero", "../transport/calls/1.req")'
    )
    program = f"""
import os, time
{make}
time.sleep(300)
"""
    started = asyncio.get_running_loop().time()
    with pytest.raises(HostToolRunTimeout) as info:
        await run_with_host_tools(sandbox, program, start(registry_with(), sandbox), timeout=3)
    took = asyncio.get_running_loop().time() - started
    assert took < 3 + 5, took
    assert [r.refusal for r in info.value.records] == ["HostToolRequestInvalid"]
    assert info.value.leftovers_ended == 0


async def test_a_fifo_at_the_exit_marker_does_not_outlive_the_deadline(sandbox: Sandbox) -> None:
    program = """
import os, time
os.mkfifo("../transport/exit")
time.sleep(300)
"""
    started = asyncio.get_running_loop().time()
    with pytest.raises(HostToolRunTimeout) as info:
        await run_with_host_tools(sandbox, program, start(registry_with(), sandbox), timeout=3)
    assert asyncio.get_running_loop().time() - started < 3 + 5
    assert info.value.signal is SignalOutcome.GROUP
    assert info.value.leftovers_ended == 0


# -- cleanup --------------------------------------------------------------------------------


async def test_transport_removed_when_the_program_fails(sandbox: Sandbox) -> None:
    run = start(registry_with(), sandbox)
    result = await run_with_host_tools(sandbox, "import sys; sys.exit('bad input')", run)
    assert result.exit_code == 1 and result.stderr_text == "bad input\n"
    assert result.transport_removed and not transport_exists(result.layout)


async def test_transport_removed_when_output_is_over_the_cap(tmp_path: Path) -> None:
    sandbox = local_sandbox(
        root=str(tmp_path),
        files_out={"max_bytes_per_file": 100, "max_total_bytes": 100, "max_files": 4},
    )
    layout = guest_run_layout(sandbox)
    run = start(registry_with(), sandbox)
    with pytest.raises(TransferCapExceeded):
        await run_with_host_tools(sandbox, "print('x' * 1000)", run, layout=layout)
    assert not transport_exists(layout)


class FailingRemove(DefectiveDataPlane):
    async def remove(self, work_dir: str, relative: str, *, recursive: bool) -> bool:
        raise DataPlaneError("removal refused")


async def test_a_removal_that_fails_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    base = local_sandbox(root=str(tmp_path))
    sandbox = Sandbox(base.spec, FailingRemove(frozenset(), env={"TMPDIR": str(tmp_path / "tmp")}))
    run = start(registry_with(), sandbox)
    with caplog.at_level(logging.WARNING):
        result = await run_with_host_tools(sandbox, "print(1)", run)
        assert not await reclaim_run(sandbox, result.layout)
    assert result.ok and result.transport_removed is False
    assert transport_exists(result.layout)
    assert "were not removed" in caplog.text and "was not removed" in caplog.text


# -- names and capabilities -----------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        f"{SHIM_MODULE}.py",
        SHIM_MODULE,
        f"{SHIM_MODULE}/__init__.py",
        f"{SHIM_MODULE}.cpython-311-x86_64-linux-gnu.so",
        "Sandbox_Host_Tools.PY",
        "calls/1.resp",
        "CALLS/1.req",
        "launcher.py",
        "exit",
        "pid",
    ],
)
async def test_reserved_names_are_refused(sandbox: Sandbox, name: str) -> None:
    layout = guest_run_layout(sandbox)
    with pytest.raises(HostToolFileNameReserved):
        await run_with_host_tools(
            sandbox, "print(1)", start(registry_with(), sandbox), files={name: "x"}, layout=layout
        )
    assert not root_exists(layout)  # refused before anything was written


@pytest.mark.parametrize("name", ["../x", "a/../../x", "/etc/passwd", "", "a//b"])
async def test_escaping_and_absolute_names_are_refused(sandbox: Sandbox, name: str) -> None:
    layout = guest_run_layout(sandbox)
    with pytest.raises(PathRefused):
        await run_with_host_tools(
            sandbox, "print(1)", start(registry_with(), sandbox), files={name: "x"}, layout=layout
        )
    assert not root_exists(layout)


def test_reserved_names_cover_the_transport() -> None:
    assert {"launcher.py", "program.py", "stdout", "stderr", "exit", "pid", "calls"} <= (
        RESERVED_NAMES
    )


async def test_channel_capabilities_are_required(tmp_path: Path) -> None:
    for missing in (
        Capability.EXEC,
        Capability.FILES_IN,
        Capability.FILES_OUT,
        Capability.HOST_TOOLS,
    ):
        sandbox = local_sandbox(
            root=str(tmp_path / missing.value), requires=frozenset(Capability) - {missing}
        )
        with pytest.raises(CapabilityNotRequired) as info:
            await run_with_host_tools(sandbox, "print(1)", start(registry_with(), sandbox))
        assert info.value.capability == missing.value


async def test_files_list_is_never_used(tmp_path: Path) -> None:
    sandbox = local_sandbox(
        root=str(tmp_path),
        requires=frozenset(
            {Capability.EXEC, Capability.FILES_IN, Capability.FILES_OUT, Capability.HOST_TOOLS}
        ),
    )
    program = "import sandbox_host_tools as h; print(h.add(a=1, b=2))"
    result = await run_with_host_tools(sandbox, program, start(registry_with(), sandbox))
    assert result.stdout_text == "3\n"


async def test_a_run_serves_one_program(sandbox: Sandbox) -> None:
    run = start(registry_with(), sandbox)
    program = "import sandbox_host_tools as h; print(h.add(a=1, b=2))"
    await run_with_host_tools(sandbox, program, run)
    with pytest.raises(ValueError, match="already served"):
        await run_with_host_tools(sandbox, program, run)


# -- delivery -------------------------------------------------------------------------------


class ResponseWriteFails(DefectiveDataPlane):
    """The exec carrying an answer back fails (or hangs, with ``hang``) before it reaches the
    guest: the answer path is cut after the host handled the call."""

    def __init__(self, *, env: dict[str, str], hang: bool = False) -> None:
        super().__init__(frozenset(), env=env)
        self.hang = hang
        self.attempts = 0
        self.reached = asyncio.Event()

    async def exec(self, argv: Sequence[str], **kw: Any) -> ExecResult:
        carries_answer = len(argv) > 10 and argv[3] == "sbx-poll" and argv[10] != "0"
        if carries_answer:
            self.attempts += 1
            self.reached.set()
            if self.hang:
                await asyncio.Event().wait()
            raise DataPlaneError("the sandbox went away")
        return await super().exec(argv, **kw)


def cut_sandbox(tmp_path: Path, *, hang: bool = False) -> tuple[Sandbox, ResponseWriteFails]:
    base = local_sandbox(root=str(tmp_path))
    plane = ResponseWriteFails(env={"TMPDIR": str(tmp_path / "tmp")}, hang=hang)
    return Sandbox(base.spec, plane), plane


BUMP_TWICE = """
import sandbox_host_tools as host
print(host.bump(), flush=True)
print(host.bump(), flush=True)
"""


async def test_delivery_uncertain_when_the_answer_cannot_be_written(tmp_path: Path) -> None:
    sandbox, plane = cut_sandbox(tmp_path)
    counter = Counter()
    run = start(registry_with(counter), sandbox)
    layout = guest_run_layout(sandbox)
    with pytest.raises(HostToolDeliveryUncertain) as info:
        await run_with_host_tools(sandbox, BUMP_TWICE, run, layout=layout, timeout=30)
    err = info.value
    assert (err.record.sequence, err.record.tool) == (1, "bump")
    assert err.record.executed and err.record.completed
    assert err.record.delivery is Delivery.UNCERTAIN and err.record.response_bytes == 0
    assert err.records == run.records == (err.record,)
    assert "delivery_uncertain" in str(err)
    # The effect committed once; nothing re-sent the call, and the waiting program was stopped.
    assert counter.value == 1 and plane.attempts == 1
    assert err.transport_removed is True and not transport_exists(layout)
    # Answering the same sequence again replays the first answer; the body does not run again.
    again = await run.handle_request(1, b'{"tool": "bump", "arguments": {}}')
    assert b'"result":1' in again.payload and counter.value == 1
    await asyncio.sleep(0.5)
    assert counter.value == 1


async def test_cancellation_while_answering_is_delivery_uncertain(tmp_path: Path) -> None:
    sandbox, plane = cut_sandbox(tmp_path, hang=True)
    counter = Counter()
    run = start(registry_with(counter), sandbox)
    layout = guest_run_layout(sandbox)
    task = asyncio.ensure_future(
        run_with_host_tools(sandbox, BUMP_TWICE, run, layout=layout, timeout=30)
    )
    await asyncio.wait_for(plane.reached.wait(), 20)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (record,) = run.records
    assert record.executed and record.completed and record.delivery is Delivery.UNCERTAIN
    assert counter.value == 1
    assert not transport_exists(layout)  # cleanup ran after the cancel


async def test_an_answer_is_offered_back_even_past_the_deadline(sandbox: Sandbox) -> None:
    registry = HostToolRegistry()

    @host_tool(source=None, sink=None, identity=None)
    def slow() -> str:
        import time

        time.sleep(2.5)
        return "late"

    registry.register(slow)
    run = start(registry, sandbox)
    program = """
import time, sandbox_host_tools as host
print(host.slow(), flush=True)
time.sleep(300)
"""
    with pytest.raises(HostToolRunTimeout) as info:
        await run_with_host_tools(sandbox, program, run, timeout=1.5)
    (record,) = info.value.records
    assert record.completed and record.delivery is Delivery.DELIVERED
    # Delivered, then stopped at once: the program may or may not have printed it by then.
    assert info.value.stdout in (b"", b"late\n")


@pytest.mark.parametrize("blocked", [".resp-1.tmp", "1.resp"])
async def test_a_write_the_guest_side_could_not_make_is_delivery_uncertain(
    sandbox: Sandbox, blocked: str
) -> None:
    counter = Counter()
    run = start(registry_with(counter), sandbox)
    # The program blocks the answer's temporary name, or its name (a rename would land the
    # answer inside that directory and report success), with a directory, then asks.
    program = f"""
import json, os, time
calls = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls")
os.mkdir(os.path.join(calls, {blocked!r}))
with open(os.path.join(calls, "t"), "w") as fh:
    fh.write(json.dumps({{"tool": "bump", "arguments": {{}}}}))
os.rename(os.path.join(calls, "t"), os.path.join(calls, "1.req"))
time.sleep(300)
"""
    with pytest.raises(HostToolDeliveryUncertain) as info:
        await run_with_host_tools(sandbox, program, run, timeout=30)
    assert info.value.record.completed and info.value.record.delivery is Delivery.UNCERTAIN
    assert counter.value == 1
    assert info.value.transport_removed is True


async def test_an_answer_above_the_sandbox_files_in_cap_is_delivery_uncertain(
    tmp_path: Path,
) -> None:
    sandbox = local_sandbox(
        root=str(tmp_path),
        files_in={"max_bytes_per_file": 10_000, "max_total_bytes": 20_000, "max_files": 8},
    )
    # The door's response cap (the default 8 MiB) is wider than what the sandbox takes in.
    run = registry_with().start_run(limits_in=TransferLimits(), limits_out=sandbox.spec.files_out)
    program = "import sandbox_host_tools as h; print(len(h.big(n=20_000)))"
    with pytest.raises(HostToolDeliveryUncertain) as info:
        await run_with_host_tools(sandbox, program, run, timeout=30)
    assert info.value.record.completed and info.value.record.delivery is Delivery.UNCERTAIN


async def test_channel_traffic_is_not_reported_as_store_reads(tmp_path: Path) -> None:
    class Recorder(SandboxObserver):
        def __init__(self) -> None:
            self.reads: list[StoreFileRead] = []
            self.calls: list[HostToolCalled] = []

        def store_file_read(self, event: StoreFileRead) -> None:
            self.reads.append(event)

        def host_tool_called(self, event: HostToolCalled) -> None:
            self.calls.append(event)

    recorder = Recorder()
    base = local_sandbox(root=str(tmp_path))
    sandbox = Sandbox(base.spec, base.dataplane, observer=recorder)
    registry = registry_with(observer=recorder)
    program = "import sandbox_host_tools as h; print(h.add(a=1, b=2))"
    result = await run_with_host_tools(sandbox, program, start(registry, sandbox))
    assert result.stdout_text == "3\n"
    assert recorder.reads == []
    assert [(e.tool, e.delivery, e.response_bytes) for e in recorder.calls] == [
        ("add", "delivered", result.records[0].response_bytes)
    ]


def test_the_shim_stops_waiting_once_the_channel_is_removed(tmp_path: Path) -> None:
    """A program left waiting for an answer (the host crashed, or ended the run without
    answering) must not poll forever: once the run's transport is removed it raises."""
    import subprocess
    import sys
    import time

    (tmp_path / "calls").mkdir()
    (tmp_path / "sandbox_host_tools.py").write_text(host_tool_shim(["lookup"]))
    program = (
        "import sandbox_host_tools as host\n"
        "try:\n"
        "    host.lookup(order=1)\n"
        "except host.HostToolError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", program], cwd=tmp_path, stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 10
        # Wait until the claim is complete: the request is linked into place *and* its
        # temporary file is gone. Removing the directory between the two races the shim's
        # own cleanup (rmdir would find the temporary file and fail with ENOTEMPTY).
        while sorted(p.name for p in (tmp_path / "calls").iterdir()) != ["1.req"]:
            assert time.monotonic() < deadline, "the program never asked"
            time.sleep(0.01)
        assert proc.poll() is None  # waiting for its answer
        (tmp_path / "calls" / "1.req").unlink()
        (tmp_path / "calls").rmdir()
        out, _ = proc.communicate(timeout=10)
        assert out.strip() == "HostToolError the host-tool channel is closed"
    finally:
        proc.kill()
        proc.wait()
