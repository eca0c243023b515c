#!/usr/bin/env bash
# Build kwok's controller (sigs.k8s.io/kwok/cmd/kwok) from its Go module and cache it by version,
# together with the upstream Stage definitions of the same version.
#
# Why kwok: scale tests need thousands of pods "running" without a runtime behind them. kwok's
# controller takes over Node objects that match a selector, keeps their leases and status
# alive, and plays pods bound to them through Pending -> Running/Ready and, once deleted, away,
# according to Stages. Nothing runs on a fake node; see docs/cluster.md ("Fake nodes: kwok").
#
# Usage: hack/build-kwok.sh [build|print-path|print-stages]
#   build         (default) build into $CACHE/bin/kwok-$KWOK_VERSION/kwok, copy the stages
#   print-path    print the binary's path
#   print-stages  print the directory of the cached upstream Stage files
set -euo pipefail

# v0.8.0 builds here with the Go toolchain of these machines (its go.mod asks for go 1.26); its
# go.mod has no replace directives, so a plain `go install module@version` works.
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
CACHE="${SANDBOX_OPERATOR_CACHE:-$HOME/.cache/sandbox-operator}"
BIN="$CACHE/bin/kwok-$KWOK_VERSION"
MODULE="sigs.k8s.io/kwok"
# The upstream Stages the local cluster uses (paths inside the module): nodes become Ready at
# once and keep a lease; pods become Running and Ready at once; Job pods complete. The pod
# deletion Stage is hack/cluster.py's own (it leaves pods with finalizers alone).
STAGES=(
  kustomize/stage/node/fast/node-initialize.yaml
  kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
  kustomize/stage/pod/fast/pod-ready.yaml
  kustomize/stage/pod/fast/pod-complete.yaml
)
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export CGO_ENABLED="${CGO_ENABLED:-0}"

log() { printf '[build-kwok %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# One build at a time (two `kwok up`s, or CI and a developer): the second waits, then finds the
# result cached.
lock() { mkdir -p "$CACHE/bin"; exec 9>"$CACHE/bin/.kwok.lock"; flock 9; }

cached() {
  [[ -x "$BIN/kwok" ]] || return 1
  local s
  for s in "${STAGES[@]}"; do [[ -s "$BIN/stages/$(basename "$s")" ]] || return 1; done
}

build() {
  lock
  if cached; then log "kwok $KWOK_VERSION cached in $BIN"; return; fi
  command -v go >/dev/null || { log "go is not on PATH"; exit 1; }
  log "building kwok $KWOK_VERSION (a few minutes on 2 cores)"
  rm -rf "$BIN.tmp"; mkdir -p "$BIN.tmp/stages"
  GOBIN="$BIN.tmp" go install -trimpath \
    -ldflags "-s -w -X $MODULE/pkg/consts.Version=${KWOK_VERSION#v}" \
    "$MODULE/cmd/kwok@$KWOK_VERSION"
  local dir
  dir="$(go mod download -json "$MODULE@$KWOK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  [[ -d "$dir" ]] || { log "module directory of $MODULE@$KWOK_VERSION not found"; exit 1; }
  local s
  for s in "${STAGES[@]}"; do cp "$dir/$s" "$BIN.tmp/stages/"; done
  chmod -R u+w "$BIN.tmp"
  rm -rf "$BIN"; mv "$BIN.tmp" "$BIN"
  log "kwok built into $BIN"
}

case "${1:-build}" in
  build) build ;;
  print-path) printf '%s\n' "$BIN/kwok" ;;
  print-stages) printf '%s\n' "$BIN/stages" ;;
  *) echo "usage: $0 [build|print-path|print-stages]" >&2; exit 2 ;;
esac
