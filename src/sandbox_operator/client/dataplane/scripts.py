"""The POSIX ``sh`` scripts behind :class:`~.execplane.ExecDataPlane` (dash, bash and busybox
ash), and what their exit codes mean.

Exec protocol. A command runs under a tiny wrapper: the outer ``sh`` (:data:`EXEC_OUTER`) starts
an inner ``sh`` (:data:`EXEC_INNER`) through ``setsid`` (or ``python3``'s ``os.setsid`` where the
image has no ``setsid``; started isolated, ``-I``, so nothing in the sandbox, such as a
``usercustomize`` planted in the writable home's user site, runs in it before every command), so
the command leads a process group of its own; the inner one
announces its pid on the first line of stderr, changes directory, exports the environment and
``exec``\\s the argv verbatim -- no shell ever parses it. Stdin is fed through ``head -c N`` so the
command sees EOF without relying on the transport being able to half-close.

The file scripts walk from the work dir through the parents of the relative path (``sbx_walk``)
and refuse symlinks with an exit code from :data:`REFUSALS`, right before acting.
"""

EXEC_OUTER = r"""s=$1; shift
if command -v setsid >/dev/null 2>&1; then setsid sh -c "$s" sbx group "$@"
elif command -v python3 >/dev/null 2>&1; then
  python3 -I -c 'import os, sys; os.setsid(); os.execvp(sys.argv[1], sys.argv[1:])' \
    sh -c "$s" sbx group "$@"
else sh -c "$s" sbx process "$@"; fi
exit $?
"""

EXEC_INNER = r"""printf 'SBX:pid:%s:%s\n' "$$" "$1" >&2
mk=$2; cwd=$3; nin=$4; ne=$5; shift 5
if [ "$mk" = 1 ] && [ ! -d "$cwd" ]; then mkdir -p "$cwd" 2>/dev/null; fi
cd "$cwd" 2>/dev/null || { printf 'SBX:err:cwd\n' >&2; exit 125; }
while [ "$ne" -gt 0 ]; do export "$1" || { printf 'SBX:err:env\n' >&2; exit 125; }
shift; ne=$((ne - 1)); done
if [ "$nin" -gt 0 ]; then head -c "$nin" | exec "$@"; else exec "$@" </dev/null; fi
"""

# Walk from $W through the parents of $R; refuse symlinks; create missing parents when MK=1.
WALK = r"""sbx_walk() {
  [ -L "$W" ] && exit 90
  if [ ! -d "$W" ]; then
    [ -e "$W" ] && exit 91
    if [ "$MK" = 1 ]; then mkdir -p "$W" || exit 99; else exit 94; fi
  fi
  p=$W; rest=$R
  while :; do
    case $rest in */*) ;; *) break ;; esac
    c=${rest%%/*}; rest=${rest#*/}
    p=$p/$c
    if [ -L "$p" ]; then exit 92
    elif [ -d "$p" ]; then :
    elif [ -e "$p" ]; then exit 93
    elif [ "$MK" = 1 ]; then mkdir "$p" || exit 99
    else exit 94; fi
  done
  D=$p/$rest
}
"""

WRITE = (
    WALK
    + r"""W=$1; R=$2; N=$3; REPL=$4; TOK=$5; MK=1
sbx_walk
[ -L "$D" ] && exit 95
if [ -e "$D" ]; then
  [ -d "$D" ] && exit 96
  [ -f "$D" ] || exit 97
  [ "$REPL" = 1 ] || exit 98
fi
T=${D%/*}/.sbx-$TOK
set -C
head -c "$N" > "$T" || { rm -f "$T"; exit 99; }
set +C
set -- $(wc -c < "$T")
[ "$1" = "$N" ] || { rm -f "$T"; exit 102; }
if [ -L "$D" ] || [ -d "$D" ]; then rm -f "$T"; exit 95; fi
if [ "$REPL" = 1 ]; then mv -f "$T" "$D" || { rm -f "$T"; exit 99; }
else ln "$T" "$D" 2>/dev/null || { rm -f "$T"; exit 98; }; rm -f "$T"; fi
"""
)

READ = (
    WALK
    + r"""W=$1; R=$2; MAX=$3; MK=0
sbx_walk
[ -L "$D" ] && exit 95
[ -e "$D" ] || exit 94
[ -d "$D" ] && exit 96
[ -f "$D" ] || exit 97
set -- $(wc -c < "$D") || exit 99
[ -n "${1:-}" ] || exit 99
printf 'SBX:size:%s\n' "$1" >&2
[ "$1" -le "$MAX" ] || exit 100
head -c "$((MAX + 1))" < "$D"
"""
)

STAT = (
    WALK
    + r"""W=$1; R=$2; MK=0
sbx_walk
if [ -L "$D" ]; then echo "symlink 0"
elif [ -d "$D" ]; then echo "dir 0"
elif [ -f "$D" ]; then set -- $(wc -c < "$D" 2>/dev/null); echo "file ${1:-?}"
elif [ -e "$D" ]; then echo "other 0"
else exit 94; fi
"""
)

