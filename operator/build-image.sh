#!/usr/bin/env bash
# Build the operator image without a container engine or a registry, and import it into the local
# cluster's containerd. The content matches operator/Dockerfile: Debian's python3, the project's
# wheel and its dependencies, a non-root user (65532), entrypoint `sandbox-operator`, cmd `run`.
#
#   operator/build-image.sh build     build (or reuse) the OCI archive; prints "<ref> <tarball>"
#   operator/build-image.sh import    build, then import into containerd's k8s.io namespace
#   operator/build-image.sh import-keyed
#                                     the same, printing "<keyed ref> <tarball>"
#   operator/build-image.sh ref       print the image reference only
#
# The archive names the image twice: "<repo>:<version>", the tag a plain `helm install` of the
# chart runs (shared: the last import wins), and "<repo>:<version>-<content key>", a tag only this
# content has. Tests and benchmarks run the keyed one, so checkouts testing side by side on one
# machine never run one another's operator.
#
# Three layers, each cached under $CACHE/images keyed by a hash of what it is made of:
#   1. Debian rootfs: python3 and its dependency closure, from .debs unpacked (no maintainer
#      scripts run); key = this script + the candidate versions of those packages.
#   2. Python dependencies of the project (binary wheels for CPython 3.11, manylinux x86_64);
#      key = this script + the dependency list in pyproject.toml.
#   3. The project's wheel; key = this script + pyproject.toml + every file under src/.
# The archive itself is keyed by all three, so a warm build with unchanged sources costs nothing.
#
# Environment: CONTAINERD_ADDRESS (default: the local cluster's socket under
# $SANDBOX_OPERATOR_STATE/containerd, else /run/containerd/containerd.sock),
# SANDBOX_OPERATOR_CACHE, PYTHON.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SELF="$ROOT/operator/build-image.sh"
CACHE="${SANDBOX_OPERATOR_CACHE:-$HOME/.cache/sandbox-operator}"
IMAGES="$CACHE/images"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$PYTHON" ]] || PYTHON=python3
REPO="sandbox-operator.dev/operator"
DEBIAN_PACKAGES=(python3 libpython3.11-stdlib ca-certificates tzdata)
PY_TAG=3.11
SITE=/usr/local/lib/python3.11/dist-packages
UID_GID=65532

