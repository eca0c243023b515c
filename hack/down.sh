#!/usr/bin/env bash
# `make down`: undo `make up`.
#
#   1. delete the example Sandbox and SandboxScope while the operator still runs (so their
#      finalizers dispose of the sandbox pods)
#   2. helm uninstall the operator (CRDs are kept by design: see docs/install.md)
#   3. stop the local cluster (hack/cluster.py down), unless $KUBECONFIG points at another
#      cluster, which is left running. WIPE=1 also deletes the local cluster's state;
#      KEEP_CLUSTER=1 leaves the local cluster running (only the release and examples go).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
CACHE="${SANDBOX_OPERATOR_CACHE:-$HOME/.cache/sandbox-operator}"
STATE="${SANDBOX_OPERATOR_STATE:-$CACHE/state}"
LOCAL_KUBECONFIG="$STATE/kubeconfig"
PY="$ROOT/.venv/bin/python"
[[ -x "$PY" ]] || PY=python3
RELEASE="${RELEASE:-sandbox-operator}"
OPERATOR_NAMESPACE="${OPERATOR_NAMESPACE:-sandbox-operator-system}"
DEMO_NAMESPACE="${DEMO_NAMESPACE:-default}"
T0=$SECONDS
say() { printf '[%3dm%02ds] %s\n' $(( (SECONDS - T0) / 60 )) $(( (SECONDS - T0) % 60 )) "$*"; }

paths="$(bash hack/build-binaries.sh print-paths)"
KUBECTL="${KUBECTL:-$(sed -n 's/^K8S_BIN=//p' <<<"$paths")/kubectl}"
[[ -x "$KUBECTL" ]] || KUBECTL="$(command -v kubectl || true)"
HELM="${HELM:-$(sed -n 's/^HELM_BIN=//p' <<<"$paths")/helm}"
[[ -x "$HELM" ]] || HELM="$(command -v helm || true)"

if [[ -n "${KUBECONFIG:-}" && "$(readlink -f "$KUBECONFIG")" != "$(readlink -f "$LOCAL_KUBECONFIG")" ]]; then
  MODE=external
else
  MODE=local
  export KUBECONFIG="$LOCAL_KUBECONFIG"
fi

reachable() { [[ -n "$KUBECTL" && -f "$KUBECONFIG" ]] && "$KUBECTL" get --raw /readyz >/dev/null 2>&1; }

if reachable; then
  say "deleting the example Sandbox and SandboxScope (namespace $DEMO_NAMESPACE)"
  "$KUBECTL" -n "$DEMO_NAMESPACE" delete --ignore-not-found --wait --timeout=120s \
    -f examples/sandbox.yaml -f examples/sandboxscope.yaml \
    || say "warning: the examples did not go away in time (their finalizers may still be running)"
  if [[ -n "$HELM" ]] && "$HELM" status "$RELEASE" -n "$OPERATOR_NAMESPACE" >/dev/null 2>&1; then
    say "helm uninstall $RELEASE (namespace $OPERATOR_NAMESPACE); CRDs are kept"
    "$HELM" uninstall "$RELEASE" -n "$OPERATOR_NAMESPACE" --wait --timeout 2m
  else
    say "release $RELEASE is not installed in $OPERATOR_NAMESPACE"
  fi
  "$KUBECTL" delete namespace "$OPERATOR_NAMESPACE" --ignore-not-found --wait=false >/dev/null
else
  say "the cluster is not reachable: nothing to uninstall"
fi

if [[ "$MODE" == local && "${KEEP_CLUSTER:-0}" == 1 ]]; then
  say "KEEP_CLUSTER=1: the local cluster is left running"
elif [[ "$MODE" == local ]]; then
  if [[ "${WIPE:-0}" == 1 ]]; then
    say "stopping the local cluster and wiping its state (hack/cluster.py down --wipe)"
    "$PY" hack/cluster.py down --wipe
  else
    say "stopping the local cluster (hack/cluster.py down); caches and state are kept"
    "$PY" hack/cluster.py down
  fi
else
  say "KUBECONFIG points at another cluster: it is left running"
fi
say "make down: done"
