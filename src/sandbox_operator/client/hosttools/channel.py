"""The host-tool channel: guest code calls host tools over nothing but exec and files.

A sandbox's guest can give the host an exit code, output and files the host pulls; it cannot open
a connection to the host. So a host-tool call is a request *file* the guest writes and the host
finds by polling, answered by a response file the host writes back. This module is that channel.
It needs ``EXEC``, ``FILES_IN`` and ``FILES_OUT`` and deliberately not ``FILES_LIST``: the host
never lists a directory the guest controls, it asks for the one name it expects next.

Everything after setup rides one exec, the *poll* (:data:`_POLL`), and each poll does up to two
things: it writes the previous call's answer (sent on its stdin, written as a temporary file and
renamed, under the ``filesIn`` cap), then waits in the guest until the next request or the exit
marker appears and returns it with its bytes (under the ``filesOut`` caps). Carrying both ways on
one exec is what makes a call cost one round trip instead of three (find, read, write back); it
also keeps channel traffic out of the handle's ``StoreFileRead`` records, which are about what a
host read from a sandbox, not about the channel's own files.

**Layout.** One run lives in ``<work dir>/.host-tools/<run id>/`` as two sibling directories
(:func:`guest_run_layout`):

* ``work/``: the program's working directory and the only place files a caller names (and so
  perhaps a model named) are written; artifacts stay there for the caller to collect.
* ``transport/``: the launcher, the program, the generated shim, the captured output, the pid
  file, the exit marker and ``calls/<n>.req`` / ``calls/<n>.resp``. The program is started from
  here, not from ``work/``, because Python puts the *script's* directory first on ``sys.path``: a
  guest file named like the shim in ``work/`` therefore cannot replace the real one.

**The guest side.** :func:`host_tool_shim` generates a small Python module
(``sandbox_host_tools``) the program imports: ``call(tool, **arguments)`` writes the request
atomically (a temporary file, then a hard link to the first free sequence number, so two writers
cannot claim the same one), waits for the response and returns its ``result`` or raises an
exception whose class name is the refusal's type. The shim is not a control: every gate is in the
registry's one door on the host (:meth:`HostToolRun.handle_request`), so a program that edits the
shim or writes request files by hand is served exactly the same.

**Detached, in its own session.** The program does not run inside the exec that starts it: a
backend may tear an exec down with its stream, and then a timed-out program would keep running.
One exec starts ``launcher.py`` with ``nohup`` and every descriptor redirected, so the exec
returns at once; the launcher calls ``os.setsid()`` (the images need no ``setsid`` binary),
records its pid (which is then its process group id), starts the program with output going to
files, waits, and writes the exit marker. Where ``setsid`` fails, the pid file names the program
alone and says so, and the timeout report says the signal reached it alone.

**Overrun.** When the run's timeout passes, one exec sends SIGKILL to the recorded process group
(or process) and returns what the output files hold; :class:`HostToolRunTimeout` carries that
partial output and a :class:`SignalOutcome`. It says the program *was sent* SIGKILL, never that
it died: the pid comes from a file the program could rewrite, and a descendant that left the
group (``setpgid``) is not reached.

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
import json
import logging
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from sandbox_operator.client.dataplane import ExecResult
from sandbox_operator.client.errors import CapabilityNotRequired, PathRefused, TransferCapExceeded
from sandbox_operator.client.hosttools.errors import (
    HostToolChannelError,
    HostToolDeliveryUncertain,
    HostToolFileNameReserved,
    HostToolRunTimeout,
    SignalOutcome,
)
from sandbox_operator.client.hosttools.registry import (
    HostToolAnswer,
    HostToolCallRecord,
    HostToolRun,
)
from sandbox_operator.client.paths import collision_key, confine
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.contract import Capability

log = logging.getLogger(__name__)

__all__ = [
    "HOST_TOOLS_DIRECTORY",
    "RESERVED_NAMES",
    "SHIM_MODULE",
    "GuestRunLayout",
    "HostToolRunResult",
    "SignalOutcome",
    "guest_run_layout",
    "host_tool_shim",
    "reclaim_run",
    "run_with_host_tools",
]

#: The capabilities the channel uses; a sandbox whose spec did not require them is refused.
CHANNEL_CAPABILITIES: Final = (Capability.EXEC, Capability.FILES_IN, Capability.FILES_OUT)
#: What a spec must require for a run: the channel's three, and host_tools itself (what admission
#: judged: a backend declaring it; a spec that did not ask for it gets no host-tool calls).
RUN_CAPABILITIES: Final = (*CHANNEL_CAPABILITIES, Capability.HOST_TOOLS)

#: Every run's directory sits under this one, inside the sandbox's work dir.
HOST_TOOLS_DIRECTORY: Final = ".host-tools"
WORK_DIRECTORY: Final = "work"
TRANSPORT_DIRECTORY: Final = "transport"

#: The module name the program imports (``import sandbox_host_tools``).
SHIM_MODULE: Final = "sandbox_host_tools"
SHIM_FILE: Final = f"{SHIM_MODULE}.py"
LAUNCHER_FILE: Final = "launcher.py"
PROGRAM_FILE: Final = "program.py"
STDOUT_FILE: Final = "stdout"
STDERR_FILE: Final = "stderr"
EXIT_FILE: Final = "exit"
PID_FILE: Final = "pid"
CALLS_DIRECTORY: Final = "calls"

#: Top-level names a caller's ``files`` may not use (compared case-folded): the transport's own
#: file names and the shim module's name. ``work/`` is not on the program's import path, so these
#: are refused to keep a run unambiguous to read, not because a collision could reach the
#: transport; any ``sandbox_host_tools.*`` (``.pyc``, an extension module) is refused as well.
RESERVED_NAMES: Final = frozenset(
    {
        SHIM_MODULE,
        SHIM_FILE,
        LAUNCHER_FILE,
        PROGRAM_FILE,
        STDOUT_FILE,
        STDERR_FILE,
        EXIT_FILE,
        PID_FILE,
        CALLS_DIRECTORY,
        "__pycache__",
    }
)

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
#: Slack on top of a poll's own budget before its exec is abandoned as hung.
_EXEC_SLACK = 30.0
#: How long cleanup on a failure path may take before it is abandoned (it is best-effort).
_CLEANUP_TIMEOUT = 20.0


# --------------------------------------------------------------------------------------------
# Layout


@dataclass(frozen=True)
class GuestRunLayout:
    """Where one run's files live. ``root``, ``work`` and ``transport`` are relative to the
    sandbox's work dir (what :class:`Sandbox` file methods take); the ``*_path`` properties are
    the same directories as absolute paths inside the sandbox (what a guest process sees)."""

    run_id: str
    sandbox_work_dir: str
    root: str
    work: str
    transport: str

    def _absolute(self, relative: str) -> str:
        return f"{self.sandbox_work_dir}/{relative}"

    @property
    def root_path(self) -> str:
        return self._absolute(self.root)

    @property
    def work_path(self) -> str:
        return self._absolute(self.work)

    @property
    def transport_path(self) -> str:
        return self._absolute(self.transport)

    def transport_file(self, name: str) -> str:
        """A transport file's path relative to the sandbox work dir."""
        return f"{self.transport}/{name}"

    def request(self, sequence: int) -> str:
        return self.transport_file(f"{CALLS_DIRECTORY}/{sequence}.req")

    def response(self, sequence: int) -> str:
        return self.transport_file(f"{CALLS_DIRECTORY}/{sequence}.resp")


