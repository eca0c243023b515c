"""Fake nodes for scale tests: kwok (hack/build-kwok.sh; docs/cluster.md, "Fake nodes: kwok").

`kwok up` runs kwok's controller as one more supervised process and creates Node objects it
plays: leases and Ready status for the nodes, Pending -> Running/Ready for pods bound to them,
and their removal once deleted. Nothing runs on a fake node; it is not a runtime. The builders
of kwok's objects and configuration are pure (tested without a cluster)."""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

from .layout import HACK, KUBECONFIG, KWOK_PORT, LOGS, PIDS, STATE
from .probes import alive_api, api, kwok_healthy
from .steps import StepFailed, run, say, step, write_file
from .supervise import Proc, pid_alive, read_pidfile, start, stop_record, wait_for

KWOK = HACK / "build-kwok.sh"
KWOK_DIR = STATE / "kwok"
# kwok manages the nodes that carry this annotation (and only those: never the real node).
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
# Labels and taint of the fake nodes; the RuntimeClass `kwok` steers pods onto them.
KWOK_NODE_LABELS = {"type": "kwok", "sandbox-operator.dev/cluster": "local"}
KWOK_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
KWOK_RUNTIME_CLASS = "kwok"
# Named to list after the real node ("sandbox-operator-node" < "sbxop-kwok-0"): code that takes
# the first node of `kubectl get nodes` keeps getting the real one.
KWOK_NODE_PREFIX = "sbxop-kwok-"
# Generous: 10,000 pods over 3 nodes fit with room to spare (pods, and 10m CPU / 16Mi each).
KWOK_ALLOCATABLE = {"cpu": "256", "memory": "1Ti", "pods": "110000", "ephemeral-storage": "10Ti"}
# Addresses nobody routes (198.18.0.0/15, benchmarking): pod IPs from their own range, node
# addresses of their own. Never the real node's address: kube-router treats every pod whose
# hostIP is its node's address as local and would write firewall chains for each fake pod.
KWOK_POD_CIDR = "10.245.0.0/16"
KWOK_NODE_IP_BASE = "198.18.0."

# Stages (kwok's lifecycle rules). The upstream ones come with the build (node-initialize,
# node-heartbeat-with-lease, pod-ready, pod-complete, from kwok's "fast" sets); the deletion
# Stage is ours: a deleted pod without finalizers is removed at once (kwok deletes it with grace
# 0, whatever grace the deleter asked for), one with finalizers waits for them like on a kubelet.
KWOK_POD_DELETE_STAGE = """apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
    - key: '.metadata.finalizers'
      operator: 'DoesNotExist'
  next:
    delete: true
"""
# A KwokConfiguration in the config file is taken as it is: kwok applies its defaults only when
# there is none, so every option it needs is spelled out (a zero parallelism is refused).
KWOK_OPTIONS = {
    "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
    "kind": "KwokConfiguration",
    "options": {
        "cidr": KWOK_POD_CIDR,
        # kwok renews a Lease per node (the node controller's heartbeat), like a kubelet.
        "nodeLeaseDurationSeconds": 40,
        "nodeLeaseParallelism": 4,
        # Status patches in flight at once (default 4): thousands of pods become Ready in step
        # with the scheduler instead of queueing behind kwok.
        "podPlayStageParallelism": 16,
        "nodePlayStageParallelism": 4,
        "podsOnNodeSyncParallelism": 2,
        "enablePodsOnNodeSyncListPager": True,
        "enablePodsOnNodeSyncStreamWatch": False,
        "enableDebuggingHandlers": False,
        "enableProfilingHandler": False,
        "enableContentionProfiling": False,
    },
}


def kwok_paths() -> tuple[Path, Path]:
    """(kwok binary, directory of the upstream Stage files), from hack/build-kwok.sh."""
    binary = Path(run(["bash", str(KWOK), "print-path"]).strip())
    stages = Path(run(["bash", str(KWOK), "print-stages"]).strip())
    return binary, stages


def build_kwok() -> tuple[Path, Path]:
    binary, stages = kwok_paths()
    if binary.is_file() and os.access(binary, os.X_OK) and any(stages.glob("*.yaml")):
        return binary, stages
    log = LOGS / "build-kwok.log"
    with step(f"build kwok from the Go module proxy (log {log})", log):
        if shutil.which("go") is None:
            raise StepFailed("build kwok", "`go` is not on PATH", log)
        run(["bash", str(KWOK), "build"], log=log)
    return binary, stages


