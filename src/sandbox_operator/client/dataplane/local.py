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

        async def pump(stream: asyncio.StreamReader | None, buf: bytearray) -> None:
            assert stream is not None
            while chunk := await stream.read(65536):
                buf.extend(chunk)
                if len(out) + len(err) > max_output:
                    overflow.set()
                    return

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

    async def close(self) -> None:
        return None


def local_dataplane(env: Mapping[str, str] | None = None) -> ExecDataPlane:
    """A data plane running commands on this machine (no isolation; for tests)."""
    return ExecDataPlane(LocalExecTransport(env))
