"""What runs in the guest: the shim module a program imports, the launcher that starts it
detached, and the POSIX sh scripts the host runs over exec (start, poll, stop).

All of it is text generated on the host and carried in by the channel
(:mod:`sandbox_operator.client.hosttools.channel`); see there for the protocol they implement.
Paths and numbers reach the scripts as arguments, never by interpolation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sandbox_operator.client.hosttools.layout import TRANSPORT_FILES, GuestRunLayout

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
                if not _os.path.isdir(_CALLS):
                    # The host removed the run's transport (it ended or gave up on the run):
                    # no answer can come, so stop waiting instead of polling forever.
                    raise HostToolError("the host-tool channel is closed") from None
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
"""Start one host-tool program detached from the exec that ran this, and end what it leaves.

Generated. It reads a one-time receipt from its stdin (the start exec's, which no guest process
can read), makes itself undumpable (so no process of the sandbox's uid can read it from its
memory) and a child subreaper (so every process the program starts stays in its tree, whatever
session or group it moves to), runs the program in a process group of its own, and once that
ends (or SIGTERM asks it to end it) kills every process left in its tree. The exit marker
carries the program's exit code, the number of processes it ended and the receipt: a marker
without the receipt was not written by this launcher.
"""

import ctypes
import os
import signal
import subprocess
import sys
import time
import traceback

CONFIG = %(config)r
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
SWEEP_SECONDS = 5.0
CHILD = []


def _path(name):
    return os.path.join(CONFIG["transport"], name)


def _write_atomic(name, data):
    target = _path(name)
    tmp = "%%s.tmp-%%d" %% (target, os.getpid())
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, target)


def _prctl(option, value):
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _children():
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%%s/stat" %% entry, "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 1 and fields[1] == str(me).encode():
            found.append(int(entry))
    return found


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _sweep():
    """Kill every process left in this launcher's tree; their number, or -1 when the tree
    could not be emptied (no subreaper, or processes forking faster than the deadline)."""
    ended = set()
    deadline = time.monotonic() + SWEEP_SECONDS
    while time.monotonic() < deadline:
        _reap()
        left = _children()
        if not left:
            return len(ended)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                ended.add(pid)
            except OSError:
                pass
        time.sleep(0.01)
    return -1


def _on_term(signum, frame):
    for pid in CHILD:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def main():
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_term)
    try:
        os.setsid()
    except OSError:
        pass
    # A new session has no controlling terminal, so no hangup can arrive: give the program the
    # default disposition back rather than an inherited "ignore".
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    os.makedirs(_path(CONFIG["calls"]), exist_ok=True)
    os.makedirs(CONFIG["work"], exist_ok=True)
    _write_atomic(CONFIG["shim_file"], CONFIG["shim"].encode("utf-8"))
    _write_atomic(CONFIG["program_file"], CONFIG["program"].encode("utf-8"))
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1", PYTHONNOUSERSITE="1")
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
                start_new_session=True,
            )
        except OSError as exc:
            err.write(("could not start the program: %%s\\n" %% type(exc).__name__).encode())
            return 127
        CHILD.append(child.pid)
        _write_atomic(CONFIG["pid"], ("%%d group\\n" %% child.pid).encode())
        code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    # Undumpable before the receipt is read: from then on no process of this uid can read it.
    private = _prctl(PR_SET_DUMPABLE, 0)
    subreaper = _prctl(PR_SET_CHILD_SUBREAPER, 1)
    receipt = sys.stdin.buffer.readline(128).strip().decode("ascii", "replace")
    os.close(0)
    os.open(os.devnull, os.O_RDONLY)
    status = 126
    try:
        status = main()
    except BaseException:
        try:
            with open(_path(CONFIG["stderr"]), "ab") as fh:
                fh.write(traceback.format_exc().encode("utf-8", "replace"))
        except OSError:
            pass
    ended = _sweep() if subreaper and private else -1
    _write_atomic(CONFIG["exit"], ("%%d %%d %%s\\n" %% (status, ended, receipt)).encode())
'''


def launcher_source(layout: GuestRunLayout, *, program: str, shim: str) -> str:
    """The launcher, carrying the program and the shim so that setup is one write, not three."""
    config = {
        "transport": layout.transport_path,
        "work": layout.work_path,
        **TRANSPORT_FILES,
        "shim": shim,
        "program": program,
    }
    return _LAUNCHER_TEMPLATE % {"config": config}


# Scripts the host runs over exec (POSIX sh: dash, bash, busybox ash). Arguments, never
# interpolation: every path and number reaches the script as "$n".

# Start the launcher detached: every descriptor redirected, so the exec returns at once.
# Start the launcher detached: stdout and stderr redirected, so the exec returns at once, and its
# stdin (the exec's: the receipt) handed over on fd 3 because an asynchronous command's own
# stdin is /dev/null. Prints "launched <pid> <start time>", the launcher's identity read from
# /proc before it can have started the program: what the host later checks it against.
START = r"""cd "$1" || exit 125
command -v python3 >/dev/null 2>&1 || exit 127
exec 3<&0
if command -v nohup >/dev/null 2>&1; then
  nohup python3 -I launcher.py <&3 3<&- >/dev/null 2>&1 &
else
  python3 -I launcher.py <&3 3<&- >/dev/null 2>&1 &
