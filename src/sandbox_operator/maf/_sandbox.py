"""The maf-sandbox ``Sandbox`` over any of this project's data planes.

:class:`OperatorSandbox` is the one place maf's path rules meet our data plane: every file method
first discharges maf's confinement bundle (:mod:`maf_sandbox.paths`, the file name check and the
filesystem path check) with no-follow stats read in one batch (:meth:`OperatorSandbox.lstat_many`:
one command for every component from the root, not one per component), then hands the path to
the data plane, whose scripts walk it again inside the sandbox right before acting. It is built
over a :class:`~sandbox_operator.client.dataplane.DataPlane`, a storage base and a spec only, so
the unit tests run maf's conformance suites against the local data plane (processes in a temp
directory) and :class:`~sandbox_operator.maf.OperatorBackend` builds it over the pod data plane.

Reach: the pod data plane runs every primitive as the guest's own user (``pods/exec`` into the
sandbox container), so a path swapped between the check and the act reaches nothing the guest
program could not reach itself. The same is true of the stat the check uses, and it is answered
by a guest program (``sh``'s ``test``): the engine offers no other no-follow stat of a pod's
filesystem, which maf's rule allows as the residual of acting at the guest's authority.
"""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Awaitable, Callable, Sequence
from typing import Unpack

import maf_sandbox as maf
from maf_sandbox.bounded_exec import SandboxExecOutputLimitExceeded
from maf_sandbox.paths import (
    confine_resolve_guest_delete_path,
    confine_resolve_guest_list_path,
    confine_resolve_guest_path,
    confine_resolve_guest_read_path,
    confine_resolve_guest_write_path,
    ensure_guest_work_dir,
    guest_path_and_ancestors,
    posix_work_dir_ancestors,
    resolve_guest_working_directory,
)

from sandbox_operator.client.dataplane import DataPlane
from sandbox_operator.client.dataplane.protocol import (
    DEFAULT_OUTPUT_BUDGET,
    ExecOptions,
    ExecResult,
    FileKind,
)
from sandbox_operator.client.errors import (
    DataPlaneError,
    ExecQueuedTimeout,
    ExecSetupError,
    ExecStreamLost,
    ExecTimeout,
    OutputBudgetExceeded,
    PathRefused,
    SandboxFileNotFound,
    SandboxUnclean,
    TransferCapExceeded,
)
from sandbox_operator.client.sandbox import Sandbox as ClientSandbox
from sandbox_operator.contract import SandboxSpec as ContractSpec
from sandbox_operator.views import SandboxView

_KINDS: dict[FileKind, maf.EntryKind] = {
    "file": maf.EntryKind.FILE,
    "dir": maf.EntryKind.DIRECTORY,
    "symlink": maf.EntryKind.SYMLINK,
    "other": maf.EntryKind.OTHER,
}

#: Refusals of the data plane's in-sandbox walk that mean "a link on the way" (maf: ValueError).
_LINK_RULES = frozenset({"symlinked_work_dir", "symlinked_parent", "symlink_destination"})

#: How long a primitive the caller gave no bound (stat, write, list, remove) may take.
DEFAULT_OP_TIMEOUT = 60.0

#: The exit status of a command that could not start because its working directory is missing.
CWD_MISSING_EXIT = 125

#: The interpreter :meth:`OperatorSandbox.run_code` evaluates a program with (program on stdin).
RUN_CODE_ARGV = ("python3", "-")


#: Describes each argument without following it, one line each: ``symlink``, ``dir``,
#: ``file <size>``, ``other`` or ``none`` (nothing visible there). Names never reach the output.
_LSTAT_MANY = r"""for p in "$@"; do
  if [ -L "$p" ]; then echo symlink
  elif [ -d "$p" ]; then echo dir
  elif [ -f "$p" ]; then n=$(wc -c < "$p" 2>/dev/null); echo file $n
  elif [ -e "$p" ]; then echo other
  else echo none; fi
done
"""


def _file_kind(text: str) -> FileKind:
    if text in ("file", "dir", "symlink", "other"):
        return text  # type: ignore[return-value]
    raise OSError(f"unexpected file kind {text!r}")


