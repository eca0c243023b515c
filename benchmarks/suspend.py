"""Suspend and resume latency on the local cluster, per runtime (runc, gVisor). Prints a table.

    .venv/bin/python benchmarks/suspend.py [--count 10] [--runtimes runc,gvisor]
    .venv/bin/python benchmarks/suspend.py --smoke          # CI: runc, count 2

Needs the local cluster (``make up``: the RuntimeClasses and the ``sandbox-local`` StorageClass
with its provisioner) and the CRDs applied (done here, server-side). It creates a namespace of its
own, runs the operator as a subprocess pinned to each runtime in turn (as
benchmarks/client_roundtrip.py does, with ``persistentStorage`` declared), and deletes the
namespace.

Per runtime, ``--count`` Sandboxes (busybox, storage 64Mi) are acquired one at a time through the
Python client; each writes a file into its work directory, then is suspended and resumed
``--cycles`` times (1), one Sandbox at a time:

* ``create -> Ready (storage)``: the client's ``acquire`` of a new Sandbox with storage (the PVC
  is provisioned and bound before its pod can start);
* ``suspend``: from the patch ``spec.suspended: true`` to the Sandbox reporting ``Ready=False``
  reason ``Suspended`` with no pod left (the pod's deletion seen by a poll of the pod);
* ``resume``: from the patch ``spec.suspended: false`` to ``Ready=True`` (a new pod on the same
  volume);
* ``file kept``: resumed Sandboxes whose file read back byte for byte.

Times are wall-clock seconds from just before the patch; the end is seen by polling the Sandbox
(and its pod) every 50 ms, so each figure is late by at most that much. p50 and p90 are
nearest-rank. Nothing is asserted here; the figures go in docs/performance-node.md.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import client_roundtrip

from sandbox_operator.client import SandboxClient
from sandbox_operator.contract import (
    GROUP,
    SANDBOX_PLURAL,
    VERSION,
    Capability,
    SandboxSpec,
)

REPO = Path(__file__).resolve().parents[1]
POLL = 0.05
SPEC = SandboxSpec.model_validate(
    {
        "kind": "bench",
        "image": "sandbox-operator.dev/busybox:1",
        "requires": [Capability.EXEC, Capability.FILES_IN, Capability.FILES_OUT],
        "resources": {
            "requests": {"cpu": "10m", "memory": "16Mi"},
            "limits": {"cpu": "500m", "memory": "128Mi"},
        },
        "storage": {"size": "64Mi"},
    }
)


def operator_config(runtime: str) -> dict[str, Any]:
    config = client_roundtrip.operator_config(runtime)
    for backend in config["backends"]:
        backend["declarations"] = {**backend["declarations"], "persistentStorage": True}
    return config


def nearest_rank(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _ready(obj: dict[str, Any]) -> tuple[str, str]:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("status")), str(cond.get("reason"))
    return "", ""


async def _patch_suspended(client: SandboxClient, name: str, value: bool) -> None:
    await client.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        client.namespace,
        SANDBOX_PLURAL,
        name,
        {"spec": {"suspended": value}},
        _content_type="application/merge-patch+json",  # type: ignore[call-arg]
    )


async def _read(client: SandboxClient, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = await client.custom.get_namespaced_custom_object(
        GROUP, VERSION, client.namespace, SANDBOX_PLURAL, name
    )
    return obj


async def _serving_pod(client: SandboxClient, name: str) -> str:
    status = (await _read(client, name)).get("status") or {}
    return str((status.get("servedBy") or {}).get("name") or "")


async def _pod_exists(client: SandboxClient, pod: str) -> bool:
    from kubernetes_asyncio.client import CoreV1Api
    from kubernetes_asyncio.client.exceptions import ApiException

    try:
        await CoreV1Api(client.api).read_namespaced_pod(pod, client.namespace)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


async def _until(check: Any, timeout: float, start: float) -> float:  # noqa: ASYNC109
    """Seconds from ``start`` until ``check()`` holds (polled every POLL seconds)."""
    while True:
        if await check():
            return time.perf_counter() - start
        if time.perf_counter() - start > timeout:
            raise TimeoutError("not reached in time")
        await asyncio.sleep(POLL)


async def bench_runtime(
    runtime: str, namespace: str, kubeconfig: str, count: int, cycles: int
) -> dict[str, list[float]]:
    client = await SandboxClient.from_kubeconfig(namespace, kubeconfig=kubeconfig)
    out: dict[str, list[float]] = {"create": [], "suspend": [], "resume": [], "kept": []}
    try:
        scope = await client.create_scope(
            scope="bench", thread_id=f"{runtime}-{secrets.token_hex(3)}"
        )
        for i in range(count):
            start = time.perf_counter()
            sandbox = await client.acquire(scope, f"bench/{runtime}/{i}", SPEC, timeout=300)
            out["create"].append(time.perf_counter() - start)
            data = os.urandom(4096)
            await sandbox.write_file("kept.bin", data)
            name = sandbox.name
            pod = await _serving_pod(client, name)
            await sandbox.close()
            for _ in range(cycles):

                async def suspended(pod: str = pod, name: str = name) -> bool:
                    obj = await _read(client, name)
                    return _ready(obj) == ("False", "Suspended") and not await _pod_exists(
                        client, pod
                    )

                begin = time.perf_counter()
                await _patch_suspended(client, name, True)
                out["suspend"].append(await _until(suspended, 180, begin))

                async def ready(name: str = name) -> bool:
                    return _ready(await _read(client, name)) == ("True", "Ready")

                begin = time.perf_counter()
                await _patch_suspended(client, name, False)
                out["resume"].append(await _until(ready, 300, begin))
                pod = await _serving_pod(client, name)
            resumed = await client.acquire(scope, f"bench/{runtime}/{i}", SPEC, timeout=300)
            out["kept"].append(1.0 if await resumed.read_file("kept.bin") == data else 0.0)
            await client.dispose(resumed)
        await client.delete_scope(scope, wait=True, timeout=180)
    finally:
        await client.close()
    return out


def table(results: dict[str, dict[str, list[float]]]) -> str:
    head = f"{'':<38}" + "".join(f"{rt:>22}" for rt in results)
    lines = [head, "-" * len(head)]

    def row(label: str, key: str) -> None:
        cells = []
        for values in results.values():
            v = values[key]
            cells.append(f"{nearest_rank(v, 0.5):.2f} / {nearest_rank(v, 0.9):.2f} (n={len(v)})")
        lines.append(f"{label:<38}" + "".join(f"{c:>22}" for c in cells))

    row("create -> Ready (storage) p50/p90 s", "create")
    row("suspend p50/p90 s", "suspend")
    row("resume -> Ready p50/p90 s", "resume")
    kept = "".join(f"{int(sum(v['kept']))}/{len(v['kept'])}".rjust(22) for v in results.values())
    lines.append(f"{'file kept across suspend':<38}{kept}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--cycles", type=int, default=1)
    parser.add_argument("--runtimes", default="runc,gvisor")
    parser.add_argument("--smoke", action="store_true", help="CI: runc, count 2")
    parser.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG", str(client_roundtrip.DEFAULT_KUBECONFIG)),
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.count, args.runtimes = 2, "runc"
    # t-*, labelled served-by like the test suite's: on the local cluster `make up`'s release
    # serves every other namespace, and a second operator there would fight this script's.
    namespace = f"t-bench-suspend-{secrets.token_hex(3)}"
    kubectl = ["kubectl", "--kubeconfig", args.kubeconfig]
    subprocess.run(
        [*kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds")],
        check=True,
        capture_output=True,
    )
    subprocess.run([*kubectl, "create", "namespace", namespace], check=True, capture_output=True)
    subprocess.run(
        [*kubectl, "label", "namespace", namespace, "sandbox-operator.dev/served-by=bench"],
        check=True,
        capture_output=True,
    )
    results: dict[str, dict[str, list[float]]] = {}
    try:
        for runtime in args.runtimes.split(","):
            with client_roundtrip.running_operator(
                runtime, namespace, args.kubeconfig, operator_config(runtime)
            ):
                results[runtime] = asyncio.run(
                    bench_runtime(runtime, namespace, args.kubeconfig, args.count, args.cycles)
                )
    finally:
        subprocess.run(
            [*kubectl, "delete", "namespace", namespace, "--wait=false"], capture_output=True
        )
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
