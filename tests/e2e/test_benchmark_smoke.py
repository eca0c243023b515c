"""The scale benchmark's ``--smoke`` mode, run by CI so the script cannot rot.

It asserts the run completes and prints its table with every Sandbox Admitted and Ready and the
idle operator making (almost) no request. Performance figures are never asserted here (they are
measured by the benchmark itself and kept in docs/performance.md)."""

from __future__ import annotations

import re

import pytest

from tests.fixtures.benchmark_smoke import run_smoke

# exclusive: kwok's fake nodes are cluster-wide, and the idle operator's request rate is asserted
# (run alone, after the concurrent part). The smokes that need neither are in
# test_benchmark_smoke_node.py, which runs with the concurrent part.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.exclusive]


def test_scale_benchmark_smoke(kubeconfig: str) -> None:
    """benchmarks/scale.py --smoke --real-node: N=20 on kwok (and the same 20 pods bare), the
    API ceiling, and on the real node one burst of 3 Sandboxes and 3 bare pods (runc) with the
    API writes per object. No figure but the counts and the idle rate is asserted."""
    proc, out = run_smoke("scale.py", kubeconfig, timeout=900, extra=("--real-node",))
    rows = {}
    for line in proc.stdout.splitlines():
        parts = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        if len(parts) == 2 and not line.startswith(("[", "-")):
            rows[parts[0]] = parts[1].split()
    assert rows.get("Admitted / Ready / refused") == ["20", "/", "20", "/", "0"], out[-4000:]
    assert rows.get("the same pods bare: all Ready after last", [""])[-1] == "(20/20)", out[-4000:]
    assert rows.get("runc: 3 Sandboxes", [])[:1] == ["3/3"], out[-4000:]
    assert rows.get("runc: 3 bare pods", [])[:1] == ["3/3"], out[-4000:]
    # Writes per object in the create phase: a Sandbox costs at least its POST and its pod's.
    writes = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("runc: Sandboxes ")]
    assert any("create" in ln for ln in writes), out[-4000:]
    idle = next(v for k, v in rows.items() if k.startswith("idle") and "operator requests/s" in k)
    # Nothing per Sandbox; at most a watch stream reconnecting in the window (kopf's, about one
    # per kind every two minutes).
    assert float(idle[0]) < 1.0, out[-4000:]
