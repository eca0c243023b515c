"""Egress latency through the TLS hop (#38): an HTTPS request the egress proxy intercepts (a host
whose rule the proxy must read) beside the same request through a plain allowlisted host's CONNECT
tunnel and with no proxy at all, measured side by side in one run from inside pods on the local
cluster (runc), plus the proxy's CPU time per request.

In a fresh ``t-`` namespace this script starts the real operator (a subprocess, as the e2e tests
do) with the managed proxy intercepting TLS (tests/fixtures/egress_upstream.py's configuration:
the proxy trusts a test CA for upstreams), one HTTPS server on this machine (its certificate from
that test CA, for ``api.wild.test`` and ``allowed.test``), and in the namespace:

- an unrestricted pod (no NetworkPolicy selects it; same runtime class and image): **no proxy**,
  TLS straight to the server by the node's address;
- an ``egress: allowlist`` Sandbox allowed ``allowed.test`` (a **CONNECT tunnel**: TLS end to end,
  the guest trusting the test CA) and ruled ``api.wild.test`` (``schemes: [https]``,
  ``paths: ["/*"]``: **intercepted**, the guest trusting the proxy's CA through ``SSL_CERT_FILE``,
  the proxy terminating TLS, judging the request and opening its own verified TLS upstream).

Every request is a fresh TCP connection, a full TLS handshake and ``GET /`` with
``Connection: close``, timed inside the pod (``time.perf_counter``; after warm-up requests, which
also mint the intercepted host's leaf certificate), in three phases: ``connect`` (TCP, and for the
proxied paths the CONNECT exchange, answered after the proxy's checks and its upstream TCP
connect), ``tls`` (the guest's handshake: with the server, or with the proxy when intercepted),
``request`` (the request to the last byte of the answer: for the intercepted path this holds the
proxy's own handshake with the upstream). The three paths run in ``--rounds`` alternating blocks
so drift on the machine falls on all of them. The proxy's CPU per request is the proxy
process's user + system time (``/proc/1/stat`` in its pod, read by an exec before and after each
block) over the block's requests, warm-up included; its decision recording is part of it.

Usage: .venv/bin/python benchmarks/egress_tls.py [--requests 300] [--rounds 3]
       .venv/bin/python benchmarks/egress_tls.py --smoke      # CI: 1 round of 5 requests
Needs the local cluster (``make up``: CRDs applied, the runc RuntimeClass). Prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

from kubernetes import client, config

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.fixtures.cluster import LOCAL_KUBECONFIG  # noqa: E402
from tests.fixtures.egress_probe import node_address, unrestricted_pod  # noqa: E402
from tests.fixtures.egress_proxy import PROXY_SELECTOR, bench_namespace  # noqa: E402
from tests.fixtures.egress_upstream import (  # noqa: E402
    PLAIN,
    RULED,
    Upstreams,
    intercepting_config,
    upstreams,
)
from tests.fixtures.node import exec_in  # noqa: E402
from tests.fixtures.operator import PYTHON, build_operator_image  # noqa: E402

RUNTIME = "runc"
PATHS = ("direct", "tunnel", "intercepted")
LABELS = {
    "direct": "no proxy (unrestricted pod, by address)",
    "tunnel": "CONNECT tunnel (plain allowlisted host)",
    "intercepted": "intercepted (TLS ended at the proxy)",
}

#: Runs inside a pod: ``MODE HOST PORT N WARMUP CA_PEM`` (MODE: direct | tunnel | intercepted;
#: HOST: the address for direct, the name otherwise); prints {"connect": [...], "tls": [...],
#: "request": [...]} in microseconds, one entry per timed request.
IN_POD = r"""
import json, os, socket, ssl, sys, time
mode, host, ca = sys.argv[1], sys.argv[2], sys.argv[6]
port, n, warmup = (int(x) for x in sys.argv[3:6])
name = "allowed.test" if mode == "direct" else host
if mode == "intercepted":
    ctx = ssl.create_default_context()  # SSL_CERT_FILE: the bundle with the proxy's CA
else:
    ctx = ssl.create_default_context(cadata=ca)
proxy = os.environ.get("HTTPS_PROXY", "").split("://", 1)[-1].rstrip("/")

def answer(s):
    # the status of the HTTP head arriving on s (read to its blank line), and the reader
    reader = s.makefile("rb")
    first = reader.readline()
    while reader.readline() not in (b"\r\n", b""):
        pass
    return int(first.split()[1]), reader

def once():
    t0 = time.perf_counter()
    if mode == "direct":
        raw = socket.create_connection((host, port), timeout=10)
    else:
        ph, pp = proxy.rsplit(":", 1)
        raw = socket.create_connection((ph, int(pp)), timeout=10)
        target = "%s:%d" % (host, port)
        raw.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
        status, reader = answer(raw)
        reader.close()
        if status != 200:
            raise RuntimeError("CONNECT answered %d" % status)
    t1 = time.perf_counter()
    s = ctx.wrap_socket(raw, server_hostname=name)
    t2 = time.perf_counter()
    get = "GET / HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n" % (name, port)
    s.sendall(get.encode())
    status, reader = answer(s)
    try:
        reader.read()
    except ssl.SSLError:  # an end without close_notify
        pass
    reader.close()
    t3 = time.perf_counter()
    s.close()
    if status != 200:
        raise RuntimeError("GET answered %d" % status)
    return (t1 - t0) * 1e6, (t2 - t1) * 1e6, (t3 - t2) * 1e6

for _ in range(warmup):
    once()
