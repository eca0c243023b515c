"""benchmarks/maf.py's ``--smoke`` mode, run so the script cannot rot.

The script runs with this interpreter (the maf tier's Python 3.12 venv: it imports maf-sandbox)
against the cluster. Asserted: it completes, and every row of its table was measured: each of
the two rounds gave one sample per route and temperature, acquire, exec and dispose all
succeeded, the warm samples were all served from the pool and the cold ones were not, the
client created one Sandbox per acquire, and every ratio row has figures. No latency is asserted
(the benchmark measures; docs keep the figures)."""

from __future__ import annotations

import re

import pytest
from tests.fixtures.benchmark_smoke import run_smoke

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.exclusive]


def test_maf_benchmark_smoke(kubeconfig: str) -> None:
    proc, out = run_smoke("maf.py", kubeconfig, timeout=600)
    rows = {}
    for line in proc.stdout.splitlines():
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) >= 2 and line.startswith("runc: "):
            rows[parts[0]] = parts[1:]
    # done, from pool, Sandboxes per acquire, then acquire / first exec / dispose / total as
    # "p50 / p90"
    for route in ("maf router", "own client"):
        assert rows.get(f"runc: {route}, cold", [])[:2] == ["2/2", "0/2"], out[-4000:]
        assert rows.get(f"runc: {route}, warm", [])[:2] == ["2/2", "2/2"], out[-4000:]
        for temp in ("cold", "warm"):
            figures = rows[f"runc: {route}, {temp}"][3:]
            assert len(figures) == 4, out[-4000:]
            assert all(float(p) > 0 for cell in figures for p in cell.split(" / ")), out[-4000:]
    # the client's acquire creates exactly the one Sandbox it returns
    assert rows["runc: own client, cold"][2] == rows["runc: own client, warm"][2] == "1.0"
    for temp in ("cold", "warm"):
        ratios = rows.get(f"runc: maf / own, {temp}", [])
        assert len(ratios) == 4 and all(r != "n/a" for r in ratios), out[-4000:]
    assert "failed:" not in proc.stdout, out[-4000:]
