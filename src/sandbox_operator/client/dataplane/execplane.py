# ruff: noqa: ASYNC109
# (ExecTransport.run takes its timeout in seconds and enforces it itself.)
"""A :class:`~.protocol.DataPlane` built on one primitive: "run this argv with these stdin bytes
and give me back exit code, stdout and stderr" (an :class:`ExecTransport`).

Every file primitive is a POSIX ``sh`` script (:mod:`.scripts`) using only busybox/coreutils
applets (``head``, ``wc``, ``mv``, ``ln``, ``rm``, ``mkdir``, ``setsid``, ``kill``), so one
implementation serves any transport: ``pods/exec`` (:mod:`.pod`) or local processes
(:mod:`.local`). On timeout, output over budget, cancellation or a stream lost before the
command's end, the client stops reading and, over a second exec, sends SIGKILL to the command's
process group (the exception says what that reached: :mod:`sandbox_operator.client.unclean`).
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Unpack

from sandbox_operator.client.dataplane import scripts
from sandbox_operator.client.dataplane.protocol import (
    DEFAULT_OUTPUT_BUDGET,
    DirEntry,
    ExecRequest,
    FileStat,
    check_exec_request,
    read_cap_exceeded,
)
from sandbox_operator.client.dataplane.streaming import (
    ExecStream,
    StreamOptions,
    StreamTransport,
)
from sandbox_operator.client.dataplane.streaming import (
    despite_cancellation as _despite_cancellation,
)
from sandbox_operator.client.errors import (
    DataPlaneError,
    ExecCancelled,
    ExecSetupError,
    ExecStreamLost,
    ExecStreamUnsupported,
    PathRefused,
    SandboxFileNotFound,
    TransferIntegrityError,
)

if TYPE_CHECKING:
    from sandbox_operator.client.dataplane.protocol import ExecOptions, ExecResult, FileKind


@dataclass
class RawResult:
    """What a transport returns. ``exit_code`` is None when the command's end was not seen: a
    timeout, an overflow, or (neither flag set) a stream lost after the command was started;
    ``stdout``/``stderr`` are what arrived before that."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    overflowed: bool = False


class ExecTransport(Protocol):
    """Run an argv (no shell) with the given stdin bytes; stop reading at ``timeout`` seconds or
    after more than ``max_output`` bytes of stdout+stderr and report which. ``stderr``, when
    given, is where stderr is gathered as it arrives: a caller whose run is cancelled reads what
    came before (the exec wrapper's pid, to kill its process group).

    A failure to start the command raises :class:`DataPlaneError`; a stream lost once the
    command was started returns a result without an exit code and without either flag (the
    data plane then kills the command's group and raises :class:`ExecStreamLost`).

    ``header_wait`` > 0: an overflow reads on (keeping stderr alone) for at most that many
    seconds until stderr holds a whole first line, the exec wrapper's pid, which a command
    flooding stdout can overtake on its way from the node; its kill needs it."""

    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None,
        timeout: float,
        max_output: int,
        stderr: bytearray | None = None,
        header_wait: float = 0.0,
    ) -> RawResult: ...

    async def close(self) -> None: ...


#: How long an exec over its budget reads on for the wrapper's pid line (as a stream does).
_HEADER_WAIT = 5.0

_HEADER = re.compile(rb"^SBX:pid:(\d+):(group|process)\n")
_SIZE = re.compile(rb"SBX:size:(\d+)")


def _split_header(stderr: bytes) -> tuple[int | None, str, bytes]:
    """The exec wrapper's first stderr line: the command's pid and whether it leads a process
    group (``group``) or not (``process``); the rest is the command's own stderr."""
    m = _HEADER.match(stderr)
    if not m:
        return None, "nothing", stderr
    return int(m.group(1)), m.group(2).decode(), stderr[m.end() :]


def _parse_size(stderr: bytes) -> int | None:
    """The size the read script announced on stderr before sending the file."""
    m = _SIZE.search(stderr)
    return int(m.group(1)) if m else None


def _stderr_detail(stderr: bytes) -> str:
    return stderr.decode("utf-8", errors="replace").strip()[:300]


def _kind(text: str) -> FileKind:
    if text in ("file", "dir", "symlink", "other"):
        return text  # type: ignore[return-value]
    raise DataPlaneError(f"unexpected file kind {text!r}")


def _size(text: str) -> int | None:
    return int(text) if text.isdigit() else None