def _refusal(exc: PathRefused) -> Exception:
    """The maf refusal type of a data plane's confinement refusal."""
    if exc.rule in _LINK_RULES:
        return ValueError(f"path refused: {exc.rule}")
    if exc.rule == "destination_is_directory":
        return IsADirectoryError(f"path refused: {exc.rule}")
    if exc.rule in ("not_a_directory", "parent_not_directory"):
        return NotADirectoryError(f"path refused: {exc.rule}")
    return OSError(f"path refused: {exc.rule}")


def _split(guest_path: str) -> tuple[str, str]:
    """``(work_dir, relative)`` of an absolute, normalized guest path, for the data plane."""
    return "/", guest_path.lstrip("/")


def _bare_handle(dataplane: DataPlane, spec: maf.SandboxSpec, base: str) -> ClientSandbox:
    """A client handle straight on a data plane (no Sandbox resource, nothing to dispose): what
    a wrapper built without one judges its execs through. Its spec is never admitted (only its
    work dir and an empty ``requires`` are read), so it is built without validation."""
    bare = ContractSpec.model_construct(
        kind=spec.kind, image="-", work_dir=base, requires=frozenset()
    )
    return ClientSandbox(bare, dataplane)


def sandbox_instance_id(obj: SandboxView) -> str:
    """One physical sandbox: the Sandbox's uid, the serving object's name, when it last became
    Ready and the reset it answers. A replacement (a new pod after a resume or a reset, a
    recreated Sandbox) changes it; another acquire of the same live sandbox does not. ``obj``:
    the Sandbox's view (a plain dict is wrapped: the function is public)."""
    view = SandboxView.of(obj)
    status = view.status
    ready = ""
    for condition in status.conditions:
        if condition.type == "Ready":
            ready = condition.last_transition_time
    resets = status.resets
    reset = f"/{resets}" if isinstance(resets, int) and resets > 0 else ""
    return f"{view.metadata.uid}/{status.served_by.name}/{ready}{reset}"