def guest_run_layout(sandbox: Sandbox, run_id: str | None = None) -> GuestRunLayout:
    """A fresh run's layout in ``sandbox``; ``run_id`` defaults to a random token, so a run's
    directory cannot be guessed (and pre-planted) by an earlier program in the same sandbox."""
    rid = run_id if run_id is not None else secrets.token_hex(12)
    if not _RUN_ID.fullmatch(rid):
        raise ValueError(f"run id {rid!r} is not 1-64 letters, digits, '-' or '_'")
    root = f"{HOST_TOOLS_DIRECTORY}/{rid}"
    return GuestRunLayout(
        run_id=rid,
        sandbox_work_dir=sandbox.work_dir,
        root=root,
        work=f"{root}/{WORK_DIRECTORY}",
        transport=f"{root}/{TRANSPORT_DIRECTORY}",
    )


def _check_files(
    layout: GuestRunLayout, files: Mapping[str, bytes | str]
) -> list[tuple[str, bytes | str]]:
    """Each caller file as a path under ``work/``, refused before anything is written: absolute
    and escaping paths (lexical confinement under ``work/``) and reserved top-level names."""
    checked: list[tuple[str, bytes | str]] = []
    for name, data in files.items():
        if name.startswith("/"):
            raise PathRefused(
                path=name, rule="absolute_outside_work_dir", detail="name run files relative"
            )
        confined = confine(name, layout.work_path)
        first = collision_key(confined.parts[0])
        if first in RESERVED_NAMES or first.startswith(f"{SHIM_MODULE}."):
            raise HostToolFileNameReserved(name)
        checked.append((f"{layout.work}/{confined.relative}", data))
    return checked