def kwok_config_text(stages: Path) -> str:
    """kwok's --config: its options and the Stages, as one multi-document YAML file."""
    docs = [json.dumps(KWOK_OPTIONS, indent=2)]
    docs += [p.read_text().strip() for p in sorted(stages.glob("*.yaml"))]
    docs.append(KWOK_POD_DELETE_STAGE.strip())
    return "\n---\n".join(docs) + "\n"


def kwok_proc(binary: Path, config: Path) -> Proc:
    key, value = KWOK_ANNOTATION
    return Proc(
        "kwok",
        [
            str(binary),
            f"--kubeconfig={KUBECONFIG}",
            f"--config={config}",
            f"--manage-nodes-with-annotation-selector={key}={value}",
            f"--server-address=127.0.0.1:{KWOK_PORT}",
            # INFO logs every node and pod patch: thousands of lines per scale run.
            "--v=WARN",
        ],
        kwok_healthy,
        # kwok reads HOME for its default config (~/.kwok/kwok.yaml): point it at its own dir.
        env={"HOME": str(KWOK_DIR)},
        inputs=(config,),
    )


def kwok_node_name(index: int) -> str:
    return f"{KWOK_NODE_PREFIX}{index}"


def kwok_node(index: int) -> dict[str, Any]:
    """A fake Node: annotated for kwok, labelled `type=kwok`, tainted so that only pods that
    tolerate the taint (the `kwok` RuntimeClass adds the toleration) land on it."""
    name = kwok_node_name(index)
    key, value = KWOK_ANNOTATION
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {key: value, "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                **KWOK_NODE_LABELS,
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node-role.kubernetes.io/agent": "",
            },
        },
        "spec": {"taints": [dict(KWOK_TAINT)]},
        "status": {
            "allocatable": dict(KWOK_ALLOCATABLE),
            "capacity": dict(KWOK_ALLOCATABLE),
            "addresses": [
                {"type": "InternalIP", "address": f"{KWOK_NODE_IP_BASE}{10 + index}"},
                {"type": "Hostname", "address": name},
            ],
        },
    }


def kwok_runtime_class() -> dict[str, Any]:
    """RuntimeClass `kwok`: its scheduling section sends a pod that names it to the fake nodes
    (node selector) and lets it past their taint. The handler is never run: no kubelet serves
    those nodes."""
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {
            "name": KWOK_RUNTIME_CLASS,
            "labels": {"sandbox-operator.dev/cluster": "local"},
        },
        "handler": "runc",
        "scheduling": {
            "nodeSelector": {"type": KWOK_NODE_LABELS["type"]},
            "tolerations": [
                {
                    "key": KWOK_TAINT["key"],
                    "operator": "Equal",
                    "value": KWOK_TAINT["value"],
                    "effect": KWOK_TAINT["effect"],
                }
            ],
        },
    }


def kwok_nodes() -> list[str]:
    """Names of the fake nodes that exist (label `type=kwok` and the name prefix)."""
    code, obj = api("GET", f"/api/v1/nodes?labelSelector=type%3D{KWOK_NODE_LABELS['type']}")
    if code != 200:
        raise StepFailed("kwok nodes", f"listing nodes: HTTP {code} {obj}")
    names = [i["metadata"]["name"] for i in obj.get("items", [])]
    return sorted(n for n in names if n.startswith(KWOK_NODE_PREFIX))


def ensure_kwok_objects(nodes: int) -> None:
    """Exactly `nodes` fake nodes (extra ones deleted) and the `kwok` RuntimeClass."""
    want = {kwok_node_name(i): i for i in range(nodes)}
    have = set(kwok_nodes())
    for name in sorted(have - set(want)):
        api("DELETE", f"/api/v1/nodes/{name}")
        say(f"fake node {name} deleted")
    for name, index in want.items():
        if name in have:
            continue
        code, obj = api("POST", "/api/v1/nodes", kwok_node(index))
        if code not in (200, 201, 409):
            raise StepFailed("kwok nodes", f"creating {name}: HTTP {code} {obj}")
    body = kwok_runtime_class()
    path = f"/apis/node.k8s.io/v1/runtimeclasses/{KWOK_RUNTIME_CLASS}"
    code, obj = api("GET", path)
    if code == 200 and (obj.get("handler"), obj.get("scheduling")) != (
        body["handler"],
        body["scheduling"],
    ):
        api("DELETE", path)  # handler and scheduling are immutable
        code = 404
    if code != 200:
        code, obj = api("POST", "/apis/node.k8s.io/v1/runtimeclasses", body)
        if code not in (200, 201, 409):
            raise StepFailed("kwok runtime class", f"HTTP {code} {obj}")


