"""The data plane: how a ``Sandbox`` handle runs commands and moves files in a sandbox.

:class:`DataPlane` is the protocol every backend's data plane implements (the pod one here, the
ACA sandboxes one in ``backends/acas``). Paths it receives are already confined *lexically* by the
handle (see :mod:`sandbox_operator.client.paths`): ``work_dir`` is absolute and normalized,
``relative`` has no empty, ``.`` or ``..`` segment. What only the sandbox can answer -- a symlinked
parent, a symlinked destination -- the data plane answers inside the sandbox, right before acting.

:class:`ExecDataPlane` implements every file primitive over a single primitive, "run this argv
with these stdin bytes and give me back exit code, stdout and stderr" (an :class:`ExecTransport`),
using only POSIX ``sh`` and busybox/coreutils applets (``head``, ``wc``, ``mv``, ``ln``, ``rm``,
``mkdir``, ``setsid``, ``kill``). :class:`PodExecTransport` is that primitive over the API
server's ``pods/exec`` (websocket, binary-safe); :class:`LocalExecTransport` runs the same scripts
as local processes (no isolation at all: tests and development only).

Exec protocol. A command runs under a tiny wrapper: the outer ``sh`` starts an inner ``sh`` through
``setsid`` (or ``python3``'s ``os.setsid`` where the image has no ``setsid``), so the command
leads a process group of its own, the inner one announces its pid on
the first line of stderr, changes directory, exports the environment and ``exec``\\s the argv
verbatim -- no shell ever parses it. Stdin is fed through ``head -c N`` so the command sees EOF
without relying on the transport being able to half-close. On timeout (or output over budget) the
client stops reading and, over a second exec, sends SIGKILL to the process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import aiohttp
from kubernetes_asyncio.client import CoreV1Api

from sandbox_operator.client.errors import (
    DataPlaneError,
    ExecSetupError,
    ExecTimeout,
    OutputBudgetExceeded,
    PathRefused,
    SandboxFileNotFound,
    SandboxForbidden,
    TransferCapExceeded,
    TransferIntegrityError,
)

FileKind = Literal["file", "dir", "symlink", "other"]

#: Default budget for a command's stdout + stderr.
DEFAULT_OUTPUT_BUDGET = 16 * 1024 * 1024

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_exec_request(
    argv: Sequence[str], env: Mapping[str, str] | None
) -> tuple[tuple[str, ...], list[str]]:
    """Refuse an argv or environment no data plane can pass on faithfully, before anything runs.

    Every backend shares this so that the same request is refused the same way everywhere.
    Returns the argv as a tuple and the environment as ``NAME=value`` strings.
    """
    args = tuple(argv)
    if not args:
        raise ExecSetupError(what="argv", detail="empty argv")
    if any("\x00" in a for a in args):
        raise ExecSetupError(what="argv", detail="NUL in an argument")
    env_args: list[str] = []
    for k, v in (env or {}).items():
        if not _ENV_NAME.match(k) or "\x00" in v:
            raise ExecSetupError(what="env", detail=f"invalid variable {k!r}")
        env_args.append(f"{k}={v}")
    return args, env_args


@dataclass(frozen=True)
class ExecResult:
    """What a finished command produced. ``stdout``/``stderr`` are bytes; ``*_text`` decode them
    as UTF-8 (invalid bytes replaced)."""

    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def stdout_text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class FileStat:
    """One path as the sandbox sees it, without following a symlink. ``size`` is None when the
    sandbox could not say (and always 0 for non-files)."""

    path: str
    kind: FileKind
    size: int | None


@dataclass(frozen=True)
class DirEntry:
    name: str
    kind: FileKind
    size: int | None


@runtime_checkable
class DataPlane(Protocol):
    """Everything a ``Sandbox`` handle needs from a backend.

    Paths are given as ``(work_dir, relative)`` already confined lexically. Each primitive refuses
    a symlinked work dir or parent, and a symlinked destination, with :class:`PathRefused`.
    """

    async def exec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        cwd: str,
        create_cwd: bool = False,
        env: Mapping[str, str] | None = None,
        timeout: float,  # noqa: ASYNC109
        max_output_bytes: int = DEFAULT_OUTPUT_BUDGET,
    ) -> ExecResult: ...

    async def write_file(
        self, work_dir: str, relative: str, data: bytes, *, replace: bool = True
    ) -> None: ...

    async def read_file(self, work_dir: str, relative: str, *, max_bytes: int) -> bytes: ...

    async def stat(self, work_dir: str, relative: str) -> FileStat: ...

    async def list_dir(self, work_dir: str, relative: str) -> list[DirEntry]: ...

    async def remove(self, work_dir: str, relative: str, *, recursive: bool) -> bool: ...

    async def close(self) -> None: ...


# --------------------------------------------------------------------------------------------
# Transport


@dataclass
class RawResult:
    """What a transport returns. ``exit_code`` is None when the command did not finish (timeout,
    overflow); ``stdout``/``stderr`` are what arrived before that."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    overflowed: bool = False


