# ruff: noqa: ASYNC109
# (ExecTransport.run takes its timeout in seconds and enforces it itself.)
"""An exec session: one long-lived exec stream per handle to the launcher of :mod:`.launcher`,
through which a buffered command costs a frame each way instead of a new ``pods/exec``.

Its own module because it is a transport of its own (an :class:`~.execplane.ExecTransport`)
built on another one's streams: :class:`SessionExecTransport` opens the session with the
``direct`` transport's :meth:`~.streaming.StreamTransport.open` (over ``pods/exec``, authorized by
the API server like any exec), runs each command as a numbered frame, and hands everything it
must not trust the guest with back to ``direct``: streams and terminals, and (through
:class:`~.execplane.ExecDataPlane`'s ``kill_transport``) every kill.

Semantics are the plain transport's: a command's stdout and stderr apart and binary-safe, its
output over ``max_output`` or past ``timeout`` reported as such (the data plane kills its group
over a fresh ``pods/exec``), and a session that drops, or breaks the frame protocol, before a
command's exit frame reports that command's stream lost (no exit code), so the unclean rule of
:mod:`sandbox_operator.client.unclean` applies unchanged. Commands may run concurrently, each
its own number on the one stream. A guest that cannot run the launcher (no ``python3``, or no
banner in time) gets plain ``pods/exec`` for the handle's life. A session is reopened (so
authorized again) once it is ``max_age`` seconds old, and after it drops.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Protocol

from sandbox_operator.client.dataplane import launcher
from sandbox_operator.client.dataplane.execplane import ExecTransport, RawResult
from sandbox_operator.client.dataplane.streaming import ExecChannel, ExitStatus, StreamTransport
from sandbox_operator.client.errors import DataPlaneError

#: The largest frame payload a launcher may send (it sends at most 64 KiB): past it the guest is
#: not speaking the protocol and the session is dropped, so a guest cannot make the client buffer
#: an announced length.
MAX_FRAME = 1024 * 1024
#: How long a launcher has to announce itself (its ``python3`` starting) by default.
_OPEN_TIMEOUT = 10.0


class SessionOpener(ExecTransport, Protocol):
    """What the session needs of the transport under it: buffered runs (for the fallback) and
    streams (to open the session)."""

    async def open(self, argv: Sequence[str], *, stdin: bool, tty: bool) -> ExecChannel: ...


class _Command:
    """One command in a session: what arrived for it, and how it ended."""

    def __init__(self, max_output: int, stderr: bytearray | None) -> None:
        self.out = bytearray()
        self.err = stderr if stderr is not None else bytearray()
        self.max_output = max_output
        self.exit_code: int | None = None
        self.failed: str | None = None
        self.overflowed = False
        #: ended, failed, over budget or lost: the caller stops waiting
        self.settled = asyncio.Event()
        #: stderr holds its first whole line (the wrapper's pid), or nothing more will come
        self.header = asyncio.Event()

    def feed(self, kind: bytes, payload: bytes) -> bool:
        """Take one frame; False when it is not one a launcher may send."""
        if kind == launcher.STDOUT:
            if not self.overflowed:
                self.out.extend(payload)
        elif kind == launcher.STDERR:
            if not self.overflowed or not self.header.is_set():
                self.err.extend(payload)
            if b"\n" in self.err:
                self.header.set()
        elif kind == launcher.EXIT:
            if not payload.isdigit() or len(payload) > 10:
                return False
            self.exit_code = int(payload)
            self.header.set()
            self.settled.set()
        elif kind == launcher.FAILED:
            self.failed = payload[:200].decode("utf-8", errors="replace")
            self.header.set()
            self.settled.set()
        else:
            return False
        if not self.overflowed and len(self.out) + len(self.err) > self.max_output:
            self.overflowed = True
            self.settled.set()
        return True

    def lost(self) -> None:
        """The session ended before this command's exit frame: its end is unknown."""
        self.header.set()
        self.settled.set()

    async def result(self, deadline: float, header_wait: float) -> RawResult:
        try:
            async with asyncio.timeout_at(deadline):
                await self.settled.wait()
        except TimeoutError:
            return RawResult(None, bytes(self.out), bytes(self.err), timed_out=True)
        if self.overflowed:
            if header_wait > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(header_wait):
                        await self.header.wait()
            return RawResult(None, bytes(self.out), bytes(self.err), overflowed=True)
        if self.failed is not None:
            raise DataPlaneError(f"the exec session could not start the command: {self.failed}")
        return RawResult(self.exit_code, bytes(self.out), bytes(self.err))


