"""The client's `DataPlane` for sandboxes served by an `acas` backend (`servedBy.kind`
`AcasSandbox`), over the service's HTTP API.

Files use the service's raw file operations (binary-safe): write, read, stat, list, delete,
mkdir. Before acting, each primitive walks the path from the work dir down with `stat` and
refuses a symlinked work dir, a symlinked or non-directory parent and a symlinked destination,
with the same `PathRefused` rules as the pod data plane. (A check-then-act gap remains: the
service offers no `O_NOFOLLOW`; the sandbox is the workload's own, so this protects against
mistakes, not against a racing adversary inside it.)

`exec` uses `executeCommand` (sent once, never retried) with a small POSIX `sh` wrapper, since
the operation has neither a timeout nor stdin: the wrapper changes directory (creating it if
asked), reads stdin from a file uploaded just before (and removes it), runs the argv verbatim in
a process group of its own and kills that group when the timeout passes.

The service returns stdout/stderr as JSON strings, which cannot carry bytes that are not UTF-8.
So the command's two streams go to files in a private directory of the guest's temp dir (mode
700, removed after), and the wrapper answers with an ASCII envelope only: exit code, whether the
timeout fired, both sizes, then both streams in base64 (or `od` hex where the image has no
`base64`). Output is byte-exact, both streams stay separate, and output over the budget is
refused from the sizes, before a byte of it crosses the wire.
"""

from __future__ import annotations

import base64
import posixpath
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Unpack

from sandbox_operator.acas.api import AcasClient
from sandbox_operator.acas.errors import AcasConflict, AcasError, AcasNotFound, AcasTimeout
from sandbox_operator.acas.models import FileInfo
from sandbox_operator.client.dataplane.protocol import (
    DirEntry,
    ExecRequest,
    FileStat,
    read_cap_exceeded,
)
from sandbox_operator.client.errors import (
    DataPlaneError,
    OutputBudgetExceeded,
    PathRefused,
    SandboxFileNotFound,
    TransferIntegrityError,
)
from sandbox_operator.views import SandboxView

if TYPE_CHECKING:
    from sandbox_operator.client.dataplane.protocol import (
        DataPlane,
        DataPlaneFactory,
        ExecOptions,
        ExecResult,
        FileKind,
    )

#: How much longer than the command's timeout the client waits for the HTTP answer.
RESPONSE_MARGIN = 30.0


_EXEC_WRAPPER = r"""t=$1; mk=$2; cwd=$3; in=$4; mark=$5; cap=$6; budget=$7; shift 7
if [ "$mk" = 1 ] && [ ! -d "$cwd" ]; then mkdir -p "$cwd" 2>/dev/null; fi
cd "$cwd" 2>/dev/null || { printf 'SBX:err:cwd\n' >&2; exit 125; }
(umask 077 && mkdir "$cap") 2>/dev/null || { printf 'SBX:err:capture\n' >&2; exit 125; }
if [ -n "$in" ]; then
  exec 3<"$in" || { rmdir "$cap"; printf 'SBX:err:stdin\n' >&2; exit 125; }
  rm -f "$in"
else
  exec 3</dev/null
fi
if command -v setsid >/dev/null 2>&1; then
  setsid "$@" <&3 3<&- >"$cap/o" 2>"$cap/e" &
else
  "$@" <&3 3<&- >"$cap/o" 2>"$cap/e" &
fi
c=$!
exec 3<&-
( sleep "$t"; : > "$mark"; kill -9 -"$c" 2>/dev/null || kill -9 "$c" 2>/dev/null ) \
  >/dev/null 2>&1 </dev/null &
w=$!
wait "$c"; rc=$?
kill "$w" 2>/dev/null
to=0; if [ -e "$mark" ]; then rm -f "$mark"; to=1; fi
os=$(wc -c <"$cap/o"); es=$(wc -c <"$cap/e")
if command -v base64 >/dev/null 2>&1; then enc=b64; else enc=hex; fi
printf 'SBX:out %s %s %s %s %s\n' "$rc" "$to" $os $es "$enc"
if [ $((os + es)) -le "$budget" ]; then
  for f in o e; do
    if [ "$enc" = b64 ]; then base64 <"$cap/$f"; else od -An -v -tx1 <"$cap/$f"; fi
    printf '\nSBX:end\n'
  done
fi
rm -f "$cap/o" "$cap/e"; rmdir "$cap" 2>/dev/null
exit 0
"""

