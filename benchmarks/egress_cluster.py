"""Egress proxy benchmark in the local cluster: added latency and memory of the per-namespace
proxy the operator runs (managed ``egressProxy``), under runc and gVisor.

Per runtime class, in a fresh namespace, this script starts the real operator (a subprocess, as
the e2e tests do) configured with the managed proxy (image = the operator image, built and
imported by ``operator/build-image.sh import``), an HTTP server on this machine's node address,
and in the namespace:

- an unrestricted pod (no NetworkPolicy selects it; same runtime class and image as the sandbox);
- an ``egress: allowlist`` Sandbox allowed ``allowed.test`` (the proxy resolves that name to the
  node address through its hostAliases).

Each series runs as one ``python3`` script inside a pod (one exec), which times every request
itself (``time.perf_counter``, a fresh TCP connection per request, after 20 warm-up requests), so
the exec round trip is not in the figures:

- direct: the unrestricted pod GETs the server by IP;
- proxied HTTP: the sandbox sends an absolute-form GET to its ``HTTP_PROXY``;
- proxied CONNECT: the sandbox opens a CONNECT tunnel to ``allowed.test:port`` and GETs through it.

Then the proxy pod's memory from the kubelet's stats summary (through the API server's node
proxy): idle, and while the sandbox holds N concurrent CONNECT tunnels. The kubelet refreshes
those figures every ~10-15 s, so each reading waits for a sample taken after the state it
describes (at most 30 s).

Usage: .venv/bin/python benchmarks/egress_cluster.py [--requests 300] [--concurrency 200]
       [--runtime runc --runtime gvisor]
Needs the local cluster (hack/cluster.py up) or $KUBECONFIG pointing at it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.stream import stream

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.fixtures.cluster import LOCAL_KUBECONFIG  # noqa: E402
from tests.fixtures.egress_probe import Outside, node_address, unrestricted_pod  # noqa: E402
from tests.fixtures.egress_proxy import (  # noqa: E402
    PROXY_SELECTOR,
    bench_namespace,
    config_with_managed_proxy,
)
from tests.fixtures.node import exec_in  # noqa: E402
from tests.fixtures.operator import PYTHON, build_operator_image  # noqa: E402

from sandbox_operator.testing.egress import serve_http_in_thread  # noqa: E402

BODY = b"egress-bench-ok"
WARMUP = 20

#: Runs inside a pod: ``direct HOST PORT N`` | ``http HOST PORT N`` | ``connect HOST PORT N``
#: (each: N timed requests on fresh connections, prints {"us": [...]}) or ``hold HOST PORT N``
#: (opens N tunnels, prints {"open": k}, holds them until a line on stdin, prints {"closed": k}).
IN_POD = r"""
import json, os, socket, sys, time
mode, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
proxy = os.environ.get("HTTP_PROXY", "").split("://", 1)[-1].rstrip("/")

def head(s):
    data = b""
    while b"\r\n\r\n" not in data:
        c = s.recv(65536)
        if not c:
            raise RuntimeError("closed before the head: %r" % data[:200])
        data += c
    h, rest = data.split(b"\r\n\r\n", 1)
    lines = h.split(b"\r\n")
    status = int(lines[0].split(b" ")[1])
    length = 0
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    return status, length, rest

def response(s):
    status, length, rest = head(s)
    while len(rest) < length:
        c = s.recv(65536)
        if not c:
            break
        rest += c
    if status != 200:
        raise RuntimeError("status %d" % status)

