#!/usr/bin/env bash
# `make up`: everything from a fresh clone to a Ready sandbox in which a command ran.
#
#   1. the cluster: the local one (hack/cluster.py up), or the one $KUBECONFIG points at
#   2. the sandbox images (busybox, python) in the node's containerd
#   3. the operator image (operator/build-image.sh), imported the same way
#   4. the Helm chart, with the local configuration: floor lowered to hardened_container (gVisor),
#      because the local cluster has no microVM runtime; the chart's own default stays microvm
#   5. the example SandboxScope and Sandbox (examples/)
#   6. wait for the Sandbox to be Ready
#   7. run a command inside it (kubectl exec)
#   8. kubectl get sbx -o wide
#
# Each step logs to its own file under $SANDBOX_OPERATOR_STATE/up-logs/<time>/; a failing step
# names itself and its log and shows the log's last lines.
#
# Environment: KUBECONFIG (use that cluster instead of the local one), RELEASE (default
# sandbox-operator), OPERATOR_NAMESPACE (default sandbox-operator-system), DEMO_NAMESPACE
# (default default), OPERATOR_IMAGE (repository:tag of an image your cluster can pull: skips the
# local build and import), READY_TIMEOUT (default 180s), WATCH_NAMESPACES (comma-separated: serve
# only these namespaces instead of all), IGNORE_NAMESPACES (comma-separated globs: serve all
# namespaces but these; on the local cluster it defaults to t-*, so the test suite's namespaces
# are left alone; set it empty to serve all).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
CACHE="${SANDBOX_OPERATOR_CACHE:-$HOME/.cache/sandbox-operator}"
STATE="${SANDBOX_OPERATOR_STATE:-$CACHE/state}"
LOCAL_KUBECONFIG="$STATE/kubeconfig"
PY="$ROOT/.venv/bin/python"
RELEASE="${RELEASE:-sandbox-operator}"
OPERATOR_NAMESPACE="${OPERATOR_NAMESPACE:-sandbox-operator-system}"
DEMO_NAMESPACE="${DEMO_NAMESPACE:-default}"
READY_TIMEOUT="${READY_TIMEOUT:-180s}"
LOCAL_FLOOR=hardened_container
LOGDIR="$STATE/up-logs/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$LOGDIR"

# --- step machinery ----------------------------------------------------------------------------
T0=$SECONDS
STEP_NO=0
TOTAL_STEPS=8
elapsed() { echo $((SECONDS - T0)); }
stamp() { printf '[%3dm%02ds]' $(( (SECONDS - T0) / 60 )) $(( (SECONDS - T0) % 60 )); }
note() { printf '%s           %s\n' "$(stamp)" "$*"; }
banner() { printf '%s   %s\n' "$(stamp)" "$*"; }
step_log() { echo "$LOGDIR/$1.log"; }
show_log() { sed 's/^/             | /' "$(step_log "$1")"; }
fail_now() { printf '%s FAILED: %s\n' "$(stamp)" "$*" >&2; exit 1; }
finish() { printf '%s %s\n' "$(stamp)" "$*"; }

# step TITLE NAME CMD...: run CMD with its output in NAME's log; stop everything if it fails.
step() {
  local title="$1" name="$2"; shift 2
  local log; log="$(step_log "$name")"
  STEP_NO=$((STEP_NO + 1))
  local started=$SECONDS
  printf '%s %d/%d  %s ...\n' "$(stamp)" "$STEP_NO" "$TOTAL_STEPS" "$title"
  # A subshell with errexit, run outside any `if`, so a failing command inside a step function
  # fails the step (errexit is ignored in an if-condition and everything it calls).
  local rc=0
  set +e
  (set -eo pipefail; "$@") </dev/null >"$log" 2>&1
  rc=$?
  set -e
  if ((rc == 0)); then
    printf '%s %d/%d  ok (%ds)\n' "$(stamp)" "$STEP_NO" "$TOTAL_STEPS" $((SECONDS - started))
  else
    printf '%s %d/%d  FAILED after %ds (exit %d): %s\n' "$(stamp)" "$STEP_NO" "$TOTAL_STEPS" \
      $((SECONDS - started)) "$rc" "$title" >&2
    printf '             log: %s (last lines below)\n' "$log" >&2
    tail -n 25 "$log" | sed 's/^/             | /' >&2
    exit "$rc"
  fi
}
skip() {
  STEP_NO=$((STEP_NO + 1))
  printf '%s %d/%d  %s (skipped)\n' "$(stamp)" "$STEP_NO" "$TOTAL_STEPS" "$1"
}

