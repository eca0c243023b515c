"""Synchronous twins of :class:`SandboxClient` and :class:`Sandbox`, for scripts.

Same method names and arguments; each call runs the async method on a private event loop in a
background thread and returns its result (exceptions are the same types). Each call runs in a copy
of the caller's context, so a ``with client.tool_call(call_id):`` block on the caller's thread is
the call every event inside it carries.

A method that only passes its arguments through is built by :func:`_blocking` from the async one
(same signature, same docstring, same types for a type checker); the rest are written out: they
take a sync handle where the async method takes a handle, or return one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeAlias, TypeVar, Unpack

from sandbox_operator.client.acquire import CarriesHostTools
from sandbox_operator.client.client import SandboxClient
from sandbox_operator.client.dataplane import DEFAULT_OUTPUT_BUDGET
from sandbox_operator.client.dataplane.streaming import (
    ChunkCallback,
    ExecStream,
    StreamItem,
    StreamOptions,
)
from sandbox_operator.client.observer import EffectiveState, SandboxObserver, ToolCallContext
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.contract import SandboxSpec
from sandbox_operator.contract.egressrules import EgressRule, EgressRuleFields

T = TypeVar("T")
P = ParamSpec("P")


class _InNamespace(Protocol):
    @property
    def namespace(self) -> str: ...


#: The async object a twin stands for, and the class an async method is defined on.
A_co = TypeVar("A_co", bound=_InNamespace, covariant=True)
S = TypeVar("S", bound=_InNamespace)


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


class _Twin(Generic[A_co]):
    """A blocking twin: the async object ``aio`` and the loop each of its calls runs on."""

    def __init__(self, aio: A_co, loop: _Loop) -> None:
        self.aio: A_co = aio
        self._loop = loop

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run(coro)

    @property
    def namespace(self) -> str:
        return self.aio.namespace


def _blocking(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[_Twin[S], P], T]:
    """The blocking twin of an async method that takes and returns nothing sync-specific."""

    @functools.wraps(method)
    def call(self: _Twin[S], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(method(self.aio, *args, **kwargs))

    return call


class SyncExecStream:
    """Blocking twin of :class:`~sandbox_operator.client.dataplane.streaming.ExecStream`."""

    def __init__(self, aio: ExecStream, loop: _Loop) -> None:
        self.aio = aio
        self._loop = loop

    @property
    def exit_code(self) -> int | None:
        return self.aio.exit_code

    def __iter__(self) -> Iterator[StreamItem]:
        return self

    def __next__(self) -> StreamItem:
        try:
            return self._loop.run(self.aio.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def write_stdin(self, data: bytes | str) -> None:
        self._loop.run(self.aio.write_stdin(data))

    def close_stdin(self) -> None:
        self._loop.run(self.aio.close_stdin())

    def resize(self, cols: int, rows: int) -> None:
        self._loop.run(self.aio.resize(cols, rows))

    def wait(self) -> int:
        return self._loop.run(self.aio.wait())

    def close(self) -> None:
        self._loop.run(self.aio.aclose())

    def __enter__(self) -> SyncExecStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncSandbox(_Twin[Sandbox]):
    """Blocking twin of :class:`Sandbox`."""

    @property
    def name(self) -> str:
        return self.aio.name

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

    def report_activity(self) -> None:
        """:meth:`Sandbox.report_activity`, run on the twin's loop: the report is a task there,
        and this thread has no running loop to start it on."""

        async def report() -> None:
            self.aio.report_activity()

        self._run(report())

    exec = _blocking(Sandbox.exec)
    exec_on_plane = _blocking(Sandbox.exec_on_plane)

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
    ) -> SyncExecStream:
        """:meth:`Sandbox.exec_stream`, started at once: a blocking iterator of the same items
        and a context manager that stops it (the callbacks run on the twin's loop thread)."""
        opening = self.aio.exec_stream(
            command,
            cwd=cwd,
            timeout=timeout,
            env=env,
            stdin=stdin,
            tty=tty,
            max_output_bytes=max_output_bytes,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
        )

        async def start() -> ExecStream:
            return await opening

        return SyncExecStream(self._run(start()), self._loop)

    def open_stream_on_plane(
        self, argv: Sequence[str], **options: Unpack[StreamOptions]
    ) -> SyncExecStream:
        return SyncExecStream(self._run(self.aio.open_stream_on_plane(argv, **options)), self._loop)

    run_code = _blocking(Sandbox.run_code)
    write_file = _blocking(Sandbox.write_file)
    write_files = _blocking(Sandbox.write_files)
    read_file = _blocking(Sandbox.read_file)
    read_text = _blocking(Sandbox.read_text)
    stat = _blocking(Sandbox.stat)
    exists = _blocking(Sandbox.exists)
    list_dir = _blocking(Sandbox.list_dir)
    remove = _blocking(Sandbox.remove)
    reclaim = _blocking(Sandbox.reclaim)
    collect_outputs = _blocking(Sandbox.collect_outputs)
    list_outputs = _blocking(Sandbox.list_outputs)
    suspend = _blocking(Sandbox.suspend)
    resume = _blocking(Sandbox.resume)
    reset = _blocking(Sandbox.reset)
    edit_egress = _blocking(Sandbox.edit_egress)
    close = _blocking(Sandbox.close)


#: A sandbox as the sync client takes it: a sync handle, a handle or a name.
_AnySandbox: TypeAlias = "SyncSandbox | Sandbox | str"


def _aio(sandbox: _AnySandbox) -> Sandbox | str:
    """What the async client takes for a sandbox given as a sync handle, a handle or a name."""
    return sandbox.aio if isinstance(sandbox, SyncSandbox) else sandbox


class SyncSandboxClient(_Twin[SandboxClient]):
    """Blocking twin of :class:`SandboxClient`."""

    @property
    def observer(self) -> SandboxObserver | None:
        return self.aio.observer

    def tool_call(self, call_id: str) -> ToolCallContext:
        """``with client.tool_call(call_id): ...``: see :meth:`SandboxClient.tool_call`."""
        return self.aio.tool_call(call_id)

    def report_egress(self, sandbox: _AnySandbox) -> int:
        return self._run(self.aio.report_egress(_aio(sandbox)))

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
            self._run(self.aio.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> SyncSandboxClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    create_scope = _blocking(SandboxClient.create_scope)
    delete_scope = _blocking(SandboxClient.delete_scope)
    touch = _blocking(SandboxClient.touch)
    dispose_scope = _blocking(SandboxClient.dispose_scope)

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
        sandbox = self._run(
            self.aio.acquire(
                scope_ref, agent_dir, spec, call_id, timeout=timeout, host_tools=host_tools
            )
        )
        return SyncSandbox(sandbox, self._loop)

    def dispose(self, sandbox: _AnySandbox, *, wait: bool = False, uid: str | None = None) -> None:
        self._run(self.aio.dispose(_aio(sandbox), wait=wait, uid=uid))

    def suspend(
        self, sandbox: _AnySandbox, *, wait: bool = True, timeout: float | None = None
    ) -> None:
        self._run(self.aio.suspend(_aio(sandbox), wait=wait, timeout=timeout))

    def resume(
        self, sandbox: _AnySandbox, *, wait: bool = True, timeout: float | None = None
    ) -> None:
        self._run(self.aio.resume(_aio(sandbox), wait=wait, timeout=timeout))

    def reset(self, sandbox: _AnySandbox, *, timeout: float | None = None) -> None:
        self._run(self.aio.reset(_aio(sandbox), timeout=timeout))

    def edit_egress(
        self,
        sandbox: _AnySandbox,
        *,
        allow: Sequence[str] | None = None,
        rules: Sequence[EgressRule | EgressRuleFields] | None = None,
        timeout: float | None = None,
    ) -> None:
        self._run(self.aio.edit_egress(_aio(sandbox), allow=allow, rules=rules, timeout=timeout))

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
        sandbox = self._run(cm.__aenter__())
        try:
            yield SyncSandbox(sandbox, self._loop)
        except BaseException as exc:
            if not self._run(cm.__aexit__(type(exc), exc, exc.__traceback__)):
                raise
        else:
            self._run(cm.__aexit__(None, None, None))