class OperatorSandbox:
    """A ``maf_sandbox.Sandbox`` over a client handle (or a bare data plane), a storage base and
    the spec it was acquired for.

    ``sandbox`` is the client's :class:`~sandbox_operator.client.Sandbox` the backend acquired,
    or a data plane (a handle is then made on it, with no Sandbox to dispose). Every command
    goes through the handle's :meth:`~sandbox_operator.client.Sandbox.exec_on_plane`, so the
    client's unclean rule is this wrapper's too (one implementation): an exec cancelled, timed
    out, over its budget or cut off from its stream whose kill fell short disposes the Sandbox,
    and every later use of this wrapper raises :class:`maf_sandbox.SandboxUnclean`.

    ``base`` is the absolute guest path relative working directories address (``spec.work_dir``
    when the spec names one). ``instance_id`` identifies the physical sandbox (the serving pod's
    uid under the operator); ``freshly_created`` is True only when the acquire that built this
    wrapper created the instance from a clean image. ``name``/``namespace`` name the Sandbox
    resource (the handle's by default) and ``pod`` its pod. Every method reports the handle's
    activity (the client's idle timeout).
    ``reclaims`` is False where the backend withholds ``RECLAIM`` (its data plane cannot refuse a
    link on the way): :meth:`reclaim` then raises ``NotImplementedError``, as maf's protocol asks.
    ``resets`` is True where the backend declares ``SNAPSHOT`` (the operator resets it):
    :meth:`reset` raises ``NotImplementedError`` otherwise; ``on_reset`` is told the new
    instance id of each reset made.
    """

    def __init__(
        self,
        sandbox: ClientSandbox | DataPlane,
        spec: maf.SandboxSpec,
        *,
        base: str,
        instance_id: str,
        freshly_created: bool = False,
        name: str | None = None,
        namespace: str | None = None,
        pod: str = "",
        op_timeout: float = DEFAULT_OP_TIMEOUT,
        reclaims: bool = True,
        resets: bool = False,
        on_reset: Callable[[str], None] | None = None,
    ) -> None:
        if not base.startswith("/") or posixpath.normpath(base) != base:
            raise ValueError("base must be an absolute, normalized guest path")
        if isinstance(sandbox, ClientSandbox):
            handle = sandbox
        else:
            handle = _bare_handle(sandbox, spec, base)
        self.handle = handle
        self.dataplane = handle.dataplane
        self.spec = spec
        self.base = base
        self._instance_id = instance_id
        self.freshly_created = freshly_created
        self.name = handle.name if name is None else name
        self.namespace = handle.namespace if namespace is None else namespace
        self.pod = pod
        self.op_timeout = op_timeout
        self.reclaims = reclaims
        self.resets = resets
        self._on_reset = on_reset

    def __repr__(self) -> str:
        return f"OperatorSandbox(name={self.name!r}, pod={self.pod!r}, base={self.base!r})"

    @property
    def instance_id(self) -> str:
        """The physical sandbox's identity: stable across acquires, new after replacement."""
        return self._instance_id

    # -- the unconfined no-follow stat maf's checks read ---------------------------------------

    async def lstat(self, guest_path: str) -> maf.SandboxEntry | None:
        """Describe an absolute guest path without following its last component; None when
        nothing is there. A size is reported for regular files only."""
        self._check_clean()
        path = posixpath.normpath(guest_path)
        if path == "/":
            return maf.SandboxEntry(path=path, kind=maf.EntryKind.DIRECTORY, size_bytes=None)
        work_dir, relative = _split(path)
        try:
            st = await self.dataplane.stat(work_dir, relative)
        except SandboxFileNotFound:
            return None
        except PathRefused as exc:
            raise _refusal(exc) from None
        except DataPlaneError as exc:
            raise OSError(str(exc)) from exc
        kind = _KINDS[st.kind]
        size = st.size if kind is maf.EntryKind.FILE else None
        return maf.SandboxEntry(path=path, kind=kind, size_bytes=size)

    async def lstat_many(self, guest_paths: Sequence[str]) -> dict[str, maf.SandboxEntry | None]:
        """:meth:`lstat` of several absolute guest paths in one command (one round trip instead
        of one per path component: maf's path check stats every component from the root)."""
        paths = [posixpath.normpath(p) for p in guest_paths]
        answer: dict[str, maf.SandboxEntry | None] = {}
        asked = [p for p in dict.fromkeys(paths) if p != "/"]
        if "/" in paths:
            answer["/"] = maf.SandboxEntry(path="/", kind=maf.EntryKind.DIRECTORY, size_bytes=None)
        if not asked:
            return answer
        try:
            result = await self._plane_exec(
                ["sh", "-c", _LSTAT_MANY, "sbx", *asked], cwd="/", timeout=self.op_timeout
            )
        except (DataPlaneError, ExecSetupError, ExecTimeout) as exc:
            raise OSError(f"the sandbox could not describe its paths: {exc}") from exc
        lines = result.stdout.decode(errors="replace").splitlines()
        if result.exit_code != 0 or len(lines) != len(asked):
            raise OSError("the sandbox could not describe its paths")
        for path, line in zip(asked, lines, strict=True):
            kind, _, size = line.partition(" ")
            if kind == "none":
                answer[path] = None
                continue
            entry_kind = _KINDS[_file_kind(kind)]
            size_bytes = int(size) if entry_kind is maf.EntryKind.FILE and size.isdigit() else None
            answer[path] = maf.SandboxEntry(path=path, kind=entry_kind, size_bytes=size_bytes)
        return answer

    async def _stat_for(
        self, guest_path: str, working_directory: str
    ) -> Callable[[str], Awaitable[maf.SandboxEntry | None]]:
        """A no-follow stat for maf's checks on ``guest_path`` (already confined lexically),
        answered from one batch over every component from the root down to it."""
        known = await self.lstat_many(guest_path_and_ancestors(guest_path, working_directory))

        async def stat(path: str) -> maf.SandboxEntry | None:
            normalized = posixpath.normpath(path)
            if normalized in known:
                return known[normalized]
            return await self.lstat(normalized)

        return stat

    def _check_clean(self) -> None:
        """Refuse any use once the sandbox is unclean, with maf's type for it."""
        reason = self.handle.unclean
        if reason is not None:
            raise maf.SandboxUnclean(
                f"sandbox {self.name or '(unnamed)'} is unclean ({reason}); it is disposed and "
                "never used again"
            )

    def _use(self) -> None:
        """A use of the sandbox: refused when unclean, else counted for the idle timeout."""
        self._check_clean()
        self.handle.report_activity()

    async def _plane_exec(self, argv: Sequence[str], **options: Unpack[ExecOptions]) -> ExecResult:
        """Every command of this wrapper: through the client handle's unclean rule."""
        try:
            return await self.handle.exec_on_plane(argv, **options)
        except SandboxUnclean:
            self._check_clean()
            raise

    def _working_directory(self, working_directory: str) -> str:
        self._use()
        return resolve_guest_working_directory(working_directory, self.base)

    async def prepare(self) -> None:
        """Make sure the storage base is a real directory (maf's acquire duty): missing parents
        are created, a link or a non-directory on the way is refused."""
        known = await self.lstat_many(posix_work_dir_ancestors(self.base))

        async def stat(path: str) -> maf.SandboxEntry | None:
            return known[path] if path in known else await self.lstat(path)

        await ensure_guest_work_dir(
            self.spec,
            stat,
            self._create_directories,
            resolve=posix_work_dir_ancestors,
            base=self.base,
        )

    async def _create_directories(self, directories: tuple[str, ...]) -> None:
        deepest = directories[-1]
        result = await self._plane_exec(
            ["mkdir", "-p", "--", deepest], cwd="/", timeout=self.op_timeout
        )
        if result.exit_code != 0:
            raise OSError(f"could not create the storage base {deepest!r}")

    # -- exec -----------------------------------------------------------------------------

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        working_directory: str,
        timeout: float,  # noqa: ASYNC109 (maf's signature)
    ) -> maf.ExecResult:
        """Run ``command`` (a sequence: argv verbatim; a string: an ``sh -c`` line) in the
        resolved working directory. :class:`TimeoutError` means ``timeout`` expired and nothing
        else: the data plane then kills the command's process group. A connection to the
        command lost before its end is a :class:`ConnectionError` (its group killed first). A
        kill that fell short (after a timeout, a cancellation, the budget or a lost stream)
        leaves the sandbox unclean: disposed, and every later use raises
        :class:`maf_sandbox.SandboxUnclean`."""
        cwd = self._working_directory(working_directory)
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        return await self._exec(argv, cwd=cwd, timeout=timeout, stdin=None)

    async def exec_bounded(
        self,
        command: str | Sequence[str],
        *,
        working_directory: str,
        timeout: float,  # noqa: ASYNC109
        max_output_bytes: int,
    ) -> maf.ExecResult:
        """:meth:`exec` with a caller's stdout + stderr budget (maf's ``BoundedExec``)."""
        if type(max_output_bytes) is not int or max_output_bytes <= 0:
            raise ValueError("max_output_bytes must be a positive integer")
        cwd = self._working_directory(working_directory)
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        return await self._exec(argv, cwd=cwd, timeout=timeout, stdin=None, budget=max_output_bytes)

    async def _exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        timeout: float,  # noqa: ASYNC109
        stdin: bytes | None,
        budget: int = DEFAULT_OUTPUT_BUDGET,
    ) -> maf.ExecResult:
        try:
            result = await self._plane_exec(
                argv, cwd=cwd, timeout=timeout, stdin=stdin, max_output_bytes=budget
            )
        except ExecTimeout as exc:
            raise TimeoutError(f"the command ran past its {timeout:g}s bound") from exc
        except ExecQueuedTimeout as exc:
            # Before the transport's TimeoutError below: this one is the caller's bound, spent
            # waiting for the sandbox (a resume), and the program never started.
            raise maf.SandboxQueuedTimeout(
                f"the {timeout:g}s bound ran out waiting for the sandbox; nothing ran"
            ) from exc
        except TimeoutError as exc:
            # Not the caller's bound (a transport's own): never surfaced as a TimeoutError.
            raise ConnectionError("the data plane timed out reaching the sandbox") from exc
        except OutputBudgetExceeded as exc:
            raise SandboxExecOutputLimitExceeded(
                f"the command produced more than {budget} bytes of output"
            ) from exc
        except ExecStreamLost as exc:
            # A transport failure, never the caller's bound: not a TimeoutError.
            raise ConnectionError(
                "the connection to the command was lost before it ended; its process group "
                + ("was killed" if exc.kill_reach == "group" else "could not be killed")
            ) from exc
        except ExecSetupError as exc:
            if exc.what == "cwd":
                # The command never ran: reported as its result, as a shell's failed ``cd`` or an
                # engine's exec into a missing directory is, never by creating the directory.
                return maf.ExecResult(
                    exit_code=CWD_MISSING_EXIT,
                    stderr_bytes=f"working directory {cwd!r} is not a directory\n".encode(),
                )
            raise ValueError(f"the command could not be started: {exc.what}") from exc
        return maf.ExecResult(
            exit_code=result.exit_code, stdout_bytes=result.stdout, stderr_bytes=result.stderr
        )

    async def run_code(self, code: str, *, timeout: float) -> maf.ExecResult:  # noqa: ASYNC109
        """Evaluate a Python program with the image's ``python3`` (program on stdin, in the
        storage base): what it prints comes back, not the value of its last expression."""
        if maf.Capability.RUN_CODE not in self.spec.required_capabilities:
            raise NotImplementedError("RUN_CODE was not required by the spec")
        self._use()
        return await self._exec(
            RUN_CODE_ARGV, cwd=self.base, timeout=timeout, stdin=code.encode("utf-8")
        )

    # -- files ----------------------------------------------------------------------------

    async def write_file(self, path: str, content: str | bytes, *, working_directory: str) -> None:
        wd = self._working_directory(working_directory)
        stat = await self._stat_for(confine_resolve_guest_path(path, wd), wd)
        guest = await confine_resolve_guest_write_path(stat, path, wd)
        data = content.encode("utf-8") if isinstance(content, str) else content
        work_dir, relative = _split(guest)
        try:
            await self.dataplane.write_file(work_dir, relative, data)
        except PathRefused as exc:
            raise _refusal(exc) from None
        except DataPlaneError as exc:
            raise OSError(str(exc)) from exc

    async def stat_file(self, path: str, *, working_directory: str) -> maf.SandboxEntry | None:
        wd = self._working_directory(working_directory)
        stat = await self._stat_for(confine_resolve_guest_path(path, wd), wd)
        guest = await confine_resolve_guest_read_path(stat, path, wd)
        entry = await stat(guest)
        if entry is None:
            return None
        return maf.SandboxEntry(
            path=posixpath.normpath(path), kind=entry.kind, size_bytes=entry.size_bytes
        )

    async def read_file(self, path: str, *, working_directory: str, max_bytes: int) -> bytes:
        wd = self._working_directory(working_directory)
        stat = await self._stat_for(confine_resolve_guest_path(path, wd), wd)
        guest = await confine_resolve_guest_read_path(stat, path, wd)
        entry = await stat(guest)
        if entry is None:
            raise FileNotFoundError(f"no such file: {path!r}")
        if entry.kind is not maf.EntryKind.FILE:
            raise OSError(f"{path!r} is not a regular file and is refused")
        if entry.size_bytes is not None and entry.size_bytes > max_bytes:
            raise maf.SandboxTransferCapExceeded(
                f"{path!r} is {entry.size_bytes} bytes and the caller allowed {max_bytes}"
            )
        work_dir, relative = _split(guest)
        try:
            return await self.dataplane.read_file(work_dir, relative, max_bytes=max_bytes)
        except TransferCapExceeded as exc:
            raise maf.SandboxTransferCapExceeded(
                f"{path!r} is over the {max_bytes} bytes the caller allowed"
            ) from exc
        except SandboxFileNotFound:
            raise FileNotFoundError(f"no such file: {path!r}") from None
        except PathRefused as exc:
            raise _refusal(exc) from None
        except DataPlaneError as exc:
            raise OSError(str(exc)) from exc

    async def list_dir(self, path: str, *, working_directory: str) -> tuple[maf.SandboxEntry, ...]:
        wd = self._working_directory(working_directory)
        stat = await self._stat_for(confine_resolve_guest_path(path, wd), wd)
        guest = await confine_resolve_guest_list_path(stat, path, wd)
        work_dir, relative = _split(guest)
        try:
            entries = await self.dataplane.list_dir(work_dir, relative)
        except SandboxFileNotFound:
            raise FileNotFoundError(f"no such directory: {path!r}") from None
        except PathRefused as exc:
            raise _refusal(exc) from None
        except DataPlaneError as exc:
            raise OSError(str(exc)) from exc
        prefix = posixpath.normpath(path)
        return tuple(
            maf.SandboxEntry(
                path=e.name if prefix == "." else posixpath.join(prefix, e.name),
                kind=_KINDS[e.kind],
                size_bytes=e.size if e.kind == "file" else None,
            )
            for e in entries
        )

    async def remove(self, path: str, *, working_directory: str, recursive: bool = False) -> None:
        if maf.Capability.FILES_DELETE not in self.spec.required_capabilities:
            raise NotImplementedError("FILES_DELETE was not required by the spec")
        wd = self._working_directory(working_directory)
        stat = await self._stat_for(confine_resolve_guest_path(path, wd), wd)
        guest = await confine_resolve_guest_delete_path(stat, path, wd)
        work_dir, relative = _split(guest)
        try:
            await self.dataplane.remove(work_dir, relative, recursive=recursive)
        except PathRefused as exc:
            raise _refusal(exc) from None
        except DataPlaneError as exc:
            raise OSError(str(exc)) from exc

    async def reclaim(
        self,
        directory: str,
        *,
        working_directory: str,
        timeout: float,  # noqa: ASYNC109
    ) -> None:
        """Remove a framework directory and everything under it, as the guest's own user (so a
        swapped component reaches nothing the guest could not delete itself); links inside are
        unlinked, never followed. Absolute targets must be canonical and two components deep.
        Raises ``NotImplementedError`` where the backend withholds ``RECLAIM``."""
        if not self.reclaims:
            raise NotImplementedError(
                "this backend withholds RECLAIM: its data plane cannot refuse a link on the way; "
                "dispose the sandbox instead"
            )
        wd = self._working_directory(working_directory)
        if not posixpath.isabs(directory):
            directory = confine_resolve_guest_path(directory, wd)
            if directory == posixpath.normpath(wd):
                raise ValueError("reclaim must name a child of the working directory")
        if directory != posixpath.normpath(directory) or directory.startswith("//"):
            raise ValueError("reclaim requires a canonical absolute path")
        if len([part for part in directory.split("/") if part]) < 2:
            raise ValueError("refusing to reclaim that close to the filesystem root")
        work_dir, relative = _split(directory)
        try:
            async with asyncio.timeout(timeout):
                await self.dataplane.remove(work_dir, relative, recursive=True)
        except PathRefused as exc:
            raise OSError(f"reclaim refused: {exc.rule}") from None
        except DataPlaneError as exc:
            raise OSError(str(exc)) from exc

    async def reset(self, *, timeout: float) -> None:  # noqa: ASYNC109
        """Restore the state before any input: the operator replaces the Sandbox's pod by a
        never-used one (a matching warm pool's idle pod, else a new pod) with an empty work
        directory, and deletes the old one with every process and file it had
        (``SandboxClient.reset``, docs/reset.md). The storage base needs no preparing: it is the
        new pod's work directory, a volume mounted there when the pod was made, and nothing has
        used the pod yet. The key,
        kind and Sandbox stay; :attr:`instance_id` is the new pod's. Raises on any failure
        (maf then disposes), ``NotImplementedError`` where the backend does not reset (it
        declares no ``SNAPSHOT`` there)."""
        if not self.resets:
            raise NotImplementedError(
                "this backend does not reset sandboxes (no SNAPSHOT); dispose instead"
            )
        self._check_clean()
        async with asyncio.timeout(timeout):
            await self.handle.reset(timeout=timeout)
            view = self.handle.view
            self._instance_id = sandbox_instance_id(view)
            self.pod = view.status.served_by.name
        if self._on_reset is not None:
            self._on_reset(self._instance_id)


__all__ = ["OperatorSandbox"]