class ExecTransport(Protocol):
    """Run an argv (no shell) with the given stdin bytes; stop reading at ``timeout`` seconds or
    after more than ``max_output`` bytes of stdout+stderr and report which."""

    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None,
        timeout: float,  # noqa: ASYNC109
        max_output: int,
    ) -> RawResult: ...

    async def close(self) -> None: ...


# --------------------------------------------------------------------------------------------
# Scripts (POSIX sh; dash, bash and busybox ash)

_EXEC_OUTER = r"""s=$1; shift
if command -v setsid >/dev/null 2>&1; then setsid sh -c "$s" sbx group "$@"
elif command -v python3 >/dev/null 2>&1; then
  python3 -c 'import os, sys; os.setsid(); os.execvp(sys.argv[1], sys.argv[1:])' \
    sh -c "$s" sbx group "$@"
else sh -c "$s" sbx process "$@"; fi
exit $?
"""

_EXEC_INNER = r"""printf 'SBX:pid:%s:%s\n' "$$" "$1" >&2
mk=$2; cwd=$3; nin=$4; ne=$5; shift 5
if [ "$mk" = 1 ] && [ ! -d "$cwd" ]; then mkdir -p "$cwd" 2>/dev/null; fi
cd "$cwd" 2>/dev/null || { printf 'SBX:err:cwd\n' >&2; exit 125; }
while [ "$ne" -gt 0 ]; do export "$1" || { printf 'SBX:err:env\n' >&2; exit 125; }
shift; ne=$((ne - 1)); done
if [ "$nin" -gt 0 ]; then head -c "$nin" | exec "$@"; else exec "$@" </dev/null; fi
"""

# Walk from $W through the parents of $R; refuse symlinks; create missing parents when MK=1.
_WALK = r"""sbx_walk() {
  [ -L "$W" ] && exit 90
  if [ ! -d "$W" ]; then
    [ -e "$W" ] && exit 91
    if [ "$MK" = 1 ]; then mkdir -p "$W" || exit 99; else exit 94; fi
  fi
  p=$W; rest=$R
  while :; do
    case $rest in */*) ;; *) break ;; esac
    c=${rest%%/*}; rest=${rest#*/}
    p=$p/$c
    if [ -L "$p" ]; then exit 92
    elif [ -d "$p" ]; then :
    elif [ -e "$p" ]; then exit 93
    elif [ "$MK" = 1 ]; then mkdir "$p" || exit 99
    else exit 94; fi
  done
  D=$p/$rest
}
"""

_WRITE = (
    _WALK
    + r"""W=$1; R=$2; N=$3; REPL=$4; TOK=$5; MK=1
sbx_walk
[ -L "$D" ] && exit 95
if [ -e "$D" ]; then
  [ -d "$D" ] && exit 96
  [ -f "$D" ] || exit 97
  [ "$REPL" = 1 ] || exit 98
fi
T=${D%/*}/.sbx-$TOK
set -C
head -c "$N" > "$T" || { rm -f "$T"; exit 99; }
set +C
set -- $(wc -c < "$T")
[ "$1" = "$N" ] || { rm -f "$T"; exit 102; }
if [ -L "$D" ] || [ -d "$D" ]; then rm -f "$T"; exit 95; fi
if [ "$REPL" = 1 ]; then mv -f "$T" "$D" || { rm -f "$T"; exit 99; }
else ln "$T" "$D" 2>/dev/null || { rm -f "$T"; exit 98; }; rm -f "$T"; fi
"""
)

_READ = (
    _WALK
    + r"""W=$1; R=$2; MAX=$3; MK=0
sbx_walk
[ -L "$D" ] && exit 95
[ -e "$D" ] || exit 94
[ -d "$D" ] && exit 96
[ -f "$D" ] || exit 97
set -- $(wc -c < "$D") || exit 99
[ -n "${1:-}" ] || exit 99
printf 'SBX:size:%s\n' "$1" >&2
[ "$1" -le "$MAX" ] || exit 100
head -c "$((MAX + 1))" < "$D"
"""
)