class _NotSent(Exception):
    """The command's frame never left: nothing ran, another session may take it."""


class _Session:
    """One open launcher stream and the commands in flight on it."""

    def __init__(self, channel: ExecChannel, opened_at: float, rest: bytes) -> None:
        self.channel = channel
        self.opened_at = opened_at
        self.pending: dict[int, _Command] = {}
        self.next_id = 1
        self.dead = False
        self.retired = False
        self._buf = bytearray(rest)
        self._send_lock = asyncio.Lock()
        self._closing: asyncio.Future[None] | None = None
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def open(cls, opener: StreamTransport, timeout: float) -> _Session | None:
        """Open a session; None when the guest cannot run the launcher (it said so, or ended,
        or wrote something else); :class:`TimeoutError` when no banner came in ``timeout``."""
        loop = asyncio.get_running_loop()
        channel = await opener.open(launcher.launch_argv(), stdin=True, tty=False)
        buf = bytearray()
        try:
            async with asyncio.timeout(timeout):
                while len(buf) < len(launcher.BANNER):
                    item = await channel.receive()
                    if item is None or isinstance(item, ExitStatus):
                        break
                    if item.stream == "stdout":
                        buf.extend(item.data)
        except BaseException:
            await channel.close()
            raise
        if not buf.startswith(launcher.BANNER):
            await channel.close()
            return None
        return cls(channel, loop.time(), bytes(buf[len(launcher.BANNER) :]))

    async def _read(self) -> None:
        try:
            while not self.dead:
                item = await self.channel.receive()
                if item is None or isinstance(item, ExitStatus):
                    return
                if item.stream == "stdout":
                    self._buf.extend(item.data)
                    if not self._dispatch():
                        return
        except Exception:
            return  # a failed read is a dropped session, whatever failed
        finally:
            self._die()

    def _dispatch(self) -> bool:
        """Hand each whole frame to its command; False on anything a launcher may not send."""
        buf, size = self._buf, launcher.HEAD.size
        while len(buf) >= size:
            kind, cid, n = launcher.HEAD.unpack_from(buf)
            if n > MAX_FRAME or not 0 < cid < self.next_id:
                return False
            if len(buf) < size + n:
                break
            payload = bytes(buf[size : size + n])
            del buf[: size + n]
            command = self.pending.get(cid)
            if command is None:
                continue  # a command its caller stopped waiting for: its late frames go
            if not command.feed(kind, payload):
                return False
        return True

    def _die(self) -> None:
        """The stream is gone, broken or closed: every command still in flight is lost."""
        self.dead = True
        for command in self.pending.values():
            command.lost()
        self.pending.clear()
        if self._closing is None:
            self._closing = asyncio.ensure_future(self.channel.close())

    async def start(self, argv: Sequence[str], stdin: bytes, command: _Command) -> int:
        """Send the command's frame; its number. :class:`_NotSent` when the stream is gone."""
        if self.dead:
            raise _NotSent
        cid = self.next_id
        self.next_id += 1
        self.pending[cid] = command
        frame = launcher.run_frame(cid, argv, stdin)
        # Shielded: a caller cancelled mid-frame must not leave half a frame on the stream, which
        # would make every later frame of the session unreadable to the launcher.
        sending = asyncio.ensure_future(self._send(frame))
        try:
            sent = await asyncio.shield(sending)
        except asyncio.CancelledError:
            self.pending.pop(cid, None)  # as a cancelled plain exec: its kill has no pid yet
            raise
        if not sent:
            self.pending.pop(cid, None)
            raise _NotSent
        return cid

    async def _send(self, frame: bytes) -> bool:
        """Send one whole frame; False (and the session dropped) when the stream is gone."""
        async with self._send_lock:
            try:
                await self.channel.send_stdin(frame)
            except DataPlaneError:
                self._die()
                return False
        return True

    def done(self, cid: int) -> None:
        """The caller stopped waiting for ``cid``; a retired session closes once idle."""
        self.pending.pop(cid, None)
        if self.retired and not self.pending:
            self.close()

    def close(self) -> None:
        self._reader.cancel()
        self._die()


