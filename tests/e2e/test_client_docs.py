"""The example docs/client.md shows (docs/examples/host_agent.py) runs against the operator, and
so does the client round-trip benchmark (tests/unit/test_client_doc_example.py: the doc shows it
unchanged)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs/examples/host_agent.py"


def test_example_runs(
    kubeconfig: str, namespace: str, start_operator: Callable[..., Any], tmp_path: Path
) -> None:
    start_operator()
    out = tmp_path / "landed"
    argv = [sys.executable, str(EXAMPLE), "--namespace", namespace, "--kubeconfig", kubeconfig]
    proc = subprocess.run(
        [*argv, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "wrote 5 rows" in proc.stdout
    assert "report.json (application/json" in proc.stdout
    rows = (out / "report.json").read_text()
    assert '"square": 25' in rows


def test_benchmark_runs(kubeconfig: str, crds: None) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import client_roundtrip
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    results = client_roundtrip.main(["--smoke", "--backends", "runc", "--kubeconfig", kubeconfig])
    assert set(results) == {"runc"}
    assert results["runc"]["acquire_ready_s"] > 0
    assert results["runc"]["read_8MiB_MiBps"] > 0
    # exec(["true"]) plain and through an exec session, side by side (no figure asserted)
    assert results["runc"]["true_plain_p50_ms"] > 0 and results["runc"]["true_session_p50_ms"] > 0
