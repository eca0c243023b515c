"""The launcher an exec session (:mod:`.session`) runs in the guest, and the frames both sides
speak. Its own module because it is guest text (a Python program sent as an argument of the one
``pods/exec`` that opens the session), not client code: it runs as whatever the container runs
as, with the authority any command of that container has and nothing more.

What it does is deliberately little: it reads "run this argv with these stdin bytes" frames from
its stdin, starts each argv as a child of its own (the argv is the exec wrapper of
:mod:`.scripts`, which makes the process group, announces its pid, changes directory and
exports the environment, exactly as over a plain ``pods/exec``), and writes the child's stdout
and stderr back as they come, then its exit code, each in a frame naming the command. Timeouts,
the output budget and kills are the client's: it stops reading and kills the group over a fresh
``pods/exec``, never through this program (docs/exec-session.md says why).

Frames, both ways: one kind byte, the command's number (u32, big endian), the payload's length
(u32) and the payload.

* client -> guest ``R``: u32 length of the argv (JSON list of strings), the argv, then the
  command's stdin bytes (none: ``/dev/null``). ``S``: the same, the child started in a session
  (so a process group) of its own, as ``setsid`` would: the launcher standing in for the exec
  wrapper's outer script, whose ``setsid`` (or, without it, a ``python3`` started per command
  only to call ``os.setsid``) would cost a process or an interpreter per command.
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

from sandbox_operator.client.dataplane import scripts

#: kind byte, command number, payload length
HEAD = struct.Struct(">cII")
RUN, RUN_SESSION, STDOUT, STDERR, EXIT, FAILED = b"R", b"S", b"O", b"E", b"X", b"F"
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

def run(cid, argv, data, alone):
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if data else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=alone,
        )
    except OSError as exc:
        send(b"F", cid, (exc.strerror or "cannot start").encode()[:200])
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
        if kind not in (b"R", b"S") or n < 4:
            return
        (m,) = struct.unpack(">I", payload[:4])
        argv = json.loads(payload[4 : 4 + m])
        data = payload[4 + m :]
        args = (cid, argv, data, kind == b"S")
        threading.Thread(target=run, args=args, daemon=True).start()

main()
"""


def launch_argv() -> list[str]:
    """The argv of the ``pods/exec`` that opens a session."""
    return ["sh", "-c", START, "sbx", SOURCE]


def run_frame(cid: int, argv: list[str], stdin: bytes, *, new_session: bool = False) -> bytes:
    """The ``R`` (``new_session``: ``S``) frame of command ``cid``."""
    encoded = json.dumps(argv).encode()
    payload = struct.pack(">I", len(encoded)) + encoded + stdin
    return HEAD.pack(RUN_SESSION if new_session else RUN, cid, len(payload)) + payload


def as_launched(argv: Sequence[str]) -> tuple[list[str], bool]:
    """What the launcher runs for ``argv``, and whether in a session of its own: the exec
    wrapper (:data:`~.scripts.EXEC_OUTER` then its inner script and arguments) becomes its inner
    script alone, announcing ``group``, started by the launcher as the outer script's ``setsid``
    would start it; any other argv runs as given."""
    args = list(argv)
    if len(args) >= 5 and args[:3] == ["sh", "-c", scripts.EXEC_OUTER]:
        return ["sh", "-c", args[4], "sbx", "group", *args[5:]], True
    return args, False
