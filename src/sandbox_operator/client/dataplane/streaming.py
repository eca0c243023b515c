"""Streaming exec: a command whose output is handed over as it arrives and whose stdin is fed
while it runs, or a terminal session (``tty``) for a person or an agent.

A transport that can stream (:class:`StreamTransport`, the pod one over ``pods/exec``) opens an
:class:`ExecChannel`: typed events in (:class:`OutputChunk`, then one :class:`ExitStatus`, or
None when the stream ended without one) and stdin, its end and the window size out.
:class:`ExecStream` holds one open channel to a command started under the data plane's wrapper
(:data:`~.scripts.STREAM_INNER`) and applies the rules every exec has:

* ``timeout`` seconds from the start (None: none, for a person's terminal); then its kill and
  :class:`~sandbox_operator.client.errors.ExecTimeout` (the output was already handed over, so
  the error carries none);
* ``max_output_bytes`` over stdout + stderr together (None: none); the chunk that would go over
  is not handed over: its kill and
  :class:`~sandbox_operator.client.errors.OutputBudgetExceeded`;
* a stream that ends without the command's exit status: its kill and
  :class:`~sandbox_operator.client.errors.ExecStreamLost`;
* a caller cancelled while waiting: its kill and
  :class:`~sandbox_operator.client.errors.ExecCancelled`;
* a caller that stops early (``aclose``, leaving ``async with``): its kill; what it reached is
  :attr:`ExecStream.stopped`, which the handle judges by the unclean rule
  (:mod:`sandbox_operator.client.unclean`) as a cancellation.

The kill is the data plane's (the same script and answer as the buffered exec's), handed in.
"""

from __future__ import annotations

import asyncio
import collections
import re
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, Required, TypedDict, TypeVar, Unpack, runtime_checkable

from sandbox_operator.client.dataplane.protocol import ExecRequest
from sandbox_operator.client.errors import (
    ExecCancelled,
    ExecSetupError,
    ExecStreamLost,
)

Stream = Literal["stdout", "stderr"]


@dataclass(frozen=True)
class OutputChunk:
    """Bytes the command wrote, on ``stream``, as they arrived (a terminal session's output,
    its echo included, is all ``stdout``)."""

    stream: Stream
    data: bytes


@dataclass(frozen=True)
class ExitStatus:
    """The command's end: the last item of a stream."""

    exit_code: int

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


#: What a stream hands over, in order.
StreamItem = OutputChunk | ExitStatus

#: Called with each chunk of one stream as it is handed over (a coroutine function or a plain one).
ChunkCallback = Callable[[bytes], Awaitable[None] | None]


class ExecChannel(Protocol):
    """One open exec stream of a transport. ``receive`` returns the next event, None once the
    stream ended without an exit status (lost, or closed by :meth:`close`)."""

    async def receive(self) -> OutputChunk | ExitStatus | None: ...

    async def send_stdin(self, data: bytes) -> None: ...

    async def close_stdin(self) -> None: ...

    async def resize(self, cols: int, rows: int) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class StreamTransport(Protocol):
    """A transport that can open an exec stream: ``argv`` started with stdin from the stream
    (``stdin``) or none, on a terminal (``tty``: stdout and stderr are one stream). A failure to
    start raises like :meth:`~.execplane.ExecTransport.run`'s."""

    async def open(self, argv: Sequence[str], *, stdin: bool, tty: bool) -> ExecChannel: ...


class StreamOptions(TypedDict, total=False):
    """The keyword arguments of :meth:`StreamingPlane.open_stream`.

    ``cwd``, ``create_cwd`` and ``env`` as for a buffered exec; ``timeout`` in seconds from the
    call (None: none); ``max_output_bytes`` over stdout + stderr (None: none); ``stdin``: the
    command reads the stream's stdin (else ``/dev/null``); ``tty``: a terminal session (stdin
    too; stdout and stderr are one stream); ``on_stdout``/``on_stderr``: called with each chunk.
    """

    cwd: Required[str]
    timeout: float | None
    create_cwd: bool
    env: Mapping[str, str] | None
    max_output_bytes: int | None
    stdin: bool
    tty: bool
    on_stdout: ChunkCallback | None
    on_stderr: ChunkCallback | None


@runtime_checkable
class StreamingPlane(Protocol):
    """A data plane that can stream an exec (:class:`~.execplane.ExecDataPlane` over a
    :class:`StreamTransport`). The command is started when this returns."""

    async def open_stream(
        self, argv: Sequence[str], **options: Unpack[StreamOptions]
    ) -> ExecStream: ...


#: Kills what the wrapper announced (its pid and reach): whether delivered, and what it reached.
Kill = Callable[[int | None, str], Awaitable[tuple[bool, str]]]

T = TypeVar("T")

#: How long a stream stopped before its wrapper announced itself reads on to learn its pid.
_LEARN_PID = 5.0

#: One of the wrapper's lines: its pid and reach, ``run`` or a setup refusal.
_LINE = re.compile(rb"SBX:(?:pid:(\d+):(group|process|session)|(run)|err:(\w+))\r?\n")


