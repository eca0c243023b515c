"""The ports router's cost on the local cluster (runc): a request's round trip through the router
beside the same request straight to the pod's IP, measured side by side in one run, and the
time from a request to a suspended Sandbox until it is answered. Prints a table.

    .venv/bin/python benchmarks/router.py [--requests 200] [--wakes 5]
    .venv/bin/python benchmarks/router.py --smoke          # CI: 10 requests, 1 wake-up

Needs the local cluster (``make up``: the CRDs, the runc RuntimeClass, the ``sandbox-local``
StorageClass). It creates a namespace of its own (``t-bench-router-*``, labelled as the tests'
namespaces), runs the operator as a subprocess serving it (as benchmarks/suspend.py does) and the
router as a process on this machine (tests/fixtures/router.py: the node reaches pod IPs, so both
paths start from the same host), and deletes the namespace.

One Sandbox (busybox, storage 64Mi) serves ``httpd`` on its declared port ``web`` (8080). Its
conversation's agent (a ServiceAccount the SandboxScope names, granted ``connect`` on its
Sandboxes' ports by the operator's Role) holds the token the router is called with.

* ``direct`` and ``router``: ``GET /index.html`` on a new HTTP/1.1 connection each (the router
  serves one request per connection), alternately straight to ``<pod IP>:8080`` and through
  ``/<namespace>/<sandbox>/web/index.html``, after 5 unmeasured of each. Review answers are
  cached (``reviewCacheSeconds``, 10 s here, refreshed as the run goes): a token's first request
  also costs a TokenReview and a SubjectAccessReview, not in these figures.
* ``wake``: the Sandbox suspended (``spec.suspended: true``, then its pod gone), then one GET
  through the router timed from just before it is sent until its answer (200) is read: the
  router's resume, the operator's new pod on the same volume, httpd starting.

Times are wall-clock (``time.perf_counter``); p50 and p90 are nearest-rank. Nothing is asserted
here but that every answer is 200; the figures go in docs/ports.md and docs/performance.md.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import math
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import client_roundtrip
from kubernetes import client, config
from tests.fixtures.agents import token
from tests.fixtures.cluster import TEST_NAMESPACE_LABELS
from tests.fixtures.router import RouterProcess, running_router
from tests.fixtures.suspend import STORAGE
from tests.fixtures.suspend import config as suspend_config

GROUP, VERSION = "sandbox-operator.dev", "v1alpha1"
SERVE = (
    "mkdir -p /workspace/www && echo served-through-the-router > /workspace/www/index.html && "
    "httpd -p 8080 -h /workspace/www; "
    "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"
)
WARMUP = 5


def nearest_rank(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def get(host: str, port: int, path: str, token: str | None = None, timeout: float = 30) -> float:
    """Seconds for one GET on a new connection; raises unless the answer is 200."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    start = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers)
        answer = conn.getresponse()
        body = answer.read()
    finally:
        conn.close()
    elapsed = time.perf_counter() - start
    if answer.status != 200:
        raise RuntimeError(f"GET {path}: {answer.status} {body[:200]!r}")
    return elapsed


def until(what: str, timeout: float, check: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.2)
    return value


class Bench:
    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.ns = namespace

    def sandbox(self) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.ns, "sandboxes", "web"
        )
        return obj

    def ready(self, reason: str | None = None) -> dict[str, Any] | None:
        obj = self.sandbox()
        for cond in (obj.get("status") or {}).get("conditions") or ():
            if cond.get("type") == "Ready":
                ok = cond.get("status") == ("False" if reason else "True")
                if ok and (reason is None or cond.get("reason") == reason):
                    return obj
        return None

    def pod_ip(self) -> str | None:
        served = (self.sandbox().get("status") or {}).get("servedBy") or {}
        with contextlib.suppress(client.ApiException):
            pod = self.core.read_namespaced_pod(served.get("name", ""), self.ns)
            return str(pod.status.pod_ip) if pod.status.pod_ip else None
        return None

    def dispose(self) -> None:
        """Delete the conversation (its Sandbox goes with it) and wait until both are gone, while
        the operator still runs: a namespace deleted after it stopped would keep them, and
        itself, for ever (their finalizers)."""
        with contextlib.suppress(client.ApiException):
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.ns, "sandboxscopes", "conv"
            )

        def gone() -> bool:
            for plural in ("sandboxes", "sandboxscopes"):
                listed: dict[str, Any] = self.custom.list_namespaced_custom_object(
                    GROUP, VERSION, self.ns, plural
                )
                if listed["items"]:
                    return False
            return True

        until("the conversation disposed", 120, gone)

    def create(self) -> None:
        self.core.create_namespaced_service_account(self.ns, {"metadata": {"name": "agent"}})
        scope = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxScope",
            "metadata": {"name": "conv"},
            "spec": {"scope": "bench", "threadId": "t-1", "agentServiceAccounts": ["agent"]},
        }
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, "sandboxscopes", scope)
        spec = {
            "scopeRef": "conv",
            "agentDir": "agents/web",
            "kind": "shell",
            "image": "sandbox-operator.dev/busybox:1",
            "workDir": "/workspace",
            "requires": ["exec"],
            "resources": {
                "requests": {"cpu": "10m", "memory": "16Mi"},
                "limits": {"cpu": "500m", "memory": "128Mi"},
            },
            "ports": [{"name": "web", "port": 8080}],
            "storage": STORAGE,
        }
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Sandbox",
            "metadata": {"name": "web"},
            "spec": spec,
        }
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, "sandboxes", body)

    def suspend(self) -> None:
        pod = ((self.sandbox().get("status") or {}).get("servedBy") or {}).get("name", "")
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.ns, "sandboxes", "web", {"spec": {"suspended": True}}
        )
        until("Suspended", 120, lambda: self.ready("Suspended"))

        def gone() -> bool:
            try:
                self.core.read_namespaced_pod(pod, self.ns)
            except client.ApiException as exc:
                return exc.status == 404
            return False

        until("the pod gone", 120, gone)


