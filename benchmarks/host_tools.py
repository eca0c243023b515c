"""Host-tool call latency on the local cluster, per runtime (runc, gVisor): one call's round trip
timed inside the guest, and what a whole run costs on the host, with zero calls and with N.

    .venv/bin/python benchmarks/host_tools.py [--calls 50] [--runs 3] [--runtimes runc,gvisor]
    .venv/bin/python benchmarks/host_tools.py --smoke          # what CI runs: runc, 3 calls
    .venv/bin/python benchmarks/host_tools.py --runtimes local # local processes, no cluster

Each runtime gets one plain pod (the python image, no operator) in a namespace of the
benchmark's own, deleted at the end; the calls go through the real channel
(:func:`sandbox_operator.client.hosttools.channel.run_with_host_tools`) and the registry's door.
The tool is trivial (it returns its argument), so the figures are the channel's own cost: the
guest writes a request file, the host's long-poll exec sees it and returns its bytes, the host
answers through the door, the next poll exec writes the answer back (and confirms it landed), the
guest sees the file: one exec per call. Rows:

* ``call (guest)``: one call, ``time.perf_counter()`` around ``host.call`` inside the program;
* ``run, 0 calls (host)``: a run whose program makes no call (setup, start, exit, cleanup);
* ``run, N calls (host)``: a run whose program makes N calls;
* ``per call (host)``: (N-call run - median 0-call run) / N.

Columns: median, p90 and the number of samples, in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures.pods import plain_pod

from sandbox_operator.client import Sandbox, SandboxClient, pod_dataplane
from sandbox_operator.client.hosttools import (
    HostToolRegistry,
    HostToolsWarning,
    host_tool,
    reclaim_run,
    run_with_host_tools,
)
from sandbox_operator.contract import Capability, SandboxSpec

REPO = Path(__file__).resolve().parents[1]
DEFAULT_KUBECONFIG = Path.home() / ".cache/sandbox-operator/state/kubeconfig"
PYTHON = "sandbox-operator.dev/python:1"
REQUIRES = frozenset(
    {Capability.EXEC, Capability.FILES_IN, Capability.FILES_OUT, Capability.HOST_TOOLS}
)
SPEC = SandboxSpec(kind="bench", image=PYTHON, work_dir="/workspace", requires=REQUIRES)

#: The program: N calls of a trivial tool, each timed in the guest; one JSON line of results.
PROGRAM = """\
import json, time
import sandbox_host_tools as host

N = {calls}
samples = []
for i in range(N):
    start = time.perf_counter()
    answer = host.ping(value=i)
    samples.append(time.perf_counter() - start)
    assert answer == i, (answer, i)
print("SAMPLES " + json.dumps(samples), flush=True)
"""

ROWS = ("call (guest)", "run, 0 calls (host)", "run, N calls (host)", "per call (host)")


def pod_manifest(name: str, runtime_class: str) -> dict[str, Any]:
    """The e2e tests' plain sandbox pod (tests/fixtures/pods.py), with the python image."""
    return plain_pod(
        name,
        runtime_class,
        PYTHON,
        pull_policy="IfNotPresent",
        resources={
            "requests": {"cpu": "100m", "memory": "64Mi"},
            "limits": {"cpu": "1", "memory": "256Mi"},
        },
    )


def registry() -> HostToolRegistry:
    reg = HostToolRegistry(max_calls_per_run=100_000)

    @host_tool(source=None, sink=None, identity=None)
    async def ping(value: int) -> int:
        return value

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostToolsWarning)
        reg.register(ping)
    return reg


def kubectl(kubeconfig: str, *args: str, stdin: str | None = None) -> None:
    subprocess.run(
        ["kubectl", "--kubeconfig", kubeconfig, *args],
        input=stdin,
        check=True,
        capture_output=True,
        text=True,
    )


@asynccontextmanager
async def pod_sandbox(runtime: str, namespace: str, kubeconfig: str) -> AsyncIterator[Sandbox]:
    name = f"hosttools-{runtime}"
    await asyncio.to_thread(
        kubectl,
        kubeconfig,
        "-n",
        namespace,
        "apply",
        "-f",
        "-",
        stdin=json.dumps(pod_manifest(name, runtime)),
    )
    await asyncio.to_thread(
        kubectl,
        kubeconfig,
        "-n",
        namespace,
        "wait",
        "--for=condition=Ready",
        f"pod/{name}",
        "--timeout=180s",
    )
    client = await SandboxClient.from_kubeconfig(namespace, kubeconfig=kubeconfig)
    try:
        yield Sandbox(SPEC, pod_dataplane(client.ws_api, namespace, name), name=name)
    finally:
        await client.close()


@asynccontextmanager
async def local_sandbox() -> AsyncIterator[Sandbox]:
    from sandbox_operator.testing.fakes import local_sandbox as make

    with tempfile.TemporaryDirectory(prefix="bench-hosttools-") as root:
        yield make(root=root, requires=REQUIRES)