async def despite_cancellation(work: Coroutine[Any, Any, T]) -> T:
    """Await ``work`` to its end even when the caller is cancelled again meanwhile (the kill of a
    cancelled exec must land, not be cancelled with it)."""
    task = asyncio.ensure_future(work)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                return task.result()


class ExecStream:
    """An open streaming exec: an async iterator of :class:`OutputChunk` then one
    :class:`ExitStatus`, with :meth:`write_stdin`, :meth:`close_stdin` and (``tty``)
    :meth:`resize`. ``on_stdout``/``on_stderr`` are called with each chunk as it is handed over;
    :meth:`wait` hands everything over and returns the exit code. Leaving ``async with`` (or
    :meth:`aclose`) before the end kills the command."""

    def __init__(
        self,
        channel: ExecChannel,
        request: ExecRequest,
        kill: Kill,
        *,
        tty: bool = False,
        timeout: float | None,
        budget: int | None,
        on_stdout: ChunkCallback | None = None,
        on_stderr: ChunkCallback | None = None,
    ) -> None:
        self.request = request
        self.tty = tty
        self._channel = channel
        self._kill_with = kill
        self._budget = budget
        self._callbacks: dict[Stream, ChunkCallback | None] = {
            "stdout": on_stdout,
            "stderr": on_stderr,
        }
        loop = asyncio.get_running_loop()
        self._deadline = None if timeout is None else loop.time() + timeout
        #: the wrapper's pid and reach, once announced
        self.pid: int | None = None
        self.reach = "nothing"
        # The wrapper's lines come first on stderr (a terminal's one stream: stdout): held back
        # until ``SBX:run``; output of the other stream arriving meanwhile waits in ``_early``.
        self._head = bytearray()
        self._echo = bytearray()
        self._running = False
        self._early: collections.deque[OutputChunk] = collections.deque()
        #: stdout + stderr handed over so far
        self.received = 0
        #: the exit code, once the command ended
        self.exit_code: int | None = None
        #: what the kill of a stream stopped early reached (delivered, reach); None otherwise
        self.stopped: tuple[bool, str] | None = None
        self._over = False
        self._exit: ExitStatus | None = None
        #: called with every error the stream raises and, for a stream stopped early, with the
        #: cancellation that stands for it (the handle's unclean rule); None: nobody judges
        self.judge: Callable[[BaseException], None] | None = None

    @property
    def header_stream(self) -> Stream:
        return "stdout" if self.tty else "stderr"

    # -- reading --------------------------------------------------------------------------

    def __aiter__(self) -> ExecStream:
        return self

    async def __anext__(self) -> StreamItem:
        try:
            return await self._anext()
        except BaseException as exc:
            if self.judge is not None and not isinstance(exc, StopAsyncIteration):
                self.judge(exc)
            raise

    async def _anext(self) -> StreamItem:
        if self._over:
            raise StopAsyncIteration
        try:
            item = await self._next()
        except ExecSetupError:
            # The wrapper refused before the command ran, and exits: nothing to kill.
            self._over = True
            await self._channel.close()
            raise
        except asyncio.CancelledError:
            delivered, reach = await despite_cancellation(self._kill())
            raise ExecCancelled(
                argv=self.request.argv, kill_delivered=delivered, kill_reach=reach
            ) from None
        if isinstance(item, ExitStatus):
            self._over = True
            self.exit_code = item.exit_code
            await self._channel.close()
        else:
            callback = self._callbacks[item.stream]
            if callback is not None:
                result = callback(item.data)
                if result is not None:
                    await result
        return item

    async def wait(self) -> int:
        """Hand everything over (to the callbacks) and return the exit code."""
        async for _ in self:
            pass
        assert self.exit_code is not None
        return self.exit_code

    async def _next(self) -> StreamItem:
        while True:
            if self._running and self._early:
                early = self._early.popleft()
                await self._count(len(early.data))
                return early
            if self._exit is not None:
                return self._exit
            event = await self._receive()
            if isinstance(event, ExitStatus):
                self._check_ran()
                self._exit = event
                continue
            if event.stream == self.header_stream and not self._running:
                self._head.extend(event.data)
                chunk = self._parse_head()
                if chunk is None:
                    continue
                if self._early:
                    # Output that came before the wrapper's last line goes first, in order.
                    if chunk.data:
                        self._early.append(chunk)
                    continue
                event = chunk
            elif not self._running:
                self._early.append(event)
                continue
            if not event.data:
                continue
            await self._count(len(event.data))
            return event

    async def _receive(self) -> OutputChunk | ExitStatus:
        loop = asyncio.get_running_loop()
        try:
            if self._deadline is None:
                event = await self._channel.receive()
            else:
                left = max(self._deadline - loop.time(), 0.0)
                async with asyncio.timeout(left):
                    event = await self._channel.receive()
        except TimeoutError:
            delivered, reach = await self._kill()
            raise self.request.timed_out(
                b"", b"", kill_delivered=delivered, kill_reach=reach
            ) from None
        if event is None:
            delivered, reach = await self._kill()
            raise ExecStreamLost(
                "the stream ended without the command's exit status",
                argv=self.request.argv,
                kill_delivered=delivered,
                kill_reach=reach,
            )
        return event

    def _parse_head(self) -> OutputChunk | None:
        """Read the wrapper's lines off the head of its stream: the pid, then ``SBX:run`` (what
        follows is the command's) or ``SBX:err:<what>`` (the setup's refusal). Returns the
        command's first bytes once running (maybe empty). On a terminal, what the caller typed
        meanwhile is echoed between those lines: it is kept, in order, as output; anywhere else
        the head holds the wrapper's lines alone, and anything else is a wrapper that failed."""
        while not self._running:
            m = _LINE.search(bytes(self._head))
            if m is None:
                if not self.tty and b"\n" in self._head:
                    self._refuse_wrapper(bytes(self._head))
                return None
            if m.start() and not self.tty:
                self._refuse_wrapper(bytes(self._head[: m.start()]))
            self._echo.extend(self._head[: m.start()])
            del self._head[: m.end()]
            if m.group(1):
                self.pid, self.reach = int(m.group(1)), m.group(2).decode()
            elif m.group(3):
                self._running = True
            else:
                what = m.group(4).decode()
                detail = f"cwd={self.request.cwd!r}" if what == "cwd" else ""
                raise ExecSetupError(what=what, detail=detail)
        data = bytes(self._echo + self._head)
        self._echo, self._head = bytearray(), bytearray()
        return OutputChunk(self.header_stream, data)

    @staticmethod
    def _refuse_wrapper(text: bytes) -> None:
        raise ExecSetupError(what="wrapper", detail=text.decode(errors="replace").strip()[:300])

    def _check_ran(self) -> None:
        """At the exit status: a wrapper that never got to run the command is its setup's
        refusal (or a wrapper that failed)."""
        if self._running:
            return
        if not self._head.endswith(b"\n"):
            self._head.extend(b"\n")
        self._parse_head()  # raises the setup's refusal, if it was one
        if not self._running:
            self._refuse_wrapper(bytes(self._echo + self._head))

    async def _count(self, n: int) -> None:
        if self._budget is not None and self.received + n > self._budget:
            delivered, reach = await self._kill()
            raise self.request.over_budget(
                self.received + n, kill_delivered=delivered, kill_reach=reach
            )
        self.received += n

    # -- writing --------------------------------------------------------------------------

    async def write_stdin(self, data: bytes | str) -> None:
        """Send bytes (text as UTF-8) to the command's stdin (a terminal's keyboard)."""
        await self._channel.send_stdin(data.encode("utf-8") if isinstance(data, str) else data)

    async def close_stdin(self) -> None:
        """End the command's stdin (it reads EOF)."""
        await self._channel.close_stdin()

    async def resize(self, cols: int, rows: int) -> None:
        """Set a terminal session's window size."""
        await self._channel.resize(cols, rows)

    # -- ending ---------------------------------------------------------------------------

    async def _kill(self) -> tuple[bool, str]:
        """Stop reading and kill the command's group (or session); the stream is over. A
        stream stopped before anything was read has not seen the wrapper's pid yet: it reads
        on (a few seconds at most) until it has, or until the command's end."""
        if self.pid is None and await self._learn_pid():
            self._over = True
            await self._channel.close()
            return False, "gone"
        self._over = True
        await self._channel.close()
        return await self._kill_with(self.pid, self.reach)

    async def _learn_pid(self) -> bool:
        """Read until the wrapper's pid is known; True when the command's end came first."""
        loop = asyncio.get_running_loop()
        end = loop.time() + _LEARN_PID
        while self.pid is None and not self._over:
            try:
                async with asyncio.timeout(max(end - loop.time(), 0.0)):
                    event = await self._channel.receive()
            except TimeoutError:
                return False
            if event is None:
                return False
            if isinstance(event, ExitStatus):
                return True
            if event.stream != self.header_stream:
                continue
            self._head.extend(event.data)
            try:
                self._parse_head()
            except ExecSetupError:
                return True  # the wrapper refused and exits: nothing ran
        return False

    async def aclose(self) -> None:
        """Stop the stream. A command still running is killed; :attr:`stopped` says what the
        kill reached."""
        if self._over:
            return
        self.stopped = delivered, reach = await despite_cancellation(self._kill())
        if self.judge is not None:
            self.judge(
                ExecCancelled(argv=self.request.argv, kill_delivered=delivered, kill_reach=reach)
            )

    async def __aenter__(self) -> ExecStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class StreamOpening:
    """What :meth:`~sandbox_operator.client.Sandbox.exec_stream` returns: awaited, the open
    :class:`ExecStream`; used with ``async with``, the stream, stopped (its command killed if it
    still runs) on the way out."""

    def __init__(self, start: Callable[[], Coroutine[Any, Any, ExecStream]]) -> None:
        self._start = start
        self._stream: ExecStream | None = None

    def __await__(self) -> Generator[Any, None, ExecStream]:
        return self._start().__await__()

    async def __aenter__(self) -> ExecStream:
        self._stream = await self._start()
        return self._stream

    async def __aexit__(self, *exc: object) -> None:
        if self._stream is not None:
            await self._stream.aclose()
