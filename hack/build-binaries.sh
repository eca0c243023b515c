#!/usr/bin/env bash
# Build the Kubernetes components, etcd and helm from their Go modules and cache them by version.
#
# Why: these machines have no container engine and reach no download site, only the Go module
# proxy. k8s.io/kubernetes cannot be `go install`ed because its go.mod replaces the staging
# modules with local paths, so we build it from a throwaway wrapper module that pins each staging
# module to its published v0.Y.Z twin. Results are cached under $CACHE keyed by version, so only
# the first run on a machine pays the build.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.33.13}"
ETCD_VERSION="${ETCD_VERSION:-v3.5.21}"
HELM_VERSION="${HELM_VERSION:-v3.17.3}"
# gVisor publishes no semver tags; its `go` branch (the Go-tool-friendly tree) is pinned here by
# pseudo-version. Debian's runsc (2022) cannot set up pod networking on current kernels (it takes
# every network namespace for the root one), so the cluster uses this build. Only runsc: gVisor's
# containerd-shim-runsc-v1 does not work with Debian's containerd 1.6 (it answers `start` in the
# newer JSON form and insists on an OOM score root lacks the capability for here); containerd
# runs runsc through its runc v2 shim instead.
GVISOR_VERSION="${GVISOR_VERSION:-v0.0.0-20260905035102-160fafc42237}"
CACHE="${SANDBOX_OPERATOR_CACHE:-$HOME/.cache/sandbox-operator}"
K8S_BIN="$CACHE/bin/kubernetes-$K8S_VERSION"
ETCD_BIN="$CACHE/bin/etcd-$ETCD_VERSION"
HELM_BIN="$CACHE/bin/helm-$HELM_VERSION"
GVISOR_BIN="$CACHE/bin/gvisor-$GVISOR_VERSION"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export CGO_ENABLED="${CGO_ENABLED:-1}"

# One build per target at a time (two `up`s, or CI and a developer): the second waits, then
# finds the result cached.
lock() { mkdir -p "$CACHE/bin"; exec 9>"$CACHE/bin/.$1.lock"; flock 9; }

log() { printf '[build-binaries %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

staging_minor="v0.${K8S_VERSION#v1.}"   # v1.33.13 -> v0.33.13

build_kubernetes() {
  lock kubernetes
  local want=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
  local missing=0
  for b in "${want[@]}"; do [[ -x "$K8S_BIN/$b" ]] || missing=1; done
  if (( missing == 0 )); then log "kubernetes $K8S_VERSION cached in $K8S_BIN"; return; fi
  local work; work="$(mktemp -d)"
  log "building kubernetes $K8S_VERSION in $work (cold build: 10-30 min on 2 cores)"
  local staging=(api apiextensions-apiserver apimachinery apiserver cli-runtime client-go
    cloud-provider cluster-bootstrap code-generator component-base component-helpers
    controller-manager cri-api cri-client csi-translation-lib dynamic-resource-allocation
    endpointslice externaljwt kms kube-aggregator kube-controller-manager kube-proxy
    kube-scheduler kubectl kubelet metrics mount-utils pod-security-admission sample-apiserver
    sample-cli-plugin sample-controller)
  {
    echo "module sandbox-operator.dev/k8s-build"
    echo
    echo "go 1.24.0"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    for m in "${staging[@]}"; do echo "	k8s.io/$m => k8s.io/$m $staging_minor"; done
    echo ")"
  } >"$work/go.mod"
  cat >"$work/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  (cd "$work" && go mod tidy -e >/dev/null 2>&1 || true
   cd "$work" && GOFLAGS="$GOFLAGS -mod=mod" go mod download k8s.io/kubernetes)
  local ver_pkg="k8s.io/component-base/version"
  local cg_pkg="k8s.io/client-go/pkg/version"
  local date; date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  local ld=""
  for p in "$ver_pkg" "$cg_pkg"; do
    ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1"
    ld+=" -X $p.gitMinor=$(cut -d. -f2 <<<"$K8S_VERSION") -X $p.gitTreeState=clean"
    ld+=" -X $p.buildDate=$date"
  done
  mkdir -p "$K8S_BIN.tmp"
  (cd "$work" && GOFLAGS="$GOFLAGS -mod=mod" go build -trimpath -ldflags "-s -w $ld" \
     -o "$K8S_BIN.tmp/" \
     k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
     k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet \
     k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl)
  rm -rf "$K8S_BIN"; mv "$K8S_BIN.tmp" "$K8S_BIN"; rm -rf "$work"
  log "kubernetes $K8S_VERSION built into $K8S_BIN"
}