#: The first line of the wrapper's envelope: exit code, timed out (0/1), the two streams' sizes
#: and their encoding.
_ENVELOPE = "SBX:out "
_STREAM_END = "SBX:end"


@dataclass(frozen=True)
class _Captured:
    """What the wrapper's envelope says: the command's exit code, whether its timeout fired,
    the sizes of its two streams and, when within the budget, their exact bytes."""

    exit_code: int
    timed_out: bool
    sizes: tuple[int, int]
    streams: tuple[bytes, bytes] | None


def _decode(lines: list[str], encoding: str) -> bytes:
    text = "".join(lines)
    if encoding == "b64":
        return base64.b64decode("".join(text.split()), validate=True)
    return bytes.fromhex(text)


def _parse_envelope(stdout: str) -> _Captured | None:
    """The wrapper's envelope (ASCII only, so the service's JSON strings carry it unchanged), or
    None when the wrapper printed none (it refused to set up, or did not run)."""
    if not stdout.startswith(_ENVELOPE):
        return None
    head, _, rest = stdout.partition("\n")
    try:
        rc, flag, out_size, err_size, encoding = head[len(_ENVELOPE) :].split()
        sizes = (int(out_size), int(err_size))
        if encoding not in ("b64", "hex"):
            raise ValueError(encoding)
        captured = _Captured(int(rc), flag == "1", sizes, None)
        if not rest:
            return captured
        chunks: list[list[str]] = [[]]
        for line in rest.splitlines():
            if line == _STREAM_END:
                chunks.append([])
            else:
                chunks[-1].append(line)
        if len(chunks) != 3 or chunks[2]:
            raise ValueError("streams")
        decoded = [_decode(chunk, encoding) for chunk in chunks[:2]]
    except ValueError:
        raise DataPlaneError("exec output envelope is malformed") from None
    # A process the command left behind may write on after it ended: the command's output is
    # what the stream held when the command's own exit was seen.
    if any(len(raw) < size for raw, size in zip(decoded, sizes, strict=True)):
        raise DataPlaneError("exec output shrank between its measure and its read")
    streams = (decoded[0][: sizes[0]], decoded[1][: sizes[1]])
    return _Captured(captured.exit_code, captured.timed_out, sizes, streams)


def _kind(info: FileInfo) -> FileKind:
    if info.is_symlink:
        return "symlink"
    if info.is_dir:
        return "dir"
    return "file"