kubectl_path() {
  if [[ -n "${KUBECTL:-}" ]]; then echo "$KUBECTL"; return; fi
  local k8s_bin
  k8s_bin="$(bash "$ROOT/hack/build-binaries.sh" print-paths | sed -n 's/^K8S_BIN=//p')"
  if [[ -x "$k8s_bin/kubectl" ]]; then echo "$k8s_bin/kubectl"; return; fi
  command -v kubectl || fail_now "no kubectl: hack/cluster.py up builds one, or put one on PATH"
}
helm_path() {
  if [[ -n "${HELM:-}" ]]; then echo "$HELM"; return; fi
  local helm_bin
  helm_bin="$(bash "$ROOT/hack/build-binaries.sh" print-paths | sed -n 's/^HELM_BIN=//p')"
  if [[ ! -x "$helm_bin/helm" ]] && ! command -v helm >/dev/null; then
    bash "$ROOT/hack/build-binaries.sh" helm >"$LOGDIR/helm-build.log" 2>&1 \
      || fail_now "could not build helm (log: $LOGDIR/helm-build.log)"
  fi
  if [[ -x "$helm_bin/helm" ]]; then echo "$helm_bin/helm"; else command -v helm; fi
}
# load_archive REF TARBALL: put an OCI archive on the nodes of a cluster we did not start.
load_archive() {
  local ref="$1" tar="$2" ctx
  ctx="$("$KUBECTL" config current-context 2>/dev/null || true)"
  if [[ "$ctx" == kind-* ]] && command -v kind >/dev/null; then
    echo "kind load image-archive $tar --name ${ctx#kind-}  ($ref)"
    kind load image-archive "$tar" --name "${ctx#kind-}"
  else
    echo "cannot load $ref into the nodes of context '$ctx' from here: import $tar into each"
    echo "node's containerd (ctr -n k8s.io images import), or push it to a registry and set"
    echo "OPERATOR_IMAGE=<repository:tag>"
    return 1
  fi
}
fullname() { [[ "$RELEASE" == *sandbox-operator* ]] && echo "$RELEASE" || echo "$RELEASE-sandbox-operator"; }