# --------------------------------------------------------------------------------------------
# Guest-side text


_SHIM_TEMPLATE = '''\
"""Host tools for this program (generated; editing it changes nothing on the host).

    import sandbox_host_tools as host
    answer = host.call("lookup", order=7)     # or host.lookup(order=7)

A refusal raises an exception whose class name is the refusal's type (a subclass of
HostToolError), e.g. HostToolNotRegistered or HostToolCallCapExceeded.
"""

import json as _json
import os as _os
import threading as _threading
import time as _time

TOOLS = tuple(_json.loads(%(tools)r))
_CALLS = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "calls")
_LOCK = _threading.Lock()
_NEXT = [1]
_CLASSES = {}


class HostToolError(Exception):
    """A host-tool call the host refused or could not complete."""


def _error_class(name):
    if not (isinstance(name, str) and name.isidentifier()):
        return HostToolError
    if name not in _CLASSES:
        _CLASSES[name] = type(name, (HostToolError,), {"__module__": __name__})
    return _CLASSES[name]


def _claim(body):
    tmp = _os.path.join(_CALLS, ".req-%%d-%%s" %% (_os.getpid(), _os.urandom(6).hex()))
    with open(tmp, "wb") as fh:
        fh.write(body)
    try:
        seq = _NEXT[0]
        while True:
            target = _os.path.join(_CALLS, "%%d.req" %% seq)
            try:
                _os.link(tmp, target)
                break
            except FileExistsError:
                seq += 1
            except OSError:
                if _os.path.lexists(target):
                    seq += 1
                    continue
                _os.rename(tmp, target)
                break
        _NEXT[0] = seq + 1
        return seq
    finally:
        try:
            _os.unlink(tmp)
        except FileNotFoundError:
            pass


def call(tool, /, **arguments):
    """Call host tool ``tool`` with keyword ``arguments``; returns its JSON result."""
    body = _json.dumps({"tool": tool, "arguments": arguments}).encode("utf-8")
    with _LOCK:
        seq = _claim(body)
        path = _os.path.join(_CALLS, "%%d.resp" %% seq)
        delay = 0.002
        while True:
            try:
                with open(path, "rb") as fh:
                    raw = fh.read()
                break
            except FileNotFoundError:
                _time.sleep(delay)
                delay = min(delay * 2, 0.02)
    answer = _json.loads(raw)
    if answer.get("ok") is True:
        return answer.get("result")
    error = answer.get("error") or {}
    raise _error_class(error.get("type"))(str(error.get("message") or ""))


def _bind(name):
    def tool(**arguments):
        return call(name, **arguments)

    tool.__name__ = tool.__qualname__ = name
    return tool


for _name in TOOLS:
    if _name.isidentifier() and _name not in globals():
        globals()[_name] = _bind(_name)
'''