class AcasDataPlane:
    """`DataPlane` for one remote sandbox. `client` is shared per backend; `close()` only
    closes it when `owns_client` is true."""

    def __init__(
        self,
        client: AcasClient,
        sandbox_id: str,
        *,
        owns_client: bool = False,
        tmp_dir: str = "/tmp",
    ) -> None:
        self.client = client
        self.sandbox_id = sandbox_id
        self._owns = owns_client
        self._tmp = tmp_dir

    def __repr__(self) -> str:
        return f"AcasDataPlane(sandbox={self.sandbox_id!r})"

    # -- exec -----------------------------------------------------------------------------

    async def exec(self, argv: Sequence[str], **options: Unpack[ExecOptions]) -> ExecResult:
        req = ExecRequest.check(argv, options)
        timeout = req.timeout
        token = secrets.token_hex(8)
        stdin_path = ""
        if req.stdin:
            stdin_path = posixpath.join(self._tmp, f".sbx-stdin-{token}")
            try:
                await self.client.write_file(
                    self.sandbox_id, stdin_path, req.stdin, create_dirs=True
                )
            except AcasError as exc:
                raise DataPlaneError(f"uploading stdin failed: {exc.detail}") from None
        mark = posixpath.join(self._tmp, f".sbx-timeout-{token}")
        capture = posixpath.join(self._tmp, f".sbx-out-{token}")
        wrapper = [
            "sh",
            "-c",
            _EXEC_WRAPPER,
            "sbx",
            f"{max(timeout, 0.001):g}",
            "1" if req.create_cwd else "0",
            req.cwd,
            stdin_path,
            mark,
            capture,
            str(req.budget),
            *req.argv,
        ]
        started = time.monotonic()
        try:
            result = await self.client.execute_command(
                self.sandbox_id,
                wrapper,
                environment=req.env,
                read_timeout=timeout + RESPONSE_MARGIN,
            )
        except AcasTimeout:
            raise req.timed_out(b"", b"", kill_delivered=False, kill_reach="nothing") from None
        except AcasError as exc:
            raise DataPlaneError(f"execute command failed: {exc.detail}") from None
        captured = _parse_envelope(result.stdout)
        if captured is None:
            stderr = result.stderr.encode("utf-8", errors="replace")
            if result.exit_code == 137 and time.monotonic() - started >= timeout:
                raise req.timed_out(b"", stderr, kill_delivered=True, kill_reach="group")
            req.finish(result.exit_code, b"", stderr)  # raises the wrapper's setup refusal
            raise DataPlaneError(
                f"exec wrapper printed no output envelope (exit {result.exit_code})"
            )
        if captured.streams is None:
            received = sum(captured.sizes)
            if captured.timed_out:  # the wrapper killed the command's group at its deadline
                raise req.over_budget(received, kill_delivered=True, kill_reach="group")
            # It ran to its end: nothing is left to kill, the sandbox stays clean.
            raise OutputBudgetExceeded(
                budget=req.budget, received=received, kill_delivered=False, ended=True
            )
        stdout, stderr = captured.streams
        if captured.timed_out:
            raise req.timed_out(stdout, stderr, kill_delivered=True, kill_reach="group")
        return req.finish(captured.exit_code, stdout, stderr)

    # -- path walk --------------------------------------------------------------------------

    async def _stat(self, path: str) -> FileInfo | None:
        try:
            return await self.client.stat_file(self.sandbox_id, path)
        except AcasNotFound:
            return None

    async def _walk(self, work_dir: str, relative: str, *, create: bool) -> str:
        """Check (and with `create`, make) the work dir and every parent of `relative`;
        return the destination's absolute path."""
        info = await self._stat(work_dir)
        if info is None:
            if not create:
                raise SandboxFileNotFound(relative or work_dir)
            await self.client.mkdir(self.sandbox_id, work_dir, create_parents=True)
        elif info.is_symlink:
            raise PathRefused(path=relative, rule="symlinked_work_dir")
        elif not info.is_dir:
            raise PathRefused(path=relative, rule="not_a_directory")
        parts = [p for p in relative.split("/") if p]
        current = work_dir
        for part in parts[:-1]:
            current = posixpath.join(current, part)
            info = await self._stat(current)
            if info is None:
                if not create:
                    raise SandboxFileNotFound(relative)
                await self.client.mkdir(self.sandbox_id, current, create_parents=False)
            elif info.is_symlink:
                raise PathRefused(path=relative, rule="symlinked_parent")
            elif not info.is_dir:
                raise PathRefused(path=relative, rule="parent_not_directory")
        return posixpath.join(work_dir, *parts) if parts else work_dir

    async def _files(self, call: Callable[[], Any], relative: str) -> Any:
        try:
            return await call()
        except AcasNotFound:
            raise SandboxFileNotFound(relative) from None
        except AcasConflict as exc:
            raise DataPlaneError(f"file operation refused: {exc.detail}") from None
        except AcasError as exc:
            raise DataPlaneError(f"file operation failed: {exc.detail}") from None

    # -- file primitives ---------------------------------------------------------------------

    async def write_file(
        self, work_dir: str, relative: str, data: bytes, *, replace: bool = True
    ) -> None:
        async def go() -> None:
            dest = await self._walk(work_dir, relative, create=True)
            info = await self._stat(dest)
            if info is not None:
                if info.is_symlink:
                    raise PathRefused(path=relative, rule="symlink_destination")
                if info.is_dir:
                    raise PathRefused(path=relative, rule="destination_is_directory")
                if not replace:
                    raise PathRefused(path=relative, rule="exists")
            written = await self.client.write_file(self.sandbox_id, dest, data, create_dirs=False)
            if written != len(data):
                raise TransferIntegrityError(path=relative, expected=len(data), received=written)

        await self._files(go, relative)

    async def read_file(self, work_dir: str, relative: str, *, max_bytes: int) -> bytes:
        async def go() -> bytes:
            dest = await self._walk(work_dir, relative, create=False)
            info = await self._stat(dest)
            if info is None:
                raise SandboxFileNotFound(relative)
            if info.is_symlink:
                raise PathRefused(path=relative, rule="symlink_destination")
            if info.is_dir:
                raise PathRefused(path=relative, rule="destination_is_directory")
            if info.size > max_bytes:
                raise read_cap_exceeded(relative, max_bytes, info.size)
            data = await self.client.read_file(self.sandbox_id, dest, max_bytes=max_bytes)
            if len(data) != info.size:
                raise TransferIntegrityError(path=relative, expected=info.size, received=len(data))
            return data

        result: bytes = await self._files(go, relative)
        return result

    async def stat(self, work_dir: str, relative: str) -> FileStat:
        async def go() -> FileStat:
            dest = await self._walk(work_dir, relative, create=False)
            info = await self._stat(dest)
            if info is None:
                raise SandboxFileNotFound(relative)
            kind = _kind(info)
            return FileStat(relative, kind, info.size if kind == "file" else 0)

        result: FileStat = await self._files(go, relative)
        return result

    async def list_dir(self, work_dir: str, relative: str) -> list[DirEntry]:
        async def go() -> list[DirEntry]:
            dest = await self._walk(work_dir, relative, create=False)
            if relative:
                info = await self._stat(dest)
                if info is None:
                    raise SandboxFileNotFound(relative)
                if info.is_symlink:
                    raise PathRefused(path=relative, rule="symlink_destination")
                if not info.is_dir:
                    raise PathRefused(path=relative, rule="not_a_directory")
            entries = await self.client.list_files(self.sandbox_id, dest)
            out = [
                DirEntry(e.name, _kind(e), e.size if _kind(e) == "file" else 0)
                for e in entries
                if e.name not in (".", "..")
            ]
            return sorted(out, key=lambda e: e.name)

        result: list[DirEntry] = await self._files(go, relative or ".")
        return result

    async def remove(self, work_dir: str, relative: str, *, recursive: bool) -> bool:
        async def go() -> bool:
            try:
                dest = await self._walk(work_dir, relative, create=False)
            except SandboxFileNotFound:
                return False
            info = await self._stat(dest)
            if info is None:
                return False
            if info.is_dir and not info.is_symlink and not recursive:
                raise PathRefused(path=relative, rule="destination_is_directory")
            try:
                await self.client.delete_file(
                    self.sandbox_id, dest, recursive=info.is_dir and not info.is_symlink
                )
            except AcasNotFound:
                return False
            return True

        result: bool = await self._files(go, relative)
        return result

    async def close(self) -> None:
        if self._owns:
            await self.client.aclose()


