"""The launcher an exec session (:mod:`.session`) runs in the guest, and the frames both sides
speak. Its own module because it is guest text (a Python program sent as an argument of the one
``pods/exec`` that opens the session), not client code: it runs as whatever the container runs
as, with the authority any command of that container has and nothing more.

What it does is deliberately little: it reads "run this" frames from its stdin and starts each
command as a child of its own, then writes the child's stdout and stderr back as they come and
its exit code, each in a frame naming the command. Timeouts, the output budget and kills are the
client's: it stops reading and kills the group over a fresh ``pods/exec``, never through this
program (docs/exec-session.md says why).

For the exec wrapper (:data:`~.scripts.EXEC_OUTER` with :data:`~.scripts.EXEC_INNER`), the
launcher does the wrapper's work itself, so a command costs one ``exec`` in the guest, not three
(the outer ``sh``, its ``setsid`` or a ``python3`` for ``os.setsid``, the inner ``sh``; on gVisor
each costs 10-20 ms): it starts the argv in a session (so a process group) of its own, writes the
pid line first on stderr (``SBX:pid:<pid>:group``), creates the cwd when asked (as ``mkdir -p``,
errors ignored), starts the argv in it (refused: the pid line with pid 0, ``SBX:err:cwd``, exit
125, as the inner script answers), with the environment added, stdin bytes then EOF (or
``/dev/null``). An argv that cannot be executed directly (not found, not executable, a script
without ``#!``) is started as ``sh -c 'exec "$@"'`` instead, so the shell's own answer (127, 126,
running the script) is the same as over the wrapper.

Frames, both ways: one kind byte, the command's number (u32, big endian), the payload's length
(u32) and the payload.

* client -> guest ``R``: u32 length of a JSON argv, the argv, then the command's stdin bytes
  (none: ``/dev/null``), run as given. ``W``: the same with a JSON object instead of the argv:
  the exec wrapper's ``argv``, ``cwd``, ``mkdir`` and ``env`` (``NAME=value`` strings).
* guest -> client ``O`` / ``E``: a chunk of the command's stdout / stderr; ``X``: its exit code
  (ASCII decimal; a child ended by a signal is 128 + the signal, as a shell reports it);
  ``F``: the argv could not be started (a short reason).

Before any frame the launcher writes :data:`BANNER`; a guest without ``python3`` writes
:data:`NO_LAUNCHER` instead and exits, and the session's commands go over plain ``pods/exec``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import TypedDict

from sandbox_operator.client.dataplane import scripts

#: kind byte, command number, payload length
HEAD = struct.Struct(">cII")
RUN, WRAPPED, STDOUT, STDERR, EXIT, FAILED = b"R", b"W", b"O", b"E", b"X", b"F"
#: The launcher's first line: it runs and speaks these frames.
BANNER = b"SBXL1\n"
#: What a guest without ``python3`` answers instead.
NO_LAUNCHER = b"SBXL:none\n"

#: Starts the launcher with the guest's ``python3``, isolated (``-I``: nothing the sandbox
#: planted in its user site runs in it), or answers :data:`NO_LAUNCHER`.
START = r"""command -v python3 >/dev/null 2>&1 || { printf 'SBXL:none\n'; exit 127; }
exec python3 -I -c "$1"
"""

#: The launcher itself (Python 3, standard library only). It exits when its stdin ends (the
#: session closed or dropped); commands still running go on in their own process groups, and the
#: client, which no longer knows their end, kills them over a fresh ``pods/exec``.
SOURCE = r"""import json, os, struct, subprocess, sys, threading
HEAD = struct.Struct(">cII")
OUT = sys.stdout.buffer
IN = sys.stdin.buffer
LOCK = threading.Lock()

def send(kind, cid, data=b""):
    with LOCK:
        OUT.write(HEAD.pack(kind, cid, len(data)) + data)
        OUT.flush()

def pump(cid, kind, fd):
    while True:
        data = os.read(fd, 65536)
        if not data:
            return
        send(kind, cid, data)

def feed(pipe, data):
    try:
        pipe.write(data)
        pipe.close()
    except OSError:
        pass

