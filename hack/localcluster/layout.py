"""Where the local cluster lives: its state directory and the files in it, its ports, its
addresses, and the images and RuntimeClasses it offers.

One module for all of them, read by every other, so that two environment variables move a whole
cluster: $SANDBOX_OPERATOR_STATE (where everything it writes goes) and
$SANDBOX_OPERATOR_PORT_OFFSET (every port shifted: a second cluster beside the first).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
HACK = REPO / "hack"
CACHE = Path(os.environ.get("SANDBOX_OPERATOR_CACHE", Path.home() / ".cache/sandbox-operator"))
STATE = Path(os.environ.get("SANDBOX_OPERATOR_STATE", CACHE / "state"))
LOGS = STATE / "logs"
PIDS = STATE / "pids"
PKI = STATE / "pki"
KUBECONFIG = STATE / "kubeconfig"
CONTAINERD_DIR = STATE / "containerd"
CONTAINERD_SOCK = CONTAINERD_DIR / "containerd.sock"

NODE_NAME = "sandbox-operator-node"
# SANDBOX_OPERATOR_PORT_OFFSET shifts every port: a second, api-level cluster beside the first
# (with its own SANDBOX_OPERATOR_STATE), e.g. to try `up --clean` without touching the first.
_PORT_OFFSET = int(os.environ.get("SANDBOX_OPERATOR_PORT_OFFSET", "0"))
ETCD_CLIENT_PORT = 2379 + _PORT_OFFSET
ETCD_PEER_PORT = 2380 + _PORT_OFFSET
APISERVER_PORT = 6443 + _PORT_OFFSET
KCM_PORT = 10257 + _PORT_OFFSET
SCHEDULER_PORT = 10259 + _PORT_OFFSET
KUBELET_PORT = 10250 + _PORT_OFFSET
KUBELET_HEALTHZ_PORT = 10248 + _PORT_OFFSET
KUBE_PROXY_METRICS_PORT = 10249 + _PORT_OFFSET
KUBE_PROXY_HEALTHZ_PORT = 10256 + _PORT_OFFSET
KWOK_PORT = 10262 + _PORT_OFFSET  # kwok's server (healthz, metrics); `kwok up` only
LOCAL_PATH_PORT = 10265 + _PORT_OFFSET  # the volume provisioner's /healthz
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
POD_SUBNET = "10.244.0.0/24"
CLUSTER_CIDR = "10.244.0.0/16"
BRIDGE = "sbxop0"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"

IMAGES = {
    "pause": "sandbox-operator.dev/pause:1",
    "busybox": "sandbox-operator.dev/busybox:1",
    "python": "sandbox-operator.dev/python:1",
}
RUNTIME_CLASSES = {"runc": "runc", "gvisor": "runsc"}

# NetworkPolicy enforcement: kube-router's policy controller (hack/build-netpol.sh,
# docs/local-networkpolicy.md).
NETPOL = HACK / "build-netpol.sh"
# Volumes: hack/local_path_provisioner.py serves StorageClass `sandbox-local` (the cluster's
# default class): a directory under STATE/local-path for each claim, a hostPath PersistentVolume
# of it on the one node, both deleted with the claim (docs/cluster.md, "Volumes").
LOCAL_PATH = HACK / "local_path_provisioner.py"
LOCAL_PATH_ROOT = STATE / "local-path"
LOCAL_PATH_PROVISIONER = "sandbox-operator.dev/local-path"
STORAGE_CLASS = "sandbox-local"
