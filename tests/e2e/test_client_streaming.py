"""#39 item 1 on the real node, through the client, on runc and gVisor: a streamed exec hands its
first line over while the command still runs, stdin reaches ``cat`` a line at a time and its end
ends it, a terminal runs ``sh`` interactively (echo, window size, exit code) and its stop kills
the whole session (a background job included), docs/streaming.md's example runs as written, and
``sandbox-operator shell`` runs a shell by Sandbox name both through a pseudo-terminal and with
piped stdin.

The first line's timing is shown by cause, not by a clock: the command cannot end before the
test, having read its first line, creates the file it waits for. The unit twin (a fake channel):
tests/unit/test_client_streaming.py."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from sandbox_operator.client import ExitStatus, OutputChunk, Sandbox, SandboxClient
from sandbox_operator.client.dataplane import ExecStream
from sandbox_operator.contract import SandboxSpec
from tests.fixtures.client_specs import runc_first_config, shell_spec
from tests.fixtures.operator import Kit

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def module_operator_config() -> dict[str, Any]:
    """runc first, so a ``container`` floor runs on runc and ``hardened_container`` on gVisor."""
    return runc_first_config()


def spec(runtime: str) -> SandboxSpec:
    return shell_spec(runtime)


def docs_example() -> str:
    """The Python example of docs/streaming.md, as written."""
    doc = (Path(__file__).parents[2] / "docs" / "streaming.md").read_text()
    return doc.split("```python\n", 1)[1].split("```", 1)[0]


async def run_docs_example(sb: Sandbox) -> str:
    """Run the docs' example on ``sandbox`` (its free name) and return what it printed."""
    body = textwrap.indent(docs_example(), "    ")
    scope: dict[str, Any] = {}
    exec(f"async def example(sandbox):\n{body}", scope)  # the docs' own code
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        await scope["example"](sb)
    return printed.getvalue()


async def exists(sb: Sandbox, name: str) -> bool:
    return (await sb.exec(["test", "-e", name], timeout=30)).exit_code == 0


async def read_until(stream: ExecStream, token: bytes) -> bytes:
    """Output (stdout and stderr together) until ``token`` has arrived; fails at the end."""
    seen = b""
    async with asyncio.timeout(60):
        while token not in seen:
            item = await anext(stream)
            assert isinstance(item, OutputChunk), (item, seen)
            seen += item.data
    return seen


async def streamed_first_line(sb: Sandbox) -> None:
    command = "echo first; while [ ! -e go ]; do sleep 0.1; done; echo last"
    async with sb.exec_stream(command, timeout=120) as stream:
        assert await anext(stream) == OutputChunk("stdout", b"first\n")
        # It cannot have ended: it waits for ``go``, which does not exist yet.
        assert not await exists(sb, "go")
        await sb.exec(["touch", "go"], timeout=30)
        assert [item async for item in stream] == [OutputChunk("stdout", b"last\n"), ExitStatus(0)]


async def incremental_stdin(sb: Sandbox) -> None:
    async with sb.exec_stream(["cat"], stdin=True, timeout=120) as stream:
        for line in (b"one\n", b"two\n"):
            await stream.write_stdin(line)
            assert await read_until(stream, line) == line
        await stream.close_stdin()
        assert await stream.wait() == 0


async def interactive_sh(sb: Sandbox) -> None:
    async with sb.exec_stream(["sh"], tty=True, timeout=None) as term:
        await term.resize(100, 30)
        await term.write_stdin(b"echo hi$((1+1)); stty size\n")
        seen = await read_until(term, b"30 100\r\n")
        assert b"hi2\r\n" in seen, seen  # its output, after the echo of what was typed
        await term.write_stdin(b"exit 3\n")
        assert await term.wait() == 3
    assert term.stopped is None


async def terminal_stop_kills_the_session(sb: Sandbox) -> None:
    term = await sb.exec_stream(["sh"], tty=True, timeout=None)
    # The job writes "late" once "stopped" exists, which the test creates only after the stop: by
    # cause, not by a race between a sleep and the kill (a loaded node's exec takes seconds).
    job = b"(while [ ! -e stopped ]; do sleep 0.2; done; touch late) & echo started\n"
    await term.write_stdin(job)
    await read_until(term, b"started\r\n")
    await term.write_stdin(b"sleep 600\n")
    await term.aclose()
    assert term.reach == "session" and term.stopped == (True, "session"), term.stopped
    assert (await sb.exec(["touch", "stopped"], timeout=30)).exit_code == 0
    await asyncio.sleep(2)  # ten of the job's looks at "stopped", were it alive
    assert not await exists(sb, "late"), "a job of the stopped session ran on"
    assert sb.unclean is None


def drive_cli_on_a_pty(command: list[str]) -> tuple[int, bytes]:
    """Run ``command`` on a pseudo-terminal of 101x33: wait for the prompt, type, read."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 101, 0, 0))
        os.execv(command[0], command)
    seen = b""

    def until(token: bytes) -> None:
        nonlocal seen
        deadline = time.monotonic() + 60
        while token not in seen:
            assert time.monotonic() < deadline, seen
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    seen += os.read(fd, 4096)
                except OSError:
                    return

    try:
        until(b"$ ")
        os.write(fd, b"echo hi$((1+1)); stty size\r")
        until(b"33 101")
        os.write(fd, b"exit 3\r")
        until(b"\x00never")  # to its end
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), seen


@pytest.mark.parametrize("runtime", ["runc", "gvisor"])
async def test_streams_and_terminals(module_kit: Kit, kubeconfig: str, runtime: str) -> None:
    ns = module_kit.ns
    async with await SandboxClient.from_kubeconfig(ns, kubeconfig=kubeconfig) as c:
        scope = await c.create_scope(scope="stream", thread_id=uuid.uuid4().hex[:8])
        sb = await c.acquire(scope, "agents/stream", spec(runtime), timeout=240)
        assert (sb.resource or {})["status"]["backend"] == runtime

        await streamed_first_line(sb)
        await incremental_stdin(sb)
        await interactive_sh(sb)
        await terminal_stop_kills_the_session(sb)
        printed = await run_docs_example(sb)
        assert "stdout b'first\\n'" in printed and "exit 0" in printed, printed
        assert "OutputChunk(stream='stdout', data=b'one\\n')" in printed, printed
        assert printed.rstrip().endswith("3"), printed

        cli = [sys.executable, "-m", "sandbox_operator.cli", "shell", sb.name, "-n", ns]
        cli += ["--kubeconfig", kubeconfig]
        code, seen = await asyncio.to_thread(drive_cli_on_a_pty, cli)
        assert code == 3, seen
        assert b"hi2\r\n" in seen and b"33 101\r\n" in seen, seen
        piped = await asyncio.to_thread(
            subprocess.run,
            cli,
            input=b"echo hi; echo oops >&2; exit 4\n",
            capture_output=True,
            timeout=120,
        )
        assert (piped.returncode, piped.stdout, piped.stderr) == (4, b"hi\n", b"oops\n")
        missing = await asyncio.to_thread(
            subprocess.run, [*cli[:4], "nope", *cli[5:]], capture_output=True, timeout=120
        )
        assert missing.returncode == 255 and b"no such Sandbox" in missing.stderr