async def timed_run(
    sandbox: Sandbox, reg: HostToolRegistry, calls: int
) -> tuple[float, list[float]]:
    """One run of the program with ``calls`` calls: its host-side seconds and the guest's
    per-call seconds."""
    run = reg.start_run(limits_in=sandbox.spec.files_in, limits_out=sandbox.spec.files_out)
    start = time.perf_counter()
    result = await run_with_host_tools(
        sandbox, PROGRAM.format(calls=calls), run, timeout=120 + calls
    )
    elapsed = time.perf_counter() - start
    await reclaim_run(sandbox, result.layout)
    if result.exit_code != 0:
        raise RuntimeError(f"the program failed ({result.exit_code}): {result.stderr_text[-800:]}")
    line = next(ln for ln in result.stdout_text.splitlines() if ln.startswith("SAMPLES "))
    samples = [float(s) for s in json.loads(line[len("SAMPLES ") :])]
    delivered = [r for r in result.records if r.delivery.value == "delivered" and r.completed]
    if len(samples) != calls or len(delivered) != calls or not result.transport_removed:
        raise RuntimeError(
            f"{len(samples)} samples, {len(delivered)} delivered records for {calls} calls "
            f"(transport removed: {result.transport_removed})"
        )
    return elapsed, samples


async def bench(sandbox: Sandbox, calls: int, runs: int) -> dict[str, list[float]]:
    reg = registry()
    await timed_run(sandbox, reg, 1)  # warm-up: page cache, python start-up, the exec path
    out: dict[str, list[float]] = {row: [] for row in ROWS}
    for _ in range(max(runs, 3)):
        elapsed, _ = await timed_run(sandbox, reg, 0)
        out["run, 0 calls (host)"].append(elapsed)
    fixed = statistics.median(out["run, 0 calls (host)"])
    for _ in range(runs):
        elapsed, samples = await timed_run(sandbox, reg, calls)
        out["call (guest)"] += samples
        out["run, N calls (host)"].append(elapsed)
        out["per call (host)"].append((elapsed - fixed) / calls)
    return out


def p90(values: list[float]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[8]


def print_table(results: dict[str, dict[str, list[float]]], calls: int) -> None:
    print(f"host-tool call latency (ms), N = {calls} calls per run")
    print(f"{'':<34}{'median':>10}{'p90':>10}{'samples':>10}")
    print("-" * 64)
    for runtime, rows in results.items():
        for row in ROWS:
            values = rows[row]
            label = f"{runtime}: {row.replace('N calls', f'{calls} calls')}"
            print(
                f"{label:<34}{statistics.median(values) * 1000:>10.1f}"
                f"{p90(values) * 1000:>10.1f}{len(values):>10}"
            )


async def run_all(
    runtimes: list[str], namespace: str, kubeconfig: str, calls: int, runs: int
) -> dict[str, dict[str, list[float]]]:
    results: dict[str, dict[str, list[float]]] = {}
    for runtime in runtimes:
        print(f"[{runtime}] {runs} run(s) of {calls} calls ...", file=sys.stderr, flush=True)
        if runtime == "local":
            async with local_sandbox() as sandbox:
                results[runtime] = await bench(sandbox, calls, runs)
        else:
            async with pod_sandbox(runtime, namespace, kubeconfig) as sandbox:
                results[runtime] = await bench(sandbox, calls, runs)
    return results


def main(argv: list[str] | None = None) -> dict[str, dict[str, list[float]]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--calls", type=int, default=50, help="host-tool calls per run")
    parser.add_argument("--runs", type=int, default=3, help="runs of --calls calls per runtime")
    parser.add_argument("--runtimes", default="runc,gvisor", help="runtime classes, or local")
    parser.add_argument("--smoke", action="store_true", help="runc, 3 calls, 1 run (CI)")
    parser.add_argument(
        "--kubeconfig", default=os.environ.get("KUBECONFIG", str(DEFAULT_KUBECONFIG))
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.calls, args.runs = 3, 1
        if args.runtimes == parser.get_default("runtimes"):
            args.runtimes = "runc"
    if args.calls < 1 or args.runs < 1:
        parser.error("--calls and --runs must be at least 1")
    runtimes = [r for r in args.runtimes.split(",") if r]
    # t-*, labelled served-by like the test suite's: on the local cluster `make up`'s release
    # serves every other namespace, and a second operator there would fight this script's.
    namespace = f"t-bench-hosttools-{secrets.token_hex(3)}"
    cluster = any(r != "local" for r in runtimes)
    if cluster:
        kubectl(args.kubeconfig, "create", "namespace", namespace)
        kubectl(
            args.kubeconfig, "label", "namespace", namespace, "sandbox-operator.dev/served-by=bench"
        )
    try:
        results = asyncio.run(run_all(runtimes, namespace, args.kubeconfig, args.calls, args.runs))
    finally:
        if cluster:
            subprocess.run(
                ["kubectl", "--kubeconfig", args.kubeconfig, "delete", "namespace", namespace],
                capture_output=True,
                timeout=300,
            )
    print_table(results, args.calls)
    return results


if __name__ == "__main__":
    main()