log() { printf '[operator-image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
need() {
  local missing=() t
  for t in "$@"; do command -v "$t" >/dev/null 2>&1 || missing+=("$t"); done
  ((${#missing[@]} == 0)) || die "missing tools: ${missing[*]} (apt-get install umoci containerd)"
}

version() {
  "$PYTHON" - "$ROOT/pyproject.toml" <<'PY'
import sys, tomllib
print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])
PY
}

dependencies() {
  "$PYTHON" - "$ROOT/pyproject.toml" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
# The image runs the operator: the base install plus the operator's and the ACA backend's extras.
for dep in project["dependencies"] + [
    dep for extra in ("operator", "acas") for dep in project["optional-dependencies"][extra]
]:
    print(dep)
PY
}

script_hash() { sha256sum "$SELF" | cut -c1-64; }
short() { sha256sum | cut -c1-16; }

debian_key() {
  { script_hash; apt-cache policy "${DEBIAN_PACKAGES[@]}" 2>/dev/null \
      | awk '/^[^ ]/{p=$1} /Candidate:/{print p, $2}'; } | short
}
deps_key() { { script_hash; dependencies; } | short; }
app_key() {
  { script_hash; sha256sum "$ROOT/pyproject.toml" | cut -c1-64
    (cd "$ROOT" && find src -type f -not -path '*/__pycache__/*' -not -path '*.egg-info/*' \
       -print0 | LC_ALL=C sort -z | xargs -0 sha256sum); } | short
}

# Layer 1: a Debian rootfs with python3, from the packages' .debs.
build_debian() {
  local dir="$IMAGES/operator-debian-$1"
  if [[ -d "$dir/rootfs" ]]; then echo "$dir/rootfs"; return; fi
  need apt-get dpkg-deb
  log "layer 1: Debian rootfs with ${DEBIAN_PACKAGES[*]} (and dependencies)"
  local work; work="$(mktemp -d)"
  mkdir -p "$work/debs/partial" "$work/state"; : >"$work/state/status"
  # Resolve the dependency closure against an empty package database; download only.
  apt-get install -y -q --download-only --no-install-recommends \
    -o Dir::State::status="$work/state/status" -o Dir::Cache::archives="$work/debs" \
    -o Debug::NoLocking=1 "${DEBIAN_PACKAGES[@]}" >"$work/apt.log" 2>&1 \
    || { cat "$work/apt.log" >&2; die "apt could not download ${DEBIAN_PACKAGES[*]}"; }
  local rootfs="$work/rootfs" deb
  mkdir -p "$rootfs"
  for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$rootfs"; done
  [[ -e "$rootfs/bin/sh" ]] || ln -s dash "$rootfs/bin/sh"
  # ca-certificates' bundle is normally built by its maintainer script.
  if [[ -d "$rootfs/usr/share/ca-certificates" ]]; then
    mkdir -p "$rootfs/etc/ssl/certs"
    find "$rootfs/usr/share/ca-certificates" -name '*.crt' -print0 | LC_ALL=C sort -z \
      | xargs -0 cat >"$rootfs/etc/ssl/certs/ca-certificates.crt"
  fi
  mkdir -p "$rootfs"/{tmp,proc,sys,dev,home/operator,etc,"${SITE#/}"}
  chmod 1777 "$rootfs/tmp"
  printf 'root:x:0:0:root:/root:/usr/sbin/nologin\noperator:x:%s:%s:sandbox-operator:/home/operator:/usr/sbin/nologin\n' \
    "$UID_GID" "$UID_GID" >"$rootfs/etc/passwd"
  printf 'root:x:0:\noperator:x:%s:\n' "$UID_GID" >"$rootfs/etc/group"
  printf 'hosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
  chown "$UID_GID:$UID_GID" "$rootfs/home/operator"
  rm -rf "$rootfs"/usr/share/{doc,man,info,locale,lintian} "$rootfs"/var/cache/* \
    "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/lib/dpkg
  mkdir -p "$dir.tmp" && mv "$rootfs" "$dir.tmp/rootfs" && rm -rf "$work"
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
  echo "$dir/rootfs"
}

# Layer 2: the project's dependencies as binary wheels for the image's CPython.
build_deps() {
  local dir="$IMAGES/operator-deps-$1"
  if [[ -d "$dir/site" ]]; then echo "$dir/site"; return; fi
  log "layer 2: Python dependencies: $(dependencies | tr '\n' ' ')"
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp/site"
  local deps=(); mapfile -t deps < <(dependencies)
  "$PYTHON" -m pip install -q --disable-pip-version-check --no-compile --target "$dir.tmp/site" \
    --only-binary=:all: --implementation cp --python-version "$PY_TAG" --abi "cp${PY_TAG/./}" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --platform linux_x86_64 \
    "${deps[@]}" >"$dir.tmp/pip.log" 2>&1 \
    || { cat "$dir.tmp/pip.log" >&2; die "pip could not install the dependencies"; }
  # Console scripts of dependencies are not part of the image.
  rm -rf "$dir.tmp/site/bin"
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
  echo "$dir/site"
}

# Layer 3: the project's wheel, plus the `sandbox-operator` command.
build_app() {
  local dir="$IMAGES/operator-app-$1"
  if [[ -d "$dir/root" ]]; then echo "$dir/root"; return; fi
  log "layer 3: the sandbox-operator wheel"
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp/wheel" "$dir.tmp/root/${SITE#/}" "$dir.tmp/root/usr/local/bin"
  (cd "$ROOT" && "$PYTHON" -m pip wheel -q --disable-pip-version-check --no-deps \
     -w "$dir.tmp/wheel" .) >"$dir.tmp/pip.log" 2>&1 \
    || { cat "$dir.tmp/pip.log" >&2; die "could not build the project's wheel"; }
  "$PYTHON" -m pip install -q --disable-pip-version-check --no-deps --no-compile \
    --target "$dir.tmp/root/$SITE" "$dir.tmp"/wheel/*.whl >>"$dir.tmp/pip.log" 2>&1 \
    || { cat "$dir.tmp/pip.log" >&2; die "could not install the project's wheel"; }
  rm -rf "$dir.tmp/root/$SITE/bin"
  cat >"$dir.tmp/root/usr/local/bin/sandbox-operator" <<'PY'
#!/usr/bin/python3
import sys

from sandbox_operator.cli import main

sys.exit(main())
PY
  chmod 0755 "$dir.tmp/root/usr/local/bin/sandbox-operator"
  cp "$dir.tmp"/wheel/*.whl "$dir.tmp/"
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
  echo "$dir/root"
}

image_ref() { echo "$REPO:$(version)"; }
# The tag only this archive's content has (its content key is in the archive's name).
keyed_ref() { local key="${1##*/operator-}"; echo "$REPO:$(version)-${key%.tar}"; }

build() {
  need umoci apt-cache sha256sum
  mkdir -p "$IMAGES"
  local dkey pkey akey key ref out
  dkey="$(debian_key)"; pkey="$(deps_key)"; akey="$(app_key)"
  key="$(printf '%s %s %s %s' "$dkey" "$pkey" "$akey" "$(version)" | short)"
  ref="$(image_ref)"; out="$IMAGES/operator-$key.tar"
  local keyed; keyed="$(keyed_ref "$out")"
  if [[ -s "$out" ]]; then
    log "$ref cached ($out)"
    echo "$ref $out"; return
  fi
  local rootfs site app
  rootfs="$(build_debian "$dkey")"; site="$(build_deps "$pkey")"; app="$(build_app "$akey")"
  log "packing $ref"
  local work; work="$(mktemp -d)"
  local layout="$work/layout" tag="${ref##*:}"
  umoci init --layout "$layout"
  umoci new --image "$layout:$tag"
  umoci insert --image "$layout:$tag" --history.comment "Debian python3 rootfs" "$rootfs" / >/dev/null
  umoci insert --image "$layout:$tag" --history.comment "Python dependencies" "$site" "$SITE" >/dev/null
  umoci insert --image "$layout:$tag" --history.comment "sandbox-operator wheel" "$app" / >/dev/null
  umoci config --image "$layout:$tag" --no-history --os linux --architecture amd64 \
    --config.user "$UID_GID:$UID_GID" --config.workingdir /home/operator \
    --config.env "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --config.env "PYTHONDONTWRITEBYTECODE=1" --config.env "PYTHONUNBUFFERED=1" \
    --config.env "HOME=/home/operator" \
    --config.entrypoint /usr/local/bin/sandbox-operator --config.cmd run \
    --config.label "org.opencontainers.image.title=sandbox-operator" \
    --config.label "org.opencontainers.image.version=$tag" \
    --config.label "dev.sandbox-operator.content-key=$key"
  # containerd names an imported image after this annotation on an index entry: one entry per
  # name, the same manifest under both.
  "$PYTHON" - "$layout/index.json" "$ref" "$keyed" <<'PY'
import json, sys
path, refs = sys.argv[1], sys.argv[2:]
index = json.load(open(path))
index["manifests"] = [
    {**m, "annotations": {**m.get("annotations", {}), "io.containerd.image.name": ref}}
    for m in index["manifests"]
    for ref in refs
]
json.dump(index, open(path, "w"))
PY
  tar -C "$layout" -cf "$out.tmp" . && mv "$out.tmp" "$out"
  rm -rf "$work"
  log "built $ref ($(du -h "$out" | cut -f1), key $key)"
  echo "$ref $out"
}

containerd_address() {
  # Explicit address, else the local cluster's containerd (hack/cluster.py keeps its socket in
  # its state directory), else the system one.
  if [[ -n "${CONTAINERD_ADDRESS:-}" ]]; then echo "$CONTAINERD_ADDRESS"; return; fi
  local local_sock="${SANDBOX_OPERATOR_STATE:-$CACHE/state}/containerd/containerd.sock"
  if [[ -S "$local_sock" ]]; then echo "$local_sock"; return; fi
  echo /run/containerd/containerd.sock
}

import_image() {
  need ctr
  local ref out addr
  read -r ref out < <(build)
  addr="$(containerd_address)"
  [[ -S "$addr" ]] || die "no containerd socket at $addr (is the cluster up? set CONTAINERD_ADDRESS)"
  log "importing $ref into containerd ($addr, namespace k8s.io)"
  ctr --address "$addr" -n k8s.io images import "$out" >/dev/null \
    || die "ctr could not import $out"
  local present
  present="$(ctr --address "$addr" -n k8s.io images ls -q)"  # not piped into grep -q: SIGPIPE
  local name
  for name in "$ref" "$(keyed_ref "$out")"; do
    grep -qx "$name" <<<"$present" || die "$name is not in containerd after importing $out"
  done
  if [[ "${1:-}" == keyed ]]; then echo "$(keyed_ref "$out") $out"; else echo "$ref $out"; fi
}

case "${1:-build}" in
  build) build ;;
  import) import_image ;;
  import-keyed) import_image keyed ;;
  ref) image_ref ;;
  *) echo "usage: $0 [build|import|import-keyed|ref]" >&2; exit 2 ;;
esac