[[ -x "$PY" ]] || { echo "no virtualenv at $ROOT/.venv: run 'make venv' (make up does)" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------
if [[ -n "${KUBECONFIG:-}" && "$(readlink -f "$KUBECONFIG")" != "$(readlink -f "$LOCAL_KUBECONFIG")" ]]; then
  MODE=external
  check_cluster() { "$(kubectl_path)" version && "$(kubectl_path)" get nodes -o wide; }
  step "cluster: using \$KUBECONFIG=$KUBECONFIG" cluster check_cluster
else
  MODE=local
  step "cluster: bring up the local cluster (hack/cluster.py up)" cluster \
    "$PY" hack/cluster.py up
  export KUBECONFIG="$LOCAL_KUBECONFIG"
  # `make test` runs next on this cluster and starts an operator of its own in each test
  # namespace (all named t-*): an operator serving those too would reconcile the tests' Sandboxes
  # (two operators, one object). So on the local cluster the release serves every namespace but
  # the test suite's, unless IGNORE_NAMESPACES says otherwise (IGNORE_NAMESPACES= , set and
  # empty, serves all of them).
  IGNORE_NAMESPACES="${IGNORE_NAMESPACES-t-*}"
fi
KUBECTL="$(kubectl_path)"; export KUBECTL
HELM="$(helm_path)"
note "kubectl: $KUBECTL"
note "helm:    $HELM"

# ---------------------------------------------------------------------------------------------
if [[ "$MODE" == local ]]; then
  step "sandbox images: busybox, python, pause into containerd" images "$PY" hack/cluster.py images
else
  load_sandbox_images() {
    local ref tar
    hack/images.sh build >"$LOGDIR/images-build.out"
    while read -r ref tar; do load_archive "$ref" "$tar"; done <"$LOGDIR/images-build.out"
  }
  step "sandbox images: build, then load into the cluster's nodes" images load_sandbox_images
fi

# ---------------------------------------------------------------------------------------------
IMAGE_KEY=""
if [[ -n "${OPERATOR_IMAGE:-}" ]]; then
  skip "operator image: using $OPERATOR_IMAGE (OPERATOR_IMAGE is set)" operator-image
  IMAGE_REPO="${OPERATOR_IMAGE%:*}"; IMAGE_TAG="${OPERATOR_IMAGE##*:}"
else
  if [[ "$MODE" == local ]]; then
    step "operator image: build from Debian packages + the wheel, import into containerd" \
      operator-image operator/build-image.sh import
  else
    load_operator_image() {
      local ref tar
      read -r ref tar < <(operator/build-image.sh build)
      load_archive "$ref" "$tar"
      echo "$ref $tar"
    }
    step "operator image: build from Debian packages + the wheel, load into the nodes" \
      operator-image load_operator_image
  fi
  read -r IMAGE_REF IMAGE_TAR < <(tail -n 1 "$(step_log operator-image)")
  IMAGE_REPO="${IMAGE_REF%:*}"; IMAGE_TAG="${IMAGE_REF##*:}"
  IMAGE_KEY="$(basename "$IMAGE_TAR" .tar)"; IMAGE_KEY="${IMAGE_KEY#operator-}"
  note "image:   $IMAGE_REF (content key $IMAGE_KEY)"
fi

# ---------------------------------------------------------------------------------------------
VALUES="$LOGDIR/local-values.yaml"
[[ -f examples/config-local.yaml ]] || fail_now "examples/config-local.yaml is missing"
"$PY" - examples/config-local.yaml "$VALUES" <<'PY'
import sys, yaml
config = yaml.safe_load(open(sys.argv[1]))
yaml.safe_dump({"config": config}, open(sys.argv[2], "w"), sort_keys=False)
PY
floor="$("$PY" -c 'import sys,yaml; print(yaml.safe_load(open(sys.argv[1]))["config"]["hostPolicy"]["minIsolation"])' "$VALUES")"
banner "NOTE: the chart's default isolation floor is microvm. This cluster has no microVM runtime,"
banner "      so this install lowers the floor to '$floor' (gVisor) with examples/config-local.yaml."
banner "      Do not do this on a cluster that serves untrusted code without meaning to."
[[ "$floor" == "$LOCAL_FLOOR" ]] || note "(examples/config-local.yaml says $floor, not $LOCAL_FLOOR)"
helm_args=(upgrade --install "$RELEASE" charts/sandbox-operator
  --namespace "$OPERATOR_NAMESPACE" --create-namespace --take-ownership
  --values "$VALUES" --set "image.repository=$IMAGE_REPO" --set "image.tag=$IMAGE_TAG"
  --wait --timeout 5m)
# The egress proxy the operator runs for allowlisted sandboxes is the operator image just installed.
helm_args+=(--set "config.egressProxy.image=$IMAGE_REPO:$IMAGE_TAG")
if [[ -n "${WATCH_NAMESPACES:-}" ]]; then
  note "the operator serves only: $WATCH_NAMESPACES (WATCH_NAMESPACES)"
  helm_args+=(--set "watchNamespaces={$WATCH_NAMESPACES}")
elif [[ -n "${IGNORE_NAMESPACES:-}" ]]; then
  # Serving a pattern, kopf's peering would want an object in every namespace: one replica,
  # standalone.
  note "the operator serves every namespace except: $IGNORE_NAMESPACES (IGNORE_NAMESPACES)"
  helm_args+=(--set "ignoreNamespaces={$IGNORE_NAMESPACES}" --set peering.enabled=false)
fi
# A rebuilt image under the same tag rolls the operator pods.
[[ -z "$IMAGE_KEY" ]] || helm_args+=(--set-string "podAnnotations.sandbox-operator\.dev/image-key=$IMAGE_KEY")
# The ports router (docs/ports.md), from the same image, with its NetworkPolicy in the demo
# namespace (serving every namespace, the chart cannot know where sandboxes are). ROUTER=0 leaves
# it out. Its Service's ClusterIP is reachable from this machine (kube-proxy), as docs/ports.md's
# example uses it.
if [[ "${ROUTER:-1}" != 0 ]]; then
  helm_args+=(--set router.enabled=true --set "router.sandboxNamespaces={$DEMO_NAMESPACE}")
  [[ -z "$IMAGE_KEY" ]] || helm_args+=(--set-string "router.podAnnotations.sandbox-operator\.dev/image-key=$IMAGE_KEY")
fi
install_chart() {
  # A release whose last operation failed or never finished cannot be upgraded: remove it first
  # (the CRDs and any Sandboxes are kept).
  local status
  status="$("$HELM" status "$RELEASE" -n "$OPERATOR_NAMESPACE" -o json 2>/dev/null \
    | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["info"]["status"])' 2>/dev/null || true)"
  if [[ "$status" == failed || "$status" == pending-* ]]; then
    echo "release $RELEASE is '$status': uninstalling it before installing again"
    "$HELM" uninstall "$RELEASE" -n "$OPERATOR_NAMESPACE" --wait
  fi
  if "$HELM" "${helm_args[@]}"; then return 0; fi
  echo "--- operator pods and their recent events:"
  "$KUBECTL" -n "$OPERATOR_NAMESPACE" get pods -o wide || true
  "$KUBECTL" -n "$OPERATOR_NAMESPACE" get events --sort-by=.lastTimestamp | tail -n 8 || true
  echo "--- operator logs (last 20 lines, health probes left out):"
  "$KUBECTL" -n "$OPERATOR_NAMESPACE" logs "deployment/$(fullname)" --tail=400 \
    | grep -v -e aiohttp.access -e "Activity 'backends'" | tail -n 20 || true
  return 1
}
step "install the chart (release $RELEASE in $OPERATOR_NAMESPACE, floor $floor)" chart install_chart

# ---------------------------------------------------------------------------------------------
for f in examples/sandboxscope.yaml examples/sandbox.yaml; do
  [[ -f "$f" ]] || fail_now "$f is missing"
done
SANDBOX="$("$PY" -c 'import sys,yaml; print(yaml.safe_load(open(sys.argv[1]))["metadata"]["name"])' examples/sandbox.yaml)"
apply_examples() {
  # A Sandbox left by an earlier run may have ended (failed, expired): start from a fresh one.
  "$KUBECTL" -n "$DEMO_NAMESPACE" delete --ignore-not-found --wait --timeout=90s \
    -f examples/sandbox.yaml
  "$KUBECTL" -n "$DEMO_NAMESPACE" apply -f examples/sandboxscope.yaml -f examples/sandbox.yaml
}
step "apply examples/sandboxscope.yaml and examples/sandbox.yaml (namespace $DEMO_NAMESPACE)" \
  examples apply_examples

# ---------------------------------------------------------------------------------------------
# The resource by its full name: "sandbox" alone is ambiguous on a cluster that also has
# kubernetes-sigs/agent-sandbox's CRD (sandboxes.agents.x-k8s.io), and kubectl picks theirs.
SANDBOXES="sandboxes.sandbox-operator.dev"
wait_ready() {
  if "$KUBECTL" -n "$DEMO_NAMESPACE" wait --for=condition=Ready "$SANDBOXES/$SANDBOX" \
      --timeout="$READY_TIMEOUT"; then
    return 0
  fi
  # Most telling last, where the failure summary shows the log's tail.
  echo "--- operator logs (last 30 lines, health probes left out):"
  "$KUBECTL" -n "$OPERATOR_NAMESPACE" logs "deployment/$(fullname)" --tail=400 \
    | grep -v -e aiohttp.access -e "Activity 'backends'" | tail -n 30 || true
  echo "--- the sandbox's pod:"
  "$KUBECTL" -n "$DEMO_NAMESPACE" get pods -l "sandbox-operator.dev/sandbox=$SANDBOX" -o wide || true
  echo "--- the Sandbox's conditions:"
  "$KUBECTL" -n "$DEMO_NAMESPACE" get "$SANDBOXES" "$SANDBOX" \
    -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}' || true
  return 1
}
step "wait for sandbox/$SANDBOX to be Ready (timeout $READY_TIMEOUT)" ready wait_ready

