"""benchmarks/maf.py's ``--smoke`` mode, run so the script cannot rot.

The script runs with this interpreter (the maf tier's Python 3.12 venv: it imports maf-sandbox)
against the cluster. Asserted: it completes, and every row of its three tables was measured:
its one round gave one sample per row, every step succeeded, the warm samples were all
served from the pool and the cold ones were not, the client created one Sandbox per acquire, a
maf call ending in a reset kept one Sandbox and claimed at least twice from the pool (its
acquire and its reset), the client's reset put a pool pod in its place, API writes were counted
for every row, every ratio row has figures, and the conversation's calls all completed. No
latency is asserted (the benchmark measures; docs keep the figures)."""

from __future__ import annotations

import re

import pytest
from tests.fixtures.benchmark_smoke import run_smoke

# Not exclusive: its writes and claims are counted on its own operator's metrics and its own
# client, in a namespace of its own; no figure is asserted, so it runs beside the tier's modules.
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def figures(cells: list[str]) -> bool:
    """Every "p50 / p90" cell has two positive figures."""
    return all(float(p) > 0 for cell in cells for p in cell.split(" / "))


def writes(cell: str) -> tuple[float, float]:
    """ "operator + client" writes per call."""
    op, own = cell.split(" + ")
    return float(op), float(own)


def test_maf_benchmark_smoke(kubeconfig: str) -> None:
    proc, out = run_smoke("maf.py", kubeconfig, timeout=900)
    tail = out[-4000:]
    rows = {}
    for line in proc.stdout.splitlines():
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) >= 2 and line.startswith("runc: "):
            rows[parts[0]] = parts[1:]
    # The calls' table: done, from pool, Sandboxes per acquire, pool claims, then acquire /
    # first exec / cleanup / total as "p50 / p90", then writes "operator + client".
    for route in ("maf router", "own client"):
        assert rows.get(f"runc: {route}, cold", [])[:2] == ["1/1", "0/1"], tail
        assert rows.get(f"runc: {route}, warm", [])[:2] == ["1/1", "1/1"], tail
        assert rows[f"runc: {route}, cold"][3] == "0.0", tail
    # pool claims: the client's warm acquire claims once; maf's (no --seal here) may claim again
    # when the router resets the pool pod it cannot vouch for
    assert rows["runc: own client, warm"][3] == "1.0", tail
    assert float(rows["runc: maf router, warm"][3].split()[0]) >= 1.0, tail
    # A maf call ending in a reset: one Sandbox, two pool claims at least (its acquire and its
    # reset; without --seal maf also resets the unfamiliar pool pod at acquire, a third claim
    # that may find the pool of two empty, so "from pool" is not asserted here).
    reset_call = rows.get("runc: maf router, reset", [])
    assert reset_call[0] == "1/1" and reset_call[2] == "1.0", tail
    assert float(reset_call[3].split()[0]) >= 2.0, tail
    for label in ("maf router", "own client"):
        for temp in ("cold", "warm", "reset"):
            if (label, temp) == ("own client", "reset"):
                continue
            row = rows[f"runc: {label}, {temp}"]
            assert len(row) == 9 and figures(row[4:8]), tail
            # every call writes: the operator at least its Sandbox's status, the client its create
            op, own = writes(row[8])
            assert op > 0 and own > 0, tail
    # the client's acquire creates exactly the one Sandbox it returns
    assert rows["runc: own client, cold"][2] == rows["runc: own client, warm"][2] == "1.0"
    for label in ("maf / own, cold", "maf / own, warm", "maf reset / own warm"):
        ratios = rows.get(f"runc: {label}", [])
        assert len(ratios) == 4 and all(r != "n/a" for r in ratios), tail
    # The reset alone: done, from pool, pool claims, reset / first exec / total, writes.
    reset = rows.get("runc: own client, reset", [])
    assert reset[:3] == ["1/1", "1/1", "1.0"] and figures(reset[3:6]), tail
    assert all(w > 0 for w in writes(reset[6])), tail
    # The conversation (3 calls in the smoke run): done, pool claims, conversation, the calls'
    # acquire / first exec / cleanup / total, writes per call.
    conv = rows.get("runc: maf, 3 calls", [])
    assert conv[:1] == ["1/1"] and len(conv) == 8 and figures(conv[2:7]), tail
    assert "failed:" not in proc.stdout, tail
