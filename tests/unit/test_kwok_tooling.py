"""The kwok tooling without a cluster: what `hack/cluster.py kwok up` creates and runs, and the
pure parts of benchmarks/scale.py (metrics parsing, percentiles, the bare-pod copy)."""

from __future__ import annotations

import importlib.util
import ipaddress
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cluster() -> ModuleType:
    return _load("hack_cluster_for_tests", ROOT / "hack" / "cluster.py")


@pytest.fixture(scope="module")
def scale() -> ModuleType:
    return _load("bench_scale_for_tests", ROOT / "benchmarks" / "scale.py")


def _tolerates(toleration: dict[str, Any], taint: dict[str, str]) -> bool:
    if toleration.get("effect") not in (None, "", taint["effect"]):
        return False
    if toleration.get("operator") == "Exists":
        return toleration.get("key") in (None, "", taint["key"])
    return toleration.get("key") == taint["key"] and toleration.get("value") == taint["value"]


def test_fake_node_is_kwoks_tainted_and_big_enough(cluster: ModuleType) -> None:
    node = cluster.kwok_node(0)
    meta, spec, status = node["metadata"], node["spec"], node["status"]
    assert meta["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert meta["labels"]["type"] == "kwok"
    assert spec["taints"] == [
        {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
    ]
    # 10,000 pods over 3 nodes, 10m CPU and 16Mi each, fit.
    alloc = status["allocatable"]
    assert 3 * int(alloc["pods"]) >= 10_000
    assert 3 * int(alloc["cpu"]) >= 10_000 * 0.010
    assert alloc["memory"].endswith("Ti")


def test_fake_nodes_list_after_the_real_one_and_have_addresses_of_their_own(
    cluster: ModuleType,
) -> None:
    names = [cluster.kwok_node_name(i) for i in range(12)]
    assert all(name > cluster.NODE_NAME for name in names)  # `get nodes` lists the real one first
    addrs = {
        a["address"]
        for i in range(12)
        for a in cluster.kwok_node(i)["status"]["addresses"]
        if a["type"] == "InternalIP"
    }
    assert len(addrs) == 12
    for addr in addrs:  # never the real node's: kube-router would take their pods for local
        assert ipaddress.ip_address(addr) in ipaddress.ip_network("198.18.0.0/15")
    assert not ipaddress.ip_network(cluster.KWOK_POD_CIDR).overlaps(
        ipaddress.ip_network(cluster.POD_SUBNET)
    )


def test_runtime_class_steers_pods_to_the_fake_nodes(cluster: ModuleType) -> None:
    rc = cluster.kwok_runtime_class()
    node = cluster.kwok_node(0)
    assert rc["metadata"]["name"] == "kwok"
    assert rc["handler"] == "runc"
    for key, value in rc["scheduling"]["nodeSelector"].items():
        assert node["metadata"]["labels"][key] == value
    for taint in node["spec"]["taints"]:
        assert any(_tolerates(t, taint) for t in rc["scheduling"]["tolerations"])


def test_kwok_config_has_options_upstream_stages_and_our_pod_delete(
    cluster: ModuleType, tmp_path: Path
) -> None:
    (tmp_path / "pod-ready.yaml").write_text(
        "apiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\nmetadata:\n  name: pod-ready\n"
    )
    docs = list(yaml.safe_load_all(cluster.kwok_config_text(tmp_path)))
    assert docs[0]["kind"] == "KwokConfiguration"
    assert docs[0]["options"]["nodeLeaseDurationSeconds"] > 0
    stages = {d["metadata"]["name"]: d for d in docs[1:]}
    assert set(stages) == {"pod-ready", "pod-delete"}
    delete = stages["pod-delete"]["spec"]
    exprs = {e["key"]: e["operator"] for e in delete["selector"]["matchExpressions"]}
    assert exprs == {
        ".metadata.deletionTimestamp": "Exists",
        ".metadata.finalizers": "DoesNotExist",
    }
    assert delete["next"] == {"delete": True}
    assert "delay" not in delete  # removed at once, whatever grace period the deleter asked for


def test_kwok_process_manages_only_annotated_nodes(cluster: ModuleType, tmp_path: Path) -> None:
    config = tmp_path / "kwok.yaml"
    config.write_text("x")
    proc = cluster.kwok_proc(Path("/opt/kwok"), config)
    assert proc.name == "kwok"
    assert "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake" in proc.argv
    assert f"--kubeconfig={cluster.KUBECONFIG}" in proc.argv
    assert f"--config={config}" in proc.argv
    assert not any(a.startswith("--manage-all-nodes") for a in proc.argv)
    assert proc.pidfile.name == "kwok.json" and proc.log.name == "kwok.log"
    fingerprint = proc.fingerprint
    config.write_text("y")  # a changed config restarts kwok, like a changed flag
    assert cluster.kwok_proc(Path("/opt/kwok"), config).fingerprint != fingerprint


def test_scheduler_and_controller_manager_rate_limits_raised(cluster: ModuleType) -> None:
    bins = cluster.Bins(Path("/k8s"), Path("/etcd"), Path("/helm"), Path("/gvisor"))
    for proc, default_qps in ((cluster.scheduler_proc(bins), 50), (cluster.kcm_proc(bins), 20)):
        flags = dict(a.split("=", 1) for a in proc.argv[1:] if "=" in a)
        assert int(flags["--kube-api-qps"]) > default_qps
        assert int(flags["--kube-api-burst"]) >= int(flags["--kube-api-qps"])


def test_kwok_subcommand_parses(cluster: ModuleType) -> None:
    with pytest.raises(SystemExit) as exc:
        cluster.main(["kwok", "up", "--nodes", "0"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        cluster.main(["kwok"])  # up or down is required


def test_build_script_caches_by_version(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KWOK_VERSION": "v9.9.9"}
    out = subprocess.run(
        ["bash", str(ROOT / "hack" / "build-kwok.sh"), "print-path"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=30,
    ).stdout.strip()
    assert out == f"{tmp_path}/.cache/sandbox-operator/bin/kwok-v9.9.9/kwok"
    default = subprocess.run(
        ["bash", str(ROOT / "hack" / "build-kwok.sh"), "print-path"],
        capture_output=True,
        text=True,
        env={**env, "KWOK_VERSION": ""},
        check=False,
        timeout=30,
    )
    assert "/kwok-v" in default.stdout


def test_metrics_parsing_and_differences(scale: ModuleType) -> None:
    text = "\n".join(
        [
            "# HELP sandbox_operator_api_requests_total requests",
            "# TYPE sandbox_operator_api_requests_total counter",
            'sandbox_operator_api_requests_total{verb="get",resource="pods",code="200"} 7',
            'sandbox_operator_api_requests_total{verb="patch",resource="sandboxes",code="200"} 3',
            'sandbox_operator_api_response_bytes_total{verb="get",resource="pods"} 1024',
            'apiserver_request_total{code="200",resource="pods",verb="LIST"} 5',
            'other_metric{a="b"} 99',
        ]
    )
    op = scale.operator_counters(text)
    assert (op.requests, op.bytes) == (10, 1024)
    assert op.by_kind["get pods"] == 7
    later = scale.operator_counters(text.replace("} 7", "} 12"))
    diff = later.minus(op)
    assert diff.requests == 5 and diff.bytes == 0 and dict(diff.by_kind) == {"get pods": 5}
    api = scale.apiserver_counters(text)
    assert api.requests == 5
    missing = scale.operator_counters("")
    assert missing.requests is None and later.minus(missing).requests is None


def test_percentiles(scale: ModuleType) -> None:
    values = [float(v) for v in range(1, 101)]
    assert scale.pct(values, 50) == 50
    assert scale.pct(values, 90) == 90
    assert scale.pct([3.0], 90) == 3
    assert scale.pct([], 50) != scale.pct([], 50)  # nan


def test_bare_pod_is_the_operators_spec_without_its_identity(scale: ModuleType) -> None:
    template: dict[str, Any] = {
        "metadata": {
            "name": "sbx-x",
            "labels": {"app.kubernetes.io/managed-by": "sandbox-operator"},
            "ownerReferences": [{"kind": "Sandbox", "name": "x"}],
        },
        "spec": {
            "runtimeClassName": "gvisor",
            "nodeName": "n",
            "priority": 0,
            "containers": [{"name": "sandbox", "image": "busybox"}],
        },
        "status": {"phase": "Running"},
    }
    pod = scale.bare_pod(template, "bare-1")
    assert pod["metadata"] == {"name": "bare-1", "labels": {scale.BARE_LABEL: "true"}}
    assert pod["spec"] == {
        "runtimeClassName": "gvisor",
        "containers": [{"name": "sandbox", "image": "busybox"}],
    }
    assert "nodeName" in template["spec"]  # the template itself is left alone