build_etcd() {
  lock etcd
  if [[ -x "$ETCD_BIN/etcd" ]]; then log "etcd $ETCD_VERSION cached"; return; fi
  local work; work="$(mktemp -d)"
  log "building etcd $ETCD_VERSION"
  cat >"$work/go.mod" <<GOMOD
module sandbox-operator.dev/etcd-build

go 1.23

require go.etcd.io/etcd/server/v3 $ETCD_VERSION

replace (
	go.etcd.io/etcd/api/v3 => go.etcd.io/etcd/api/v3 $ETCD_VERSION
	go.etcd.io/etcd/client/pkg/v3 => go.etcd.io/etcd/client/pkg/v3 $ETCD_VERSION
	go.etcd.io/etcd/client/v2 => go.etcd.io/etcd/client/v2 v2.305.${ETCD_VERSION##*.}
	go.etcd.io/etcd/client/v3 => go.etcd.io/etcd/client/v3 $ETCD_VERSION
	go.etcd.io/etcd/pkg/v3 => go.etcd.io/etcd/pkg/v3 $ETCD_VERSION
	go.etcd.io/etcd/raft/v3 => go.etcd.io/etcd/raft/v3 $ETCD_VERSION
)
GOMOD
  mkdir -p "$ETCD_BIN.tmp"
  (cd "$work" && GOFLAGS="$GOFLAGS -mod=mod" go build -trimpath -ldflags "-s -w" \
     -o "$ETCD_BIN.tmp/etcd" go.etcd.io/etcd/server/v3)
  rm -rf "$ETCD_BIN"; mv "$ETCD_BIN.tmp" "$ETCD_BIN"; rm -rf "$work"
  log "etcd built into $ETCD_BIN"
}

build_helm() {
  lock helm
  if [[ -x "$HELM_BIN/helm" ]]; then log "helm $HELM_VERSION cached"; return; fi
  log "building helm $HELM_VERSION"
  mkdir -p "$HELM_BIN.tmp"
  GOBIN="$HELM_BIN.tmp" go install -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  rm -rf "$HELM_BIN"; mv "$HELM_BIN.tmp" "$HELM_BIN"
  log "helm built into $HELM_BIN"
}

build_gvisor() {
  lock gvisor
  if [[ -x "$GVISOR_BIN/runsc" ]]; then log "gvisor runsc $GVISOR_VERSION cached"; return; fi
  local work; work="$(mktemp -d)"
  log "building gvisor runsc $GVISOR_VERSION (cold: 5-15 min)"
  cat >"$work/go.mod" <<GOMOD
module sandbox-operator.dev/gvisor-build

go 1.26

require gvisor.dev/gvisor $GVISOR_VERSION
GOMOD
  mkdir -p "$GVISOR_BIN"
  (cd "$work" && GOFLAGS="$GOFLAGS -mod=mod" go mod download gvisor.dev/gvisor \
   && GOFLAGS="$GOFLAGS -mod=mod" CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
     -o "$GVISOR_BIN/runsc.tmp" gvisor.dev/gvisor/runsc)
  mv "$GVISOR_BIN/runsc.tmp" "$GVISOR_BIN/runsc"
  rm -rf "$work"
  log "gvisor runsc built into $GVISOR_BIN"
}

what="${1:-all}"
case "$what" in
  kubernetes) build_kubernetes ;;
  etcd) build_etcd ;;
  helm) build_helm ;;
  gvisor) build_gvisor ;;
  all) build_etcd; build_helm; build_gvisor; build_kubernetes ;;
  print-paths)
    printf 'K8S_BIN=%s\nETCD_BIN=%s\nHELM_BIN=%s\nGVISOR_BIN=%s\n' \
      "$K8S_BIN" "$ETCD_BIN" "$HELM_BIN" "$GVISOR_BIN" ;;
  *) echo "usage: $0 [all|kubernetes|etcd|helm|gvisor|print-paths]" >&2; exit 2 ;;
esac
