# ruff: noqa: ASYNC109
# (ExecTransport.run takes its timeout in seconds and enforces it itself.)
"""Commands as local processes: :class:`LocalExecTransport` runs the data plane's scripts on this
machine, without any isolation. For tests and development only (also offered by
:mod:`sandbox_operator.testing`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping, Sequence

from sandbox_operator.client.dataplane.execplane import ExecDataPlane, RawResult
from sandbox_operator.client.dataplane.streaming import ExitStatus, OutputChunk
from sandbox_operator.client.errors import ExecStreamUnsupported


class LocalExecTransport:
    """Runs argv as a local process. Draws no boundary whatsoever. ``env`` is added to this
    process's environment for every command (e.g. a private ``TMPDIR``)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = {**os.environ, **env} if env else None

    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None,
        timeout: float,
        max_output: int,
        stderr: bytearray | None = None,
        header_wait: float = 0.0,
    ) -> RawResult:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
        )
        out = bytearray()
        err = stderr if stderr is not None else bytearray()
        overflow = asyncio.Event()
        header = asyncio.Event()

        async def pump(stream: asyncio.StreamReader | None, buf: bytearray) -> None:
            assert stream is not None
            while chunk := await stream.read(65536):
                if overflow.is_set():
                    # Past the budget only stderr's first line is still wanted (header_wait);
                    # the rest is drained unkept, as a remote transport drops its frames.
                    if buf is err and not header.is_set():
                        buf.extend(chunk)
                        if b"\n" in err:
                            header.set()
                    continue
                buf.extend(chunk)
                if b"\n" in err:
                    header.set()
                if len(out) + len(err) > max_output:
                    overflow.set()

        async def feed() -> None:
            if stdin and proc.stdin is not None:
                try:
                    proc.stdin.write(stdin)
                    await proc.stdin.drain()
                    proc.stdin.close()
                except (BrokenPipeError, ConnectionResetError):
                    pass

        async def finish() -> int:
            await asyncio.gather(pump(proc.stdout, out), pump(proc.stderr, err), feed())
            return await proc.wait()

        task = asyncio.ensure_future(finish())
        waiter = asyncio.ensure_future(overflow.wait())

        def stop_reading() -> None:
            """Stop reading and drop the local wrapper (its pipes included); the command's own
            process group lives on until the caller's kill, as it would behind a remote
            transport's closed stream."""
            task.cancel()
            transport = getattr(proc, "_transport", None)
            if transport is not None:
                transport.close()

        try:
            done, _ = await asyncio.wait(
                {task, waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        except asyncio.CancelledError:
            stop_reading()
            raise
        finally:
            waiter.cancel()
        if task in done:
            return RawResult(task.result(), bytes(out), bytes(err))
        if overflow.is_set() and header_wait > 0 and not header.is_set():
            # As a remote transport does: read on for the wrapper's pid line (see pod.py).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(header.wait(), header_wait)
        stop_reading()
        with contextlib.suppress(TimeoutError, ProcessLookupError):
            await asyncio.wait_for(proc.wait(), 5.0)
        return RawResult(
            None,
            bytes(out),
            bytes(err),
            timed_out=not overflow.is_set(),
            overflowed=overflow.is_set(),
        )

    async def open(self, argv: Sequence[str], *, stdin: bool, tty: bool) -> LocalExecChannel:
        """Start ``argv`` as a stream (:mod:`.streaming`); no terminal here."""
        if tty:
            raise ExecStreamUnsupported("local processes run without a terminal", what="tty")
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
        )
        return LocalExecChannel(proc)

    async def close(self) -> None:
        return None


class LocalExecChannel:
    """A local process as an :class:`~.streaming.ExecChannel`: its pipes read as they fill, its
    exit status once both are drained. Closing it drops the pipes and leaves the command's
    group running, as a remote transport's closed stream does, until the data plane's kill."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        self._events: asyncio.Queue[OutputChunk | None] = asyncio.Queue()
        self._pumps = [
            asyncio.ensure_future(self._pump(proc.stdout, "stdout")),
            asyncio.ensure_future(self._pump(proc.stderr, "stderr")),
        ]
        self._open = 2
        self._closed = False

    async def _pump(self, stream: asyncio.StreamReader | None, name: str) -> None:
        assert stream is not None
        while chunk := await stream.read(65536):
            self._events.put_nowait(OutputChunk("stdout" if name == "stdout" else "stderr", chunk))
        self._events.put_nowait(None)

    async def receive(self) -> OutputChunk | ExitStatus | None:
        while self._open and not self._closed:
            event = await self._events.get()
            if event is not None:
                return event
            self._open -= 1
        if self._closed:
            return None
        return ExitStatus(await self._proc.wait())

    async def send_stdin(self, data: bytes) -> None:
        if self._proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self._proc.stdin.write(data)
                await self._proc.stdin.drain()

    async def close_stdin(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()

    async def resize(self, cols: int, rows: int) -> None:
        raise ExecStreamUnsupported("local processes run without a terminal", what="resize")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for pump in self._pumps:
            pump.cancel()
        transport = getattr(self._proc, "_transport", None)
        if transport is not None:
            transport.close()


def local_dataplane(env: Mapping[str, str] | None = None) -> ExecDataPlane:
    """A data plane running commands on this machine (no isolation; for tests)."""
    return ExecDataPlane(LocalExecTransport(env))
