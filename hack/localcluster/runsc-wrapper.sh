#!/bin/sh
# Written by hack/cluster.py: runsc as the binary of containerd's runc v2 shim.
dir=@DIR@
eval "id=\${$#}"
root="" bundle="" pidfile="" cmd="" prev=""
for a in "$@"; do
  case "$prev" in
    --root) root="$a" ;;
    --bundle|-b) bundle="$a" ;;
    --pid-file) pidfile="$a" ;;
  esac
  case "$a" in
    --root=*) root="${a#--root=}" ;;
    --bundle=*) bundle="${a#--bundle=}" ;;
    --pid-file=*) pidfile="${a#--pid-file=}" ;;
    create|start|delete|kill) [ -z "$cmd" ] && cmd="$a" ;;
  esac
  prev="$a"
done
# containerd treats a kill or delete of a container that is already gone as done only when
# runc's words say so; runsc says it differently ("sandbox is not running").
mapped() {
  words="$1"; shift
  out="$(@RUNSC@ "$@" 2>&1)" && { [ -n "$out" ] && printf '%s\n' "$out"; return 0; }
  rc=$?
  case "$out" in
    *"not running"*|*"does not exist"*|*"no such"*|*"not found"*|*"not exist"*)
      printf '%s\n' "$words" >&2 ;;
    *) printf '%s\n' "$out" >&2 ;;
  esac
  return $rc
}
kill_holder() {
  pid="$(cat "$dir/$id.holder" 2>/dev/null)"
  if [ -n "$pid" ] && grep -qx sleep "/proc/$pid/comm" 2>/dev/null; then kill "$pid"; fi
  rm -f "$dir/$id.holder"
}
case "$cmd" in
  create)
    sleep 2147483647 <&0 &
    echo $! >"$dir/$id.holder"
    @RUNSC@ "$@" || { rc=$?; kill_holder; exit $rc; }
    if [ -n "$pidfile" ] && grep -Eq '"io.kubernetes.cri.container-type": *"container"' \
        "$bundle/config.json" 2>/dev/null; then
      : >"$dir/$id.watcher"
      (
        while [ ! -e "$dir/$id.started" ]; do
          [ -e "$dir/$id.watcher" ] || exit 255
          sleep 0.1
        done
        rm -f "$dir/$id.started" "$dir/$id.watcher"
        st="$(@RUNSC@ --root "$root" wait "$id" 2>/dev/null \
          | sed -n 's/.*"exitStatus": *\([0-9]*\).*/\1/p')"
        exit "${st:-255}"
      ) </dev/null >/dev/null 2>&1 &
      printf %s $! >"$pidfile"
    fi
    exit 0 ;;
  start)
    pid="$(cat "$dir/$id.holder" 2>/dev/null)"
    if [ -n "$pid" ] && [ -e "/proc/$pid/fd/1" ]; then
      @RUNSC@ "$@" </proc/$pid/fd/0 >/proc/$pid/fd/1 2>/proc/$pid/fd/2
    else
      @RUNSC@ "$@"
    fi
    rc=$?
    kill_holder
    [ -e "$dir/$id.watcher" ] && : >"$dir/$id.started"
    exit $rc ;;
  delete)
    kill_holder
    rm -f "$dir/$id.watcher" "$dir/$id.started"
    mapped "container $id does not exist" "$@"
    exit $? ;;
  kill)
    mapped "container not running" "$@"
    exit $? ;;
esac
exec @RUNSC@ "$@"
