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
START = r"""cd "$1" || exit 125
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
POLL = r"""d=$1; n=$2; ticks=$3; nap=$4; cap=$5; rcap=$6; w=$7; wlen=$8; i=0; r=$d/calls/$n.req
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
STOP = r"""d=$1; cap=$2; out=not_sent; pid=; reach=
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