def wait_kwok_nodes_ready(nodes: int, since: float, timeout: float = 60) -> None:
    """`nodes` fake nodes Ready, each held by this kwok (its Lease renewed since `since`)."""

    def held(name: str) -> bool:
        code, lease = api("GET", kwok_lease_path(name))
        renewed = (lease.get("spec") or {}).get("renewTime") if code == 200 else None
        when = datetime.fromisoformat(renewed.replace("Z", "+00:00")) if renewed else None
        return when is not None and when.timestamp() >= since - 1

    def ready() -> bool:
        code, obj = api("GET", f"/api/v1/nodes?labelSelector=type%3D{KWOK_NODE_LABELS['type']}")
        count = 0
        for node in obj.get("items", []) if code == 200 else []:
            conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
            count += conds.get("Ready") == "True" and held(node["metadata"]["name"])
        return count >= nodes

    wait_for(f"{nodes} fake node(s) Ready and held by kwok", ready, timeout, LOGS / "kwok.log")


def kwok_lease_path(node: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}"


def release_kwok_leases() -> None:
    """Delete the fake nodes' Leases (with no kwok running). kwok holds each node through its
    Lease under a per-process identity: a new kwok would otherwise leave the nodes, and every
    pod bound to them, alone until the old Leases expire (40 s) and its next try (~10 s)."""
    for name in kwok_nodes():
        api("DELETE", kwok_lease_path(name))


def kwok_up(nodes: int) -> None:
    """Start kwok (restarted when its configuration changed; the old one's Leases released
    first), make exactly `nodes` fake nodes and the `kwok` RuntimeClass, wait until kwok holds
    them. The caller holds the state lock."""
    if not alive_api():
        raise StepFailed(
            "kwok up", "the cluster's API server is not running: `hack/cluster.py up` first"
        )
    if not (PIDS / "kube-scheduler.json").exists():
        say("note: no kube-scheduler runs (a cluster brought up by an older hack/cluster.py: "
            "`up` again starts it): pods are bound to fake nodes only if they name "
            "spec.nodeName")  # fmt: skip
    binary, stages = build_kwok()
    KWOK_DIR.mkdir(parents=True, exist_ok=True)
    config = KWOK_DIR / "kwok.yaml"
    write_file(config, kwok_config_text(stages))
    proc = kwok_proc(binary, config)
    record = read_pidfile(proc.pidfile)
    running = bool(record and pid_alive(record))
    if record and running and record.get("fingerprint") != proc.fingerprint:
        say(f"kwok: configuration changed, restarting pid {record['pid']}")
        stop_record("kwok", record)
        running = False
    if not running:
        release_kwok_leases()
    start(proc)
    started = float((read_pidfile(proc.pidfile) or {}).get("started", 0))
    with step(f"kwok: {nodes} fake node(s) {KWOK_NODE_PREFIX}*, RuntimeClass kwok"):
        ensure_kwok_objects(nodes)
        wait_kwok_nodes_ready(nodes, started)


def kwok_down(quiet: bool = False) -> None:
    """Delete the fake nodes and the `kwok` RuntimeClass (when the API server answers), then
    stop kwok. Pods left on a deleted node are removed by the controller-manager's pod GC."""
    if alive_api():
        for name in kwok_nodes():
            api("DELETE", f"/api/v1/nodes/{name}")
            say(f"fake node {name} deleted")
        code, _ = api("DELETE", f"/apis/node.k8s.io/v1/runtimeclasses/{KWOK_RUNTIME_CLASS}")
        if code == 200:
            say(f"RuntimeClass {KWOK_RUNTIME_CLASS} deleted")
    elif not quiet:
        say("the API server does not answer: fake nodes and RuntimeClass left as they are")
    record = read_pidfile(PIDS / "kwok.json")
    if record:
        stop_record("kwok", record)
        (PIDS / "kwok.json").unlink(missing_ok=True)
