"""What every data plane implements and returns: the :class:`DataPlane` protocol, its result
types, and :class:`ExecRequest`, the one place an exec request is checked and its outcome judged.

Paths a data plane receives are already confined *lexically* by the handle (see
:mod:`sandbox_operator.client.paths`): ``work_dir`` is absolute and normalized, ``relative`` has no
empty, ``.`` or ``..`` segment. What only the sandbox can answer -- a symlinked parent, a symlinked
destination -- the data plane answers inside the sandbox, right before acting.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, Required, TypedDict, Unpack, runtime_checkable

from sandbox_operator.client.errors import (
    ExecSetupError,
    ExecTimeout,
    OutputBudgetExceeded,
    TransferCapExceeded,
)
from sandbox_operator.views import SandboxView

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


class ExecOptions(TypedDict, total=False):
    """The keyword arguments of :meth:`DataPlane.exec`, written once for the protocol and every
    data plane (each signature says ``**options: Unpack[ExecOptions]``).

    ``cwd`` is absolute and ``create_cwd`` makes it when missing; ``env`` adds variables;
    ``timeout`` is in seconds; ``max_output_bytes`` bounds stdout + stderr together (default
    :data:`DEFAULT_OUTPUT_BUDGET`); ``stdin`` is fed to the command whole, then EOF.
    """

    cwd: Required[str]
    timeout: Required[float]
    stdin: bytes | None
    create_cwd: bool
    env: Mapping[str, str] | None
    max_output_bytes: int


@runtime_checkable
class DataPlane(Protocol):
    """Everything a ``Sandbox`` handle needs from a backend.

    Paths are given as ``(work_dir, relative)`` already confined lexically. Each primitive refuses
    a symlinked work dir or parent, and a symlinked destination, with :class:`PathRefused`.
    """

    async def exec(self, argv: Sequence[str], **options: Unpack[ExecOptions]) -> ExecResult: ...

    async def write_file(
        self, work_dir: str, relative: str, data: bytes, *, replace: bool = True
    ) -> None: ...

    async def read_file(self, work_dir: str, relative: str, *, max_bytes: int) -> bytes: ...

    async def stat(self, work_dir: str, relative: str) -> FileStat: ...

    async def list_dir(self, work_dir: str, relative: str) -> list[DirEntry]: ...

    async def remove(self, work_dir: str, relative: str, *, recursive: bool) -> bool: ...

    async def close(self) -> None: ...


#: Builds the data plane of a Ready Sandbox: called with the ``SandboxClient`` and the Sandbox
#: object (a :class:`~sandbox_operator.views.SandboxView`, a read-only mapping over it); a client
#: holds one per ``status.servedBy.kind`` (``SandboxClient(dataplanes=...)``).
DataPlaneFactory = Callable[[Any, SandboxView], DataPlane]


@dataclass(frozen=True)
class ExecRequest:
    """One :meth:`DataPlane.exec` call, checked by :func:`check_exec_request` and with its
    defaults applied, so that every data plane refuses and judges a command the same way."""

    argv: tuple[str, ...]
    #: the environment as ``NAME=value`` strings, checked
    env_args: tuple[str, ...]
    env: dict[str, str]
    stdin: bytes
    cwd: str
    create_cwd: bool
    timeout: float
    #: ``max_output_bytes``: stdout + stderr together
    budget: int

    @classmethod
    def check(cls, argv: Sequence[str], options: ExecOptions) -> ExecRequest:
        env = options.get("env")
        args, env_args = check_exec_request(argv, env)
        stdin = options.get("stdin") or b""
        cwd, create = options["cwd"], options.get("create_cwd", False)
        timeout = options["timeout"]
        budget = options.get("max_output_bytes", DEFAULT_OUTPUT_BUDGET)
        return cls(args, tuple(env_args), dict(env or {}), stdin, cwd, create, timeout, budget)

    def timed_out(
        self, stdout: bytes, stderr: bytes, *, kill_delivered: bool, kill_reach: str
    ) -> ExecTimeout:
        """The timeout error: partial output, and whether (and how far) the kill reached."""
        return ExecTimeout(
            argv=self.argv,
            timeout=self.timeout,
            stdout=stdout,
            stderr=stderr,
            kill_delivered=kill_delivered,
            kill_reach=kill_reach,
        )

    def over_budget(
        self, received: int, *, kill_delivered: bool, kill_reach: str
    ) -> OutputBudgetExceeded:
        """The budget error of a command still running when its output went over the budget:
        whether (and how far) the kill reached."""
        return OutputBudgetExceeded(
            budget=self.budget,
            received=received,
            kill_delivered=kill_delivered,
            kill_reach=kill_reach,
        )

    def finish(self, exit_code: int, stdout: bytes, stderr: bytes) -> ExecResult:
        """Judge a command that ran to its end: a wrapper's setup refusal (exit 125 with
        ``SBX:err:<what>`` on stderr) and output over the budget raise; anything else is the
        command's own result."""
        if exit_code == 125 and stderr.startswith(b"SBX:err:"):
            what = stderr[8:].split(b"\n", 1)[0].decode(errors="replace")
            raise ExecSetupError(what=what, detail=f"cwd={self.cwd!r}" if what == "cwd" else "")
        if len(stdout) + len(stderr) > self.budget:
            raise OutputBudgetExceeded(
                budget=self.budget,
                received=len(stdout) + len(stderr),
                kill_delivered=False,
                ended=True,
            )
        return ExecResult(exit_code, stdout, stderr)


def read_cap_exceeded(path: str, limit: int, actual: int) -> TransferCapExceeded:
    """A ``read_file`` refused because the file is larger than ``max_bytes``."""
    return TransferCapExceeded(
        direction="read", cap="max_bytes", limit=limit, actual=actual, path=path
    )
