"""The ``Sandbox`` handle: what a workload gets once a sandbox is Ready.

Every method is gated by the capabilities the spec *required* (not by what the backend could do):
a workload that did not ask for ``files_list`` cannot list, whichever backend serves it. The one
exception is :meth:`Sandbox.reclaim`, gated by nothing: cleanup must always be possible.

Paths are confined lexically here (see :mod:`sandbox_operator.client.paths`) and on disk by the
data plane. Transfer caps come from the spec's ``filesIn``/``filesOut`` and refuse, never truncate.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, Unpack

from sandbox_operator.client.activity import ActivityReport
from sandbox_operator.client.dataplane import (
    DEFAULT_OUTPUT_BUDGET,
    DataPlane,
    DirEntry,
    ExecOptions,
    ExecResult,
    FileStat,
)
from sandbox_operator.client.dataplane.streaming import (
    ChunkCallback,
    ExecStream,
    StreamingPlane,
    StreamOpening,
    StreamOptions,
)
from sandbox_operator.client.errors import (
    CapabilityNotRequired,
    ExecSetupError,
    ExecStreamUnsupported,
    SandboxFileNotFound,
    SandboxNotSuspendable,
    SandboxUnclean,
    TransferCapExceeded,
)
from sandbox_operator.client.observer import (
    EffectiveState,
    SandboxObserver,
    StoreFileRead,
    failure_name,
    notify,
    record_key,
)
from sandbox_operator.client.outputs import check_cap
from sandbox_operator.client.paths import confine, normalize_work_dir
from sandbox_operator.client.unclean import unclean_reason
from sandbox_operator.contract import (
    Capability,
    DeclaredOutput,
    Disposition,
    SandboxKey,
    SandboxSpec,
)
from sandbox_operator.contract.egressrules import EgressRule, EgressRuleFields
from sandbox_operator.views import SandboxView

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from sandbox_operator.client.outputs import CollectedOutputs, OutputSink

#: Interpreters ``run_code`` knows, as argv reading the program from stdin.
LANGUAGES: dict[str, tuple[str, ...]] = {
    "python": ("python3", "-"),
    "sh": ("sh", "-s"),
}


class SuspendsSandboxes(Protocol):
    """What suspends, resumes and disposes of a handle's sandbox: the ``SandboxClient`` that
    acquired it."""

    async def dispose(
        self, sandbox: Sandbox | str, *, wait: bool = False, uid: str | None = None
    ) -> None: ...

    async def suspend(self, sandbox: Sandbox, *, wait: bool, timeout: float | None) -> None: ...  # noqa: ASYNC109

    async def resume(self, sandbox: Sandbox, *, wait: bool, timeout: float | None) -> None: ...  # noqa: ASYNC109

    async def reset(self, sandbox: Sandbox, *, timeout: float | None) -> None: ...  # noqa: ASYNC109

    async def edit_egress(
        self,
        sandbox: Sandbox,
        *,
        allow: Sequence[str] | None,
        rules: Sequence[EgressRule | EgressRuleFields] | None,
        timeout: float | None,  # noqa: ASYNC109
    ) -> None: ...


class Sandbox:
    """A live sandbox: exec, code and files under the caps its spec declared.

    ``name``/``namespace`` name the Sandbox resource (empty for a handle built directly on a data
    plane); ``key`` is the sandbox key when known. ``observer`` receives the handle's events
    (``StoreFileRead``, ``OutputsCollected``); ``effective_state`` builds the value
    :attr:`effective_state` returns, on first use. ``resource`` is the Sandbox object as it was
    when it became Ready; ``created`` says whether the acquire that made this handle created it.
    """

    def __init__(
        self,
        spec: SandboxSpec,
        dataplane: DataPlane,
        *,
        name: str = "",
        namespace: str = "",
        key: SandboxKey | None = None,
        scope_ref: str = "",
        on_activity: Callable[[], Awaitable[None]] | None = None,
        activity_interval: float = 30.0,
        observer: SandboxObserver | None = None,
        effective_state: EffectiveState | Callable[[], EffectiveState] | None = None,
        lifecycle: SuspendsSandboxes | None = None,
        resource: SandboxView | None = None,
        created: bool = False,
    ) -> None:
        # What was asked for, and through what it is reached.
        self.spec = spec
        self.work_dir = normalize_work_dir(spec.work_dir)
        self.required: frozenset[Capability] = frozenset(spec.requires)
        self.dataplane = dataplane
        # Which Sandbox resource this is.
        self.name = name
        self.namespace = namespace
        self.key = key
        self.scope_ref = scope_ref
        # Who hears of its use, and who suspends it.
        self._activity = ActivityReport(on_activity, activity_interval)
        self.observer = observer
        self._effective_state = effective_state
        self._lifecycle = lifecycle
        # The Sandbox object as it was when it became Ready, and whether the acquire that made
        # this handle created that object (its server-side apply got 201, so no other acquire
        # of the key did).
        self.resource = resource
        self.created = created
        # Why the sandbox may run what nobody owns any more (None: clean). Once set, every use
        # is refused and the Sandbox is disposed (``_become_unclean``).
        self.unclean: str | None = None
        self._disposal: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"Sandbox(name={self.name!r}, namespace={self.namespace!r}, kind={self.spec.kind!r})"

    @property
    def view(self) -> SandboxView:
        """:attr:`resource` as a typed view (over the same object; empty for a handle built
        directly on a data plane)."""
        return SandboxView.of(self.resource)

    @property
    def effective_state(self) -> EffectiveState | None:
        """What the acquire that made this handle was served with (backend, isolation rung and
        scope, egress, capabilities, host tools, call id); ``None`` for a handle built directly
        on a data plane. Built on first read."""
        state = self._effective_state
        if state is None or isinstance(state, EffectiveState):
            return state
        self._effective_state = built = state()
        return built

    @effective_state.setter
    def effective_state(self, state: EffectiveState) -> None:
        """What serves the Sandbox now, once a resume has moved it to a new pod (the client's
        resume sets it; the rung and egress are the new pod's, judged again)."""
        self._effective_state = state

    def report_activity(self) -> None:
        """Count a use made through :attr:`dataplane` directly (a caller wrapping the data plane,
        e.g. the maf backend), so the idle timeout sees it as it sees a use of this handle."""
        record_key(self.key)
        self._activity()

    # -- gating ---------------------------------------------------------------------------

    def _gate(self, method: str, capability: Capability) -> None:
        record_key(self.key)  # the current call (if any) touched this sandbox
        if self.unclean is not None:
            raise SandboxUnclean(sandbox=self.name, reason=self.unclean)
        if capability not in self.required:
            raise CapabilityNotRequired(method=method, capability=capability.value)
        self._activity()

    # -- exec -----------------------------------------------------------------------------

    def _cwd(self, cwd: str | None) -> tuple[str, bool]:
        if cwd is None or cwd in ("", "."):
            return self.work_dir, True
        if cwd.startswith("/"):
            return cwd, False
        return confine(cwd, self.work_dir).absolute, False

    async def exec(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        timeout: float = 60.0,  # noqa: ASYNC109
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        max_output_bytes: int = DEFAULT_OUTPUT_BUDGET,
    ) -> ExecResult:
        """Run a command. A list is an argv passed verbatim (no shell); a string is run by
        ``sh -c``. ``cwd`` defaults to the work dir (created if missing); a relative ``cwd`` is
        confined under it. Raises ``ExecTimeout`` (with partial output and whether the kill was
        delivered), ``OutputBudgetExceeded`` (output is never truncated) and ``ExecStreamLost``
        (the connection to the command was lost); one whose kill fell short leaves the sandbox
        unclean (:meth:`exec_on_plane`)."""
        self._gate("exec", Capability.EXEC)
        argv = ("sh", "-c", command) if isinstance(command, str) else tuple(command)
        if not argv:
            raise ExecSetupError(what="argv", detail="empty command")
        return await self._run(argv, stdin, cwd, env, timeout, max_output_bytes)

    def exec_stream(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        timeout: float | None = 60.0,
        env: Mapping[str, str] | None = None,
        stdin: bool = False,
        tty: bool = False,
        max_output_bytes: int | None = DEFAULT_OUTPUT_BUDGET,
        on_stdout: ChunkCallback | None = None,
        on_stderr: ChunkCallback | None = None,
    ) -> StreamOpening:
        """Run a command and hand its output over as it arrives (docs/streaming.md):
        ``async with sandbox.exec_stream(argv) as stream: async for item in stream`` gives
        :class:`OutputChunk` items, then one :class:`ExitStatus`. ``stdin=True`` lets the caller
        feed it (``write_stdin``, ``close_stdin``); ``tty=True`` runs it on a terminal (stdin
        too, one output stream, ``resize``). ``command``, ``cwd`` and ``env`` as for
        :meth:`exec`; ``timeout`` and ``max_output_bytes`` bound it as they bound :meth:`exec`
        (None: no bound, for a person's terminal). A timeout, an output over the budget, a lost
        stream, a cancellation or leaving the block before the end kill the command; one whose
        kill fell short leaves the sandbox unclean, as for :meth:`exec`."""
        self._gate("exec_stream", Capability.EXEC)
        argv = ("sh", "-c", command) if isinstance(command, str) else tuple(command)
        if not argv:
            raise ExecSetupError(what="argv", detail="empty command")
        cwd_abs, create = self._cwd(cwd)
        options: StreamOptions = {
            "cwd": cwd_abs,
            "create_cwd": create,
            "env": env,
            "timeout": timeout,
            "max_output_bytes": max_output_bytes,
            "stdin": stdin,
            "tty": tty,
            "on_stdout": on_stdout,
            "on_stderr": on_stderr,
        }
        return StreamOpening(lambda: self.open_stream_on_plane(argv, **options))

    async def open_stream_on_plane(
        self, argv: Sequence[str], **options: Unpack[StreamOptions]
    ) -> ExecStream:
        """:meth:`exec_on_plane` for a stream: started on :attr:`dataplane` as given, under the
        unclean rule (every error the stream raises, and a stop before its end, is judged by
        it)."""
        if self.unclean is not None:
            raise SandboxUnclean(sandbox=self.name, reason=self.unclean)
        plane = self.dataplane
        if not isinstance(plane, StreamingPlane):
            raise ExecStreamUnsupported(
                "this sandbox's data plane runs buffered commands only", what="stream"
            )
        try:
            stream = await plane.open_stream(argv, **options)
        except BaseException as exc:
            self._judge(exc)
            raise
        stream.judge = self._judge
        return stream

    async def run_code(
        self,
        code: str,
        *,
        timeout: float = 60.0,  # noqa: ASYNC109
        language: str = "python",
        env: Mapping[str, str] | None = None,
        max_output_bytes: int = DEFAULT_OUTPUT_BUDGET,
    ) -> ExecResult:
        """Run a program text with an interpreter in the image (``python``: ``python3``; ``sh``).
        The program is sent on stdin, so its size is not limited by argv."""
        self._gate("run_code", Capability.RUN_CODE)
        try:
            argv = LANGUAGES[language]
        except KeyError:
            raise ExecSetupError(
                what="language", detail=f"{language!r} (known: {', '.join(LANGUAGES)})"
            ) from None
        return await self._run(argv, code, None, env, timeout, max_output_bytes)

    async def _run(
        self,
        argv: Sequence[str],
        stdin: bytes | str | None,
        cwd: str | None,
        env: Mapping[str, str] | None,
        timeout: float,  # noqa: ASYNC109
        budget: int,
    ) -> ExecResult:
        """Hand a gated command to the data plane, in ``cwd`` resolved against the work dir, with
        text ``stdin`` as UTF-8."""
        cwd_abs, create = self._cwd(cwd)
        options: ExecOptions = {
            "stdin": stdin.encode("utf-8") if isinstance(stdin, str) else stdin,
            "cwd": cwd_abs,
            "create_cwd": create,
            "env": env,
            "timeout": timeout,
            "max_output_bytes": budget,
        }
        return await self.exec_on_plane(argv, **options)

    async def exec_on_plane(
        self, argv: Sequence[str], **options: Unpack[ExecOptions]
    ) -> ExecResult:
        """Hand a command to :attr:`dataplane` as it is given (no capability gate, no ``cwd``
        resolution) under the unclean rule (:mod:`sandbox_operator.client.unclean`): refused
        with :class:`SandboxUnclean` once the sandbox is unclean, and an exec whose kill fell
        short makes it so. For a caller that gates and resolves commands itself (the maf
        backend), so that every exec on a sandbox is judged by this one rule."""
        if self.unclean is not None:
            raise SandboxUnclean(sandbox=self.name, reason=self.unclean)
        try:
            return await self.dataplane.exec(argv, **options)
        except BaseException as exc:
            self._judge(exc)
            raise

    def _judge(self, exc: BaseException) -> None:
        """The unclean rule on one exec's error (buffered or streamed)."""
        reason = unclean_reason(exc)
        if reason is not None:
            self._become_unclean(reason)

    def _become_unclean(self, reason: str) -> None:
        """Something may still run in the sandbox that no caller owns: a failed run over leaked
        state. Refuse every further use of this handle and, for a handle a client acquired,
        dispose of the Sandbox (in the background: the caller's own error or cancellation goes
        on at once), so the conversation's next acquire waits for the disposal and gets a new
        sandbox, never this one."""
        if self.unclean is not None:
            return
        self.unclean = reason
        log.warning(
            "sandbox %s/%s is unclean (%s): disposing it", self.namespace, self.name, reason
        )
        if self._lifecycle is None or not self.name:
            return
        uid = self.view.metadata.uid or None
        soon = getattr(self._lifecycle, "dispose_soon", None)
        if soon is not None:  # the client: registered, so its next acquire of the name waits
            self._disposal = soon(self.name, uid=uid)
        else:
            self._disposal = asyncio.ensure_future(self._lifecycle.dispose(self.name, uid=uid))

    # -- files in -------------------------------------------------------------------------

    def _check_in_file(self, path: str, size: int) -> None:
        check_cap(
            "filesIn", "max_bytes_per_file", self.spec.files_in.max_bytes_per_file, size, path
        )

    async def write_file(self, path: str, data: bytes | str, *, replace: bool = True) -> None:
        """Write ``data`` (bytes, or text as UTF-8) at ``path`` under the work dir, creating
        parents. Refuses escapes, symlinked parents/destination, and (``replace=False``) an
        existing file; refuses data above ``filesIn.maxBytesPerFile``."""
        self._gate("write_file", Capability.FILES_IN)
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        target = confine(path, self.work_dir)
        self._check_in_file(path, len(raw))
        await self.dataplane.write_file(target.work_dir, target.relative, raw, replace=replace)

    async def write_files(self, files: Mapping[str, bytes | str], *, replace: bool = True) -> None:
        """Write several files as one transfer: every path and all three ``filesIn`` caps are
        checked before the first byte is sent."""
        self._gate("write_files", Capability.FILES_IN)
        limits = self.spec.files_in
        check_cap("filesIn", "max_files", limits.max_files, len(files))
        prepared = []
        total = 0
        for path, data in files.items():
            raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
            target = confine(path, self.work_dir)
            self._check_in_file(path, len(raw))
            total += len(raw)
            check_cap("filesIn", "max_total_bytes", limits.max_total_bytes, total, path)
            prepared.append((target, raw))
        for target, raw in prepared:
            await self.dataplane.write_file(target.work_dir, target.relative, raw, replace=replace)

    # -- files out ------------------------------------------------------------------------

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """The exact bytes at ``path``. Refuses a file above ``max_bytes`` (or above
        ``filesOut.maxBytesPerFile``, whichever is smaller) rather than truncating it; refuses
        symlinks and anything not a regular file.

        With an observer, every read (including a refused one) is reported as a
        ``StoreFileRead`` carrying ``path`` as given: a path is usually chosen by the model or
        by the program in the sandbox, so a recorder must treat it as guest-chosen text."""
        call = record_key(self.key)
        try:
            data = await self._read_file(path, max_bytes)
        except BaseException as exc:
            failure = failure_name(exc)
            notify(
                self.observer,
                "store_file_read",
                lambda: StoreFileRead(
                    key=self.key, call=call, sandbox=self.name, path=path, bytes=0, failure=failure
                ),
            )
            raise
        notify(
            self.observer,
            "store_file_read",
            lambda: StoreFileRead(
                key=self.key, call=call, sandbox=self.name, path=path, bytes=len(data), failure=None
            ),
        )
        return data

    async def _read_file(self, path: str, max_bytes: int | None) -> bytes:
        self._gate("read_file", Capability.FILES_OUT)
        target = confine(path, self.work_dir)
        cap = self.spec.files_out.max_bytes_per_file
        if max_bytes is not None and max_bytes < cap:
            limit, direction, cap_name = max_bytes, "read", "max_bytes"
        else:
            limit, direction, cap_name = cap, "filesOut", "max_bytes_per_file"
        try:
            return await self.dataplane.read_file(target.work_dir, target.relative, max_bytes=limit)
        except TransferCapExceeded as exc:
            raise TransferCapExceeded(
                direction=direction, cap=cap_name, limit=limit, actual=exc.actual, path=path
            ) from None

    async def read_text(
        self, path: str, *, max_bytes: int | None = None, encoding: str = "utf-8"
    ) -> str:
        return (await self.read_file(path, max_bytes=max_bytes)).decode(encoding)

    async def stat(self, path: str) -> FileStat:
        """What is at ``path``, without following a symlink. Raises ``SandboxFileNotFound``."""
        self._gate("stat", Capability.FILES_OUT)
        target = confine(path, self.work_dir)
        return await self.dataplane.stat(target.work_dir, target.relative)

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
        except SandboxFileNotFound:
            return False
        return True

    async def list_dir(self, path: str = ".") -> list[DirEntry]:
        """Entries of a directory under the work dir (``"."`` is the work dir), sorted by name;
        symlinks are reported as symlinks, never followed."""
        self._gate("list_dir", Capability.FILES_LIST)
        target = confine(path, self.work_dir, allow_work_dir=True)
        return await self.dataplane.list_dir(target.work_dir, target.relative)

    # -- delete ---------------------------------------------------------------------------

    async def remove(self, path: str, *, recursive: bool = False) -> bool:
        """Remove ``path``; a symlink is removed itself, never followed. A missing path is
        success (returns False). A directory needs ``recursive``, even an empty one (maf-sandbox's
        rule: a plane without enumeration cannot tell empty from full, so none decides on it)."""
        self._gate("remove", Capability.FILES_DELETE)
        target = confine(path, self.work_dir)
        return await self.dataplane.remove(target.work_dir, target.relative, recursive=recursive)

    async def reclaim(self, directory: str) -> None:
        """Remove a directory the caller created under the work dir, and everything in it.
        Gated by no capability (cleanup must always be possible); a missing directory is
        success; links are removed, never followed."""
        target = confine(directory, self.work_dir)
        self._activity()
        await self.dataplane.remove(target.work_dir, target.relative, recursive=True)

    # -- suspend and resume ---------------------------------------------------------------

    def _lifecycle_for(self, method: str) -> SuspendsSandboxes:
        if self._lifecycle is None:
            raise SandboxNotSuspendable(
                sandbox=self.name,
                namespace=self.namespace,
                message=f"Sandbox.{method} needs a handle acquired through a SandboxClient",
            )
        return self._lifecycle

    async def suspend(
        self,
        *,
        wait: bool = True,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        """Suspend this sandbox: its compute stops (processes and memory are lost), its work
        directory on ``spec.storage``, NetworkPolicy and identity are kept. Raises
        :class:`SandboxNotSuspendable` when the spec declares no storage; with ``wait``, returns
        once the operator reports it ``Suspended``. The next use of the handle resumes it."""
        await self._lifecycle_for("suspend").suspend(self, wait=wait, timeout=timeout)

    async def resume(
        self,
        *,
        wait: bool = True,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        """Resume this sandbox, whatever suspended it (``suspend()``, ``spec.suspended``, the idle
        timeout): a new pod on the same work volume, re-admitted by the operator's policy. With
        ``wait``, returns once it is Ready again and the handle talks to the new pod; a refusal
        raises its typed error (e.g. :class:`SandboxIsolationBelowFloor` when the floor was raised
        meanwhile) and the sandbox stays suspended. Without ``wait``, the next use waits."""
        await self._lifecycle_for("resume").resume(self, wait=wait, timeout=timeout)

    async def reset(self, *, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Reset this sandbox: its pod is replaced by a never-used one (a matching warm pool's
        when one is idle) with an empty work directory; nothing the old pod ran or wrote stays.
        The handle then talks to the new pod. Raises :class:`SandboxUnclean` when the handle
        is unclean (its sandbox is being disposed), :class:`SandboxNotResettable` when the
        Sandbox declares storage or its backend cannot reset (see ``SandboxClient.reset``)."""
        if self.unclean is not None:
            raise SandboxUnclean(sandbox=self.name, reason=self.unclean)
        await self._lifecycle_for("reset").reset(self, timeout=timeout)

    async def edit_egress(
        self,
        *,
        allow: Sequence[str] | None = None,
        rules: Sequence[EgressRule | EgressRuleFields] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        """Narrow or widen this sandbox's egress allowlist (``allow``) and method and path rules
        (``rules``); None leaves one as it is. Returns once the edit is in force (see
        ``SandboxClient.edit_egress``); raises :class:`SandboxEgressEditRefused` when it is
        refused, the egress in force staying so."""
        await self._lifecycle_for("edit_egress").edit_egress(
            self, allow=allow, rules=rules, timeout=timeout
        )

    # -- outputs --------------------------------------------------------------------------

    async def collect_outputs(
        self, sink: OutputSink | None = None, *, named_at_call: Sequence[DeclaredOutput] = ()
    ) -> CollectedOutputs:
        """Collect the spec's declared outputs, and ``named_at_call`` when the spec sets
        ``outputsNamedAtCallTime`` (see :func:`collect_outputs`)."""
        from sandbox_operator.client.outputs import collect_outputs

        return await collect_outputs(self, sink, named_at_call=named_at_call)

    async def list_outputs(
        self,
        directory: str = ".",
        *,
        media_type: str = "application/octet-stream",
        disposition: Disposition = Disposition.LAND,
        required: bool = True,
    ) -> tuple[DeclaredOutput, ...]:
        """Name the entries of ``directory`` as outputs, for ``collect_outputs(named_at_call=)``
        (see :func:`~sandbox_operator.client.outputs.list_outputs`)."""
        from sandbox_operator.client.outputs import list_outputs

        return await list_outputs(
            self, directory, media_type=media_type, disposition=disposition, required=required
        )

    async def close(self) -> None:
        await self._activity.settle()
        await self.dataplane.close()


def shell_join(argv: Sequence[str]) -> str:
    """Quote an argv for display."""
    return shlex.join(argv)