out = {"connect": [], "tls": [], "request": []}
for _ in range(n):
    c, t, r = once()
    out["connect"].append(c); out["tls"].append(t); out["request"].append(r)
print(json.dumps(out))
"""

#: Runs in the proxy's pod: the proxy process's (pid 1) user + system CPU time, in seconds.
CPU = (
    "import os; f = open('/proc/1/stat').read().rsplit(')', 1)[1].split(); "
    "print(sum(int(x) for x in f[11:15]) / os.sysconf('SC_CLK_TCK'))"
)


def nearest_rank(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def proxy_cpu(core: client.CoreV1Api, ns: str, pod: str) -> float:
    return float(exec_in(core, ns, pod, "python3", "-I", "-c", CPU).strip())


def block(
    core: client.CoreV1Api, ns: str, pod: str, mode: str, host: str, up: Upstreams, n: int, w: int
) -> dict[str, list[float]]:
    argv = ["python3", "-I", "-c", IN_POD, mode, host, str(up.tls_port), str(n), str(w), up.tls_pem]
    out = exec_in(core, ns, pod, *argv)
    try:
        parsed: dict[str, list[float]] = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RuntimeError(f"{mode} in {pod}: {out[-2000:]}") from None
    return parsed


def measure(
    api: client.ApiClient, image: str, up: Upstreams, n: int, rounds: int, warmup: int
) -> dict[str, dict[str, list[float]]]:
    """Per path: the phases' samples and ``cpu`` (the proxy's seconds over its requests)."""
    core = client.CoreV1Api(api)
    with bench_namespace(api, "bench-egress-tls", intercepting_config(RUNTIME, image, up)) as kit:
        ns = kit.ns
        kit.scope()
        rule = {"host": RULED, "schemes": ["https"], "paths": ["/*"]}
        kit.sandbox("bench", image=PYTHON, requires=["exec"], egress="allowlist",
                    egressAllow=[PLAIN], egressRules=[rule])  # fmt: skip
        unrestricted_pod(core, ns, "direct", RUNTIME, up.outside)
        obj = kit.wait_condition("bench", reasons=("Ready",), status="True", timeout=180)
        sandbox = obj["status"]["servedBy"]["name"]
        (proxy,) = [
            p.metadata.name
            for p in core.list_namespaced_pod(ns, label_selector=PROXY_SELECTOR).items
            if p.status.phase == "Running" and not p.metadata.deletion_timestamp
        ]
        where = {
            "direct": ("direct", up.outside.address),
            "tunnel": (sandbox, PLAIN),
            "intercepted": (sandbox, RULED),
        }
        results: dict[str, dict[str, list[float]]] = {
            p: {"connect": [], "tls": [], "request": [], "cpu": [], "count": []} for p in PATHS
        }
        per_round = max(1, n // rounds)
        for r in range(rounds):
            for mode in PATHS[r % 3 :] + PATHS[: r % 3]:  # the order rotates each round
                pod, host = where[mode]
                before = proxy_cpu(core, ns, proxy)
                got = block(core, ns, pod, mode, host, up, per_round, warmup)
                results[mode]["cpu"].append(proxy_cpu(core, ns, proxy) - before)
                results[mode]["count"].append(per_round + warmup)
                for phase, values in got.items():
                    results[mode][phase] += values
        return results


def table(results: dict[str, dict[str, list[float]]], rounds: int) -> str:
    def totals(v: dict[str, list[float]]) -> list[float]:
        return [sum(x) for x in zip(v["connect"], v["tls"], v["request"], strict=True)]

    direct = nearest_rank(totals(results["direct"]), 0.5)
    head = (
        f"{'path (' + RUNTIME + ', HTTPS GET, fresh connection)':<44}{'p50 us':>9}{'p90 us':>9}"
        f"{'overhead p50':>14}{'connect':>9}{'tls':>8}{'request':>9}{'proxy CPU/req us':>18}"
        f"{'samples':>9}"
    )
    lines = [head, "-" * len(head)]
    for mode in PATHS:
        v = results[mode]
        total = totals(v)
        p50 = nearest_rank(total, 0.5)
        cpu = sum(v["cpu"]) / sum(v["count"]) * 1e6 if sum(v["count"]) else math.nan
        lines.append(
            f"{LABELS[mode]:<44}{p50:>9.0f}{nearest_rank(total, 0.9):>9.0f}{p50 - direct:>14.0f}"
            f"{nearest_rank(v['connect'], 0.5):>9.0f}{nearest_rank(v['tls'], 0.5):>8.0f}"
            f"{nearest_rank(v['request'], 0.5):>9.0f}{cpu:>18.0f}{len(total):>9}"
        )
    lines.append(f"(phases: p50 of each; {rounds} alternating rounds; proxy CPU from /proc/1/stat)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--requests", type=int, default=300, help="timed requests per path")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=10, help="untimed requests per block")
    parser.add_argument("--smoke", action="store_true", help="CI: 1 round of 5 requests")
    args = parser.parse_args(argv)
    if args.smoke:
        args.requests, args.rounds, args.warmup = 5, 1, 2
    kubeconfig = os.environ.get("KUBECONFIG") or str(LOCAL_KUBECONFIG)
    os.environ["KUBECONFIG"] = kubeconfig
    api = config.new_client_from_config(config_file=kubeconfig)
    try:
        image = build_operator_image()
        with (
            tempfile.TemporaryDirectory(prefix="egress-tls-ca-") as tmp,
            upstreams(node_address(client.CoreV1Api(api)), Path(tmp)) as up,
        ):
            results = measure(api, image, up, args.requests, args.rounds, args.warmup)
    finally:
        api.close()
    print(table(results, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