# ---------------------------------------------------------------------------------------------
run_in_sandbox() {
  local pod
  pod="$("$KUBECTL" -n "$DEMO_NAMESPACE" get pods -l "sandbox-operator.dev/sandbox=$SANDBOX" \
    -o jsonpath='{.items[0].metadata.name}')"
  [[ -n "$pod" ]] || { echo "no pod labelled sandbox-operator.dev/sandbox=$SANDBOX"; return 1; }
  echo "+ kubectl -n $DEMO_NAMESPACE exec $pod -- python3 -c ..."
  "$KUBECTL" -n "$DEMO_NAMESPACE" exec "$pod" -- python3 -c '
import os, platform
print(f"hello from sandbox pod {platform.node()}: python {platform.python_version()}, "
      f"uid {os.getuid()}, kernel {platform.release()}")
print("work dir:", os.getcwd(), "writable:", os.access(os.getcwd(), os.W_OK))'
}
step "run a command inside the sandbox (kubectl exec)" exec run_in_sandbox
show_log exec
note "(the host's kernel is $(uname -r); a different one above is gVisor's)"

# ---------------------------------------------------------------------------------------------
step "kubectl get sbx -o wide" get "$KUBECTL" -n "$DEMO_NAMESPACE" get sbx -o wide
show_log get

finish "make up: done in $(elapsed)s. KUBECONFIG=$KUBECONFIG; undo with 'make down'."