def host_tool_shim(names: Sequence[str]) -> str:
    """The guest module text for a run whose registry carries ``names``.

    Tool names are embedded as JSON data, never as code: a name becomes a module-level function
    only through ``globals()`` at import time, and never shadows the shim's own names."""
    return _SHIM_TEMPLATE % {"tools": json.dumps(sorted(names))}


_LAUNCHER_TEMPLATE = '''\
"""Start one host-tool program detached from the exec that ran this (generated)."""

import os
import signal
import subprocess
import sys
import traceback

CONFIG = %(config)r


def _path(name):
    return os.path.join(CONFIG["transport"], name)


def _write_atomic(name, data):
    target = _path(name)
    tmp = "%%s.tmp-%%d" %% (target, os.getpid())
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, target)


def main():
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        os.setsid()
        reach = "group"
    except OSError:
        reach = "process"
    # A new session has no controlling terminal, so no hangup can arrive: give the program the
    # default disposition back rather than an inherited "ignore".
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    os.makedirs(_path(CONFIG["calls"]), exist_ok=True)
    os.makedirs(CONFIG["work"], exist_ok=True)
    _write_atomic(CONFIG["shim_file"], CONFIG["shim"].encode("utf-8"))
    _write_atomic(CONFIG["program_file"], CONFIG["program"].encode("utf-8"))
    if reach == "group":
        _write_atomic(CONFIG["pid"], ("%%d group\\n" %% os.getpid()).encode())
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")
    # The program runs in the work dir, where caller-named files land: an empty or relative
    # PYTHONPATH entry (an image's "/app:" names the working directory) would let a file there
    # shadow a module the shim imports. Absolute entries are the image's own, and kept.
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(p)]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        env.pop("PYTHONPATH", None)
    with open(_path(CONFIG["stdout"]), "wb") as out, open(_path(CONFIG["stderr"]), "wb") as err:
        try:
            child = subprocess.Popen(
                [sys.executable, "-u", _path(CONFIG["program_file"])],
                cwd=CONFIG["work"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
            )
        except OSError as exc:
            err.write(("could not start the program: %%s\\n" %% type(exc).__name__).encode())
            return 127
        if reach == "process":
            _write_atomic(CONFIG["pid"], ("%%d process\\n" %% child.pid).encode())
        code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    try:
        status = main()
    except BaseException:
        status = 126
        try:
            with open(_path(CONFIG["stderr"]), "ab") as fh:
                fh.write(traceback.format_exc().encode("utf-8", "replace"))
        except OSError:
            pass
    _write_atomic(CONFIG["exit"], ("%%d\\n" %% status).encode())
'''


def _launcher_source(layout: GuestRunLayout, *, program: str, shim: str) -> str:
    """The launcher, carrying the program and the shim so that setup is one write, not three."""
    config = {
        "transport": layout.transport_path,
        "work": layout.work_path,
        "calls": CALLS_DIRECTORY,
        "shim_file": SHIM_FILE,
        "program_file": PROGRAM_FILE,
        "stdout": STDOUT_FILE,
        "stderr": STDERR_FILE,
        "pid": PID_FILE,
        "exit": EXIT_FILE,
        "shim": shim,
        "program": program,
    }
    return _LAUNCHER_TEMPLATE % {"config": config}


# Scripts the host runs over exec (POSIX sh: dash, bash, busybox ash). Arguments, never
# interpolation: every path and number reaches the script as "$n".