def spawn(argv, job, data):
    env = None
    if job.get("env"):
        env = dict(os.environ)
        for pair in job["env"]:
            name, _, value = pair.partition("=")
            env[name] = value
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if data else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=job.get("cwd"),
        env=env,
        start_new_session=bool(job),
    )

def start(cid, job, argv, data):
    if not job:
        return spawn(argv, job, data)
    cwd = job["cwd"]
    if job.get("mkdir") and not os.path.isdir(cwd):
        try:
            os.makedirs(cwd)
        except OSError:
            pass
    try:
        proc = spawn(argv, job, data)
    except OSError as exc:
        if exc.filename == cwd and argv[0] != cwd:
            send(b"E", cid, b"SBX:pid:0:group\nSBX:err:cwd\n")
            send(b"X", cid, b"125")
            return None
        proc = spawn(["sh", "-c", 'exec "$@"', "sbx"] + argv, job, data)
    send(b"E", cid, b"SBX:pid:%d:group\n" % proc.pid)
    return proc

def run(cid, job, argv, data):
    try:
        proc = start(cid, job, argv, data)
    except OSError as exc:
        send(b"F", cid, (exc.strerror or "cannot start").encode()[:200])
        return
    if proc is None:
        return
    workers = [
        threading.Thread(target=pump, args=(cid, b"O", proc.stdout.fileno()), daemon=True),
        threading.Thread(target=pump, args=(cid, b"E", proc.stderr.fileno()), daemon=True),
    ]
    if data:
        workers.append(threading.Thread(target=feed, args=(proc.stdin, data), daemon=True))
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    code = proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    send(b"X", cid, str(code if code >= 0 else 128 - code).encode())

def read(n):
    data = IN.read(n)
    if data is None or len(data) < n:
        raise EOFError
    return data

def main():
    OUT.write(b"SBXL1\n")
    OUT.flush()
    while True:
        try:
            kind, cid, n = HEAD.unpack(read(HEAD.size))
            payload = read(n)
        except EOFError:
            return
        if kind not in (b"R", b"W") or n < 4:
            return
        (m,) = struct.unpack(">I", payload[:4])
        spec = json.loads(payload[4 : 4 + m])
        job = spec if kind == b"W" else {}
        argv = spec["argv"] if kind == b"W" else spec
        args = (cid, job, argv, payload[4 + m :])
        threading.Thread(target=run, args=args, daemon=True).start()

main()
"""


def launch_argv() -> list[str]:
    """The argv of the ``pods/exec`` that opens a session."""
    return ["sh", "-c", START, "sbx", SOURCE]


def run_frame(cid: int, argv: Sequence[str], stdin: bytes) -> bytes:
    """The frame of command ``cid``: ``W`` for the exec wrapper (see the module), else ``R``."""
    job = wrapped(argv)
    encoded = json.dumps(job if job is not None else list(argv)).encode()
    payload = struct.pack(">I", len(encoded)) + encoded + stdin
    return HEAD.pack(RUN if job is None else WRAPPED, cid, len(payload)) + payload


class WrappedJob(TypedDict):
    """A ``W`` frame's JSON object: the exec wrapper's work, which the launcher does itself."""

    argv: list[str]
    cwd: str
    mkdir: bool
    #: ``NAME=value`` strings, added to the launcher's environment
    env: list[str]


def wrapped(argv: Sequence[str]) -> WrappedJob | None:
    """The exec wrapper's arguments (:meth:`~.execplane.ExecDataPlane.exec` builds them:
    ``sh -c EXEC_OUTER sbx EXEC_INNER mk cwd nin ne env... argv...``) as the launcher's job;
    None for any other argv."""
    args = list(argv)
    head = ["sh", "-c", scripts.EXEC_OUTER, "sbx", scripts.EXEC_INNER]
    if len(args) < 10 or args[:5] != head or not args[8].isdigit():
        return None
    count = int(args[8])
    command = args[9 + count :]
    if not command:
        return None
    return {"argv": command, "cwd": args[6], "mkdir": args[5] == "1", "env": args[9 : 9 + count]}
