# ruff: noqa: ASYNC230, ASYNC240
"""Sandboxes over local processes, correct or deliberately defective, for tests.

:func:`local_sandbox` is a :class:`~sandbox_operator.client.sandbox.Sandbox` handle whose data
plane runs commands as local processes in a private directory: the client's whole surface (exec,
files, host tools, outputs) without a cluster. No isolation whatsoever: for tests only.

:class:`DefectiveDataPlane` wraps that correct local data plane and breaks exactly the behaviours
named in ``defects`` (:data:`DEFECTS`): the conformance suites (:mod:`sandbox_operator.conformance`)
must catch each one, which is how this repository proves every probe can fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from sandbox_operator.client.dataplane import (
    DirEntry,
    ExecDataPlane,
    ExecResult,
    FileKind,
    FileStat,
    LocalExecTransport,
)
from sandbox_operator.client.errors import SandboxFileNotFound
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.contract import Capability, SandboxSpec

#: Every defect :class:`DefectiveDataPlane` can simulate.
DEFECTS: frozenset[str] = frozenset(
    {
        "write_follows_symlinks",  # writes with open(): follows links, no checks
        "write_mangles_bytes",  # text-mode round trip of the payload
        "read_truncates",  # returns the first max_bytes instead of refusing
        "read_follows_symlinks",  # reads with open(): follows links
        "stat_follows_symlinks",  # os.stat instead of lstat
        "list_follows_symlinks",  # reports link targets' kinds
        "exec_through_shell",  # joins argv with spaces and runs it with sh -c
        "exec_ignores_cwd",  # always runs in /
        "exec_no_kill",  # reports a kill delivered without sending one
        "remove_follows_symlinks",  # removes the link target (rmtree on realpath)
        "remove_missing_raises",  # a missing path is an error
        "remove_noop",  # reports success, removes nothing
        # host_tools (the channel over exec + files):
        "resp_write_lost",  # a write (or mv) to a *.resp file reports success, never lands
        "exec_kill_noop",  # a command's `kill` reports success and signals nothing
        "exec_reaps_detached",  # kills what a command left running when it returns
        "exec_env_imports_cwd",  # commands get PYTHONPATH=. (the cwd on Python's import path)
    }
)

#: Shell functions prepended to ``sh -c`` scripts, per defect (a function shadows the builtin or
#: the command of that name for the whole script).
_SHELL_DEFECTS = {
    "exec_kill_noop": "kill() { return 0; }\n",
    "resp_write_lost": (
        'mv() { for a in "$@"; do :; done; case $a in *.resp) return 0;; esac; command mv "$@"; }\n'
    ),
}

#: Environment variable that marks the processes one exec started (``exec_reaps_detached``).
_EXEC_MARK = "SBX_DEFECT_EXEC_MARK"


def _kill_marked(token: str) -> None:
    """SIGKILL every local process whose environment carries ``token`` under :data:`_EXEC_MARK`."""
    marker = f"{_EXEC_MARK}={token}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = fh.read().split(b"\0")
        except OSError:
            continue
        if marker in environ:
            with contextlib.suppress(OSError):
                os.kill(int(entry), signal.SIGKILL)


class DefectiveDataPlane(ExecDataPlane):
    """The local exec data plane with the named :data:`DEFECTS` switched on (none: correct)."""

    def __init__(self, defects: set[str] | frozenset[str], *, env: Mapping[str, str] | None = None):
        unknown = set(defects) - DEFECTS
        if unknown:
            raise ValueError(f"unknown defects {sorted(unknown)}")
        super().__init__(LocalExecTransport(env))
        self.defects = frozenset(defects)

    async def exec(self, argv: Sequence[str], **options: Any) -> ExecResult:
        """The correct exec (same keywords as :meth:`ExecDataPlane.exec`), with the exec defects
        applied to the arguments and, for ``exec_reaps_detached``, to what the command left."""
        cwd, env = options.pop("cwd"), options.pop("env", None)
        if "exec_through_shell" in self.defects and argv[0] != "sh":
            argv = ["sh", "-c", " ".join(argv)]
        if "exec_ignores_cwd" in self.defects and cwd != "/":
            options["create_cwd"], cwd = False, "/"
        prefix = "".join(_SHELL_DEFECTS[d] for d in sorted(self.defects & set(_SHELL_DEFECTS)))
        if prefix and list(argv[:2]) == ["sh", "-c"]:
            argv = ["sh", "-c", prefix + argv[2], *argv[3:]]
        if "exec_env_imports_cwd" in self.defects:
            env = {**(env or {}), "PYTHONPATH": "."}
        token = secrets.token_hex(8)
        if "exec_reaps_detached" in self.defects:
            env = {**(env or {}), _EXEC_MARK: token}
        try:
            return await super().exec(argv, cwd=cwd, env=env, **options)
        finally:
            if "exec_reaps_detached" in self.defects:
                # A few sweeps: a process forked or exec'd during one sweep (its /proc entry
                # not there yet, or its environment unreadable mid-exec) is caught by the next.
                for _ in range(3):
                    _kill_marked(token)
                    await asyncio.sleep(0.02)

    async def _kill(self, pid: int | None, reach: str) -> tuple[bool, str]:
        if "exec_no_kill" in self.defects:
            return True, reach
        return await super()._kill(pid, reach)

    async def write_file(
        self, work_dir: str, relative: str, data: bytes, *, replace: bool = True
    ) -> None:
        if "write_mangles_bytes" in self.defects:
            data = data.decode("utf-8", errors="replace").encode("utf-8")
        if "resp_write_lost" in self.defects and relative.endswith(".resp"):
            return
        if "write_follows_symlinks" in self.defects:
            path = os.path.join(work_dir, relative)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as fh:
                fh.write(data)
            return
        await super().write_file(work_dir, relative, data, replace=replace)

    async def read_file(self, work_dir: str, relative: str, *, max_bytes: int) -> bytes:
        if "read_follows_symlinks" in self.defects:
            try:
                with open(os.path.join(work_dir, relative), "rb") as fh:
                    return fh.read(max_bytes)
            except FileNotFoundError:
                raise SandboxFileNotFound(relative) from None
        if "read_truncates" in self.defects:
            st = await super().stat(work_dir, relative)
            if st.size is not None and st.size > max_bytes:
                with open(os.path.join(work_dir, relative), "rb") as fh:
                    return fh.read(max_bytes)
        return await super().read_file(work_dir, relative, max_bytes=max_bytes)

    async def stat(self, work_dir: str, relative: str) -> FileStat:
        if "stat_follows_symlinks" in self.defects:
            path = os.path.join(work_dir, relative)
            if not os.path.exists(path):
                raise SandboxFileNotFound(relative)
            kind: FileKind = "dir" if os.path.isdir(path) else "file"
            return FileStat(relative, kind, 0 if kind == "dir" else os.path.getsize(path))
        return await super().stat(work_dir, relative)

    async def list_dir(self, work_dir: str, relative: str) -> list[DirEntry]:
        entries = await super().list_dir(work_dir, relative)
        if "list_follows_symlinks" not in self.defects:
            return entries
        base = os.path.join(work_dir, relative)
        out = []
        for e in entries:
            p = os.path.join(base, e.name)
            if e.kind == "symlink" and os.path.exists(p):
                kind: FileKind = "dir" if os.path.isdir(p) else "file"
                out.append(DirEntry(e.name, kind, 0 if kind == "dir" else os.path.getsize(p)))
            else:
                out.append(e)
        return out

    async def remove(self, work_dir: str, relative: str, *, recursive: bool) -> bool:
        path = os.path.join(work_dir, relative)
        if "remove_noop" in self.defects:
            return True
        if "remove_missing_raises" in self.defects and not os.path.lexists(path):
            raise SandboxFileNotFound(relative)
        if "remove_follows_symlinks" in self.defects:
            real = os.path.realpath(path)
            if os.path.isdir(real):
                for root, dirs, files in os.walk(real, followlinks=True):
                    for name in files:
                        os.unlink(os.path.join(root, name))
                    del dirs
                shutil.rmtree(real, ignore_errors=True)
                return True
            if os.path.exists(real):
                os.unlink(real)
                return True
        return await super().remove(work_dir, relative, recursive=recursive)


def local_sandbox(
    *,
    defects: set[str] | frozenset[str] = frozenset(),
    requires: frozenset[Capability] | None = None,
    root: str | None = None,
    **spec_fields: object,
) -> Sandbox:
    """A ``Sandbox`` over local processes with its own work dir and ``TMPDIR`` (defects
    optional). Every capability is required unless ``requires`` says otherwise."""
    base = root or tempfile.mkdtemp(prefix="sbx-local-")
    tmp = os.path.join(base, "tmp")
    os.makedirs(tmp, exist_ok=True)
    spec = SandboxSpec.model_validate(
        {
            "kind": "local",
            "image": "local",
            "work_dir": os.path.join(base, "work"),
            "requires": requires if requires is not None else frozenset(Capability),
            **spec_fields,
        }
    )
    return Sandbox(spec, DefectiveDataPlane(defects, env={"TMPDIR": tmp}), name=f"local-{base}")
