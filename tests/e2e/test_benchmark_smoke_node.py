"""The node benchmarks' ``--smoke`` modes (warm pool, host tools, suspend, the egress TLS hop, the
ports router), run by CI so the scripts cannot rot. Each serves only a namespace of its own (its
own operator, pods and proxy or router), asserts counts and never a figure, so they run with
the concurrent part of the cluster tier; the scale smoke (kwok's fake nodes, an idle request
rate) stays exclusive in test_benchmark_smoke.py."""

from __future__ import annotations

import re

import pytest

from tests.fixtures.benchmark_smoke import run_smoke

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_warm_pool_benchmark_smoke(kubeconfig: str) -> None:
    """benchmarks/warm_pool.py --smoke (runc, 3 of each, a burst of 3): it completes, every
    Sandbox and bare pod is Ready, the warm ones (and the burst) were all served from the pool
    and the cold ones were not. No latency is asserted."""
    proc, out = run_smoke("warm_pool.py", kubeconfig, timeout=900)
    rows = {}
    for line in proc.stdout.splitlines():
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) >= 2 and not line.startswith(("[", "-", " ")):
            rows[parts[0]] = parts[1:]
    # Ready, served from pool, p50, p90, max
    assert rows.get("runc: warm", [])[:2] == ["3/3", "3/3"], out[-4000:]
    assert rows.get("runc: cold", [])[:2] == ["3/3", "0/3"], out[-4000:]
    assert rows.get("runc: bare pod", [])[:2] == ["3/3", "n/a"], out[-4000:]
    assert rows.get("runc: 3 Sandboxes", [])[:2] == ["3/3", "3/3"], out[-4000:]
    # Three Sandboxes with a floor no backend reaches: each refused.
    assert rows.get("refusals", [])[:1] == ["3/3"], out[-4000:]


def test_host_tools_benchmark_smoke(kubeconfig: str) -> None:
    """benchmarks/host_tools.py --smoke (runc, one run of 3 calls): it completes and prints a row
    for each measurement with the expected number of samples (the benchmark itself checks every
    answer and record). No latency is asserted."""
    proc, out = run_smoke("host_tools.py", kubeconfig, timeout=600)
    rows = {}
    for line in proc.stdout.splitlines():
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) == 4 and ":" in parts[0]:
            rows[parts[0]] = parts[1:]
    # median, p90, samples
    assert rows.get("runc: call (guest)", [])[2:] == ["3"], out[-4000:]
    assert rows.get("runc: run, 0 calls (host)", [])[2:] == ["3"], out[-4000:]
    assert rows.get("runc: run, 3 calls (host)", [])[2:] == ["1"], out[-4000:]
    assert rows.get("runc: per call (host)", [])[2:] == ["1"], out[-4000:]
    assert all(float(v[0]) > 0 for v in rows.values()), out[-4000:]


def test_suspend_benchmark_smoke(kubeconfig: str) -> None:
    """benchmarks/suspend.py --smoke (runc, 2 Sandboxes with storage, one suspend and resume
    each): it completes, every row has its two samples, and both files were kept. No latency
    is asserted."""
    proc, out = run_smoke("suspend.py", kubeconfig, timeout=600)
    rows = {}
    for line in proc.stdout.splitlines():
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) == 2:
            rows[parts[0]] = parts[1]
    for row in (
        "create -> Ready (storage) p50/p90 s",
        "suspend p50/p90 s",
        "resume -> Ready p50/p90 s",
    ):
        assert rows.get(row, "").endswith("(n=2)"), out[-4000:]
    assert rows.get("file kept across suspend") == "2/2", out[-4000:]


def test_egress_tls_benchmark_smoke(kubeconfig: str) -> None:
    """benchmarks/egress_tls.py --smoke (runc, one round of 5 timed HTTPS requests per path: no
    proxy, a CONNECT tunnel, intercepted): it completes, each path has its 5 samples and a
    proxy CPU figure (the benchmark itself fails on any answer but 200). No figure is asserted."""
    proc, out = run_smoke("egress_tls.py", kubeconfig, timeout=600)
    labels = ("no proxy (", "CONNECT tunnel (", "intercepted (")
    rows = {
        label: line.rsplit(")", 1)[1].split()
        for line in proc.stdout.splitlines()
        for label in labels
        if line.startswith(label)
    }
    assert set(rows) == set(labels), out[-4000:]
    # p50, p90, overhead, connect, tls, request, proxy CPU per request, samples
    assert all(len(v) == 8 and v[-1] == "5" for v in rows.values()), out[-4000:]


def test_router_benchmark_smoke(kubeconfig: str) -> None:
    """benchmarks/router.py --smoke (runc, 10 requests each way, one wake-up): it completes and
    each row has its samples (the benchmark itself fails on any answer but 200). No figure is
    asserted."""
    proc, out = run_smoke("router.py", kubeconfig, timeout=600)
    rows = {}
    for line in proc.stdout.splitlines():
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) == 4:
            rows[parts[0]] = parts[1:]
    # median, p90, samples
    assert rows.get("GET direct to the pod IP (ms)", [])[2:] == ["10"], out[-4000:]
    assert rows.get("GET through the router (ms)", [])[2:] == ["10"], out[-4000:]
    assert rows.get("router / direct", [])[2:] == ["10"], out[-4000:]
    assert rows.get("request to a suspended Sandbox -> answer (s)", [])[2:] == ["1"], out[-4000:]
