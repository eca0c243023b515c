"""Client round trips on the local cluster, per backend (runc, gVisor): acquire -> Ready (cold),
exec round trip, and write/read throughput for 1 KiB and 8 MiB files. Prints medians.

Then ``exec(["true"])`` on one python-image Sandbox through a plain ``pods/exec`` per command and
through an exec session (docs/exec-session.md), alternating, side by side: p50, p90 and their
ratio (``session_open_s``: the session's first command, which opens it).

    .venv/bin/python benchmarks/client_roundtrip.py [--iterations 5] [--backends runc,gvisor]
    .venv/bin/python benchmarks/client_roundtrip.py --smoke     # one of each, a few samples

Needs the local cluster (`make cluster-up`) with the CRDs applied; it creates a namespace of its
own, runs the operator as a subprocess pinned to each backend in turn, and deletes the namespace.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from sandbox_operator.client import (
    Sandbox,
    SandboxClient,
    SessionExecTransport,
    pod_session_factory,
)
from sandbox_operator.contract import Capability, SandboxSpec

REPO = Path(__file__).resolve().parents[1]
DEFAULT_KUBECONFIG = Path.home() / ".cache/sandbox-operator/state/kubeconfig"
DECLARATIONS = {
    "capabilities": ["exec", "run_code", "files_in", "files_out", "files_list", "files_delete"],
    "egressModes": ["closed"],
    "osFamilies": ["posix"],
    "isolationScopes": ["conversation", "call"],
}
BACKENDS = {
    "runc": {"runtimeClassName": "runc", "isolation": "container"},
    "gvisor": {"runtimeClassName": "gvisor", "isolation": "hardened_container"},
}
SPEC = SandboxSpec.model_validate(
    {
        "kind": "bench",
        "image": "sandbox-operator.dev/busybox:1",
        "requires": [Capability.EXEC, Capability.FILES_IN, Capability.FILES_OUT],
        "resources": {
            "requests": {"cpu": "10m", "memory": "16Mi"},
            "limits": {"cpu": "1", "memory": "256Mi"},
        },
    }
)


SPEC_PY = SPEC.model_copy(update={"image": "sandbox-operator.dev/python:1", "kind": "bench-py"})


def operator_config(backend: str) -> dict[str, Any]:
    return {
        "hostPolicy": {"minIsolation": "container", "selection": "fixed", "pinnedBackend": backend},
        "backends": [
            {"name": backend, "type": "runtimeClass", "declarations": DECLARATIONS}
            | BACKENDS[backend]
        ],
        "operator": {"resyncSeconds": 2, "disposeTimeoutSeconds": 20},
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_operator(
    backend: str, namespace: str, kubeconfig: str, config: dict[str, Any] | None = None
) -> Iterator[None]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "config.yaml"
        cfg.write_text(yaml.safe_dump(config or operator_config(backend)))
        port = _free_port()
        log = open(Path(tmp) / "operator.log", "wb")  # noqa: SIM115
        argv = [sys.executable, "-m", "sandbox_operator.cli", "run", "--config", str(cfg)]
        argv += ["--namespace", namespace, "--standalone", "--health-host", "127.0.0.1"]
        argv += ["--health-port", str(port), "--log-level", "warning"]
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, KUBECONFIG=kubeconfig),
            cwd=REPO,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("operator did not become healthy") from None
                    time.sleep(0.3)
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


async def bench_session(plain: Sandbox, session: Sandbox, samples: int) -> dict[str, float]:
    """``exec(["true"])`` on one Sandbox, plain and through a session, alternating."""
    opened = await timed(lambda: session.exec(["true"]))
    plane = getattr(session.dataplane, "inner", session.dataplane)  # under the handle's ServedPlane
    transport = getattr(plane, "transport", None)
    if not isinstance(transport, SessionExecTransport) or transport.unavailable:
        raise RuntimeError("the exec session did not open: nothing to compare")
    times: dict[str, list[float]] = {"plain": [], "session": []}
    for _ in range(samples):
        times["plain"].append(await timed(lambda: plain.exec(["true"])))
        times["session"].append(await timed(lambda: session.exec(["true"])))
    out = {"session_open_s": opened}
    for way, values in times.items():
        out[f"true_{way}_p50_ms"] = 1000 * quantile(values, 0.5)
        out[f"true_{way}_p90_ms"] = 1000 * quantile(values, 0.9)
    out["true_p50_ratio"] = out["true_plain_p50_ms"] / out["true_session_p50_ms"]
    out["true_p90_ratio"] = out["true_plain_p90_ms"] / out["true_session_p90_ms"]
    return out


async def bench_backend(
    backend: str, namespace: str, kubeconfig: str, iterations: int, samples: int = 50
) -> dict[str, float]:
    client = await SandboxClient.from_kubeconfig(namespace, kubeconfig=kubeconfig)
    sessions = await SandboxClient.from_kubeconfig(
        namespace, kubeconfig=kubeconfig, dataplanes={"Pod": pod_session_factory}
    )
    results: dict[str, list[float]] = {}
    figures: dict[str, float] = {}
    try:
        scope = await client.create_scope(
            scope="bench", thread_id=f"{backend}-{secrets.token_hex(3)}"
        )
        sandboxes = []
        for i in range(iterations):
            start = time.perf_counter()
            sb = await client.acquire(scope, f"bench/{backend}/{i}", SPEC, timeout=300)
            results.setdefault("acquire_ready_s", []).append(time.perf_counter() - start)
            sandboxes.append(sb)
        sb = sandboxes[0]
        for _ in range(max(iterations * 4, 10)):
            results.setdefault("exec_roundtrip_s", []).append(
                await timed(lambda: sb.exec(["true"]))
            )
        small = os.urandom(1024)
        big = os.urandom(8 * 1024 * 1024)
        for _ in range(max(iterations * 2, 5)):
            t = await timed(lambda: sb.write_file("small.bin", small))
            results.setdefault("write_1KiB_s", []).append(t)
            t = await timed(lambda: sb.read_file("small.bin"))
            results.setdefault("read_1KiB_s", []).append(t)
        for _ in range(max(iterations, 3)):
            t = await timed(lambda: sb.write_file("big.bin", big))
            results.setdefault("write_8MiB_MiBps", []).append(8 / t)
            t = await timed(lambda: sb.read_file("big.bin"))
            results.setdefault("read_8MiB_MiBps", []).append(8 / t)
        plain = await client.acquire(scope, f"bench/{backend}/py", SPEC_PY, timeout=300)
        session = await sessions.acquire(scope, f"bench/{backend}/py", SPEC_PY, timeout=300)
        assert session.name == plain.name  # one Sandbox, two ways in
        figures = await bench_session(plain, session, samples)
        await client.delete_scope(scope, wait=True, timeout=180)
    finally:
        await sessions.close()
        await client.close()
    return {name: statistics.median(values) for name, values in results.items()} | figures


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--backends", default="runc,gvisor")
    parser.add_argument("--samples", type=int, default=50, help="exec(true) samples per way")
    parser.add_argument("--smoke", action="store_true", help="one of each, 5 samples (CI)")
    parser.add_argument(
        "--kubeconfig", default=os.environ.get("KUBECONFIG", str(DEFAULT_KUBECONFIG))
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.iterations, args.samples = 1, 5
    # t-*, labelled served-by like the test suite's: on the local cluster `make up`'s release
    # serves every other namespace, and a second operator there would fight this script's.
    namespace = f"t-bench-client-{secrets.token_hex(3)}"
    kubectl = ["kubectl", "--kubeconfig", args.kubeconfig]
    subprocess.run(
        [*kubectl, "apply", "--server-side", "-f", str(REPO / "crds")],
        check=True,
        capture_output=True,
    )
    subprocess.run([*kubectl, "create", "namespace", namespace], check=True, capture_output=True)
    subprocess.run(
        [*kubectl, "label", "namespace", namespace, "sandbox-operator.dev/served-by=bench"],
        check=True,
        capture_output=True,
    )
    all_results: dict[str, dict[str, float]] = {}
    try:
        for backend in args.backends.split(","):
            with running_operator(backend, namespace, args.kubeconfig):
                all_results[backend] = asyncio.run(
                    bench_backend(
                        backend, namespace, args.kubeconfig, args.iterations, args.samples
                    )
                )
    finally:
        subprocess.run(
            [*kubectl, "delete", "namespace", namespace, "--wait=false"], capture_output=True
        )
    metrics = sorted({m for r in all_results.values() for m in r})
    print(f"{'median':<20}" + "".join(f"{b:>12}" for b in all_results))
    for metric in metrics:
        row = "".join(f"{all_results[b].get(metric, float('nan')):>12.4f}" for b in all_results)
        print(f"{metric:<20}{row}")
    return all_results


if __name__ == "__main__":
    main()