def measure(
    bench: Bench, router: RouterProcess, agent: str, requests: int, wakes: int
) -> dict[str, list[float]]:
    until("Ready", 180, bench.ready)
    path = f"/{bench.ns}/web/web/index.html"
    # httpd may still be starting, and the operator's Role may not name the Sandbox yet.
    until("the first answer", 60, lambda: router.request(path, agent, timeout=10)[0] == 200)
    ip = until("the pod's IP", 60, bench.pod_ip)
    out: dict[str, list[float]] = {"direct": [], "router": [], "wake": []}
    for i in range(WARMUP + requests):
        direct = get(ip, 8080, "/index.html")
        routed = get("127.0.0.1", router.port, path, agent)
        if i >= WARMUP:
            out["direct"].append(direct)
            out["router"].append(routed)
    for _ in range(wakes):
        bench.suspend()
        out["wake"].append(get("127.0.0.1", router.port, path, agent, timeout=300))
    return out


def table(results: dict[str, list[float]], commit: str) -> str:
    direct, routed, wake = results["direct"], results["router"], results["wake"]
    lines = [
        f"ports router, runc, one Sandbox (commit {commit})",
        f"{'':<44}{'median':>10}{'p90':>10}{'n':>6}",
        "-" * 70,
    ]
    for label, values in (
        ("GET direct to the pod IP (ms)", direct),
        ("GET through the router (ms)", routed),
    ):
        p50, p90 = nearest_rank(values, 0.5) * 1000, nearest_rank(values, 0.9) * 1000
        lines.append(f"{label:<44}{p50:>10.2f}{p90:>10.2f}{len(values):>6}")
    ratio50 = nearest_rank(routed, 0.5) / nearest_rank(direct, 0.5)
    ratio90 = nearest_rank(routed, 0.9) / nearest_rank(direct, 0.9)
    lines.append(f"{'router / direct':<44}{ratio50:>10.2f}{ratio90:>10.2f}{len(routed):>6}")
    p50, p90 = nearest_rank(wake, 0.5), nearest_rank(wake, 0.9)
    label = "request to a suspended Sandbox -> answer (s)"
    lines.append(f"{label:<44}{p50:>10.2f}{p90:>10.2f}{len(wake):>6}")
    return "\n".join(lines)


@contextlib.contextmanager
def namespace(core: client.CoreV1Api) -> Iterator[str]:
    name = f"t-bench-router-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": name, "labels": TEST_NAMESPACE_LABELS}})
    try:
        until("the default ServiceAccount", 60, lambda: _has_default_sa(core, name))
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(name)


def _has_default_sa(core: client.CoreV1Api, ns: str) -> bool:
    try:
        core.read_namespaced_service_account("default", ns)
    except client.ApiException:
        return False
    return True


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--smoke", action="store_true", help="CI: 10 requests, 1 wake-up")
    parser.add_argument("--requests", type=int, default=200, help="GETs each way")
    parser.add_argument("--wakes", type=int, default=5, help="suspend-then-request rounds")
    kubeconfig = os.environ.get("KUBECONFIG") or str(client_roundtrip.DEFAULT_KUBECONFIG)
    parser.add_argument("--kubeconfig", default=kubeconfig)
    args = parser.parse_args(argv)
    if args.smoke:
        args.requests, args.wakes = 10, 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    api = config.new_client_from_config(config_file=args.kubeconfig)
    core = client.CoreV1Api(api)
    cfg = suspend_config("runc")
    cfg["backends"][0]["pod"]["keepAliveCommand"] = ["/bin/sh", "-c", SERVE]
    cfg["router"] = {"baseUrl": "https://sandboxes.example.test"}
    commit = os.popen("git rev-parse --short HEAD").read().strip() or "unknown"
    with (
        namespace(core) as ns,
        client_roundtrip.running_operator("runc", ns, args.kubeconfig, cfg),
        tempfile.TemporaryDirectory() as tmp,
    ):
        bench = Bench(api, ns)
        try:
            bench.create()
            agent = token(core, ns, "agent")
            settings = {"wakeTimeoutSeconds": 240, "reviewCacheSeconds": 10}
            with running_router(args.kubeconfig, ns, Path(tmp), **settings) as router:
                try:
                    results = measure(bench, router, agent, args.requests, args.wakes)
                except BaseException:
                    print(f"--- router log:\n{router.log()}", file=sys.stderr)
                    raise
        finally:
            bench.dispose()
    print(table(results, commit))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