def tunnel():
    ph, pp = proxy.rsplit(":", 1)
    s = socket.create_connection((ph, int(pp)), timeout=10)
    s.sendall(("CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (host, port, host, port)).encode())
    status, _, rest = head(s)
    if status != 200 or rest:
        raise RuntimeError("CONNECT answered %d" % status)
    return s

def once():
    if mode == "direct":
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(("GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % host).encode())
    elif mode == "http":
        ph, pp = proxy.rsplit(":", 1)
        s = socket.create_connection((ph, int(pp)), timeout=10)
        s.sendall(("GET http://%s:%d/ HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n"
                   % (host, port, host, port)).encode())
    else:
        s = tunnel()
        s.sendall(("GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % host).encode())
    response(s)
    s.close()

if mode == "hold":
    socks = [tunnel() for _ in range(n)]
    print(json.dumps({"open": len(socks)}), flush=True)
    sys.stdin.readline()
    for s in socks:
        s.close()
    print(json.dumps({"closed": len(socks)}), flush=True)
    sys.exit(0)
for _ in range(WARMUP):
    once()
out = []
for _ in range(n):
    t0 = time.perf_counter()
    once()
    out.append((time.perf_counter() - t0) * 1e6)
print(json.dumps({"us": out}))
""".replace("WARMUP", str(WARMUP))


def series(core: client.CoreV1Api, ns: str, pod: str, mode: str, host: str, port: int, n: int):
    out = exec_in(core, ns, pod, "python3", "-c", IN_POD, mode, host, str(port), str(n))
    try:
        return json.loads(out.strip().splitlines()[-1])["us"]
    except (ValueError, KeyError, IndexError):
        raise RuntimeError(f"{mode} in {pod}: {out[-2000:]}") from None


class Stats:
    """The proxy pod's memory from the kubelet's stats summary (through the API server)."""

    def __init__(self, api: client.ApiClient, node: str, ns: str, pod: str):
        self.api, self.node, self.ns, self.pod = api, node, ns, pod

    def read(self) -> dict[str, Any]:
        """Container working set, pod working set and RSS; ``time`` = the older sample's."""
        resp = client.CoreV1Api(self.api).connect_get_node_proxy_with_path(
            self.node, "stats/summary", _preload_content=False, _request_timeout=30
        )
        for pod in json.loads(resp.data).get("pods", []):
            ref = pod["podRef"]
            if ref["namespace"] == self.ns and ref["name"] == self.pod:
                containers = {c["name"]: c for c in pod.get("containers") or []}
                box = (containers.get("proxy") or {}).get("memory") or {}
                whole = pod.get("memory") or {}
                times = [datetime.fromisoformat(m["time"]) for m in (box, whole) if m.get("time")]
                return {
                    "time": min(times),
                    "ws": box.get("workingSetBytes", 0),
                    "pod_ws": whole.get("workingSetBytes", 0),
                    "pod_rss": whole.get("rssBytes", 0),
                }
        raise RuntimeError(f"no stats for pod {self.ns}/{self.pod} yet")

    def sample_after(self, moment: datetime, limit: float = 30) -> dict[str, Any]:
        """The first sample taken after ``moment`` (or the latest after ``limit`` seconds)."""
        deadline = time.monotonic() + limit
        while True:
            with contextlib.suppress(RuntimeError, KeyError):
                sample = self.read()
                if sample["time"] > moment or time.monotonic() > deadline:
                    return sample
            if time.monotonic() > deadline + 30:
                raise RuntimeError(f"no stats for {self.ns}/{self.pod}")
            time.sleep(1)


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=10)[q - 1]


def memory(
    api: client.ApiClient, core: client.CoreV1Api, ns: str, sandbox_pod: str, port: int, n: int
) -> str:
    proxies = [
        p for p in core.list_namespaced_pod(ns, label_selector=PROXY_SELECTOR).items
        if p.status.phase == "Running" and not p.metadata.deletion_timestamp
    ]  # fmt: skip
    proxy_pod = proxies[0]
    stats = Stats(api, proxy_pod.spec.node_name, ns, proxy_pod.metadata.name)
    # Idle: two fresh samples (the second one's distance from the first is the refresh period).
    first = stats.sample_after(datetime.now(UTC))
    idle = stats.sample_after(first["time"])
    period = (idle["time"] - first["time"]).total_seconds()
    ws = client.CoreV1Api(api)
    resp = stream(
        ws.connect_get_namespaced_pod_exec, sandbox_pod, ns,
        command=["python3", "-c", IN_POD, "hold", "allowed.test", str(port), str(n)],
        stdin=True, stdout=True, stderr=True, tty=False, _preload_content=False,
    )  # fmt: skip
    out = ""
    try:
        deadline = time.monotonic() + 120
        while '"open"' not in out and resp.is_open() and time.monotonic() < deadline:
            resp.update(timeout=1)
            out += resp.read_stdout() if resp.peek_stdout() else ""
            out += resp.read_stderr() if resp.peek_stderr() else ""
        if '"open"' not in out:
            raise RuntimeError(f"tunnels not opened: {out[-2000:]}")
        opened = json.loads(out.strip().splitlines()[-1])["open"]
        opened_at = datetime.now(UTC)
        held = stats.sample_after(opened_at)
        waited = (held["time"] - opened_at).total_seconds()
        resp.write_stdin("close\n")
        while '"closed"' not in out and resp.is_open() and time.monotonic() < deadline:
            resp.update(timeout=1)
            out += resp.read_stdout() if resp.peek_stdout() else ""
    finally:
        resp.close()
    mib = 1024 * 1024

    def figures(x: dict[str, Any]) -> str:
        return (
            f"container working set {x['ws'] / mib:.1f} MiB (pod: working set "
            f"{x['pod_ws'] / mib:.1f}, RSS {x['pod_rss'] / mib:.1f})"
        )

    return (
        f"proxy pod memory (kubelet stats summary, a sample every ~{period:.0f} s):\n"
        f"    idle                         {figures(idle)}\n"
        f"    {opened} open tunnels{'':<{16 - len(str(opened))}}{figures(held)}\n"
        f"    added per tunnel: {(held['ws'] - idle['ws']) / 1024 / opened:.1f} KiB container "
        f"working set, {(held['pod_rss'] - idle['pod_rss']) / 1024 / opened:.1f} KiB pod RSS "
        f"(sample taken {waited:.0f} s after the tunnels were open)"
    )


def run(
    api: client.ApiClient, runtime: str, image: str, outside: Outside, n: int, concurrency: int
) -> None:
    core = client.CoreV1Api(api)
    config = config_with_managed_proxy(runtime, image, outside)
    with bench_namespace(api, f"bench-egress-{runtime}", config) as kit:
        ns = kit.ns
        kit.scope()
        kit.sandbox(
            "bench", image=PYTHON, requires=["exec"], egress="allowlist",
            egressAllow=["allowed.test"],
        )  # fmt: skip
        unrestricted_pod(core, ns, "direct", runtime, outside)
        obj = kit.wait_condition("bench", reasons=("Ready",), status="True", timeout=180)
        sbx = obj["status"]["servedBy"]["name"]

        port = outside.port
        direct = series(core, ns, "direct", "direct", outside.address, port, n)
        via_http = series(core, ns, sbx, "http", "allowed.test", port, n)
        via_connect = series(core, ns, sbx, "connect", "allowed.test", port, n)
        d = statistics.median(direct)
        print(f"egress proxy in the cluster, {runtime}: {n} sequential requests each, fresh "
              "connections, timed inside the pods")  # fmt: skip
        print(f"  {'direct GET (unrestricted pod, server by IP)':<46} median {d:6.0f} us "
              f"(p90 {pct(direct, 9):6.0f})")  # fmt: skip
        for name, values in (
            ("proxied HTTP (absolute-form GET)", via_http),
            ("proxied CONNECT + GET through the tunnel", via_connect),
        ):
            m = statistics.median(values)
            print(f"  {name:<46} median {m:6.0f} us (p90 {pct(values, 9):6.0f})   added "
                  f"{m - d:6.0f} us   x{m / d:.2f}")  # fmt: skip
        try:
            print("  " + memory(api, core, ns, sbx, port, concurrency), flush=True)
        except Exception as exc:  # a figure, not a test: say what failed and go on
            print(f"  proxy pod memory: not measured ({type(exc).__name__}: {exc})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--runtime", action="append", choices=["runc", "gvisor"])
    args = parser.parse_args()
    kubeconfig = os.environ.get("KUBECONFIG") or str(LOCAL_KUBECONFIG)
    os.environ["KUBECONFIG"] = kubeconfig
    api = config.new_client_from_config(config_file=kubeconfig)
    image = build_operator_image()
    with serve_http_in_thread(BODY, backlog=1024) as port:
        outside = Outside(node_address(client.CoreV1Api(api)), port, BODY.decode())
        try:
            for runtime in args.runtime or ["runc", "gvisor"]:
                requests, concurrency = min(args.requests, 20000), min(args.concurrency, 500)
                run(api, runtime, image, outside, requests, concurrency)
        finally:
            api.close()


if __name__ == "__main__":
    main()