_STAT = (
    _WALK
    + r"""W=$1; R=$2; MK=0
sbx_walk
if [ -L "$D" ]; then echo "symlink 0"
elif [ -d "$D" ]; then echo "dir 0"
elif [ -f "$D" ]; then set -- $(wc -c < "$D" 2>/dev/null); echo "file ${1:-?}"
elif [ -e "$D" ]; then echo "other 0"
else exit 94; fi
"""
)

_LIST = (
    _WALK
    + r"""W=$1; R=$2; MK=0
if [ -z "$R" ]; then
  [ -L "$W" ] && exit 90
  [ -e "$W" ] || exit 94
  [ -d "$W" ] || exit 101
  D=$W
else
  sbx_walk
  [ -L "$D" ] && exit 95
  [ -e "$D" ] || exit 94
  [ -d "$D" ] || exit 101
fi
for e in "$D"/* "$D"/.*; do
  n=${e##*/}
  case $n in .|..) continue ;; esac
  if [ -L "$e" ]; then t=symlink; s=0
  elif [ -d "$e" ]; then t=dir; s=0
  elif [ -f "$e" ]; then set -- $(wc -c < "$e" 2>/dev/null); t=file; s=${1:-?}
  elif [ -e "$e" ]; then t=other; s=0
  else continue; fi
  printf '%s %s %s\0' "$t" "$s" "$n"
done
"""
)

_REMOVE = (
    _WALK
    + r"""W=$1; R=$2; REC=$3; MK=0
( sbx_walk; exit 0 ); rc=$?
[ "$rc" = 94 ] && { echo 0; exit 0; }
[ "$rc" = 0 ] || exit "$rc"
sbx_walk
if [ -L "$D" ]; then rm -f "$D" || exit 99; echo 1; exit 0; fi
[ -e "$D" ] || { echo 0; exit 0; }
if [ -d "$D" ]; then
  if [ "$REC" = 1 ]; then rm -rf "$D" || exit 99; else rmdir "$D" 2>/dev/null || exit 96; fi
else rm -f "$D" || exit 99; fi
echo 1
"""
)

_REFUSALS: dict[int, str] = {
    90: "symlinked_work_dir",
    91: "not_a_directory",
    92: "symlinked_parent",
    93: "parent_not_directory",
    95: "symlink_destination",
    96: "destination_is_directory",
    97: "not_a_regular_file",
    98: "exists",
    101: "not_a_directory",
}
_MISSING = 94
_TOO_LARGE = 100
_SIZE_MISMATCH = 102


def _stderr_detail(stderr: bytes) -> str:
    return stderr.decode("utf-8", errors="replace").strip()[:300]


def _kind(text: str) -> FileKind:
    if text in ("file", "dir", "symlink", "other"):
        return text  # type: ignore[return-value]
    raise DataPlaneError(f"unexpected file kind {text!r}")


def _size(text: str) -> int | None:
    return int(text) if text.isdigit() else None


