"""Synchronous twins of :class:`SandboxClient` and :class:`Sandbox`, for scripts.

Same method names and arguments; each call runs the async method on a private event loop in a
background thread and returns its result (exceptions are the same types). Each call runs in a copy
of the caller's context, so a ``with client.tool_call(call_id):`` block on the caller's thread is
the call every event inside it carries.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from sandbox_operator.client.client import CarriesHostTools, SandboxClient
from sandbox_operator.client.dataplane import DEFAULT_OUTPUT_BUDGET, DirEntry, ExecResult, FileStat
from sandbox_operator.client.observer import EffectiveState, SandboxObserver, ToolCallContext
from sandbox_operator.client.outputs import CollectedOutputs, OutputSink
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.contract import SandboxSpec

T = TypeVar("T")


class _Loop:
    """An event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="sbx-sync")
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result()

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()


class SyncSandbox:
    """Blocking twin of :class:`Sandbox`."""

    def __init__(self, sandbox: Sandbox, loop: _Loop) -> None:
        self.aio = sandbox
        self._loop = loop

    @property
    def name(self) -> str:
        return self.aio.name

    @property
    def namespace(self) -> str:
        return self.aio.namespace

    @property
    def spec(self) -> SandboxSpec:
        return self.aio.spec

    @property
    def work_dir(self) -> str:
        return self.aio.work_dir

    @property
    def effective_state(self) -> EffectiveState | None:
        return self.aio.effective_state

    def __repr__(self) -> str:
        return f"Sync{self.aio!r}"

    def exec(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        timeout: float = 60.0,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        max_output_bytes: int = DEFAULT_OUTPUT_BUDGET,
    ) -> ExecResult:
        return self._loop.run(
            self.aio.exec(
                command,
                cwd=cwd,
                timeout=timeout,
                env=env,
                stdin=stdin,
                max_output_bytes=max_output_bytes,
            )
        )

    def run_code(
        self,
        code: str,
        *,
        timeout: float = 60.0,
        language: str = "python",
        env: Mapping[str, str] | None = None,
        max_output_bytes: int = DEFAULT_OUTPUT_BUDGET,
    ) -> ExecResult:
        return self._loop.run(
            self.aio.run_code(
                code,
                timeout=timeout,
                language=language,
                env=env,
                max_output_bytes=max_output_bytes,
            )
        )

    def write_file(self, path: str, data: bytes | str, *, replace: bool = True) -> None:
        self._loop.run(self.aio.write_file(path, data, replace=replace))

    def write_files(self, files: Mapping[str, bytes | str], *, replace: bool = True) -> None:
        self._loop.run(self.aio.write_files(files, replace=replace))

    def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        return self._loop.run(self.aio.read_file(path, max_bytes=max_bytes))

    def read_text(self, path: str, *, max_bytes: int | None = None, encoding: str = "utf-8") -> str:
        return self._loop.run(self.aio.read_text(path, max_bytes=max_bytes, encoding=encoding))

    def stat(self, path: str) -> FileStat:
        return self._loop.run(self.aio.stat(path))

    def exists(self, path: str) -> bool:
        return self._loop.run(self.aio.exists(path))

    def list_dir(self, path: str = ".") -> list[DirEntry]:
        return self._loop.run(self.aio.list_dir(path))

    def remove(self, path: str, *, recursive: bool = False) -> bool:
        return self._loop.run(self.aio.remove(path, recursive=recursive))

    def reclaim(self, directory: str) -> None:
        self._loop.run(self.aio.reclaim(directory))

    def collect_outputs(self, sink: OutputSink | None = None) -> CollectedOutputs:
        return self._loop.run(self.aio.collect_outputs(sink))

    def suspend(self, *, wait: bool = True, timeout: float | None = None) -> None:
        self._loop.run(self.aio.suspend(wait=wait, timeout=timeout))

    def resume(self, *, wait: bool = True, timeout: float | None = None) -> None:
        self._loop.run(self.aio.resume(wait=wait, timeout=timeout))

    def close(self) -> None:
        self._loop.run(self.aio.close())


def _aio(sandbox: SyncSandbox | Sandbox | str) -> Sandbox | str:
    """What the async client takes for a sandbox given as a sync handle, a handle or a name."""
    return sandbox.aio if isinstance(sandbox, SyncSandbox) else sandbox