class SessionExecTransport:
    """An :class:`~.execplane.ExecTransport` running buffered commands through one launcher
    session over ``direct`` (see the module), and a
    :class:`~.streaming.StreamTransport` whose streams are ``direct``'s own.

    ``max_age``: seconds after which new commands go to a newly opened (newly authorized)
    session. ``open_timeout``: how long the launcher has to announce itself before the handle
    falls back to ``direct`` for good. ``launch`` replaces the launcher's argv (tests only)."""

    def __init__(
        self,
        direct: SessionOpener,
        *,
        max_age: float = 60.0,
        open_timeout: float = _OPEN_TIMEOUT,
        launch: Sequence[str] | None = None,
    ) -> None:
        self.direct = direct
        self.max_age = max_age
        self.open_timeout = open_timeout
        self._launch = list(launch) if launch is not None else None
        self._session: _Session | None = None
        self._lock = asyncio.Lock()
        #: the guest cannot run the launcher: every command goes over ``direct``
        self.unavailable = False
        #: sessions opened so far
        self.opened = 0

    async def _current(self, deadline: float) -> _Session | None:
        async with self._lock:
            loop = asyncio.get_running_loop()
            session = self._session
            if session is not None and loop.time() - session.opened_at > self.max_age:
                session.retired = True
                if not session.pending:
                    session.close()
                self._session = session = None
            if session is not None and not session.dead:
                return session
            if self.unavailable:
                return None
            left = max(deadline - loop.time(), 0.001)
            opener: StreamTransport = self.direct
            if self._launch is not None:
                opener = _Launch(self.direct, self._launch)
            try:
                session = await _Session.open(opener, min(self.open_timeout, left))
            except TimeoutError:
                if left < self.open_timeout:
                    raise  # the command's own deadline, not the launcher's: try again next time
                session = None
            if session is None:
                self.unavailable = True
                return None
            self.opened += 1
            self._session = session
            return session

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
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for _ in range(2):
            try:
                async with asyncio.timeout_at(deadline):
                    session = await self._current(deadline)
            except TimeoutError:
                # As over a plain exec whose upgrade outlived the deadline: the end is unknown.
                return RawResult(None, b"", b"", timed_out=True)
            if session is None:
                break
            command = _Command(max_output, stderr)
            try:
                cid = await session.start(argv, stdin or b"", command)
            except _NotSent:
                continue  # the stream was gone before the frame left: nothing ran
            try:
                return await command.result(deadline, header_wait)
            finally:
                session.done(cid)
        left = max(deadline - loop.time(), 0.001)
        return await self.direct.run(
            argv,
            stdin=stdin,
            timeout=left,
            max_output=max_output,
            stderr=stderr,
            header_wait=header_wait,
        )

    async def open(self, argv: Sequence[str], *, stdin: bool, tty: bool) -> ExecChannel:
        """A stream (:mod:`.streaming`) is ``direct``'s own exec: a terminal and a streamed
        command keep the plain transport's every property."""
        return await self.direct.open(argv, stdin=stdin, tty=tty)

    async def close(self) -> None:
        async with self._lock:
            if self._session is not None:
                self._session.close()
                self._session = None
        await self.direct.close()


class _Launch:
    """``direct`` with the session's argv replaced (tests: a launcher that lies or dies)."""

    def __init__(self, direct: SessionOpener, argv: list[str]) -> None:
        self.direct = direct
        self.argv = argv

    async def open(self, argv: Sequence[str], *, stdin: bool, tty: bool) -> ExecChannel:
        return await self.direct.open(self.argv, stdin=stdin, tty=tty)