class ExecDataPlane:
    """A :class:`DataPlane` built on an :class:`ExecTransport` alone."""

    def __init__(
        self,
        transport: ExecTransport,
        *,
        op_timeout: float = 60.0,
        bytes_per_second: float = 1024 * 1024,
    ) -> None:
        self.transport = transport
        self.op_timeout = op_timeout
        self.bytes_per_second = bytes_per_second

    # -- exec -----------------------------------------------------------------------------

    async def exec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        cwd: str,
        create_cwd: bool = False,
        env: Mapping[str, str] | None = None,
        timeout: float,  # noqa: ASYNC109
        max_output_bytes: int = DEFAULT_OUTPUT_BUDGET,
    ) -> ExecResult:
        argv, env_args = check_exec_request(argv, env)
        data = stdin or b""
        wrapper = [
            "sh",
            "-c",
            _EXEC_OUTER,
            "sbx",
            _EXEC_INNER,
            "1" if create_cwd else "0",
            cwd,
            str(len(data)),
            str(len(env_args)),
            *env_args,
            *argv,
        ]
        raw = await self.transport.run(
            wrapper, stdin=data or None, timeout=timeout, max_output=max_output_bytes + 256
        )
        pid, reach, stderr = _split_header(raw.stderr)
        if raw.timed_out or raw.overflowed:
            delivered = await self._kill(pid) if pid is not None else False
            if raw.overflowed:
                raise OutputBudgetExceeded(
                    budget=max_output_bytes,
                    received=len(raw.stdout) + len(stderr),
                    kill_delivered=delivered,
                )
            raise ExecTimeout(
                argv=argv,
                timeout=timeout,
                stdout=raw.stdout,
                stderr=stderr,
                kill_delivered=delivered,
                kill_reach=(reach if delivered else "nothing"),
            )
        if raw.exit_code is None:
            raise DataPlaneError("command ended without an exit code")
        if pid is None:
            raise ExecSetupError(what="wrapper", detail=_stderr_detail(raw.stderr))
        if raw.exit_code == 125 and stderr.startswith(b"SBX:err:"):
            what = stderr[8:].split(b"\n", 1)[0].decode(errors="replace")
            raise ExecSetupError(what=what, detail=f"cwd={cwd!r}" if what == "cwd" else "")
        if len(raw.stdout) + len(stderr) > max_output_bytes:
            raise OutputBudgetExceeded(
                budget=max_output_bytes,
                received=len(raw.stdout) + len(stderr),
                kill_delivered=False,
            )
        return ExecResult(raw.exit_code, raw.stdout, stderr)

    async def _kill(self, pid: int) -> bool:
        if pid <= 1:
            return False
        try:
            raw = await self.transport.run(
                ["sh", "-c", 'kill -9 "-$1" 2>/dev/null || kill -9 "$1"', "sbx", str(pid)],
                stdin=None,
                timeout=self.op_timeout,
                max_output=64 * 1024,
            )
        except Exception:
            return False
        return raw.exit_code == 0

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
        if code == _MISSING:
            raise SandboxFileNotFound(path)
        if code is not None and code in _REFUSALS:
            raise PathRefused(path=path, rule=_REFUSALS[code])
        raise DataPlaneError(f"file operation on {path!r} failed: {_stderr_detail(raw.stderr)}")

    async def write_file(
        self, work_dir: str, relative: str, data: bytes, *, replace: bool = True
    ) -> None:
        token = secrets.token_hex(8)
        raw = await self._script(
            _WRITE,
            [work_dir, relative, str(len(data)), "1" if replace else "0", token],
            stdin=data or None,
            nbytes=len(data),
        )
        if raw.exit_code == _SIZE_MISMATCH:
            raise TransferIntegrityError(path=relative, expected=len(data), received=-1)
        self._check(raw, relative)

    async def read_file(self, work_dir: str, relative: str, *, max_bytes: int) -> bytes:
        raw = await self._script(
            _READ,
            [work_dir, relative, str(max_bytes)],
            max_output=max_bytes + 64 * 1024,
            nbytes=max_bytes,
        )
        size = _parse_size(raw.stderr)
        if raw.exit_code == _TOO_LARGE:
            raise TransferCapExceeded(
                direction="read",
                cap="max_bytes",
                limit=max_bytes,
                actual=size if size is not None else -1,
                path=relative,
            )
        self._check(raw, relative)
        if size is None:
            raise DataPlaneError(f"no size reported for {relative!r}")
        if len(raw.stdout) != size:
            raise TransferIntegrityError(path=relative, expected=size, received=len(raw.stdout))
        return raw.stdout

    async def stat(self, work_dir: str, relative: str) -> FileStat:
        raw = await self._script(_STAT, [work_dir, relative])
        self._check(raw, relative)
        parts = raw.stdout.decode(errors="replace").split()
        if len(parts) != 2:
            raise DataPlaneError(f"unexpected stat answer for {relative!r}")
        return FileStat(relative, _kind(parts[0]), _size(parts[1]))

    async def list_dir(self, work_dir: str, relative: str) -> list[DirEntry]:
        raw = await self._script(_LIST, [work_dir, relative], max_output=64 * 1024 * 1024)
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
        raw = await self._script(_REMOVE, [work_dir, relative, "1" if recursive else "0"])
        self._check(raw, relative)
        return raw.stdout.strip() == b"1"

    async def close(self) -> None:
        await self.transport.close()


_HEADER = re.compile(rb"^SBX:pid:(\d+):(group|process)\n")
_SIZE = re.compile(rb"SBX:size:(\d+)")


def _split_header(stderr: bytes) -> tuple[int | None, str, bytes]:
    m = _HEADER.match(stderr)
    if not m:
        return None, "nothing", stderr
    return int(m.group(1)), m.group(2).decode(), stderr[m.end() :]