class SyncSandboxClient:
    """Blocking twin of :class:`SandboxClient`."""

    def __init__(self, aio: SandboxClient, loop: _Loop) -> None:
        self.aio = aio
        self._loop = loop

    @property
    def namespace(self) -> str:
        return self.aio.namespace

    @property
    def observer(self) -> SandboxObserver | None:
        return self.aio.observer

    def tool_call(self, call_id: str) -> ToolCallContext:
        """``with client.tool_call(call_id): ...``: see :meth:`SandboxClient.tool_call`."""
        return self.aio.tool_call(call_id)

    def report_egress(self, sandbox: SyncSandbox | Sandbox | str) -> int:
        target = _aio(sandbox)
        return self._loop.run(self.aio.report_egress(target))

    @classmethod
    def from_kubeconfig(
        cls,
        namespace: str,
        *,
        kubeconfig: str | os.PathLike[str] | None = None,
        context: str | None = None,
        observer: SandboxObserver | None = None,
        **kwargs: Any,
    ) -> SyncSandboxClient:
        loop = _Loop()
        try:
            aio = loop.run(
                SandboxClient.from_kubeconfig(
                    namespace, kubeconfig=kubeconfig, context=context, observer=observer, **kwargs
                )
            )
        except BaseException:
            loop.stop()
            raise
        return cls(aio, loop)

    @classmethod
    def in_cluster(
        cls,
        namespace: str | None = None,
        *,
        observer: SandboxObserver | None = None,
        **kwargs: Any,
    ) -> SyncSandboxClient:
        loop = _Loop()

        async def build() -> SandboxClient:
            return SandboxClient.in_cluster(namespace, observer=observer, **kwargs)

        return cls(loop.run(build()), loop)

    def close(self) -> None:
        try:
            self._loop.run(self.aio.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> SyncSandboxClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_scope(
        self,
        *,
        scope: str,
        thread_id: str,
        name: str | None = None,
        min_isolation: str | None = None,
        min_isolation_scope: str | None = None,
    ) -> str:
        return self._loop.run(
            self.aio.create_scope(
                scope=scope,
                thread_id=thread_id,
                name=name,
                min_isolation=min_isolation,
                min_isolation_scope=min_isolation_scope,
            )
        )

    def delete_scope(self, name: str, *, wait: bool = False, timeout: float = 120.0) -> None:
        self._loop.run(self.aio.delete_scope(name, wait=wait, timeout=timeout))

    def acquire(
        self,
        scope_ref: str,
        agent_dir: str,
        spec: SandboxSpec,
        call_id: str = "",
        *,
        timeout: float | None = None,
        host_tools: CarriesHostTools | None = None,
    ) -> SyncSandbox:
        sandbox = self._loop.run(
            self.aio.acquire(
                scope_ref, agent_dir, spec, call_id, timeout=timeout, host_tools=host_tools
            )
        )
        return SyncSandbox(sandbox, self._loop)

    def dispose(self, sandbox: SyncSandbox | Sandbox | str, *, wait: bool = False) -> None:
        target = _aio(sandbox)
        self._loop.run(self.aio.dispose(target, wait=wait))

    def touch(self, name: str) -> None:
        self._loop.run(self.aio.touch(name))

    def suspend(
        self,
        sandbox: SyncSandbox | Sandbox | str,
        *,
        wait: bool = True,
        timeout: float | None = None,
    ) -> None:
        target = _aio(sandbox)
        self._loop.run(self.aio.suspend(target, wait=wait, timeout=timeout))

    def resume(
        self,
        sandbox: SyncSandbox | Sandbox | str,
        *,
        wait: bool = True,
        timeout: float | None = None,
    ) -> None:
        target = _aio(sandbox)
        self._loop.run(self.aio.resume(target, wait=wait, timeout=timeout))

    def dispose_scope(self, scope_ref: str) -> int:
        return self._loop.run(self.aio.dispose_scope(scope_ref))

    @contextlib.contextmanager
    def sandbox_for_call(
        self,
        scope_ref: str,
        agent_dir: str,
        spec: SandboxSpec,
        call_id: str | None = None,
        *,
        timeout: float | None = None,
    ) -> Iterator[SyncSandbox]:
        cm = self.aio.sandbox_for_call(scope_ref, agent_dir, spec, call_id, timeout=timeout)
        sandbox = self._loop.run(cm.__aenter__())
        try:
            yield SyncSandbox(sandbox, self._loop)
        except BaseException as exc:
            if not self._loop.run(cm.__aexit__(type(exc), exc, exc.__traceback__)):
                raise
        else:
            self._loop.run(cm.__aexit__(None, None, None))
