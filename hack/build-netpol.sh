#!/usr/bin/env bash
# Build kube-router (used only for its NetworkPolicy controller) from its Go module and cache it by
# version; make sure the `ipset` tool it drives is installed.
#
# Why kube-router: the local cluster's bridge CNI has no policy engine, so NetworkPolicies would be
# accepted and ignored. kube-router's network-policy controller is a maintained, CNI-agnostic
# implementation that runs as one host process (iptables + ipset, both available here) next to the
# kubelet. See docs/local-networkpolicy.md.
#
# Usage: hack/build-netpol.sh [build|print-path|print-command NODE KUBECONFIG|cleanup]
#   build          (default) build into $CACHE/bin/kube-router-$KUBE_ROUTER_VERSION/kube-router
#   print-path     print that binary's path
#   print-command  print the command line that runs the policy controller for NODE
#   cleanup        remove the controller's iptables rules and ipsets (run with it stopped)
set -euo pipefail

# v2.1.0 is the only v2 version the Go module proxy serves (later tags are not published as
# module versions). It runs only in the local test cluster.
KUBE_ROUTER_VERSION="${KUBE_ROUTER_VERSION:-v2.1.0}"
CACHE="${SANDBOX_OPERATOR_CACHE:-$HOME/.cache/sandbox-operator}"
BIN="$CACHE/bin/kube-router-$KUBE_ROUTER_VERSION"
MODULE="github.com/cloudnativelabs/kube-router/v2"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export CGO_ENABLED="${CGO_ENABLED:-0}"

log() { printf '[build-netpol %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

ensure_tools() {
  # kube-router shells out to ipset, iptables-save/-restore (the Debian iptables package is the
  # nf_tables flavour; the kernel here has NFT_COMPAT, IP_SET and XT_SET).
  local missing=()
  command -v ipset >/dev/null || missing+=(ipset)
  command -v iptables-restore >/dev/null || missing+=(iptables)
  if (( ${#missing[@]} )); then
    log "installing Debian packages: ${missing[*]}"
    if [[ ! -d /var/lib/apt/lists/partial ]] || [[ -z "$(ls -A /var/lib/apt/lists 2>/dev/null)" ]]; then
      apt-get update -qq
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; }
  fi
}

build() {
  ensure_tools
  if [[ -x "$BIN/kube-router" ]]; then log "kube-router $KUBE_ROUTER_VERSION cached in $BIN"; return; fi
  log "building kube-router $KUBE_ROUTER_VERSION (a few minutes on 2 cores)"
  local date; date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  rm -rf "$BIN.tmp"; mkdir -p "$BIN.tmp"
  GOBIN="$BIN.tmp" go install -trimpath \
    -ldflags "-s -w -X $MODULE/pkg/version.Version=$KUBE_ROUTER_VERSION -X $MODULE/pkg/version.BuildDate=$date" \
    "$MODULE/cmd/kube-router@$KUBE_ROUTER_VERSION"
  rm -rf "$BIN"; mv "$BIN.tmp" "$BIN"
  log "kube-router built into $BIN"
}

# The controller alone: no routing (the bridge CNI routes), no service proxy, no CNI config.
# kube-router lets every pod reach the Service range and the node-port range *on the node's own
# addresses* even under a deny-all egress policy (seen: a closed pod reached 192.0.2.2:30080 with
# the default 30000-32767). The exemption is narrowed to the smallest range kube-router accepts
# (two ports, 30000-30001), which nothing in this project allocates. Service IPs are translated by
# kube-proxy before the filter table sees them, so a policy judges the real pod/node destination;
# hack/cluster.py rejects untranslated ones.
print_command() {
  local node="${1:?node name}" kubeconfig="${2:?kubeconfig}"
  printf '%s\n' "$BIN/kube-router" \
    --run-router=false --run-firewall=true --run-service-proxy=false --run-loadbalancer=false \
    --enable-cni=false --enable-ipv4=true --enable-ipv6=false \
    "--kubeconfig=$kubeconfig" "--hostname-override=$node" \
    "--service-cluster-ip-range=${SERVICE_CIDR:-10.96.0.0/16}" \
    "--service-node-port-range=${NODE_PORT_RANGE:-30000-30001}" \
    --iptables-sync-period=1m --health-port=0 --metrics-port=0 --v=1
}

# Remove what the policy controller left in the host's filter table and ipsets. kube-router
# leaves its rules in place when it stops, and on start it does not remove top-level rules it
# wrote with other flags; v2.1.0's own `--cleanup-config` removes none of the netpol rules and
# then crashes in the service-proxy cleanup, so this does it by name: the jumps from
# INPUT/FORWARD/OUTPUT, the KUBE-ROUTER-*, KUBE-POD-FW-* and KUBE-NWPLCY-* chains, and the
# KUBE-SRC-*/KUBE-DST-* ipsets. Run it with kube-router stopped, before each start and on teardown.
cleanup() {
  local fam builtin rule chains c
  for fam in iptables ip6tables; do
    command -v "$fam" >/dev/null || continue
    for builtin in INPUT FORWARD OUTPUT; do
      while IFS= read -r rule; do
        eval "$fam -D ${rule#-A }"
      done < <("$fam" -S "$builtin" 2>/dev/null | grep -E -- '-j KUBE-ROUTER-(INPUT|FORWARD|OUTPUT)( |$)' || true)
    done
    chains="$("$fam" -S 2>/dev/null | awk '/^-N (KUBE-ROUTER-|KUBE-POD-FW-|KUBE-NWPLCY-)/ {print $2}' || true)"
    for c in $chains; do "$fam" -F "$c"; done
    for c in $chains; do "$fam" -X "$c"; done
  done
  if command -v ipset >/dev/null; then
    for c in $(ipset list -n 2>/dev/null | grep -E '^(inet6:)?KUBE-(SRC|DST)-' || true); do
      ipset destroy "$c"
    done
  fi
  log "kube-router network-policy rules and ipsets removed"
}

case "${1:-build}" in
  build) build ;;
  print-path) printf '%s\n' "$BIN/kube-router" ;;
  print-command) shift; print_command "$@" | paste -sd' ' ;;
  cleanup) cleanup ;;
  *) echo "usage: $0 [build|print-path|print-command NODE KUBECONFIG|cleanup]" >&2; exit 2 ;;
esac