def _parse_size(stderr: bytes) -> int | None:
    m = _SIZE.search(stderr)
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------------------------
# Local transport (no isolation; tests and development)


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
        timeout: float,  # noqa: ASYNC109
        max_output: int,
    ) -> RawResult:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
        )
        out = bytearray()
        err = bytearray()
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
        try:
            done, _ = await asyncio.wait(
                {task, waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            waiter.cancel()
        if task in done:
            return RawResult(task.result(), bytes(out), bytes(err))
        task.cancel()
        # Stop reading and drop the local wrapper (its pipes included); the command's own process
        # group lives on until the caller's kill, as it would behind a remote transport.
        transport = getattr(proc, "_transport", None)
        if transport is not None:
            transport.close()
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


# --------------------------------------------------------------------------------------------
# Pod transport over pods/exec


@dataclass
class PodTarget:
    namespace: str
    pod: str
    container: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


_STDIN, _STDOUT, _STDERR, _ERROR = 0, 1, 2, 3
_CHUNK = 256 * 1024
_ATTEMPTS = 3


class PodExecTransport:
    """Runs argv in a pod's container over ``pods/exec`` (kubernetes_asyncio websocket client).

    Frames are read as raw bytes (channel byte + payload), so stdout/stderr are binary-safe; stdin
    is sent in chunks on channel 0.
    """

    def __init__(self, ws_api_client: Any, target: PodTarget) -> None:
        self._ws = ws_api_client
        self.target = target

    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None,
        timeout: float,  # noqa: ASYNC109
        max_output: int,
    ) -> RawResult:
        api = CoreV1Api(self._ws)
        out = bytearray()
        err = bytearray()
        status: bytes = b""
        overflowed = False

        async def session() -> None:
            kwargs: dict[str, Any] = {}
            if self.target.container:
                kwargs["container"] = self.target.container
            connect: Any = await api.connect_get_namespaced_pod_exec(
                self.target.pod,
                self.target.namespace,
                command=list(argv),  # type: ignore[arg-type]
                stdin=stdin is not None,
                stdout=True,
                stderr=True,
                tty=False,
                _preload_content=False,
                **kwargs,
            )
            async with connect as ws:
                sender = asyncio.ensure_future(_send_stdin(ws, stdin)) if stdin else None
                try:
                    await _receive(ws)
                finally:
                    if sender is not None:
                        sender.cancel()
                        await asyncio.gather(sender, return_exceptions=True)

        async def _receive(ws: Any) -> None:
            nonlocal status, overflowed
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.BINARY:
                    data: bytes = msg.data
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    data = msg.data.encode("utf-8")
                elif msg.type == aiohttp.WSMsgType.ERROR:
                    raise DataPlaneError("exec stream error")
                else:
                    break
                if not data:
                    continue
                channel, payload = data[0], data[1:]
                if channel == _STDOUT:
                    out.extend(payload)
                elif channel == _STDERR:
                    err.extend(payload)
                elif channel == _ERROR:
                    status += payload
                if len(out) + len(err) > max_output:
                    overflowed = True
                    return

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        attempt = 0
        while True:
            attempt += 1
            try:
                await asyncio.wait_for(session(), timeout=max(deadline - loop.time(), 0.001))
                break
            except TimeoutError:
                return RawResult(None, bytes(out), bytes(err), timed_out=True)
            except aiohttp.WSServerHandshakeError as exc:
                if exc.status == 403:
                    raise SandboxForbidden(
                        namespace=self.target.namespace, action="create pods/exec"
                    ) from None
                # The upgrade failed, so the command never started: a transient server-side
                # failure (API server to kubelet) is safe to retry.
                if exc.status >= 500 and attempt < _ATTEMPTS and deadline - loop.time() > 1:
                    await asyncio.sleep(0.5 * attempt)
                    continue
                raise DataPlaneError(
                    f"exec refused by the API server (HTTP {exc.status})"
                ) from None
            except aiohttp.ClientError as exc:
                raise DataPlaneError(f"exec transport failed: {type(exc).__name__}") from None
        if overflowed:
            return RawResult(None, bytes(out), bytes(err), overflowed=True)
        return RawResult(_exit_code(status), bytes(out), bytes(err))

    async def close(self) -> None:
        return None


async def _send_stdin(ws: Any, data: bytes) -> None:
    """Send stdin concurrently with reading, so a command writing output before it has read all
    of its input cannot deadlock the stream."""
    for i in range(0, len(data), _CHUNK):
        await ws.send_bytes(bytes([_STDIN]) + data[i : i + _CHUNK])


def _exit_code(status: bytes) -> int | None:
    if not status:
        return None
    try:
        doc = json.loads(status)
    except ValueError:
        raise DataPlaneError("unreadable exec status") from None
    if doc.get("status") == "Success":
        return 0
    for cause in (doc.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            return int(cause.get("message", "-1"))
    raise DataPlaneError(f"exec failed: {doc.get('reason') or 'unknown'}")


def pod_dataplane(
    ws_api_client: Any, namespace: str, pod: str, container: str | None = None
) -> ExecDataPlane:
    """A data plane into one pod's container over ``pods/exec``."""
    return ExecDataPlane(PodExecTransport(ws_api_client, PodTarget(namespace, pod, container)))