# Start the launcher detached: every descriptor redirected, so the exec returns at once.
_START = r"""cd "$1" || exit 125
command -v python3 >/dev/null 2>&1 || exit 127
if command -v nohup >/dev/null 2>&1; then
  nohup python3 -I launcher.py </dev/null >/dev/null 2>&1 &
else
  python3 -I launcher.py </dev/null >/dev/null 2>&1 &
fi
exit 0
"""

# One tick of the channel. First, when $7 > 0, write the answer to call $7 ($8 bytes on stdin) as
# calls/$7.resp (a temporary file, then a rename) and say "wrote $7" only when a regular file is
# then at that name; a directory or link the guest put there ("mv" would move the answer *into*
# a directory, and succeed) or a rename that did not land says "unwritten $7". Then
# long-poll: once request $2 exists, "req <size>" and (when size <= $6) its bytes; once the exit
# marker exists, "exit <code>" and the output (stdout here, stderr on stderr, each cut at $5
# bytes); "idle" after $3 naps of $4 seconds with neither.
_POLL = r"""d=$1; n=$2; ticks=$3; nap=$4; cap=$5; rcap=$6; w=$7; wlen=$8; i=0; r=$d/calls/$n.req
if [ "$w" -gt 0 ]; then
  t=$d/calls/.resp-$w.tmp; f=$d/calls/$w.resp
  if { [ ! -d "$f" ] && [ ! -L "$f" ] && head -c "$wlen" > "$t" \
    && [ "$(wc -c < "$t" | tr -dc '0-9')" = "$wlen" ] && mv -f "$t" "$f" \
    && [ -f "$f" ] && [ ! -L "$f" ]; } 2>/dev/null; then echo "wrote $w"
  else rm -f "$t" 2>/dev/null; echo "unwritten $w"; fi
fi
while :; do
  if [ -e "$r" ]; then
    s=$(wc -c < "$r" 2>/dev/null | tr -dc '0-9')
    printf 'req %s\n' "${s:-unknown}"
    if [ -n "$s" ] && [ "$s" -le "$rcap" ] 2>/dev/null; then head -c "$rcap" "$r" 2>/dev/null; fi
    exit 0
  fi
  if [ -e "$d/exit" ]; then
    printf 'exit %s\n' "$(head -c 32 "$d/exit" 2>/dev/null | tr -dc '0-9-')"
    [ -f "$d/stdout" ] && head -c "$cap" "$d/stdout" 2>/dev/null
    [ -f "$d/stderr" ] && head -c "$cap" "$d/stderr" >&2 2>/dev/null
    exit 0
  fi
  [ "$i" -ge "$ticks" ] && { echo idle; exit 0; }
  i=$((i + 1))
  sleep "$nap" 2>/dev/null || sleep 1
done
"""

# Stop the program: SIGKILL to the group (or the process) the pid file names, refusing pid 0/1,
# then "group"/"process"/"not_sent" and the output so far (stdout here, stderr on stderr).
_STOP = r"""d=$1; cap=$2; out=not_sent; pid=; reach=
[ -f "$d/pid" ] && { read -r pid reach < "$d/pid"; } 2>/dev/null
case $pid in ''|*[!0-9]*) pid= ;; esac
if [ -n "$pid" ] && [ "$pid" -gt 1 ] 2>/dev/null; then
  if [ "$reach" = group ] && kill -9 "-$pid" 2>/dev/null; then out=group
  elif kill -9 "$pid" 2>/dev/null; then out=process
  fi
fi
echo "$out"
if [ "$cap" -gt 0 ]; then
  [ -f "$d/stdout" ] && head -c "$cap" "$d/stdout" 2>/dev/null
  [ -f "$d/stderr" ] && head -c "$cap" "$d/stderr" >&2 2>/dev/null
fi
exit 0
"""


# --------------------------------------------------------------------------------------------
# The host side


