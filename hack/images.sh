#!/usr/bin/env bash
# Build the cluster's container images from Debian packages, without a registry or a container
# engine, and (optionally) import them into containerd's k8s.io namespace.
#
#   hack/images.sh build            build (or reuse) the OCI archives, print "<ref> <tarball>" lines
#   hack/images.sh import           build, then import into containerd ($CONTAINERD_ADDRESS)
#
# Images:
#   sandbox-operator.dev/pause:1    a tiny static pause binary compiled here (the pod sandbox image)
#   sandbox-operator.dev/busybox:1  busybox-static with its applets linked into /bin
#   sandbox-operator.dev/python:1   a minimal Debian rootfs with python3, dash, coreutils, tar, curl
#                                   (curl: maf-sandbox's egress suites run it in the guest)
#
# Each archive is cached under $CACHE/images keyed by a hash of its recipe: this script, the image
# name and the candidate versions of the Debian packages it is made of. A changed recipe or a
# Debian update gives a new key and a rebuild; an unchanged one costs nothing.
set -euo pipefail

CACHE="${SANDBOX_OPERATOR_CACHE:-$HOME/.cache/sandbox-operator}"
IMAGES="$CACHE/images"
CONTAINERD_ADDRESS="${CONTAINERD_ADDRESS:-/run/containerd/containerd.sock}"
SELF="$(readlink -f "$0")"
REGISTRY="sandbox-operator.dev"
PY_PACKAGES=(python3 dash coreutils tar gzip findutils grep sed bash curl)

log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

