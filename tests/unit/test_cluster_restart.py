"""`hack/cluster.py restart NAME [--kill]` without a cluster: what it refuses, and that it stops
the recorded process and starts the very command line `up` starts (so `up` afterwards finds it
unchanged and leaves it alone)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("hack_cluster_restart", ROOT / "hack/cluster.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    state = tmp_path / "state"
    (state / "pids").mkdir(parents=True)
    monkeypatch.setattr(module, "STATE", state)
    monkeypatch.setattr(module, "PIDS", state / "pids")
    monkeypatch.setattr(module, "LOGS", state / "logs")
    bins = module.Bins(
        k8s=tmp_path / "k8s", etcd=tmp_path / "etcd", helm=tmp_path / "h", gvisor=tmp_path / "g"
    )
    monkeypatch.setattr(module, "binary_paths", lambda: bins)
    monkeypatch.setattr(module, "node_ip", lambda: "192.0.2.10")
    return module


def test_only_control_plane_processes_can_be_restarted(cluster: ModuleType) -> None:
    assert set(cluster.RESTARTABLE) == {
        "kube-apiserver",
        "etcd",
        "kube-controller-manager",
        "kube-scheduler",
    }
    with pytest.raises(SystemExit):
        cluster.main(["restart", "kubelet"])


def test_a_process_that_does_not_run_is_not_started_by_restart(
    cluster: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[Any] = []
    monkeypatch.setattr(cluster, "start", started.append)
    with pytest.raises(cluster.StepFailed, match="does not run"):
        cluster.cmd_restart("kube-apiserver")
    (cluster.PIDS / "kube-apiserver.json").write_text(json.dumps({"pid": 2**22 + 7, "exe": "x"}))
    with pytest.raises(cluster.StepFailed, match="does not run"):
        cluster.cmd_restart("kube-apiserver")
    assert cluster.main(["restart", "kube-apiserver"]) == 1
    assert started == []


@pytest.mark.parametrize("kill", [False, True])
def test_restart_stops_the_recorded_process_and_starts_what_up_starts(
    cluster: ModuleType, monkeypatch: pytest.MonkeyPatch, kill: bool
) -> None:
    record = {"pid": 4242, "exe": "/k8s/kube-apiserver"}
    (cluster.PIDS / "kube-apiserver.json").write_text(json.dumps(record))
    calls: list[tuple[str, Any]] = []
    alive = {"yes": True}

    def stop_record(name: str, rec: dict[str, Any], grace: float = 10.0) -> None:
        calls.append(("stop", (name, rec["pid"])))
        alive["yes"] = False

    def os_kill(pid: int, sig: int) -> None:
        calls.append(("kill", (pid, sig)))
        alive["yes"] = False

    monkeypatch.setattr(cluster, "pid_alive", lambda rec: alive["yes"])
    monkeypatch.setattr(cluster, "stop_record", stop_record)
    monkeypatch.setattr(cluster.os, "kill", os_kill)
    monkeypatch.setattr(cluster, "start", lambda proc: calls.append(("start", proc)))
    outage = cluster.cmd_restart("kube-apiserver", kill=kill)
    assert outage >= 0
    first, (verb, proc) = calls
    if kill:
        assert first == ("kill", (4242, cluster.signal.SIGKILL))
    else:
        assert first == ("stop", ("kube-apiserver", 4242))
    assert verb == "start"
    up = cluster.apiserver_proc(cluster.binary_paths(), cluster.node_ip())
    assert (proc.name, proc.argv, proc.fingerprint) == (up.name, up.argv, up.fingerprint)
    # A start that exits at once (its port still held by the killed process) is tried again.
    assert proc.attempts >= cluster.RESTART_ATTEMPTS > 1