@dataclass(frozen=True)
class HostToolRunResult(ExecResult):
    """A program that ran to its end: its exit code and output (``ok``, ``*_text`` as for any
    command), ``records`` (every host-tool call it made) and ``transport_removed`` (whether the
    transport files were removed; ``work/`` never is: call :func:`reclaim_run` after
    collecting)."""

    records: tuple[HostToolCallRecord, ...]
    layout: GuestRunLayout
    transport_removed: bool


class _OversizedRequest(bytes):
    """Stands in for a request the sandbox refused to send because it is above the cap.

    It holds no bytes; its length is the size the sandbox reported, which is all the door's size
    gate reads before it refuses (the guest is then answered ``HostToolRequestTooLarge``, and the
    refusal counts toward the run's cap like any other)."""

    _size: int

    def __new__(cls, size: int) -> _OversizedRequest:
        made = super().__new__(cls, b"")
        made._size = size
        return made

    def __len__(self) -> int:
        return self._size


@dataclass(frozen=True)
class _Finished:
    exit_code: int
    stdout: bytes
    stderr: bytes


class _Channel:
    """One run's host-side loop: poll, answer through the door, stop the program on the way out."""

    def __init__(
        self,
        sandbox: Sandbox,
        run: HostToolRun,
        layout: GuestRunLayout,
        *,
        poll_interval: float,
        long_poll: float,
    ) -> None:
        self.sandbox = sandbox
        self.run = run
        self.layout = layout
        self.poll_interval = poll_interval
        self.long_poll = long_poll
        self.output_cap = sandbox.spec.files_out.max_bytes_per_file
        self.started = False
        self.finished = False
        self.signalled = False

    async def start(self) -> None:
        transport = self.layout.transport_path
        self.started = True  # from here on the program may be running: a failure stops it
        res = await self.sandbox.exec(
            ["sh", "-c", _START, "sbx-start", transport], cwd=transport, timeout=60.0
        )
        if res.exit_code == 127:
            raise HostToolChannelError("the sandbox has no python3 to run a host-tool program")
        if not res.ok:
            raise HostToolChannelError(
                f"the host-tool launcher could not be started (exit {res.exit_code})"
            )

    async def serve(self, *, timeout: float, deadline: float) -> _Finished:  # noqa: ASYNC109
        """Poll and answer until the program exits or ``deadline`` (monotonic) passes.

        An answer rides the next poll (see :data:`_POLL`), so it is written even when the deadline
        passed while its tool ran: a handled call is always offered back before a stop."""
        sequence = 1
        pending: HostToolAnswer | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 and pending is None:
                raise await self._overrun(timeout)
            budget = min(self.long_poll, remaining) if remaining > 0 else 0.0
            tick, out, err = await self._poll(sequence, budget, pending)
            pending = None
            if tick.startswith("req"):
                pending = await self._handle(sequence, self._request(tick, out))
                sequence += 1
            elif tick.startswith("exit"):
                self.finished = True
                return self._finished(tick, out, err)
            elif tick != "idle":
                raise HostToolChannelError("the host-tool poll gave an answer it should not have")

    async def _handle(self, sequence: int, raw: bytes) -> HostToolAnswer:
        """Hand request ``sequence`` to the door, once."""
        if self.run.answered(sequence):  # unreachable: a fresh run, one pass per sequence
            raise HostToolChannelError(f"host-tool call {sequence} was already handled")
        answer = await self.run.handle_request(sequence, raw)
        if len(answer.payload) > self.sandbox.spec.files_in.max_bytes_per_file:
            # The door's cap was wider than the sandbox's: the answer cannot go in, and the
            # tool may have run. The same outcome as a refused write.
            self.run.delivery_failed(sequence)
            raise HostToolDeliveryUncertain(record=self._record(sequence), records=self.run.records)
        return answer

    def _record(self, sequence: int) -> HostToolCallRecord:
        return next(r for r in self.run.records if r.sequence == sequence)

    async def _poll(
        self, sequence: int, budget: float, answer: HostToolAnswer | None
    ) -> tuple[str, bytes, bytes]:
        """One exec (one round trip): write ``answer`` back, then wait up to ``budget`` seconds
        for request ``sequence`` (returned with its bytes) or the exit marker (returned with the
        exit code and the output). The answer is delivered when the guest says it wrote it; when
        the exec fails, is cancelled or the write failed, it is ``delivery_uncertain``."""
        ticks = max(0, int(budget / self.poll_interval))
        request_cap = self.run.max_request_bytes
        payload = answer.payload if answer is not None else b""
        argv = [
            "sh",
            "-c",
            _POLL,
            "sbx-poll",
            self.layout.transport_path,
            str(sequence),
            str(ticks),
            f"{self.poll_interval:.3f}",
            str(self.output_cap + 1),
            str(request_cap),
            str(answer.sequence if answer is not None else 0),
            str(len(payload)),
        ]
        try:
            res = await self.sandbox.exec(
                argv,
                stdin=payload or None,
                timeout=budget + _EXEC_SLACK,
                max_output_bytes=2 * (self.output_cap + 1) + request_cap + 4096,
            )
            if not res.ok:
                raise HostToolChannelError(f"the host-tool poll failed (exit {res.exit_code})")
        except asyncio.CancelledError:
            if answer is not None:
                self.run.delivery_failed(answer.sequence)
            raise
        except Exception as exc:
            if answer is None:
                raise
            self.run.delivery_failed(answer.sequence)
            raise HostToolDeliveryUncertain(
                record=self._record(answer.sequence), records=self.run.records
            ) from exc
        stdout = res.stdout
        if answer is not None:
            status, _, stdout = stdout.partition(b"\n")
            if status != f"wrote {answer.sequence}".encode():
                self.run.delivery_failed(answer.sequence)
                raise HostToolDeliveryUncertain(
                    record=self._record(answer.sequence), records=self.run.records
                )
            self.run.delivered(answer.sequence, len(payload))
        head, _, rest = stdout.partition(b"\n")
        return head.decode("ascii", errors="replace"), rest, res.stderr

    def _request(self, tick: str, body: bytes) -> bytes:
        """The request bytes as the door should see them. A request above the cap was not sent
        (it stands in by its size alone, which the door refuses); one whose size the guest could
        not report (not a regular file) reaches the door empty, which it refuses as invalid."""
        size = tick[len("req") :].strip()
        if not size.isdigit():
            return b""
        if int(size) > self.run.max_request_bytes:
            return _OversizedRequest(int(size))
        return body

    def _finished(self, tick: str, out: bytes, err: bytes) -> _Finished:
        for name, data in ((STDOUT_FILE, out), (STDERR_FILE, err)):
            if len(data) > self.output_cap:
                raise TransferCapExceeded(
                    direction="filesOut",
                    cap="max_bytes_per_file",
                    limit=self.output_cap,
                    actual=len(data),
                    path=self.layout.transport_file(name),
                )
        code_text = tick[len("exit") :].strip()
        try:
            code = int(code_text)
        except ValueError:
            code = -1  # the marker was rewritten by the program: no exit code to trust
        return _Finished(code, out, err)

    async def _overrun(self, timeout: float) -> HostToolRunTimeout:  # noqa: ASYNC109
        outcome, out, err = await self.stop(self.output_cap + 1)
        truncated = len(out) > self.output_cap or len(err) > self.output_cap
        return HostToolRunTimeout(
            timeout=timeout,
            stdout=out[: self.output_cap],
            stderr=err[: self.output_cap],
            signal=outcome,
            records=self.run.records,
            truncated=truncated,
        )

    async def stop(self, output_bytes: int = 0) -> tuple[SignalOutcome, bytes, bytes]:
        """Send SIGKILL to the program (one exec) and return what it could reach, with up to
        ``output_bytes`` of each output file. Never raises: a signal that could not be sent is
        :attr:`SignalOutcome.NOT_SENT`."""
        self.signalled = True
        try:
            res = await self.sandbox.exec(
                [
                    "sh",
                    "-c",
                    _STOP,
                    "sbx-stop",
                    self.layout.transport_path,
                    str(output_bytes),
                ],
                timeout=60.0,
                max_output_bytes=2 * output_bytes + 4096,
            )
        except Exception as exc:
            log.warning(
                "host-tool run %s: the program could not be signalled (%s)",
                self.layout.run_id,
                type(exc).__name__,
            )
            return SignalOutcome.NOT_SENT, b"", b""
        head, _, rest = res.stdout.partition(b"\n")
        try:
            outcome = SignalOutcome(head.decode("ascii", errors="replace").strip())
        except ValueError:
            outcome = SignalOutcome.NOT_SENT
        return outcome, rest, res.stderr


