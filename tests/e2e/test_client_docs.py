"""docs/client.md shows docs/examples/host_agent.py unchanged, and the example runs."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs/examples/host_agent.py"


def test_doc_shows_the_example_verbatim() -> None:
    doc = (REPO / "docs/client.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    assert EXAMPLE.read_text() in blocks


@pytest.mark.e2e
@pytest.mark.slow
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


@pytest.mark.e2e
@pytest.mark.slow
def test_benchmark_runs(kubeconfig: str, crds: None) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import client_roundtrip
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    results = client_roundtrip.main(
        ["--iterations", "1", "--backends", "runc", "--kubeconfig", kubeconfig]
    )
    assert set(results) == {"runc"}
    assert results["runc"]["acquire_ready_s"] > 0
    assert results["runc"]["read_8MiB_MiBps"] > 0