fi
p=$!
exec 3<&-
st=
{ read -r st < "/proc/$p/stat"; } 2>/dev/null
rest=${st##*) }
set -- $rest
echo "launched $p ${20:-}"
exit 0
"""

# Whether the launcher the host started ($lp, started at clock tick $lt) is still running: its
# /proc entry, not a zombie, the same start time (a reused pid is someone else).
_ALIVE = r"""alive() {
  [ -n "$lp" ] || return 1
  st=
  { read -r st < "/proc/$lp/stat"; } 2>/dev/null || return 1
  rest=${st##*) }
  set -- $rest
  [ "$1" != Z ] && [ "$1" != X ] && [ "${20}" = "$lt" ]
}
"""

# The exit marker's first line, kept only when it is a regular file (digits, '-', ' ', hex).
_MARKER = r"""marker() {
  if [ -f "$d/exit" ] && [ ! -L "$d/exit" ]; then
    head -c 128 "$d/exit" 2>/dev/null | head -n 1 | tr -dc '0-9a-f -'
  fi
}
"""

# Every guest-named file is read only when it is a regular file and not a link: a FIFO (an open
# that never returns), a device (/dev/zero, a read that never ends) or a link to one is never
# opened; a request that is not a regular file is "req unknown" (refused as invalid), an exit
# marker that is not one is "exit " (no code to trust). The window between the test and the
# open is closed by the host, whose exec timeout ends at the run's deadline.
# One tick of the channel. First, when $7 > 0, write the answer to call $7 ($8 bytes on stdin) as
# calls/$7.resp (a temporary file, then a rename) and say "wrote $7" only when a regular file is
# then at that name; a directory or link the guest put there ("mv" would move the answer *into*
# a directory, and succeed) or a rename that did not land says "unwritten $7". Then
# long-poll: once request $2 exists, "req <size>" and (when size <= $6) its bytes; once the
# launcher ($9, started at tick ${10}) is no longer running, "exit <marker>" (the launcher's
# "<code> <ended> <receipt>", or nothing when it left none) and the output (stdout here, stderr
# on stderr, each cut at $5 bytes); "idle" after $3 naps of $4 seconds with neither. A marker
# the program wrote while the launcher runs is not an end.
POLL = (
    _ALIVE
    + _MARKER
    + r"""d=$1; n=$2; ticks=$3; nap=$4; cap=$5; rcap=$6; w=$7; wlen=$8; lp=$9; lt=${10}; i=0
r=$d/calls/$n.req
if [ "$w" -gt 0 ]; then
  t=$d/calls/.resp-$w.tmp; f=$d/calls/$w.resp
  if { [ ! -d "$f" ] && [ ! -L "$f" ] && head -c "$wlen" > "$t" \
    && [ "$(wc -c < "$t" | tr -dc '0-9')" = "$wlen" ] && mv -f "$t" "$f" \
    && [ -f "$f" ] && [ ! -L "$f" ]; } 2>/dev/null; then echo "wrote $w"
  else rm -f "$t" 2>/dev/null; echo "unwritten $w"; fi
fi
while :; do
  if [ -e "$r" ] || [ -L "$r" ]; then
    s=
    if [ -f "$r" ] && [ ! -L "$r" ]; then s=$(wc -c < "$r" 2>/dev/null | tr -dc '0-9'); fi
    printf 'req %s\n' "${s:-unknown}"
    if [ -n "$s" ] && [ "$s" -le "$rcap" ] 2>/dev/null; then head -c "$rcap" "$r" 2>/dev/null; fi
    exit 0
  fi
  if ! alive; then
    printf 'exit %s\n' "$(marker)"
    [ -f "$d/stdout" ] && [ ! -L "$d/stdout" ] && head -c "$cap" "$d/stdout" 2>/dev/null
    [ -f "$d/stderr" ] && [ ! -L "$d/stderr" ] && head -c "$cap" "$d/stderr" >&2 2>/dev/null
    exit 0
  fi
  [ "$i" -ge "$ticks" ] && { echo idle; exit 0; }
  i=$((i + 1))
  sleep "$nap" 2>/dev/null || sleep 1
done
"""
)

# Stop the program: SIGTERM to the launcher the host started ($3, started at tick $4), which kills
# the program's process group and then every process left in its tree, and waits (up to 8 s) for
# it to finish that; where the launcher is gone, SIGKILL to the group (or the process) the pid
# file names, refusing pid 0/1. Then "<group|process|not_sent> <marker>" and the output so far
# (stdout here, stderr on stderr).
STOP = (
    _ALIVE
    + _MARKER
    + r"""d=$1; cap=$2; lp=$3; lt=$4; out=not_sent; pid=; reach=; i=0
case $lp in ''|*[!0-9]*) lp= ;; esac
if [ -n "$lp" ] && [ "$lp" -gt 1 ] && alive && kill -TERM "$lp" 2>/dev/null; then
  out=group
  while alive && [ "$i" -lt 800 ]; do i=$((i + 1)); sleep 0.01 2>/dev/null || sleep 1; done
else
  [ -f "$d/pid" ] && [ ! -L "$d/pid" ] && { read -r pid reach < "$d/pid"; } 2>/dev/null
  case $pid in ''|*[!0-9]*) pid= ;; esac
  if [ -n "$pid" ] && [ "$pid" -gt 1 ] 2>/dev/null; then
    if [ "$reach" = group ] && kill -9 "-$pid" 2>/dev/null; then out=group
    elif kill -9 "$pid" 2>/dev/null; then out=process
    fi
  fi
fi
echo "$out $(marker)"
if [ "$cap" -gt 0 ]; then
  [ -f "$d/stdout" ] && [ ! -L "$d/stdout" ] && head -c "$cap" "$d/stdout" 2>/dev/null
  [ -f "$d/stderr" ] && [ ! -L "$d/stderr" ] && head -c "$cap" "$d/stderr" >&2 2>/dev/null
fi
exit 0
"""
)