def _require(sandbox: Sandbox) -> None:
    for capability in RUN_CAPABILITIES:
        if capability not in sandbox.required:
            raise CapabilityNotRequired(method="run_with_host_tools", capability=capability.value)


async def _remove_transport(sandbox: Sandbox, layout: GuestRunLayout) -> bool:
    """Remove the transport directory (one round trip); False, and a warning, when it stays."""
    try:
        await asyncio.wait_for(sandbox.reclaim(layout.transport), _CLEANUP_TIMEOUT)
    except Exception as exc:
        log.warning(
            "host-tool run %s: its transport files (requests, responses, output) were not "
            "removed from the sandbox (%s); they stay readable to later runs there",
            layout.run_id,
            type(exc).__name__,
        )
        return False
    return True


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
    checked = _check_files(layout, files or {})
    launcher = _launcher_source(layout, program=program, shim=host_tool_shim(run.registry.names))
    channel = _Channel(sandbox, run, layout, poll_interval=poll_interval, long_poll=long_poll)
    try:
        for path, data in checked:
            await sandbox.write_file(path, data)
        await sandbox.write_file(layout.transport_file(LAUNCHER_FILE), launcher)
        started = time.monotonic()
        await channel.start()
        finished = await channel.serve(timeout=timeout, deadline=started + timeout)
    except BaseException as exc:
        removed = await _after_failure(channel)
        if isinstance(exc, HostToolRunTimeout | HostToolDeliveryUncertain):
            exc.transport_removed = removed
        raise
    removed = await _remove_transport(sandbox, layout)
    return HostToolRunResult(
        exit_code=finished.exit_code,
        stdout=finished.stdout,
        stderr=finished.stderr,
        records=run.records,
        layout=layout,
        transport_removed=removed,
    )


