"""``sandbox-operator shell``: a command (``sh`` by default) in a Sandbox, by its name, as
``kubectl exec -it`` would run it in its pod.

It goes through the client (:meth:`SandboxClient.reach`), so what it may do is what the
caller's kubeconfig identity may do: ``get`` on sandboxes and ``create`` on ``pods/exec`` in
the namespace, as for every exec of the client. On a terminal (stdin and stdout both ttys,
unless ``--tty``/``--no-tty`` says otherwise) the local terminal is put in raw mode for the
session and restored after, and its window size follows ``SIGWINCH``; without one, stdin is
passed on and ended at its EOF. The exit code is the remote command's; a failure of the client
itself (the Sandbox missing, not Ready, forbidden, the stream lost) prints one line and exits
:data:`EXIT_CLIENT` (255, as ``ssh`` does), and a command's kill that fell short says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import termios
import threading
import tty as ttymod
from collections.abc import Iterator, Sequence

from sandbox_operator.client.dataplane.streaming import ExecStream, OutputChunk, StreamingPlane
from sandbox_operator.client.errors import ExecStreamUnsupported, SandboxClientError
from sandbox_operator.client.unclean import unclean_reason
from sandbox_operator.views import KubeconfigContextView, SandboxSpecView

#: The exit code of a failure of the client itself (the remote command's own is passed on).
EXIT_CLIENT = 255


def _namespace(kubeconfig: str | None, context: str | None) -> str:
    """The kubeconfig context's namespace, else ``default`` (as kubectl reads it)."""
    from kubernetes_asyncio.config.kube_config import list_kube_config_contexts

    try:
        contexts, current = list_kube_config_contexts(config_file=kubeconfig)
    except Exception:
        return "default"
    chosen = KubeconfigContextView(current)
    if context:
        named = (KubeconfigContextView(c) for c in contexts)
        chosen = next((c for c in named if c.name == context), KubeconfigContextView(None))
    return chosen.context.namespace or "default"


def main(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    use_tty = args.tty if args.tty is not None else os.isatty(0) and os.isatty(1)
    namespace = args.namespace or _namespace(args.kubeconfig, args.context)
    try:
        return asyncio.run(
            _shell(namespace, args.sandbox, argv or ["sh"], use_tty, args.kubeconfig, args.context)
        )
    except SandboxClientError as exc:
        print(f"sandbox-operator shell: {exc}", file=sys.stderr)
        return EXIT_CLIENT


async def _shell(
    namespace: str,
    name: str,
    argv: Sequence[str],
    use_tty: bool,
    kubeconfig: str | None,
    context: str | None,
) -> int:
    from sandbox_operator.client.client import SandboxClient

    client = await SandboxClient.from_kubeconfig(namespace, kubeconfig=kubeconfig, context=context)
    try:
        obj, plane = await client.reach(name)
        if not isinstance(plane, StreamingPlane):
            raise ExecStreamUnsupported("the sandbox's data plane cannot stream", what="stream")
        work_dir = SandboxSpecView(obj.spec).work_dir or "/"
        stream = await plane.open_stream(
            argv,
            cwd=work_dir,
            create_cwd=True,
            stdin=True,
            tty=use_tty,
            timeout=None,
            max_output_bytes=None,
        )
        try:
            with _raw(use_tty):
                return await _attach(stream, use_tty)
        finally:
            await stream.aclose()
            if stream.stopped is not None:
                _warn_stopped(stream)
    finally:
        await client.close()


@contextlib.contextmanager
def _raw(on: bool) -> Iterator[None]:
    """The local terminal in raw mode (keys go to the remote terminal as they are typed)."""
    if not on or not os.isatty(0):
        yield
        return
    saved = termios.tcgetattr(0)
    try:
        ttymod.setraw(0, termios.TCSANOW)  # what was typed already is kept, not flushed
        yield
    finally:
        termios.tcsetattr(0, termios.TCSADRAIN, saved)


def _stdin_reader(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[bytes]) -> None:
    """Read local stdin in a daemon thread (a blocking read never holds the exit up); an empty
    read is its EOF."""

    def run() -> None:
        while True:
            try:
                data = os.read(0, 65536)
            except OSError:
                data = b""
            loop.call_soon_threadsafe(queue.put_nowait, data)
            if not data:
                return

    threading.Thread(target=run, daemon=True, name="sbx-shell-stdin").start()


async def _attach(stream: ExecStream, use_tty: bool) -> int:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    _stdin_reader(loop, queue)

    async def feed() -> None:
        while data := await queue.get():
            await stream.write_stdin(data)
        if not use_tty:
            with contextlib.suppress(ExecStreamUnsupported):
                await stream.close_stdin()

    async def resize() -> None:
        with contextlib.suppress(OSError):
            size = os.get_terminal_size(1)
            if size.columns and size.lines:
                await stream.resize(size.columns, size.lines)

    if use_tty:
        await resize()
        loop.add_signal_handler(signal.SIGWINCH, lambda: asyncio.ensure_future(resize()))
    feeder = asyncio.ensure_future(feed())
    try:
        async for item in stream:
            if isinstance(item, OutputChunk):
                os.write(1 if item.stream == "stdout" else 2, item.data)
    finally:
        feeder.cancel()
        await asyncio.gather(feeder, return_exceptions=True)
        if use_tty:
            loop.remove_signal_handler(signal.SIGWINCH)
    assert stream.exit_code is not None
    return stream.exit_code


def _warn_stopped(stream: ExecStream) -> None:
    from sandbox_operator.client.errors import ExecCancelled

    delivered, reach = stream.stopped or (False, "nothing")
    stop = ExecCancelled(argv=stream.request.argv, kill_delivered=delivered, kill_reach=reach)
    if unclean_reason(stop) is not None:
        print(f"sandbox-operator shell: {stop}; the sandbox may be unclean", file=sys.stderr)