def acas_dataplane_factory(clients: Mapping[str, AcasClient]) -> DataPlaneFactory:
    """The data plane factory for `AcasSandbox`-served sandboxes: picks the `AcasClient` of the
    backend named in the Sandbox's `status.backend` and the remote id from `servedBy.name`."""

    def factory(_client: Any, obj: SandboxView) -> DataPlane:
        # A factory is public: a caller outside the type checker may hand a plain dict.
        status = SandboxView.of(obj).status
        client = clients.get(status.backend)
        if client is None:
            raise DataPlaneError(f"no acas client configured for backend {status.backend!r}")
        if not status.served_by.name:
            raise DataPlaneError("the sandbox has no remote id yet")
        return AcasDataPlane(client, status.served_by.name)

    return factory


def acas_dataplanes(clients: Mapping[str, AcasClient]) -> dict[str, DataPlaneFactory]:
    """The data planes that let a `SandboxClient` reach `AcasSandbox`-served sandboxes, with one
    `AcasClient` per acas backend name (as in the operator configuration)::

        SandboxClient(api, namespace, dataplanes=acas_dataplanes({"acas-west": west}))
    """
    from sandbox_operator.acas.models import REMOTE_KIND

    return {REMOTE_KIND: acas_dataplane_factory(clients)}
