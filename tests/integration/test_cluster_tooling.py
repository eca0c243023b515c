"""hack/cluster.py itself: a second `up` on a running cluster is a no-op; `status` reports it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.fixtures.cluster import CLUSTER_PY, LOCAL_STATE

# exclusive: runs hack/cluster.py up on the running cluster (run alone, after the concurrent part).
pytestmark = [pytest.mark.integration, pytest.mark.exclusive]


@pytest.fixture
def local_only(cluster_is_local: bool) -> None:
    if not cluster_is_local:
        pytest.skip("checks the project's own local cluster; KUBECONFIG points elsewhere")


def _pids() -> dict[str, int]:
    return {
        f.stem: json.loads(f.read_text())["pid"] for f in sorted((LOCAL_STATE / "pids").glob("*"))
    }


def test_second_up_is_a_no_op(local_only: None) -> None:
    before = _pids()
    out = subprocess.run(
        [sys.executable, str(CLUSTER_PY), "up", "--level", "api"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    assert "cluster is up" in out
    assert " start " not in out and "restarting" not in out, out
    assert _pids() == before


def test_status_reports_a_healthy_control_plane(local_only: None) -> None:
    proc = subprocess.run(
        [sys.executable, str(CLUSTER_PY), "status"], capture_output=True, text=True, timeout=60
    )
    lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.startswith("  ")}
    for name in ("etcd", "kube-apiserver", "kube-controller-manager"):
        assert "healthy" in lines[name], proc.stdout
