"""The host-tool channel: guest code calls host tools over nothing but exec and files.

A sandbox's guest can give the host an exit code, output and files the host pulls; it cannot open
a connection to the host. So a host-tool call is a request *file* the guest writes and the host
finds by polling, answered by a response file the host writes back. This module is that channel
(its design, and the run a caller starts; the host side's loop of one run is :mod:`.loop`).
It needs ``EXEC``, ``FILES_IN`` and ``FILES_OUT`` and deliberately not ``FILES_LIST``: the host
never lists a directory the guest controls, it asks for the one name it expects next.

Everything after setup rides one exec, the *poll* (:data:`.guest.POLL`), and each poll does up to
two things: it writes the previous call's answer (sent on its stdin, written as a temporary file
and renamed, under the ``filesIn`` cap), then waits in the guest until the next request or the exit
marker appears and returns it with its bytes (under the ``filesOut`` caps). Carrying both ways on
one exec is what makes a call cost one round trip instead of three (find, read, write back); it
also keeps channel traffic out of the handle's ``StoreFileRead`` records, which are about what a
host read from a sandbox, not about the channel's own files.

**Layout** (:mod:`.layout`). One run lives in ``<work dir>/.host-tools/<run id>/`` as two sibling
directories (:func:`guest_run_layout`):

* ``work/``: the program's working directory and the only place files a caller names (and so
  perhaps a model named) are written; artifacts stay there for the caller to collect.
* ``transport/``: the launcher, the program, the generated shim, the captured output, the pid
  file, the exit marker and ``calls/<n>.req`` / ``calls/<n>.resp``. The program is started from
  here, not from ``work/``, because Python puts the *script's* directory first on ``sys.path``: a
  guest file named like the shim in ``work/`` therefore cannot replace the real one.

**The guest side** (:mod:`.guest`). :func:`host_tool_shim` generates a small Python module
(``sandbox_host_tools``) the program imports: ``call(tool, **arguments)`` writes the request
atomically (a temporary file, then a hard link to the first free sequence number, so two writers
cannot claim the same one), waits for the response and returns its ``result`` or raises an
exception whose class name is the refusal's type. The shim is not a control: every gate is in the
registry's one door on the host (:meth:`HostToolRun.handle_request`), so a program that edits the
shim or writes request files by hand is served exactly the same.

**Detached, holding everything the program starts.** The program does not run inside the exec
that starts it: a backend may tear an exec down with its stream, and then a timed-out program
would keep running. One exec starts ``launcher.py`` with ``nohup``, hands it a one-time receipt
on stdin and prints its pid and start time (read before the program can run: the host's own
record of who to ask about). The launcher makes itself undumpable (the receipt stays out of reach
of the sandbox's uid) and a child subreaper, runs the program in a process group of its own,
waits, kills every process left in its tree (a descendant that called ``setsid`` or double-forked
is still in it) and writes the exit marker ``<code> <ended> <receipt>``.

**The end.** A run is finished when that launcher (pid and start time) no longer runs and its
marker carries the receipt; a marker the program wrote is not an end, and a launcher gone
without its marker, or one that could not empty its tree, is :class:`HostToolRunUnclean`: a
process left in a sandbox can reach every later run's channel there.

**Guest files that never answer.** The guest scripts read a file the guest controls only when it
is a regular file and not a link; what is left of the race between that test and the read is
closed by the host side (:mod:`.loop`): no poll exec outlives the run's deadline by more than a
grace of a few seconds.

**Overrun.** When the run's timeout passes, one exec sends SIGTERM to the launcher, which kills
the program's group and then its tree, waits for that, and returns what the output files hold;
:class:`HostToolRunTimeout` carries that partial output, a :class:`SignalOutcome` and
``leftovers_ended``. Where the launcher is gone, the group the pid file names is sent SIGKILL
instead; that pid comes from a file the program could rewrite, so the report then says the
signal *was sent*, never that the program died.

**Failure semantics.** A request is handed to the run's door once; the door executes the tool at
most once per sequence, and this loop never asks it twice (``answered``). An answer is
``delivered`` only when the guest side of the poll says it renamed the response into place. When
that poll fails (the sandbox died, the exec broke, the write failed, the run was cancelled), the
record becomes ``delivery_uncertain`` and :class:`HostToolDeliveryUncertain` is raised (a
cancellation is re-raised as itself): the guest may have the answer or not, and nothing here
re-sends a call, then or after the sandbox is acquired again. An answer is always offered back
before a stop, even when the deadline passed while its tool ran.

**Cleanup.** The transport directory is removed on every exit path, success included (one
removal: :meth:`Sandbox.reclaim`, which is gated by no capability). It is best-effort: a sandbox
that is gone or refuses the removal leaves that traffic readable; the result says
``transport_removed=False`` and a warning is logged. ``work/`` is left for the caller, who calls
:func:`reclaim_run` in a ``finally`` once it has collected; a ``False`` from it means the run's
files stay readable to every later run in the same sandbox.

**Round trips** (each is one backend call: an exec or a file write):

* setup: 1 write per caller file + 1 write (the launcher, which carries the program and the
  shim and writes them itself in the guest) + 1 exec (start) = ``2 + len(files)``;
* each host-tool call: **1** -- the poll that returns request ``n`` is followed by the poll that
  writes answer ``n`` and waits for request ``n + 1`` (or the exit), so ``k`` calls take
  ``k + 1`` polls in all, the last one also bringing back the exit code and the output. A refused
  call costs the same (a request above the cap is not even sent: the poll reports its size and
  the door refuses it by that). The guest sees an answer about one exec after it asked: the end
  of the poll that found the request, the door, and the start of the next poll;
* waiting: 1 more poll per ``long_poll`` seconds (default 1.5) while the program neither calls
  nor exits; a poll notices the guest's file within ``poll_interval`` (default 0.02 s), and the
  shim notices its answer within 20 ms;
* finish: the last poll (above) + 1 removal;
* overrun: 1 exec (signal, and the partial output in the same answer) + 1 removal = 2;
* any other failure: at most 1 exec (stop the program) + 1 removal;
* :func:`reclaim_run`: 1.

One call is served at a time: the host waits for sequence ``n`` before looking for ``n + 1``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from sandbox_operator.client.dataplane import ExecResult
from sandbox_operator.client.errors import (
    CapabilityNotRequired,
)
from sandbox_operator.client.hosttools.errors import (
    HostToolDeliveryUncertain,
    HostToolRunTimeout,
    HostToolRunUnclean,
    SignalOutcome,
)
from sandbox_operator.client.hosttools.guest import (
    host_tool_shim,
    launcher_source,
)
from sandbox_operator.client.hosttools.layout import (
    LAUNCHER_FILE,
    GuestRunLayout,
    check_files,
    guest_run_layout,
)
from sandbox_operator.client.hosttools.loop import ChannelLoop
from sandbox_operator.client.hosttools.registry import (
    HostToolCallRecord,
    HostToolRun,
)
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.contract import Capability

log = logging.getLogger(__name__)


#: The capabilities the channel uses; a sandbox whose spec did not require them is refused.
CHANNEL_CAPABILITIES: Final = (Capability.EXEC, Capability.FILES_IN, Capability.FILES_OUT)
#: What a spec must require for a run: the channel's three, and host_tools itself (what admission
#: judged: a backend declaring it; a spec that did not ask for it gets no host-tool calls).
RUN_CAPABILITIES: Final = (*CHANNEL_CAPABILITIES, Capability.HOST_TOOLS)

#: How long cleanup on a failure path may take before it is abandoned (it is best-effort).
_CLEANUP_TIMEOUT = 20.0


@dataclass(frozen=True)
class HostToolRunResult(ExecResult):
    """A program that ran to its end: its exit code and output (``ok``, ``*_text`` as for any
    command), ``records`` (every host-tool call it made), ``leftovers_ended`` (processes the
    program left running that its launcher ended after it, wherever they had moved: none
    survives a run that returns) and ``transport_removed`` (whether the transport files were
    removed; ``work/`` never is: call :func:`reclaim_run` after collecting)."""

    records: tuple[HostToolCallRecord, ...]
    layout: GuestRunLayout
    transport_removed: bool
    leftovers_ended: int = 0


def _require(sandbox: Sandbox) -> None:
    for capability in RUN_CAPABILITIES:
        if capability not in sandbox.required:
            raise CapabilityNotRequired(method="run_with_host_tools", capability=capability.value)


async def _reclaim(
    sandbox: Sandbox, layout: GuestRunLayout, relative: str, *, lost: str, stays: str
) -> bool:
    """Remove ``relative`` (one round trip, bounded); False, and a warning that what was ``lost``
    (not removed) ``stays`` readable, when it could not."""
    try:
        await asyncio.wait_for(sandbox.reclaim(relative), _CLEANUP_TIMEOUT)
    except Exception as exc:
        log.warning(
            "host-tool run %s: %s from the sandbox (%s); %s readable to later runs there",
            layout.run_id,
            lost,
            type(exc).__name__,
            stays,
        )
        # Leaked state: no later run (of this conversation or the next call) may read it.
        sandbox._become_unclean(f"a host-tool run: {lost}")
        return False
    return True


async def _remove_transport(sandbox: Sandbox, layout: GuestRunLayout) -> bool:
    """Remove the transport directory; False, and a warning, when it stays."""
    lost = "its transport files (requests, responses, output) were not removed"
    return await _reclaim(sandbox, layout, layout.transport, lost=lost, stays="they stay")


async def run_with_host_tools(
    sandbox: Sandbox,
    program: str,
    run: HostToolRun,
    *,
    files: Mapping[str, bytes | str] | None = None,
    timeout: float = 60.0,  # noqa: ASYNC109
    poll_interval: float = 0.02,
    long_poll: float = 1.5,
    layout: GuestRunLayout | None = None,
) -> HostToolRunResult:
    """Run Python ``program`` in ``sandbox``, serving its host-tool calls through ``run``.

    ``files`` are written into the run's ``work/`` (the program's working directory) first;
    reserved names and paths outside ``work/`` are refused before anything is written.
    ``timeout`` bounds the whole run, host-tool calls included; past it the program is sent
    SIGKILL and :class:`HostToolRunTimeout` is raised. ``poll_interval`` is how often the guest
    side of a poll looks for a file, ``long_poll`` how long one poll exec waits before
    returning empty-handed (see the module docstring for what each costs).

    Raises :class:`HostToolDeliveryUncertain` when an answer could not be written back after the
    door handled it, ``TransferCapExceeded`` when the program's output is above
    ``filesOut.maxBytesPerFile``, and whatever the sandbox raised when it could not be reached.
    The transport files are removed on every path; ``work/`` is the caller's to collect and to
    remove with :func:`reclaim_run`.
    """
    _require(sandbox)
    if timeout <= 0 or poll_interval < 0.001 or long_poll <= 0:
        raise ValueError("timeout and long_poll must be positive, poll_interval at least 1 ms")
    if any(r.sequence > 0 for r in run.records):
        # Its sequences are taken: a second program's call 1 would be answered with the first
        # program's answer. One HostToolRun serves one program run.
        raise ValueError("this HostToolRun already served a program; start a new run")
    layout = layout if layout is not None else guest_run_layout(sandbox)
    checked = check_files(layout, files or {})
    launcher = launcher_source(layout, program=program, shim=host_tool_shim(run.registry.names))
    channel = ChannelLoop(sandbox, run, layout, poll_interval=poll_interval, long_poll=long_poll)
    try:
        for path, data in checked:
            await sandbox.write_file(path, data)
        await sandbox.write_file(layout.transport_file(LAUNCHER_FILE), launcher)
        started = time.monotonic()
        await channel.start()
        finished = await channel.serve(timeout=timeout, deadline=started + timeout)
    except BaseException as exc:
        removed = await _after_failure(channel)
        if isinstance(exc, HostToolRunTimeout | HostToolDeliveryUncertain | HostToolRunUnclean):
            exc.transport_removed = removed
        if isinstance(exc, HostToolRunUnclean):
            sandbox._become_unclean(f"a host-tool run: {exc.reason}")
        elif isinstance(exc, HostToolRunTimeout) and (
            exc.signal is not SignalOutcome.GROUP or exc.leftovers_ended is None
        ):
            sandbox._become_unclean("a host-tool run timed out and was not ended with its tree")
        elif channel.left_running:
            sandbox._become_unclean("a host-tool run was interrupted and could not be signalled")
        raise
    removed = await _remove_transport(sandbox, layout)
    return HostToolRunResult(
        exit_code=finished.exit_code,
        stdout=finished.stdout,
        stderr=finished.stderr,
        records=run.records,
        layout=layout,
        transport_removed=removed,
        leftovers_ended=finished.leftovers_ended,
    )


async def _after_failure(channel: ChannelLoop) -> bool:
    """Best-effort, bounded cleanup on a path that did not finish: stop a program that may still
    be running (it may be blocked on an answer that will never come), then remove the transport.
    Runs after a cancellation too; a second cancellation abandons it."""
    if channel.started and not channel.finished and not channel.signalled:
        channel.left_running = True  # until the stop says the program's group is ended
        with contextlib.suppress(Exception):
            outcome, ended, _, _ = await asyncio.wait_for(channel.stop(), _CLEANUP_TIMEOUT)
            # Ended: the program's group was signalled, or the launcher's own exit marker says it
            # ended every process of the run (the program was already gone). Neither: a leak.
            channel.left_running = outcome is not SignalOutcome.GROUP and ended is None
    return await _remove_transport(channel.sandbox, channel.layout)


async def reclaim_run(sandbox: Sandbox, layout: GuestRunLayout) -> bool:
    """Remove the whole run directory (``work/`` and ``transport/``): a caller's ``finally``
    after it has collected the run's artifacts. One round trip; gated by no capability.

    Returns False (and logs a warning) when it could not: that is a data-retention failure, not
    an untidy one, because a sandbox is reused for the rest of its conversation and every later
    run in it can read what is left."""
    lost = "its run directory was not removed"
    return await _reclaim(sandbox, layout, layout.root, lost=lost, stays="it stays")