async def _after_failure(channel: _Channel) -> bool:
    """Best-effort, bounded cleanup on a path that did not finish: stop a program that may still
    be running (it may be blocked on an answer that will never come), then remove the transport.
    Runs after a cancellation too; a second cancellation abandons it."""
    with contextlib.suppress(Exception):
        if channel.started and not channel.finished and not channel.signalled:
            await asyncio.wait_for(channel.stop(), _CLEANUP_TIMEOUT)
    return await _remove_transport(channel.sandbox, channel.layout)


async def reclaim_run(sandbox: Sandbox, layout: GuestRunLayout) -> bool:
    """Remove the whole run directory (``work/`` and ``transport/``): a caller's ``finally``
    after it has collected the run's artifacts. One round trip; gated by no capability.

    Returns False (and logs a warning) when it could not: that is a data-retention failure, not
    an untidy one, because a sandbox is reused for the rest of its conversation and every later
    run in it can read what is left."""
    try:
        await asyncio.wait_for(sandbox.reclaim(layout.root), _CLEANUP_TIMEOUT)
    except Exception as exc:
        log.warning(
            "host-tool run %s: its run directory was not removed from the sandbox (%s); it "
            "stays readable to later runs there",
            layout.run_id,
            type(exc).__name__,
        )
        return False
    return True