class ExecDataPlane:
    """A :class:`~.protocol.DataPlane` built on an :class:`ExecTransport` alone.

    ``kill_transport`` (default: ``transport``) is what kills go over: a transport that runs
    commands through something in the guest (an exec session, :mod:`.session`) hands its kills
    to a plain exec, so a guest that lies or dies cannot stop one (docs/exec-session.md)."""

    def __init__(
        self,
        transport: ExecTransport,
        *,
        op_timeout: float = 60.0,
        bytes_per_second: float = 1024 * 1024,
        kill_transport: ExecTransport | None = None,
    ) -> None:
        self.transport = transport
        self.kill_transport = kill_transport if kill_transport is not None else transport
        self.op_timeout = op_timeout
        self.bytes_per_second = bytes_per_second

    # -- exec -----------------------------------------------------------------------------

    async def exec(self, argv: Sequence[str], **options: Unpack[ExecOptions]) -> ExecResult:
        req = ExecRequest.check(argv, options)
        data = req.stdin
        wrapper = [
            "sh",
            "-c",
            scripts.EXEC_OUTER,
            "sbx",
            scripts.EXEC_INNER,
            "1" if req.create_cwd else "0",
            req.cwd,
            str(len(data)),
            str(len(req.env_args)),
            *req.env_args,
            *req.argv,
        ]
        arrived = bytearray()
        try:
            raw = await self.transport.run(
                wrapper,
                stdin=data or None,
                timeout=req.timeout,
                max_output=req.budget + 256,
                stderr=arrived,
                header_wait=_HEADER_WAIT,
            )
        except asyncio.CancelledError:
            # Closing the stream stops nothing in the sandbox: the command runs on unless its
            # group is killed, whatever cancelled the caller.
            pid, reach, _ = _split_header(bytes(arrived))
            delivered, reach = await _despite_cancellation(self._kill(pid, reach))
            raise ExecCancelled(argv=req.argv, kill_delivered=delivered, kill_reach=reach) from None
        pid, reach, stderr = _split_header(raw.stderr)
        if raw.timed_out or raw.overflowed or raw.exit_code is None:
            # The command may run on (past its deadline, over its budget, or behind a stream
            # that ended without its exit status): kill its group over a new exec first.
            delivered, reach = await self._kill(pid, reach)
            if raw.overflowed:
                received = len(raw.stdout) + len(stderr)
                raise req.over_budget(received, kill_delivered=delivered, kill_reach=reach)
            if raw.timed_out:
                raise req.timed_out(raw.stdout, stderr, kill_delivered=delivered, kill_reach=reach)
            raise ExecStreamLost(
                "the stream ended without the command's exit status",
                argv=req.argv,
                kill_delivered=delivered,
                kill_reach=reach,
            )
        if pid is None:
            raise ExecSetupError(what="wrapper", detail=_stderr_detail(raw.stderr))
        return req.finish(raw.exit_code, raw.stdout, stderr)

    async def open_stream(
        self, argv: Sequence[str], **options: Unpack[StreamOptions]
    ) -> ExecStream:
        """Start ``argv`` as a stream (:mod:`.streaming`) under the wrapper every exec has
        (:data:`~.scripts.STREAM_INNER`; a terminal's :data:`~.scripts.STREAM_TTY_OUTER`), its
        kill this plane's :meth:`_kill`."""
        transport = self.transport
        if not isinstance(transport, StreamTransport):
            raise ExecStreamUnsupported(
                "this data plane runs buffered commands only", what="stream"
            )
        env = options.get("env")
        args, env_args = check_exec_request(argv, env)
        cwd, create = options["cwd"], options.get("create_cwd", False)
        timeout = options.get("timeout", 60.0)
        budget = options.get("max_output_bytes", DEFAULT_OUTPUT_BUDGET)
        tty = options.get("tty", False)
        stdin = tty or options.get("stdin", False)
        req = ExecRequest(
            args, tuple(env_args), dict(env or {}), b"", cwd, create, timeout or 0.0, budget or 0
        )
        wrapper = [
            "sh",
            "-c",
            scripts.STREAM_TTY_OUTER if tty else scripts.EXEC_OUTER,
            "sbx",
            scripts.STREAM_INNER,
            "1" if create else "0",
            cwd,
            "1" if stdin else "0",
            str(len(env_args)),
            *env_args,
            *args,
        ]
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(timeout):
                channel = await transport.open(wrapper, stdin=stdin, tty=tty)
        except TimeoutError:
            # Whether the command started is unknown and it never announced itself.
            raise req.timed_out(b"", b"", kill_delivered=False, kill_reach="nothing") from None
        left = None if timeout is None else max(timeout - (loop.time() - started), 0.0)
        return ExecStream(
            channel,
            req,
            self._kill,
            tty=tty,
            timeout=left,
            budget=budget,
            on_stdout=options.get("on_stdout"),
            on_stderr=options.get("on_stderr"),
        )

    async def _kill(self, pid: int | None, reach: str) -> tuple[bool, str]:
        """SIGKILL the process group led by ``pid`` (or the process; ``reach`` is which, from
        the wrapper's header): whether the sandbox accepted it, and what it reached. A group
        found already ended (nothing left in it to signal) is ``gone``: as sure as a kill that
        reached it. A kill that could not be sent or failed reached ``nothing``."""
        if pid is None or pid <= 1:
            return False, "nothing"
        script = scripts.KILL_SESSION if reach == "session" else scripts.KILL
        try:
            raw = await self.kill_transport.run(
                [*script, str(pid)],
                stdin=None,
                timeout=self.op_timeout,
                max_output=64 * 1024,
            )
        except Exception:
            return False, "nothing"
        if raw.exit_code == 0:
            return True, reach
        if raw.exit_code == scripts.KILL_GONE and reach in ("group", "session"):
            return False, "gone"
        return False, "nothing"

    # -- file primitives ------------------------------------------------------------------

    def _timeout_for(self, nbytes: int) -> float:
        return self.op_timeout + nbytes / self.bytes_per_second

    async def _script(
        self,
        script: str,
        args: Sequence[str],
        *,
        stdin: bytes | None = None,
        max_output: int = 1024 * 1024,
        nbytes: int = 0,
    ) -> RawResult:
        raw = await self.transport.run(
            ["sh", "-c", script, "sbx", *args],
            stdin=stdin,
            timeout=self._timeout_for(nbytes),
            max_output=max_output,
        )
        if raw.timed_out:
            raise DataPlaneError("file operation timed out")
        if raw.overflowed:
            raise DataPlaneError("file operation produced more output than expected")
        if raw.exit_code is None:
            raise DataPlaneError("file operation ended without an exit code")
        return raw

    @staticmethod
    def _check(raw: RawResult, path: str) -> None:
        code = raw.exit_code
        if code == 0:
            return
        if code == scripts.MISSING:
            raise SandboxFileNotFound(path)
        if code is not None and code in scripts.REFUSALS:
            raise PathRefused(path=path, rule=scripts.REFUSALS[code])
        raise DataPlaneError(f"file operation on {path!r} failed: {_stderr_detail(raw.stderr)}")

    async def write_file(
        self, work_dir: str, relative: str, data: bytes, *, replace: bool = True
    ) -> None:
        token = secrets.token_hex(8)
        raw = await self._script(
            scripts.WRITE,
            [work_dir, relative, str(len(data)), "1" if replace else "0", token],
            stdin=data or None,
            nbytes=len(data),
        )
        if raw.exit_code == scripts.SIZE_MISMATCH:
            raise TransferIntegrityError(path=relative, expected=len(data), received=-1)
        self._check(raw, relative)

    async def read_file(self, work_dir: str, relative: str, *, max_bytes: int) -> bytes:
        raw = await self._script(
            scripts.READ,
            [work_dir, relative, str(max_bytes)],
            max_output=max_bytes + 64 * 1024,
            nbytes=max_bytes,
        )
        size = _parse_size(raw.stderr)
        if raw.exit_code == scripts.TOO_LARGE:
            raise read_cap_exceeded(relative, max_bytes, size if size is not None else -1)
        self._check(raw, relative)
        if size is None:
            raise DataPlaneError(f"no size reported for {relative!r}")
        if len(raw.stdout) != size:
            raise TransferIntegrityError(path=relative, expected=size, received=len(raw.stdout))
        return raw.stdout

    async def stat(self, work_dir: str, relative: str) -> FileStat:
        raw = await self._script(scripts.STAT, [work_dir, relative])
        self._check(raw, relative)
        parts = raw.stdout.decode(errors="replace").split()
        if len(parts) != 2:
            raise DataPlaneError(f"unexpected stat answer for {relative!r}")
        return FileStat(relative, _kind(parts[0]), _size(parts[1]))

    async def list_dir(self, work_dir: str, relative: str) -> list[DirEntry]:
        raw = await self._script(scripts.LIST, [work_dir, relative], max_output=64 * 1024 * 1024)
        self._check(raw, relative or ".")
        entries: list[DirEntry] = []
        for record in raw.stdout.split(b"\x00"):
            if not record:
                continue
            kind, size, name = record.split(b" ", 2)
            entries.append(
                DirEntry(
                    name.decode("utf-8", errors="surrogateescape"),
                    _kind(kind.decode()),
                    _size(size.decode()),
                )
            )
        return sorted(entries, key=lambda e: e.name)

    async def remove(self, work_dir: str, relative: str, *, recursive: bool) -> bool:
        raw = await self._script(scripts.REMOVE, [work_dir, relative, "1" if recursive else "0"])
        self._check(raw, relative)
        return raw.stdout.strip() == b"1"

    async def close(self) -> None:
        await self.transport.close()