need() {
  local missing=()
  for tool in "$@"; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
  ((${#missing[@]} == 0)) || die "missing tools: ${missing[*]} (hack/cluster.py up installs them)"
}

candidate_versions() {
  # The versions apt would install now: part of the cache key, so a Debian update rebuilds.
  apt-cache policy "$@" 2>/dev/null | awk '/^[^ ]/{p=$1} /Candidate:/{print p, $2}'
}

VERSIONS=""  # filled once by build_all: apt-cache is slow, ask it a single time

recipe_key() {
  local name="$1" pkg; shift
  { sha256sum "$SELF" | cut -d' ' -f1; echo "$name"
    for pkg in "$@"; do grep "^$pkg: " <<<"$VERSIONS" || echo "$pkg: unknown"; done; } \
    | sha256sum | cut -c1-16
}

# store <name> <tarball being written>: drop older archives of the same image.
prune_old() {
  local name="$1" keep="$2" f
  for f in "$IMAGES/$name"-*.tar; do [[ "$f" == "$keep" || ! -e "$f" ]] || rm -f "$f"; done
}

# pack_rootfs <rootfs dir> <ref> <out tarball> <cmd...>: one-layer OCI archive of a directory.
pack_rootfs() {
  local rootfs="$1" ref="$2" out="$3"; shift 3
  local work; work="$(mktemp -d)"
  local layout="$work/layout" tag="${ref##*:}"
  umoci init --layout "$layout"
  umoci new --image "$layout:$tag"
  umoci insert --image "$layout:$tag" --history.created_by "hack/images.sh" "$rootfs" / >/dev/null
  local cfg=(--config.env "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
  for c in "$@"; do cfg+=(--config.cmd "$c"); done
  umoci config --image "$layout:$tag" --no-history --os linux --architecture amd64 "${cfg[@]}"
  # containerd names an imported image after this annotation on the index entry.
  python3 - "$layout/index.json" "$ref" <<'PY'
import json, sys
path, ref = sys.argv[1], sys.argv[2]
index = json.load(open(path))
for m in index["manifests"]:
    m.setdefault("annotations", {})["io.containerd.image.name"] = ref
json.dump(index, open(path, "w"))
PY
  tar -C "$layout" -cf "$out.tmp" .
  mv "$out.tmp" "$out"
  rm -rf "$work"
}

build_pause() {
  local ref="$REGISTRY/pause:1" key out
  key="$(recipe_key pause gcc libc6-dev)"; out="$IMAGES/pause-$key.tar"
  if [[ ! -s "$out" ]]; then
    need gcc umoci
    log "building $ref"
    local work; work="$(mktemp -d)"
    mkdir -p "$work/rootfs"
    # The pod sandbox process: sleeps until SIGINT/SIGTERM, reaps orphans it inherits.
    cat >"$work/pause.c" <<'C'
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) { (void)sig; _exit(0); }

static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction term = {.sa_handler = on_term};
  struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGINT, &term, NULL);
  sigaction(SIGTERM, &term, NULL);
  sigaction(SIGCHLD, &child, NULL);
  for (;;) pause();
  return 0;
}
C
    gcc -static -Os -s -o "$work/rootfs/pause" "$work/pause.c"
    pack_rootfs "$work/rootfs" "$ref" "$out" /pause
    prune_old pause "$out"
    rm -rf "$work"
  fi
  echo "$ref $out"
}

build_busybox() {
  local ref="$REGISTRY/busybox:1" key out
  key="$(recipe_key busybox busybox-static)"; out="$IMAGES/busybox-$key.tar"
  if [[ ! -s "$out" ]]; then
    need umoci apt-get dpkg-deb
    log "building $ref"
    local work; work="$(mktemp -d)"
    chmod 0755 "$work"
    (cd "$work" && apt-get download -q busybox-static >/dev/null)
    dpkg-deb -x "$work"/busybox-static_*.deb "$work/pkg"
    local rootfs="$work/rootfs"
    mkdir -p "$rootfs"/{bin,sbin,usr/bin,usr/sbin,etc,tmp,root,proc,sys,dev}
    chmod 1777 "$rootfs/tmp"
    install -m 0755 "$work/pkg/bin/busybox" "$rootfs/bin/busybox"
    # One symlink per applet, at the path busybox itself reports (bin/sh, usr/bin/awk, ...).
    local applet
    while read -r applet; do
      [[ -e "$rootfs/$applet" ]] || ln -s /bin/busybox "$rootfs/$applet"
    done < <("$work/pkg/bin/busybox" --list-full)
    write_etc "$rootfs"
    pack_rootfs "$rootfs" "$ref" "$out" /bin/sh
    prune_old busybox "$out"
    rm -rf "$work"
  fi
  echo "$ref $out"
}

build_python() {
  local ref="$REGISTRY/python:1" key out
  key="$(recipe_key python "${PY_PACKAGES[@]}")"; out="$IMAGES/python-$key.tar"
  if [[ ! -s "$out" ]]; then
    need umoci apt-get dpkg-deb
    log "building $ref from Debian packages: ${PY_PACKAGES[*]} (and their dependencies)"
    local work; work="$(mktemp -d)"
    chmod 0755 "$work"
    # apt resolves the whole dependency closure against an empty package database and only
    # downloads; the .debs are then unpacked (no maintainer scripts: nothing runs as root here).
    mkdir -p "$work/debs/partial" "$work/state"; : >"$work/state/status"
    apt-get install -y -q --download-only --no-install-recommends \
      -o Dir::State::status="$work/state/status" -o Dir::Cache::archives="$work/debs" \
      -o Debug::NoLocking=1 "${PY_PACKAGES[@]}" >"$work/apt.log" 2>&1 \
      || { cat "$work/apt.log" >&2; die "apt could not download the python image's packages"; }
    local rootfs="$work/rootfs" deb
    mkdir -p "$rootfs"
    for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$rootfs"; done
    [[ -e "$rootfs/bin/sh" ]] || ln -s dash "$rootfs/bin/sh"
    [[ -e "$rootfs/usr/bin/python" ]] || ln -s python3 "$rootfs/usr/bin/python"
    mkdir -p "$rootfs"/{tmp,root,proc,sys,dev,work}
    chmod 1777 "$rootfs/tmp"
    rm -rf "$rootfs"/usr/share/{doc,man,info,locale,lintian} "$rootfs"/var/cache/* \
      "$rootfs"/var/lib/apt/lists/*
    write_etc "$rootfs"
    pack_rootfs "$rootfs" "$ref" "$out" python3
    prune_old python "$out"
    rm -rf "$work"
  fi
  echo "$ref $out"
}

write_etc() {
  local rootfs="$1"
  mkdir -p "$rootfs/etc"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' \
    >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
  printf 'hosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
}

build_all() {
  mkdir -p "$IMAGES"
  VERSIONS="$(candidate_versions gcc libc6-dev busybox-static "${PY_PACKAGES[@]}")"
  build_pause
  build_busybox
  build_python
}

import_all() {
  need ctr
  local ref tarball
  while read -r ref tarball; do
    log "importing $ref into containerd (k8s.io)"
    ctr --address "$CONTAINERD_ADDRESS" -n k8s.io images import "$tarball" \
      >/dev/null || die "ctr could not import $tarball"
    ctr --address "$CONTAINERD_ADDRESS" -n k8s.io images ls -q | grep -qx "$ref" \
      || die "$ref is not in containerd after importing $tarball"
  done < <(build_all)
  log "images imported: $(ctr --address "$CONTAINERD_ADDRESS" -n k8s.io images ls -q \
    | grep -c "^$REGISTRY/")"
}

case "${1:-build}" in
  build) build_all ;;
  import) import_all ;;
  *) echo "usage: $0 [build|import]" >&2; exit 2 ;;
esac
