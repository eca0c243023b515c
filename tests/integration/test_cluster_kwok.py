"""`hack/cluster.py kwok up`: fake nodes that play pods Pending -> Running/Ready, and away once
deleted, for scale tests (docs/cluster.md, "Fake nodes: kwok"). Nothing runs on them.

The ``kwok_nodes`` fixture (tests/fixtures/cluster.py) brings kwok up with one fake node when it
is not up already (the first time on a machine that builds kwok: a few minutes) and takes it
down at the end of the session only if it started it. No kubelet is needed: the integration
tier's cluster (level api) has none."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.fixtures.cluster import CLUSTER_PY, LOCAL_STATE

# exclusive: brings kwok fake nodes up and down (run alone, after the concurrent part).
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.exclusive]

BUSYBOX = "sandbox-operator.dev/busybox:1"


def _cluster_py(*args: str, timeout: float = 1800) -> str:
    proc = subprocess.run(
        [sys.executable, str(CLUSTER_PY), *args], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"hack/cluster.py {' '.join(args)}:\n{proc.stdout}{proc.stderr}"
    return proc.stdout


def _pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **spec.pop("metadata", {})},
        "spec": {
            "containers": [
                {"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never", "command": ["true"]}
            ],
            **spec,
        },
    }


def _wait(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout:.0f}s")


def _read(core: client.CoreV1Api, ns: str, name: str) -> client.V1Pod | None:
    try:
        pod: client.V1Pod = core.read_namespaced_pod(name, ns)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return pod


def _ready(pod: client.V1Pod | None) -> bool:
    conds = {c.type: c.status for c in (pod.status.conditions or [])} if pod else {}
    return bool(pod) and pod.status.phase == "Running" and conds.get("Ready") == "True"


def test_pod_of_runtime_class_kwok_runs_on_a_fake_node(
    kwok_nodes: list[str], core_v1: client.CoreV1Api, namespace: str
) -> None:
    assert kwok_nodes, "no fake node Ready"
    core_v1.create_namespaced_pod(namespace, _pod("on-kwok", runtimeClassName="kwok"))
    _wait("pod Running and Ready", lambda: _ready(_read(core_v1, namespace, "on-kwok")))
    pod = _read(core_v1, namespace, "on-kwok")
    assert pod is not None
    assert pod.spec.node_name in kwok_nodes
    # The RuntimeClass's scheduling section was merged in by the RuntimeClass admission plugin.
    assert pod.spec.node_selector == {"type": "kwok"}
    assert any(t.key == "kwok.x-k8s.io/node" for t in pod.spec.tolerations or [])
    assert pod.status.pod_ip and pod.status.pod_ip.startswith("10.245.")
    assert pod.status.container_statuses[0].ready


def test_deleted_pod_is_gone_at_once(
    kwok_nodes: list[str], core_v1: client.CoreV1Api, namespace: str
) -> None:
    core_v1.create_namespaced_pod(namespace, _pod("graceful", runtimeClassName="kwok"))
    _wait("pod Ready", lambda: _ready(_read(core_v1, namespace, "graceful")))
    started = time.monotonic()
    core_v1.delete_namespaced_pod("graceful", namespace, grace_period_seconds=30)
    _wait("pod gone", lambda: _read(core_v1, namespace, "graceful") is None, timeout=15)
    assert time.monotonic() - started < 15  # not after the 30 s grace period


def test_pod_with_a_finalizer_waits_for_it(
    kwok_nodes: list[str], core_v1: client.CoreV1Api, namespace: str
) -> None:
    finalizer = "sandbox-operator.dev/test-hold"
    body = _pod("held", runtimeClassName="kwok", metadata={"finalizers": [finalizer]})
    core_v1.create_namespaced_pod(namespace, body)
    try:
        _wait("pod Ready", lambda: _ready(_read(core_v1, namespace, "held")))
        core_v1.delete_namespaced_pod("held", namespace)
        time.sleep(3)
        pod = _read(core_v1, namespace, "held")
        assert pod is not None and pod.metadata.deletion_timestamp is not None
    finally:
        core_v1.patch_namespaced_pod("held", namespace, {"metadata": {"finalizers": None}})
    _wait(
        "pod gone once its finalizer is removed", lambda: _read(core_v1, namespace, "held") is None
    )


def test_fake_nodes_take_no_pod_that_does_not_tolerate_them(
    kwok_nodes: list[str], core_v1: client.CoreV1Api, namespace: str
) -> None:
    core_v1.create_namespaced_pod(namespace, _pod("untolerated", nodeSelector={"type": "kwok"}))

    def unschedulable() -> bool:
        pod = _read(core_v1, namespace, "untolerated")
        conds = {c.type: c for c in (pod.status.conditions or [])} if pod else {}
        cond = conds.get("PodScheduled")
        return cond is not None and cond.status == "False" and cond.reason == "Unschedulable"

    _wait("pod reported Unschedulable", unschedulable)


def test_status_reports_kwok(kwok_nodes: list[str], cluster_is_local: bool) -> None:
    if not cluster_is_local:
        pytest.skip("the local cluster's status")
    out = subprocess.run(
        [sys.executable, str(CLUSTER_PY), "status"], capture_output=True, text=True, timeout=60
    ).stdout
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert "healthy" in lines["kwok"], out
    assert all(name in out for name in kwok_nodes), out


def test_restarted_kwok_takes_its_nodes_over_at_once(
    kwok_nodes: list[str], core_v1: client.CoreV1Api, namespace: str, cluster_is_local: bool
) -> None:
    """kwok holds each node through a Lease under a per-process identity: `kwok up` after a
    crash releases the dead one's Leases, so pods do not wait ~50 s for them to expire."""
    if not cluster_is_local:
        pytest.skip("restarts the local cluster's kwok")
    record = json.loads((LOCAL_STATE / "pids" / "kwok.json").read_text())
    os.kill(int(record["pid"]), signal.SIGKILL)
    time.sleep(1)
    _cluster_py("kwok", "up", "--nodes", str(len(kwok_nodes)), timeout=300)
    core_v1.create_namespaced_pod(namespace, _pod("after-restart", runtimeClassName="kwok"))
    _wait("pod Ready", lambda: _ready(_read(core_v1, namespace, "after-restart")), timeout=10)