LIST = (
    WALK
    + r"""W=$1; R=$2; MK=0
if [ -z "$R" ]; then
  [ -L "$W" ] && exit 90
  [ -e "$W" ] || exit 94
  [ -d "$W" ] || exit 101
  D=$W
else
  sbx_walk
  [ -L "$D" ] && exit 95
  [ -e "$D" ] || exit 94
  [ -d "$D" ] || exit 101
fi
for e in "$D"/* "$D"/.*; do
  n=${e##*/}
  case $n in .|..) continue ;; esac
  if [ -L "$e" ]; then t=symlink; s=0
  elif [ -d "$e" ]; then t=dir; s=0
  elif [ -f "$e" ]; then set -- $(wc -c < "$e" 2>/dev/null); t=file; s=${1:-?}
  elif [ -e "$e" ]; then t=other; s=0
  else continue; fi
  printf '%s %s %s\0' "$t" "$s" "$n"
done
"""
)

REMOVE = (
    WALK
    + r"""W=$1; R=$2; REC=$3; MK=0
( sbx_walk; exit 0 ); rc=$?
[ "$rc" = 94 ] && { echo 0; exit 0; }
[ "$rc" = 0 ] || exit "$rc"
sbx_walk
if [ -L "$D" ]; then rm -f "$D" || exit 99; echo 1; exit 0; fi
[ -e "$D" ] || { echo 0; exit 0; }
if [ -d "$D" ]; then
  [ "$REC" = 1 ] || exit 96
  rm -rf "$D" || exit 99
else rm -f "$D" || exit 99; fi
echo 1
"""
)

REFUSALS: dict[int, str] = {
    90: "symlinked_work_dir",
    91: "not_a_directory",
    92: "symlinked_parent",
    93: "parent_not_directory",
    95: "symlink_destination",
    96: "destination_is_directory",
    97: "not_a_regular_file",
    98: "exists",
    101: "not_a_directory",
}
MISSING = 94
TOO_LARGE = 100
SIZE_MISMATCH = 102

#: Kills a command's process group (or, without ``setsid``, the process) by pid. When neither
#: signal is delivered, exits :data:`KILL_GONE` if that is because nothing is left to signal (no
#: such process group nor process), so a group that ended on its own (a command that exited
#: once its output went over the budget) is told from a kill that failed.
KILL = (
    "sh",
    "-c",
    r"""kill -9 "-$1" 2>/dev/null && exit 0
kill -9 "$1" 2>/dev/null && exit 0
e=$(kill -0 "-$1" 2>&1; kill -0 "$1" 2>&1)
case $e in *ermitted*) exit 1 ;; *"o such process"*) exit 3 ;; esac
exit 1
""",
    "sbx",
)
KILL_GONE = 3

# Streaming exec (:mod:`.streaming`). The same outer wrapper starts :data:`STREAM_INNER`, which
# announces the pid like :data:`EXEC_INNER`, then a second line once its setup is done
# (``SBX:run``) or the setup's refusal (``SBX:err:<what>``, exit 125), so a stream never hands a
# caller the wrapper's own lines. Stdin is the stream's own (``$4 = 1``) and reaches its EOF when
# the caller closes it, or is ``/dev/null``.
STREAM_INNER = r"""printf 'SBX:pid:%s:%s\n' "$$" "$1" >&2
mk=$2; cwd=$3; sin=$4; ne=$5; shift 5
if [ "$mk" = 1 ] && [ ! -d "$cwd" ]; then mkdir -p "$cwd" 2>/dev/null; fi
cd "$cwd" 2>/dev/null || { printf 'SBX:err:cwd\n' >&2; exit 125; }
while [ "$ne" -gt 0 ]; do export "$1" || { printf 'SBX:err:env\n' >&2; exit 125; }
shift; ne=$((ne - 1)); done
printf 'SBX:run\n' >&2
if [ "$sin" = 1 ]; then exec "$@"; else exec "$@" </dev/null; fi
"""

# A terminal session (``tty``). The exec's process leads a session of its own with the terminal
# as its controlling tty (runc and gVisor make it so): the wrapper keeps that, ``exec``\ing the
# inner script in the same process, and announces ``session``, so the kill reaches everything
# the session started, jobs in process groups of their own included (:data:`KILL_SESSION`).
# Where the process is not a session leader, it falls back to :data:`EXEC_OUTER`'s ``setsid``.
STREAM_TTY_OUTER = r"""s=$1; shift
sid=$(read -r l < /proc/$$/stat && set -- ${l##*') '} && echo "$4")
if [ "$sid" = "$$" ]; then exec sh -c "$s" sbx session "$@"; fi
if command -v setsid >/dev/null 2>&1; then setsid sh -c "$s" sbx group "$@"
else sh -c "$s" sbx process "$@"; fi
exit $?
"""

#: Kills every process of the session led by ``$1`` (read from ``/proc/<pid>/stat``), exits 0
#: when one was signalled, :data:`KILL_GONE` when none is left, 1 when a kill failed. The scan
#: is repeated (at most 5 times) while it still finds one: a listing of ``/proc`` taken while
#: the session's processes fork and exit can miss one (seen on gVisor: a job ran on).
KILL_SESSION = (
    "sh",
    "-c",
    r"""s=$1; hit=0; bad=0; pass=0
while [ "$pass" -lt 5 ]; do
  pass=$((pass + 1)); found=0
  for d in /proc/[0-9]*; do
    read -r l < "$d/stat" 2>/dev/null || continue
    set -- ${l##*') '}
    [ "$4" = "$s" ] || continue
    if kill -9 "${d#/proc/}" 2>/dev/null; then hit=1; found=1; elif [ -d "$d" ]; then bad=1; fi
  done
  [ "$found" = 1 ] || break
done
[ "$bad" = 1 ] && exit 1
[ "$hit" = 1 ] && exit 0
exit 3
""",
    "sbx",
)
