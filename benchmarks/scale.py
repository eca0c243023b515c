"""Scale benchmark: the operator with thousands of Sandboxes on kwok's fake nodes, and (with
``--real-node``) its overhead on the real local node under runc and gVisor. Prints tables.

    .venv/bin/python benchmarks/scale.py [--sizes 100,1000,10000] [--idle-seconds 60]
    .venv/bin/python benchmarks/scale.py --smoke [--real-node]  # CI: N=20, short idle, ~1-2 min
    .venv/bin/python benchmarks/scale.py --sizes 100 --real-node
    .venv/bin/python benchmarks/scale.py --sizes '' --ceiling 1000   # the API server alone
    .venv/bin/python benchmarks/scale.py --cleanup          # remove what a killed run left
    .venv/bin/python benchmarks/scale.py --sizes 1000 --idle-seconds 10 --agent-sandbox

Needs the local cluster (``make cluster-up``) or ``$KUBECONFIG`` pointing at a cluster that has
kwok's fake nodes and the ``kwok`` RuntimeClass. On the local cluster the script brings kwok up
itself (``hack/cluster.py kwok up``) and down again at the end if it started it.

One size N (fake nodes):

* one fresh namespace, the CRDs applied, the operator started as a subprocess serving it
  (``python -m sandbox_operator.cli run --standalone``, like the e2e fixtures) with a single
  backend ``kwok`` (RuntimeClass ``kwok``, isolation ``container``, host floor ``container``).
  One namespace by default: kopf then holds one watch per kind, as a cluster-wide operator does,
  instead of one per namespace and kind; ``--namespaces 10`` spreads the scopes (one each) over
  10 namespaces to show that cost;
* 10 SandboxScopes, then N Sandboxes over them (N/10 each), created by ``--concurrency``
  POSTs in flight at once. Watches on the Sandboxes and their pods timestamp every transition
  as the watch sees it: created -> Admitted=True -> Ready=True, pod bound to a node -> Ready;
* the operator idle for ``--idle-seconds`` with all N Ready: its API requests/s and response
  bytes/s (its Prometheus counters ``sandbox_operator_api_requests_total`` and
  ``sandbox_operator_api_response_bytes_total`` on ``--metrics-port``; "n/a" while the CLI has
  no such flag), the API server's own ``apiserver_request_total`` summed over every client
  ("all clients": the operator, kwok, the scheduler, the controller-manager, this script's
  watches), the operator's CPU % and RSS from /proc;
* disposal of one scope: delete SandboxScope ``scope-0`` (N/10 Sandboxes), time until all of
  its Sandboxes are gone, and the API requests that took;
* delete-all: every remaining scope and Sandbox deleted at once (concurrent DELETEs), time until
  no Sandbox is left, and the API requests that took;
* with ``--agent-sandbox``: kubernetes-sigs/agent-sandbox's controller side by side, in the same
  run after the operator's legs. Its release (``AGENT_SANDBOX_VERSION``) is built once with
  ``go install`` from its Go module into ~/.cache/sandbox-operator/bin/agent-sandbox-<version>/,
  its Sandbox CRD applied from the module's source, and the controller started as a local
  process with its defaults (leader election off, no metrics or probe port). N of its Sandboxes,
  with the operator's pod spec (as the bare pods have it) as their pod template, in a namespace
  of their own: all Ready, then all N deleted at once as above, time until none is left (its
  Sandboxes carry no finalizer: their pods go afterwards, by owner reference and the garbage
  collector; the time until the last pod is gone is a row too). The operator's delete-all
  deletes the N - N/10 Sandboxes the scope disposal left, and 9 scopes. Its CRD
  (``sandboxes.agents.x-k8s.io``, cluster-scoped) is deleted at the end, because while installed it
  makes ``kubectl get sandboxes`` ambiguous.
  The controllers' own cost side by side (#40 item 6): CPU ms per Sandbox to make N Ready (first
  POST to all Ready), to delete them (the operator's scope disposal plus its delete-all: every
  Sandbox once; agent-sandbox's delete-all) and both, and each one's RSS with all N Ready, with
  the ratio operator / agent-sandbox.

The table also gives the CPU each cluster process (hack/cluster.py's pid files: API server,
etcd, scheduler, controller-manager, kwok, kube-router, ...) and this script spent in the create
phase, as a share of one core: where a large run's time goes.

``--ceiling N`` (no operator, one namespace): N Sandbox POSTs alone, then N more each followed
by one status write (an Admitted condition, the least an admission can cost), ``--concurrency``
in flight: what this API server accepts by itself, the bound under any admission rate here.

``--real-node`` (runc and gVisor, the real node; one operator with both backends, scope "gvisor"
raising its floor to hardened_container): (a) ``--rounds`` (3) rounds of a burst of 40 Sandboxes
and of 40 bare pods with the very pod spec the operator produced (copied from one of its pods,
without its labels and owner), created directly in the same run, the order alternating between
rounds: median time until all are Ready, p50/p90 per object, and the ratio; the CPU seconds
each process spent; the API server's writes per object (``apiserver_request_total``, every
client, write verbs by resource and subresource) in the create phase (first POST to last Ready)
and in the cleanup (first DELETE until all is gone), Sandboxes against bare pods; the operator's
RSS after each Sandbox burst (it should not grow from burst to burst); (b) 100 idle
Sandboxes per runtime (fewer if the node's 110-pod limit has no room), all Ready: memory per
sandbox (the node's working set from the kubelet's stats summary before vs after, /proc/meminfo's
MemAvailable before vs after on the local cluster, and the sandbox pods' own pod-level working
set), divided by the count, and create->Ready p50/p90.

Caveats: "all clients" and the node-level memory count everything else the cluster does at the
time (another test suite, another operator): measure on a quiet cluster. kube-router's policy
controller writes rules for every pod a NetworkPolicy selects (the namespace's egress policy of
each backend and egress mode; also fake pods), which shows in its CPU column. Run one instance at
a time: a run starts by deleting what earlier runs left.

Everything the script creates lives in namespaces labelled ``sandbox-operator.dev/bench=scale``
and is deleted at the end, also on Ctrl-C or an error (``--cleanup`` deletes what a killed run
left). Every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import os
import re
import secrets
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.fixtures.cluster import LOCAL_KUBECONFIG, LOCAL_STATE  # noqa: E402
from tests.fixtures.operator import OperatorProcess  # noqa: E402

from sandbox_operator import naming  # noqa: E402

GROUP, VERSION = "sandbox-operator.dev", "v1alpha1"
CLUSTER_PY = ROOT / "hack" / "cluster.py"
BUSYBOX = "sandbox-operator.dev/busybox:1"
BENCH_LABEL = "sandbox-operator.dev/bench"  # = "scale" on every namespace this script makes
RUN_LABEL = "sandbox-operator.dev/bench-run"
BARE_LABEL = "sandbox-operator.dev/bench-bare"
MANAGED = "app.kubernetes.io/managed-by"
KWOK_RUNTIME_CLASS = "kwok"
SCOPES = 10
DECLARATIONS = {
    "capabilities": ["exec", "run_code", "files_in", "files_out", "files_list", "files_delete"],
    "egressModes": ["closed"],
    "osFamilies": ["posix"],
    "isolationScopes": ["conversation", "call"],
}
# Long enough that nothing expires or times out while a large run is being measured.
LIFETIME = {"startupTimeoutSeconds": 3600, "ttlSeconds": 86400, "idleTimeoutSeconds": 86400}
# Cluster processes whose CPU time is reported per phase (hack/cluster.py's pid files).
COMPONENTS = (
    "kube-apiserver",
    "etcd",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "kube-router",
    "kubelet",
    "containerd",
)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def say(msg: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def pct(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0-100, nearest rank); nan for no values."""
    data = sorted(values)
    if not data:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(data)))
    return data[min(rank, len(data)) - 1]


# --------------------------------------------------------------------------------------------
# Prometheus text


_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str, names: Iterable[str]) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples of the named metrics in Prometheus text format: name -> [(labels, value)]."""
    wanted = set(names)
    out: dict[str, list[tuple[dict[str, str], float]]] = {n: [] for n in wanted}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m or m.group(1) not in wanted:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)].append((dict(_LABEL.findall(m.group(2) or "")), value))
    return out


@dataclass
class Counters:
    """Counter totals at one moment; ``None`` when the endpoint did not answer."""

    requests: float | None = None
    bytes: float | None = None
    by_kind: Counter[str] = field(default_factory=Counter)  # "verb resource" -> requests

    def minus(self, before: Counters) -> Counters:
        if self.requests is None or before.requests is None:
            return Counters()
        nbytes = None
        if self.bytes is not None and before.bytes is not None:
            nbytes = self.bytes - before.bytes
        kinds = Counter(self.by_kind)
        kinds.subtract(before.by_kind)
        return Counters(self.requests - before.requests, nbytes, +kinds)


def operator_counters(text: str) -> Counters:
    m = parse_metrics(
        text,
        ("sandbox_operator_api_requests_total", "sandbox_operator_api_response_bytes_total"),
    )
    reqs = m["sandbox_operator_api_requests_total"]
    if not reqs:
        return Counters()
    kinds: Counter[str] = Counter()
    for labels, v in reqs:
        code = labels.get("code", "")
        code = "" if code.startswith("2") else f" {code}"  # failures apart (409, 404, 429, ...)
        kinds[f"{labels.get('verb', '?')} {labels.get('resource', '?')}{code}"] += int(v)
    nbytes = m["sandbox_operator_api_response_bytes_total"]
    return Counters(sum(v for _, v in reqs), sum(v for _, v in nbytes) if nbytes else None, kinds)


#: The verbs of apiserver_request_total that write (a watch, get or list reads).
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})


def apiserver_writes(text: str) -> Counter[str]:
    """The API server's write requests so far, every client, by "verb resource[/subresource]"."""
    reqs = parse_metrics(text, ("apiserver_request_total",))["apiserver_request_total"]
    out: Counter[str] = Counter()
    for labels, v in reqs:
        verb = labels.get("verb", "?")
        if verb not in WRITE_VERBS:
            continue
        sub = labels.get("subresource", "")
        out[f"{verb} {labels.get('resource', '?')}{'/' + sub if sub else ''}"] += int(v)
    return out


def apiserver_counters(text: str) -> Counters:
    reqs = parse_metrics(text, ("apiserver_request_total",))["apiserver_request_total"]
    if not reqs:
        return Counters()
    kinds: Counter[str] = Counter()
    for labels, v in reqs:
        kinds[f"{labels.get('verb', '?')} {labels.get('resource', '?')}"] += int(v)
    return Counters(sum(v for _, v in reqs), None, kinds)


# --------------------------------------------------------------------------------------------
# The API server, asynchronously (httpx with the kubeconfig's credentials)


class Kube:
    def __init__(self, kubeconfig: str, concurrency: int) -> None:
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
        if cfg.verify_ssl:
            ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
        else:
            ctx = ssl._create_unverified_context()
        if cfg.cert_file and cfg.key_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        headers = {"Accept": "application/json"}
        token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
        if token:
            headers["Authorization"] = token if " " in token else f"Bearer {token}"
        self.host = cfg.host
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self.http = httpx.AsyncClient(
            base_url=cfg.host, verify=ctx, headers=headers, limits=limits, timeout=60
        )
        # Watches hold their connections: a client of their own, without a read timeout.
        self.watch_http = httpx.AsyncClient(
            base_url=cfg.host, verify=ctx, headers=headers, timeout=httpx.Timeout(None, connect=10)
        )

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        content = None
        if body is not None:
            content = body if isinstance(body, str | bytes) else json.dumps(body)
        resp = await self.http.request(
            method, path, content=content, params=params, headers={"Content-Type": content_type}
        )
        try:
            return resp.status_code, resp.json()
        except ValueError:
            return resp.status_code, resp.text

    async def text(self, path: str) -> str:
        resp = await self.http.get(path, headers={"Accept": "text/plain"})
        resp.raise_for_status()
        return resp.text

    async def watch(
        self,
        path: str,
        on_event: Callable[[str, dict[str, Any], float], None],
        params: dict[str, str] | None = None,
    ) -> None:
        """List, then watch from there until cancelled; re-list on 410 Gone. ``on_event(type,
        object, monotonic time the event was read)``; the list's items arrive as ADDED, and an
        object a re-list no longer has (deleted while the watch was broken, e.g. while the API
        server's storage re-initialised) as DELETED, with the last state seen of it."""
        rv = ""
        known: dict[str, dict[str, Any]] = {}  # uid -> the last state seen

        def seen(kind: str, obj: dict[str, Any], t: float) -> None:
            uid = str((obj.get("metadata") or {}).get("uid", ""))
            if kind == "DELETED":
                known.pop(uid, None)
            elif uid:
                known[uid] = obj
            on_event(kind, obj, t)

        while True:
            try:
                if not rv:
                    code, listing = await self.request("GET", path, params=params)
                    if code != 200:
                        raise RuntimeError(f"list {path}: HTTP {code} {str(listing)[:300]}")
                    now = time.monotonic()
                    items = listing.get("items") or []
                    listed = {str((i.get("metadata") or {}).get("uid", "")) for i in items}
                    for uid in [u for u in known if u not in listed]:
                        seen("DELETED", known[uid], now)
                    for item in items:
                        seen("ADDED", item, now)
                    rv = listing["metadata"]["resourceVersion"]
                query = dict(params or {})
                query.update(
                    watch="1", resourceVersion=rv, allowWatchBookmarks="true", timeoutSeconds="300"
                )
                async with self.watch_http.stream("GET", path, params=query) as resp:
                    if resp.status_code != 200:
                        await resp.aread()
                        rv = "" if resp.status_code == 410 else rv
                        await asyncio.sleep(0.5)
                        continue
                    async for line in resp.aiter_lines():
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        kind, obj = event.get("type"), event.get("object") or {}
                        if kind == "ERROR":
                            rv = "" if obj.get("code") == 410 else rv
                            break
                        rv = obj.get("metadata", {}).get("resourceVersion") or rv
                        if kind != "BOOKMARK":
                            seen(kind, obj, time.monotonic())
            except asyncio.CancelledError:
                raise
            except (httpx.HTTPError, json.JSONDecodeError, RuntimeError) as exc:
                say(f"watch {path}: {type(exc).__name__}: {exc}; again")
                await asyncio.sleep(1)

    async def aclose(self) -> None:
        await self.http.aclose()
        await self.watch_http.aclose()


def sbx_path(ns: str, name: str = "", plural: str = "sandboxes") -> str:
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{plural}"
    return f"{base}/{name}" if name else base


async def gather_limited(limit: int, jobs: Iterable[Callable[[], Awaitable[Any]]]) -> list[Any]:
    sem = asyncio.Semaphore(limit)

    async def one(job: Callable[[], Awaitable[Any]]) -> Any:
        async with sem:
            return await job()

    return await asyncio.gather(*(one(j) for j in jobs))


async def wait_until(
    what: str,
    done: Callable[[], bool],
    limit: float,
    progress: Callable[[], str] | None = None,
    every: float = 10,
    poll: float = 0.2,
) -> bool:
    """Poll ``done`` (every ``poll`` s) until true or ``limit`` seconds; print ``progress()``
    every ``every`` s."""
    start = time.monotonic()
    last = start
    while not done():
        now = time.monotonic()
        if now - start > limit:
            say(f"  {what}: not reached in {limit:.0f}s" + (f" ({progress()})" if progress else ""))
            return False
        if progress is not None and now - last >= every:
            say(f"  {what}: {progress()} ({now - start:.0f}s)")
            last = now
        await asyncio.sleep(poll)
    return True


# --------------------------------------------------------------------------------------------
# What the watches saw


@dataclass
class Box:
    """One Sandbox: monotonic times of what happened to it."""

    ns: str
    name: str
    scope: str
    posted: float | None = None
    admitted: float | None = None
    ready: float | None = None
    gone: float | None = None
    refused: str | None = None
    backend: str | None = None


@dataclass
class PodSeen:
    added: float | None = None
    bound: float | None = None
    ready: float | None = None
    gone: float | None = None
    node: str | None = None


def _condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return dict(c)
    return None


class Tracker:
    def __init__(self, namespaces: Iterable[str]) -> None:
        self.namespaces = set(namespaces)
        self.boxes: dict[tuple[str, str], Box] = {}
        self.pods: dict[tuple[str, str], PodSeen] = {}
        self.last_event = time.monotonic()

    def box(self, ns: str, name: str, scope: str = "") -> Box:
        key = (ns, name)
        if key not in self.boxes:
            self.boxes[key] = Box(ns, name, scope)
        return self.boxes[key]

    def on_sandbox(self, kind: str, obj: dict[str, Any], t: float) -> None:
        meta = obj.get("metadata") or {}
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        if ns not in self.namespaces:
            return
        self.last_event = t
        box = self.box(ns, name, (obj.get("spec") or {}).get("scopeRef", ""))
        if kind == "DELETED":
            box.gone = box.gone or t
            return
        adm = _condition(obj, "Admitted")
        if adm and adm.get("status") == "True":
            box.admitted = box.admitted or t
        elif adm and adm.get("status") == "False" and not box.refused:
            box.refused = f"{adm.get('reason')}: {adm.get('message', '')[:200]}"
        ready = _condition(obj, "Ready")
        if ready and ready.get("status") == "True":
            box.ready = box.ready or t
        box.backend = (obj.get("status") or {}).get("backend") or box.backend

    def on_pod(self, kind: str, obj: dict[str, Any], t: float) -> None:
        meta = obj.get("metadata") or {}
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        if ns not in self.namespaces:
            return
        self.last_event = t
        seen = self.pods.setdefault((ns, name), PodSeen())
        seen.added = seen.added or t
        if kind == "DELETED":
            seen.gone = seen.gone or t
            return
        node = (obj.get("spec") or {}).get("nodeName")
        if node:
            seen.bound = seen.bound or t
            seen.node = node
        ready = _condition(obj, "Ready")
        if ready and ready.get("status") == "True":
            seen.ready = seen.ready or t

    def of(self, names: Iterable[tuple[str, str]]) -> list[Box]:
        return [self.boxes[k] for k in names if k in self.boxes]

    def pods_of(self, keys: Iterable[tuple[str, str]]) -> list[PodSeen]:
        """The pods of these Sandboxes (named by the operator's naming rule)."""
        return [
            self.pods[(ns, naming.pod_name(name))]
            for ns, name in keys
            if (ns, naming.pod_name(name)) in self.pods
        ]


# --------------------------------------------------------------------------------------------
# Processes: the operator's and the cluster's CPU and memory from /proc


def cpu_seconds(pid: int) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MiB; nan when the process is gone."""
    vals = {"VmRSS": math.nan, "VmHWM": math.nan}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in vals:
                vals[key] = int(rest.split()[0]) / 1024
    return vals["VmRSS"], vals["VmHWM"]


def component_pids() -> dict[str, int]:
    """pids of the local cluster's processes (hack/cluster.py's pid files), when local."""
    out = {}
    for name in COMPONENTS:
        with contextlib.suppress(OSError, ValueError, KeyError):
            rec = json.loads((LOCAL_STATE / "pids" / f"{name}.json").read_text())
            if Path(f"/proc/{rec['pid']}").exists():
                out[name] = int(rec["pid"])
    return out


@dataclass
class Snapshot:
    t: float
    op: Counters
    api: Counters
    cpu: dict[str, float]  # process -> CPU seconds ("operator", components, "benchmark")


class Probe:
    """Reads the operator's and the API server's counters and the CPU times, at one moment."""

    def __init__(self, kube: Kube, op_pid: int, metrics_url: str | None) -> None:
        self.kube, self.op_pid, self.metrics_url = kube, op_pid, metrics_url
        self.components = component_pids()

    async def snap(self) -> Snapshot:
        op = Counters()
        if self.metrics_url:
            try:
                async with httpx.AsyncClient(timeout=10) as h:
                    resp = await h.get(self.metrics_url)
                if resp.status_code == 200:
                    op = operator_counters(resp.text)
            except httpx.HTTPError:
                pass
        api = Counters()
        with contextlib.suppress(httpx.HTTPError):
            api = apiserver_counters(await self.kube.text("/metrics"))
        cpu = {"operator": cpu_seconds(self.op_pid)}
        cpu.update({n: cpu_seconds(p) for n, p in self.components.items()})
        cpu["benchmark"] = sum(os.times()[:2])
        return Snapshot(time.monotonic(), op, api, {k: v for k, v in cpu.items() if v is not None})


@dataclass
class Phase:
    """What happened between two snapshots."""

    seconds: float
    op: Counters
    api: Counters
    cpu: dict[str, float]  # CPU seconds spent in the phase

    @classmethod
    def between(cls, a: Snapshot, b: Snapshot) -> Phase:
        cpu = {k: b.cpu[k] - a.cpu[k] for k in b.cpu if k in a.cpu}
        return cls(b.t - a.t, b.op.minus(a.op), b.api.minus(a.api), cpu)


# --------------------------------------------------------------------------------------------
# Namespaces, CRDs, kwok


#: Its namespaces are t-* and carry this label, like the test suite's: on the local cluster `make
#: up`'s release serves every other namespace, and a second operator there would fight this one.
SERVED_BY = "sandbox-operator.dev/served-by"


def ns_body(name: str, run_id: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {BENCH_LABEL: "scale", RUN_LABEL: run_id, SERVED_BY: "bench"},
        },
    }


async def create_namespaces(kube: Kube, names: list[str], run_id: str) -> None:
    for name in names:
        code, obj = await kube.request("POST", "/api/v1/namespaces", ns_body(name, run_id))
        if code != 201:
            raise RuntimeError(f"namespace {name}: HTTP {code} {str(obj)[:300]}")
    # Pods are refused until the namespace's default ServiceAccount exists.
    for name in names:
        ok = False
        for _ in range(120):
            code, _obj = await kube.request(
                "GET", f"/api/v1/namespaces/{name}/serviceaccounts/default"
            )
            if code == 200:
                ok = True
                break
            await asyncio.sleep(0.5)
        if not ok:
            raise RuntimeError(f"namespace {name}: no default ServiceAccount after 60s")


async def apply_crds(kube: Kube) -> None:
    await apply_crd_files(kube, sorted((ROOT / "crds").glob("*.yaml")))


async def apply_crd_files(kube: Kube, paths: Iterable[Path]) -> None:
    """Apply CRDs (server-side) and wait until each is Established."""
    for path in paths:
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        code, obj = await kube.request(
            "PATCH",
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}",
            path.read_text(),
            params={"fieldManager": "bench-scale", "force": "true"},
            content_type="application/apply-patch+yaml",
        )
        if code not in (200, 201):
            raise RuntimeError(f"CRD {name}: HTTP {code} {str(obj)[:300]}")
        for _ in range(120):
            code, obj = await kube.request(
                "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            )
            conds = {
                c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []
            }
            if conds.get("Established") == "True":
                break
            await asyncio.sleep(0.5)
        else:
            raise RuntimeError(f"CRD {name} not Established after 60s")


async def kwok_ready(kube: Kube) -> int:
    """Fake nodes Ready (0 when the RuntimeClass `kwok` is missing)."""
    code, _ = await kube.request("GET", f"/apis/node.k8s.io/v1/runtimeclasses/{KWOK_RUNTIME_CLASS}")
    if code != 200:
        return 0
    code, nodes = await kube.request("GET", "/api/v1/nodes", params={"labelSelector": "type=kwok"})
    if code != 200:
        return 0
    return sum(
        1
        for n in nodes.get("items", [])
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in n.get("status", {}).get("conditions", [])
        )
    )


def cluster_py(*args: str, timeout: float) -> None:
    say(f"$ hack/cluster.py {' '.join(args)}")
    proc = subprocess.run(
        [sys.executable, str(CLUSTER_PY), *args], text=True, capture_output=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"hack/cluster.py {' '.join(args)} exited {proc.returncode}:\n"
            f"{(proc.stdout + proc.stderr)[-3000:]}"
        )


# --------------------------------------------------------------------------------------------
# The operator


def operator_run_flags() -> str:
    """The operator CLI's `run --help` (which flags this checkout has)."""
    out = subprocess.run(
        [sys.executable, "-m", "sandbox_operator.cli", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    return out.stdout


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: Every operator subprocess started, so that an interrupted run still stops them.
OPERATORS: list[Operator] = []


class Operator:
    """The operator subprocess (tests/fixtures/operator.py's OperatorProcess) for namespaces."""

    def __init__(
        self,
        config: dict[str, Any],
        namespaces: list[str],
        workdir: Path,
        kubeconfig: str,
        args: argparse.Namespace,
    ) -> None:
        cfg = workdir / "operator.yaml"
        cfg.write_text(yaml.safe_dump(config))
        extra = ["--standalone", "--log-level", args.operator_log_level]
        for ns in namespaces[1:]:
            extra += ["--namespace", ns]
        self.metrics_url: str | None = None
        if args.metrics:
            port = free_port()
            extra += ["--metrics-port", str(port)]
            if args.metrics_host:
                extra += ["--metrics-host", "127.0.0.1"]
            self.metrics_url = f"http://127.0.0.1:{port}/metrics"
        elif args.metrics_flag:
            extra += ["--metrics-port", "0"]  # not the default port: another operator may hold it
        self.proc = OperatorProcess(
            cfg, namespaces[0], workdir / "operator.log", kubeconfig, tuple(extra)
        )

    def start(self) -> Operator:
        OPERATORS.append(self)
        self.proc.start(wait=True)
        return self

    @property
    def pid(self) -> int:
        assert self.proc.proc is not None
        return self.proc.proc.pid

    def stop(self) -> None:
        self.proc.stop()


def operator_config(backends: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    config: dict[str, Any] = {
        "hostPolicy": {"minIsolation": "container", "selection": "perSpec"},
        "backends": backends,
    }
    if args.resync_seconds is not None:
        config["operator"] = {"resyncSeconds": args.resync_seconds}
    return config


def backend(name: str, runtime_class: str, isolation: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": "runtimeClass",
        "runtimeClassName": runtime_class,
        "isolation": isolation,
        "declarations": DECLARATIONS,
    }


def scope_body(name: str, index: int, run_id: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxScope",
        "metadata": {"name": name, "labels": {RUN_LABEL: run_id}},
        "spec": {"scope": "bench", "threadId": f"thread-{run_id}-{index}", **spec},
    }


def sandbox_body(name: str, scope: str, run_id: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": name, "labels": {RUN_LABEL: run_id}},
        "spec": {
            "scopeRef": scope,
            "agentDir": f"agents/{name}",
            "kind": "shell",
            "image": BUSYBOX,
            "workDir": "/workspace",
            "requires": ["exec"],
            "resources": {
                "requests": {"cpu": "10m", "memory": "16Mi"},
                "limits": {"cpu": "500m", "memory": "128Mi"},
            },
            "lifetime": LIFETIME,
        },
    }


async def create_sandboxes(
    kube: Kube, tracker: Tracker, keys: list[tuple[str, str, str]], run_id: str, concurrency: int
) -> tuple[float, list[str]]:
    """POST the Sandboxes (ns, name, scope), ``concurrency`` at a time; (seconds, errors)."""
    errors: list[str] = []

    async def post(ns: str, name: str, scope: str) -> None:
        box = tracker.box(ns, name, scope)
        box.posted = time.monotonic()
        try:
            code, obj = await kube.request("POST", sbx_path(ns), sandbox_body(name, scope, run_id))
        except httpx.HTTPError as exc:
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            return
        if code != 201:
            errors.append(f"{name}: HTTP {code} {str(obj)[:200]}")

    t0 = time.monotonic()
    await gather_limited(concurrency, [functools.partial(post, *k) for k in keys])
    return time.monotonic() - t0, errors


async def delete_all(kube: Kube, paths: list[str], concurrency: int) -> None:
    async def delete(path: str) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await kube.request("DELETE", path)

    await gather_limited(concurrency, [functools.partial(delete, p) for p in paths])


# --------------------------------------------------------------------------------------------
# One size on the fake nodes


@dataclass
class SizeResult:
    n: int
    namespaces: int
    post_seconds: float = math.nan
    post_errors: int = 0
    admitted: int = 0
    refused: int = 0
    ready: int = 0
    admit_span: float = math.nan
    admit_lat: list[float] = field(default_factory=list)
    ready_lat: list[float] = field(default_factory=list)
    bind_lat: list[float] = field(default_factory=list)
    pod_ready_lat: list[float] = field(default_factory=list)
    create: Phase | None = None
    idle: Phase | None = None
    rss: tuple[float, float] = (math.nan, math.nan)
    scope_n: int = 0
    scope_gone: int = 0
    scope_seconds: float = math.nan
    scope: Phase | None = None
    rest_n: int = 0
    rest_gone: int = 0
    rest_seconds: float = math.nan
    rest_lat: list[float] = field(default_factory=list)  # each Sandbox gone, after the first DELETE
    rest: Phase | None = None
    ready_after_last: float = math.nan  # the last Ready, seconds after the last POST
    # The same N pods created bare (the operator's pod spec, no Sandbox), after the Sandboxes:
    bare_ready: int = 0
    bare_ready_after_last: float = math.nan
    bare: Phase | None = None
    agent: AgentSandboxResult | None = None  # --agent-sandbox: its controller, the same delete-all
    notes: list[str] = field(default_factory=list)


async def run_size(
    kube: Kube, n: int, args: argparse.Namespace, kubeconfig: str, cleanup: list[str]
) -> SizeResult:
    run_id = f"{n}-{secrets.token_hex(3)}"
    namespaces = [f"t-bench-scale-{run_id}-{i}" for i in range(args.namespaces)]
    cleanup.extend(namespaces)
    result = SizeResult(n, len(namespaces))
    say(f"N={n}: namespaces {', '.join(namespaces)}")
    await create_namespaces(kube, namespaces, run_id)
    tracker = Tracker(namespaces)
    watches = [
        asyncio.create_task(
            kube.watch(
                f"/apis/{GROUP}/{VERSION}/sandboxes",
                tracker.on_sandbox,
                {"labelSelector": f"{RUN_LABEL}={run_id}"},
            )
        ),
        asyncio.create_task(
            kube.watch("/api/v1/pods", tracker.on_pod, {"labelSelector": f"{MANAGED}"})
        ),
        asyncio.create_task(
            kube.watch("/api/v1/pods", tracker.on_pod, {"labelSelector": BARE_LABEL})
        ),
    ]
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-scale-{n}-"))
    config = operator_config([backend("kwok", KWOK_RUNTIME_CLASS, "container")], args)
    op = Operator(config, namespaces, workdir, kubeconfig, args)
    try:
        op.start()
        probe = Probe(kube, op.pid, op.metrics_url)
        scopes = [(namespaces[i % len(namespaces)], f"scope-{i}") for i in range(SCOPES)]
        for i, (ns, name) in enumerate(scopes):
            code, obj = await kube.request(
                "POST", sbx_path(ns, plural="sandboxscopes"), scope_body(name, i, run_id)
            )
            if code != 201:
                raise RuntimeError(f"scope {name}: HTTP {code} {str(obj)[:300]}")
        keys = [(*scopes[j % SCOPES], f"sbx-{j:05d}") for j in range(n)]
        boxes = [(ns, name, scope) for ns, scope, name in keys]
        all_keys = [(ns, name) for ns, name, _ in boxes]

        # -- create -> Admitted -> Ready
        before = await probe.snap()
        say(f"N={n}: creating {n} Sandboxes over {SCOPES} scopes ({args.concurrency} in flight)")
        result.post_seconds, errors = await create_sandboxes(
            kube, tracker, boxes, run_id, args.concurrency
        )
        result.post_errors = len(errors)
        if errors:
            result.notes.append(f"{len(errors)} POST(s) failed, first: {errors[0]}")
        say(f"N={n}: {n - len(errors)} POSTed in {result.post_seconds:.1f}s")

        def settled() -> bool:
            return all(b.ready or b.refused for b in tracker.of(all_keys))

        def progress() -> str:
            bs = tracker.of(all_keys)
            pods = tracker.pods_of(all_keys)
            return (
                f"admitted {sum(1 for b in bs if b.admitted)}/{n}, "
                f"ready {sum(1 for b in bs if b.ready)}/{n}, "
                f"refused {sum(1 for b in bs if b.refused)}; pods: "
                f"{len(pods)} created, {sum(1 for p in pods if p.bound)} bound, "
                f"{sum(1 for p in pods if p.ready)} ready"
            )

        timeout = args.ready_timeout or 120 + 0.5 * n
        await wait_until(f"N={n} Ready", settled, timeout, progress)
        after = await probe.snap()
        result.create = Phase.between(before, after)
        bs = tracker.of(all_keys)
        result.admitted = sum(1 for b in bs if b.admitted)
        result.refused = sum(1 for b in bs if b.refused)
        result.ready = sum(1 for b in bs if b.ready)
        refusals = Counter(b.refused for b in bs if b.refused)
        if refusals:
            result.notes.append(f"refused: {refusals.most_common(1)[0]}")
        posted = [b.posted for b in bs if b.posted]
        admitted = [b.admitted for b in bs if b.admitted]
        if posted and admitted:
            result.admit_span = max(admitted) - min(posted)
        result.admit_lat = [b.admitted - b.posted for b in bs if b.admitted and b.posted]
        result.ready_lat = [b.ready - b.posted for b in bs if b.ready and b.posted]
        readies = [b.ready for b in bs if b.ready]
        if posted and len(readies) == n:
            result.ready_after_last = max(readies) - max(posted)
        template = None
        if boxes:
            ns_t, name_t, _ = boxes[0]
            code, obj = await kube.request(
                "GET", f"/api/v1/namespaces/{ns_t}/pods/{naming.pod_name(name_t)}"
            )
            template = obj if code == 200 else None
        for ns, name, _ in boxes:
            pod = tracker.pods.get((ns, naming.pod_name(name)))
            if pod and pod.added and pod.bound:
                result.bind_lat.append(pod.bound - pod.added)
            if pod and pod.bound and pod.ready:
                result.pod_ready_lat.append(pod.ready - pod.bound)
        say(f"N={n}: {progress()}")

        # -- idle
        await wait_until(
            "settle (no watch event for 3s)",
            lambda: time.monotonic() - tracker.last_event > 3,
            30,
        )
        say(f"N={n}: idle for {args.idle_seconds:.0f}s")
        before = await probe.snap()
        await asyncio.sleep(args.idle_seconds)
        after = await probe.snap()
        result.idle = Phase.between(before, after)
        result.rss = rss_mib(op.pid)

        # -- dispose one scope
        ns0, scope0 = scopes[0]
        mine = [(ns, name) for ns, name, scope in boxes if scope == scope0 and ns == ns0]
        result.scope_n = len(mine)
        say(f"N={n}: deleting SandboxScope {scope0} ({len(mine)} Sandboxes)")
        before = await probe.snap()
        await kube.request("DELETE", sbx_path(ns0, scope0, "sandboxscopes"))
        done = await wait_until(
            f"scope {scope0} disposed",
            lambda: all(b.gone for b in tracker.of(mine)),
            args.dispose_timeout or 120 + 0.2 * len(mine),
            lambda: f"{sum(1 for b in tracker.of(mine) if b.gone)}/{len(mine)} gone",
        )
        after = await probe.snap()
        result.scope = Phase.between(before, after)
        result.scope_gone = sum(1 for b in tracker.of(mine) if b.gone)
        result.scope_seconds = (after.t - before.t) if done else math.nan

        # -- delete everything else
        taken = set(mine)
        rest = [k for k in all_keys if k not in taken]
        result.rest_n = len(rest)
        say(f"N={n}: deleting the other {SCOPES - 1} scopes and {len(rest)} Sandboxes")
        before = await probe.snap()
        await delete_all(
            kube,
            [sbx_path(ns, name, "sandboxscopes") for ns, name in scopes[1:]]
            + [sbx_path(ns, name) for ns, name in rest],
            args.concurrency,
        )
        done = await wait_until(
            "delete-all",
            lambda: all(b.gone for b in tracker.of(rest)),
            args.dispose_timeout or 120 + 0.2 * len(rest),
            lambda: f"{sum(1 for b in tracker.of(rest) if b.gone)}/{len(rest)} gone",
        )
        after = await probe.snap()
        result.rest = Phase.between(before, after)
        result.rest_gone = sum(1 for b in tracker.of(rest) if b.gone)
        result.rest_seconds = (after.t - before.t) if done else math.nan
        result.rest_lat = [b.gone - before.t for b in tracker.of(rest) if b.gone]

        # -- the same N pods, bare: what the cluster spends without the operator's objects
        if template is not None:
            await bare_leg(kube, n, namespaces, template, tracker, probe, args, result)

        # -- agent-sandbox's controller: N of its Sandboxes with the same pod spec, deleted at once
        if args.agent_sandbox and template is not None:
            result.agent = await agent_sandbox_leg(kube, n, template, args, kubeconfig, cleanup)
    except Exception:
        print(f"--- operator log (tail), {op.proc.log_path}:\n{op.proc.log()[-4000:]}")
        raise
    finally:
        for w in watches:
            w.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
        await teardown(kube, namespaces, op)
    return result


async def bare_leg(
    kube: Kube,
    n: int,
    namespaces: list[str],
    template: dict[str, Any],
    tracker: Tracker,
    probe: Probe,
    args: argparse.Namespace,
    result: SizeResult,
) -> None:
    """N pods with the operator's pod spec, created directly (as many in flight), all Ready,
    then deleted: the create phase's time and CPU per process (kube-router's above all) beside
    the Sandboxes'."""
    names = [(namespaces[i % len(namespaces)], f"bare-{i:05d}") for i in range(n)]
    say(f"N={n}: the same {n} pods bare (no Sandbox)")
    posted: list[float] = []

    async def post(ns: str, name: str) -> None:
        posted.append(time.monotonic())
        code, obj = await kube.request(
            "POST", f"/api/v1/namespaces/{ns}/pods", bare_pod(template, name)
        )
        if code != 201:
            result.notes.append(f"bare pod {name}: HTTP {code} {str(obj)[:120]}")

    before = await probe.snap()
    await gather_limited(args.concurrency, [functools.partial(post, ns, nm) for ns, nm in names])
    await wait_until(
        f"N={n} bare pods Ready",
        lambda: all(k in tracker.pods and tracker.pods[k].ready for k in names),
        args.ready_timeout or 120 + 0.5 * n,
        lambda: f"{sum(1 for k in names if k in tracker.pods and tracker.pods[k].ready)}/{n}",
    )
    after = await probe.snap()
    result.bare = Phase.between(before, after)
    readies = [r for k in names if k in tracker.pods and (r := tracker.pods[k].ready)]
    result.bare_ready = len(readies)
    if posted and len(readies) == n:
        result.bare_ready_after_last = max(readies) - max(posted)
    await delete_all(
        kube, [f"/api/v1/namespaces/{ns}/pods/{nm}" for ns, nm in names], args.concurrency
    )
    await wait_until(
        f"N={n} bare pods gone",
        lambda: all(k not in tracker.pods or tracker.pods[k].gone for k in names),
        args.dispose_timeout or 120 + 0.2 * n,
    )


async def teardown(kube: Kube, namespaces: list[str], op: Operator | None) -> None:
    """Delete what is left while the operator still runs (its finalizers), stop it, strip any
    finalizer left, delete the namespaces. Bounded."""
    paths = []
    for ns in namespaces:
        for plural in ("sandboxscopes", "sandboxes"):
            with contextlib.suppress(httpx.HTTPError):
                code, obj = await kube.request("GET", sbx_path(ns, plural=plural))
                if code == 200:
                    paths += [sbx_path(ns, i["metadata"]["name"], plural) for i in obj["items"]]
    if paths and op is not None and op.proc.running:
        say(f"cleanup: deleting {len(paths)} leftover object(s) with the operator running")
        await delete_all(kube, paths, 32)

        async def left() -> int:
            count = 0
            for ns in namespaces:
                for plural in ("sandboxscopes", "sandboxes"):
                    with contextlib.suppress(httpx.HTTPError):
                        code, obj = await kube.request("GET", sbx_path(ns, plural=plural))
                        count += len(obj.get("items", [])) if code == 200 else 0
            return count

        deadline = time.monotonic() + 60 + 0.05 * len(paths)
        while time.monotonic() < deadline:
            if not await left():
                break
            await asyncio.sleep(1)
    if op is not None:
        op.stop()
    await strip_and_delete(kube, namespaces)


async def strip_and_delete(kube: Kube, namespaces: list[str]) -> None:
    patches = []
    for ns in namespaces:
        for plural in ("sandboxscopes", "sandboxes"):
            with contextlib.suppress(httpx.HTTPError):
                code, obj = await kube.request("GET", sbx_path(ns, plural=plural))
                if code == 200:
                    patches += [
                        sbx_path(ns, i["metadata"]["name"], plural)
                        for i in obj["items"]
                        if i["metadata"].get("finalizers")
                    ]

    async def strip(path: str) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await kube.request(
                "PATCH",
                path,
                {"metadata": {"finalizers": None}},
                content_type="application/merge-patch+json",
            )

    if patches:
        say(f"cleanup: removing finalizers from {len(patches)} object(s)")
        await gather_limited(32, [functools.partial(strip, p) for p in patches])
    for ns in namespaces:
        with contextlib.suppress(httpx.HTTPError):
            await kube.request("DELETE", f"/api/v1/namespaces/{ns}")
    say(f"cleanup: namespace(s) {', '.join(namespaces)} deleted")


# --------------------------------------------------------------------------------------------
# kubernetes-sigs/agent-sandbox's controller, side by side (--agent-sandbox)

#: The agent-sandbox release compared against, built from its Go module with `go install`.
AGENT_SANDBOX_MODULE = "sigs.k8s.io/agent-sandbox"
AGENT_SANDBOX_VERSION = "v1.0.1"
AGENT_SANDBOX_BIN = (
    LOCAL_STATE.parent
    / "bin"
    / f"agent-sandbox-{AGENT_SANDBOX_VERSION}"
    / "agent-sandbox-controller"
)
AS_GROUP, AS_VERSION = "agents.x-k8s.io", "v1beta1"


def agent_sandbox_build() -> tuple[Path, Path]:
    """The agent-sandbox controller's binary and its Sandbox CRD: ``go install`` of the release
    into the cache (once; minutes), the CRD from the module's source that ``go`` downloaded."""
    env = {**os.environ, "GOBIN": str(AGENT_SANDBOX_BIN.parent), "GOFLAGS": "-buildvcs=false"}
    ref = f"{AGENT_SANDBOX_MODULE}@{AGENT_SANDBOX_VERSION}"
    if not AGENT_SANDBOX_BIN.exists():
        say(f"agent-sandbox: go install {ref}/cmd/agent-sandbox-controller (once, minutes)")
        AGENT_SANDBOX_BIN.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["go", "install", f"{AGENT_SANDBOX_MODULE}/cmd/agent-sandbox-controller@{AGENT_SANDBOX_VERSION}"],  # noqa: E501
            env=env, check=True, timeout=1800, cwd=tempfile.gettempdir(),
        )  # fmt: skip
    out = subprocess.run(
        ["go", "mod", "download", "-json", ref],
        env=env, check=True, timeout=600, capture_output=True, text=True,
        cwd=tempfile.gettempdir(),
    )  # fmt: skip
    crd = Path(json.loads(out.stdout)["Dir"]) / "k8s" / "crds" / f"{AS_GROUP}_sandboxes.yaml"
    return AGENT_SANDBOX_BIN, crd


@dataclass
class AgentSandboxResult:
    """N of agent-sandbox's Sandboxes (the operator's pod spec as their pod template) made Ready
    by its controller, then all deleted at once."""

    n: int
    ready: int = 0
    ready_after_last: float = math.nan
    gone: int = 0
    seconds: float = math.nan  # the first DELETE until no Sandbox is left
    pods_seconds: float = math.nan  # ... until no pod is left (the garbage collector's)
    gone_lat: list[float] = field(default_factory=list)  # each gone, after the first DELETE
    phase: Phase | None = None
    create: Phase | None = None  # the first POST until all Ready (its controller's CPU)
    rss: tuple[float, float] = (math.nan, math.nan)  # its controller's, with all N Ready
    note: str = ""


def as_sandbox_body(name: str, template: dict[str, Any], run_id: str) -> dict[str, Any]:
    spec = bare_pod(template, name)["spec"]
    return {
        "apiVersion": f"{AS_GROUP}/{AS_VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": name, "labels": {RUN_LABEL: run_id}},
        "spec": {"podTemplate": {"metadata": {}, "spec": spec}},
    }


async def agent_sandbox_leg(
    kube: Kube,
    n: int,
    template: dict[str, Any],
    args: argparse.Namespace,
    kubeconfig: str,
    cleanup: list[str],
) -> AgentSandboxResult:
    """The same delete-all with agent-sandbox's controller in place of the operator: its
    Sandboxes carry no finalizer (their pods go by owner reference and the garbage collector),
    so what is timed is the API server deleting them while the controller, the garbage
    collector and kwok do their part. One namespace of its own, deleted at the end."""
    result = AgentSandboxResult(n)
    if isinstance(args.agent_sandbox, str):
        result.note = args.agent_sandbox
        return result
    binary, crd = args.agent_sandbox
    await apply_crd_files(kube, [crd])
    run_id = f"as-{n}-{secrets.token_hex(3)}"
    ns = f"t-bench-scale-{run_id}"
    cleanup.append(ns)
    await create_namespaces(kube, [ns], run_id)
    tracker = Tracker([ns])
    base = f"/apis/{AS_GROUP}/{AS_VERSION}/namespaces/{ns}/sandboxes"
    watches = [
        asyncio.create_task(kube.watch(base, tracker.on_sandbox)),
        asyncio.create_task(kube.watch(f"/api/v1/namespaces/{ns}/pods", tracker.on_pod)),
    ]
    log_path = Path(tempfile.mkdtemp(prefix="bench-scale-as-")) / "controller.log"
    log = log_path.open("wb")
    # Its defaults but leader election (one replica) and the two ports (0: none).
    proc = await asyncio.create_subprocess_exec(
        str(binary), "--leader-elect=false", "--metrics-bind-address=0",
        "--health-probe-bind-address=0",
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "KUBECONFIG": kubeconfig},
    )  # fmt: skip
    names = [f"as-{i:05d}" for i in range(n)]
    keys = [(ns, name) for name in names]
    try:
        probe = Probe(kube, proc.pid, None)
        say(f"agent-sandbox: controller pid {proc.pid} (log {log_path}); creating {n} Sandboxes")
        posted: list[float] = []
        created_from = await probe.snap()

        async def post(name: str) -> None:
            posted.append(time.monotonic())
            code, obj = await kube.request("POST", base, as_sandbox_body(name, template, run_id))
            if code != 201:
                result.note = f"POST {name}: HTTP {code} {str(obj)[:200]}"

        await gather_limited(args.concurrency, [functools.partial(post, nm) for nm in names])
        await wait_until(
            f"agent-sandbox N={n} Ready",
            lambda: sum(1 for b in tracker.of(keys) if b.ready) == n,
            args.ready_timeout or 120 + 0.5 * n,
            lambda: f"{sum(1 for b in tracker.of(keys) if b.ready)}/{n} Ready",
        )
        result.create = Phase.between(created_from, await probe.snap())
        readies = [b.ready for b in tracker.of(keys) if b.ready]
        result.ready = len(readies)
        if posted and len(readies) == n:
            result.ready_after_last = max(readies) - max(posted)
        await wait_until(
            "settle (no watch event for 3s)", lambda: time.monotonic() - tracker.last_event > 3, 30
        )
        result.rss = rss_mib(proc.pid)
        say(f"agent-sandbox: deleting its {n} Sandboxes at once")
        before = await probe.snap()
        await delete_all(kube, [f"{base}/{nm}" for nm in names], args.concurrency)
        done = await wait_until(
            "agent-sandbox delete-all",
            lambda: all(b.gone for b in tracker.of(keys)),
            args.dispose_timeout or 120 + 0.2 * n,
            lambda: f"{sum(1 for b in tracker.of(keys) if b.gone)}/{n} gone",
        )
        after = await probe.snap()
        result.phase = Phase.between(before, after)
        result.gone = sum(1 for b in tracker.of(keys) if b.gone)
        result.seconds = (after.t - before.t) if done else math.nan
        result.gone_lat = [b.gone - before.t for b in tracker.of(keys) if b.gone]
        pods = [k for k in tracker.pods if k[0] == ns]
        if pods and await wait_until(
            "agent-sandbox pods gone",
            lambda: all(tracker.pods[k].gone for k in pods),
            120 + 0.2 * n,
        ):
            result.pods_seconds = max((tracker.pods[k].gone or 0.0) for k in pods) - before.t
    except Exception:
        print(f"--- agent-sandbox controller log (tail), {log_path}:")
        print(log_path.read_text(errors="replace")[-4000:])
        raise
    finally:
        for w in watches:
            w.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        log.close()
        await strip_and_delete(kube, [ns])
        # Its CRD goes too: while it is installed, `kubectl get sandboxes` on this cluster may
        # name agent-sandbox's kind instead of the operator's (a test failed so).
        crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        code, _ = await kube.request("DELETE", f"{crds}/sandboxes.{AS_GROUP}")
        if code not in (200, 202, 404):
            say(f"agent-sandbox: its CRD not deleted (HTTP {code}): delete it by hand")
    return result


# --------------------------------------------------------------------------------------------
# --real-node


@dataclass
class Burst:
    what: str
    runtime: str
    count: int
    ready: int
    all_ready: float  # seconds from the first POST to the last Ready seen
    lat: list[float]  # per object: POST -> Ready
    cpu: dict[str, float] = field(default_factory=dict)  # process -> CPU seconds in the burst
    # The API server's writes (every client) from the first POST to the last Ready, and from the
    # first DELETE until everything is gone: "verb resource[/subresource]" -> requests.
    writes: Counter[str] = field(default_factory=Counter)
    cleanup_writes: Counter[str] = field(default_factory=Counter)
    operator_rss: float = math.nan  # MiB, after the burst's cleanup (Sandbox bursts)


@dataclass
class Idle:
    runtime: str
    count: int
    ready: int
    lat: list[float]
    ws_per: float  # bytes per sandbox, node working set (kubelet)
    avail_per: float  # bytes per sandbox, /proc/meminfo MemAvailable (local only)
    pod_per: float  # bytes per sandbox, the sandbox pods' own working set (kubelet, pod level)
    backend: str


def bare_pod(template: dict[str, Any], name: str) -> dict[str, Any]:
    """The operator's pod spec, as a plain pod: none of the operator's labels (so it never
    takes it for one of its own), no owner, no fields the API server fills in itself."""
    spec = json.loads(json.dumps(template["spec"]))
    for key in ("nodeName", "priority", "preemptionPolicy"):
        spec.pop(key, None)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {BARE_LABEL: "true"}},
        "spec": spec,
    }


async def node_memory(
    kube: Kube, node: str, after: datetime, pods: set[tuple[str, str]] | None = None
) -> tuple[float, float]:
    """From the kubelet's stats summary, a sample taken after ``after`` (it refreshes every
    ~10-15 s; at most 45 s of waiting): (the node's working set, the summed pod-level working
    set of ``pods``)."""
    deadline = time.monotonic() + 45
    last = (math.nan, math.nan)
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError, TypeError):
            code, obj = await kube.request("GET", f"/api/v1/nodes/{node}/proxy/stats/summary")
            if code == 200:
                mem = obj["node"]["memory"]
                own = sum(
                    float((p.get("memory") or {}).get("workingSetBytes") or 0)
                    for p in obj.get("pods") or []
                    if (p["podRef"]["namespace"], p["podRef"]["name"]) in (pods or set())
                )
                last = (float(mem["workingSetBytes"]), own)
                if datetime.fromisoformat(mem["time"].replace("Z", "+00:00")) > after:
                    return last
        await asyncio.sleep(2)
    return last


def mem_available() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return float(line.split()[1]) * 1024
    return math.nan


class RealNode:
    """The --real-node step: one namespace, one operator with the runc and gVisor backends.

    perSpec picks the first backend that passes: runc for scope "runc"; scope "gvisor" raises
    its floor to hardened_container, which only gVisor reaches."""

    def __init__(self, kube: Kube, args: argparse.Namespace, kubeconfig: str, local: bool):
        self.kube, self.args, self.kubeconfig, self.local = kube, args, kubeconfig, local
        self.run_id = f"real-{secrets.token_hex(3)}"
        self.ns = f"t-bench-scale-{self.run_id}"
        self.tracker = Tracker([self.ns])
        self.counter = 0
        self.node = ""
        self.watches: list[asyncio.Task[None]] = []
        self.op: Operator | None = None

    def next_name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}-{self.counter:04d}"

    async def setup(self) -> None:
        kube, ns = self.kube, self.ns
        await create_namespaces(kube, [ns], self.run_id)
        code, nodes = await kube.request("GET", "/api/v1/nodes", params={"labelSelector": "!type"})
        real = [n["metadata"]["name"] for n in nodes.get("items", [])] if code == 200 else []
        if not real:
            raise RuntimeError("no real node (every node is labelled type=...)")
        self.node = real[0]
        sandboxes = f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/sandboxes"
        self.watches = [
            asyncio.create_task(kube.watch(sandboxes, self.tracker.on_sandbox)),
            asyncio.create_task(kube.watch(f"/api/v1/namespaces/{ns}/pods", self.tracker.on_pod)),
        ]
        backends = [
            backend("runc", "runc", "container"),
            backend("gvisor", "gvisor", "hardened_container"),
        ]
        workdir = Path(tempfile.mkdtemp(prefix="bench-scale-real-"))
        self.op = Operator(
            operator_config(backends, self.args), [ns], workdir, self.kubeconfig, self.args
        ).start()
        for i, rt in enumerate(self.args.runtimes):
            extra = {"minIsolation": "hardened_container"} if rt == "gvisor" else {}
            code, obj = await kube.request(
                "POST",
                sbx_path(ns, plural="sandboxscopes"),
                scope_body(rt, i, self.run_id, **extra),
            )
            if code != 201:
                raise RuntimeError(f"scope {rt}: HTTP {code} {str(obj)[:300]}")

    async def sandboxes(self, rt: str, count: int, limit: float) -> tuple[list[Box], float]:
        """``count`` Sandboxes in scope ``rt``, all Ready (or ``limit``); (boxes, first POST)."""
        keys = [(self.ns, self.next_name(rt), rt) for _ in range(count)]
        pairs = [(ns, name) for ns, name, _ in keys]
        t0 = time.monotonic()
        _, errors = await create_sandboxes(
            self.kube, self.tracker, keys, self.run_id, self.args.concurrency
        )
        if errors:
            say(f"  {len(errors)} POST(s) failed, first: {errors[0]}")
        await wait_until(
            f"{count} {rt} Sandboxes Ready",
            lambda: all(b.ready or b.refused for b in self.tracker.of(pairs)),
            limit,
            lambda: f"{sum(1 for b in self.tracker.of(pairs) if b.ready)}/{count} ready",
        )
        return self.tracker.of(pairs), t0

    async def delete_sandboxes(self, boxes: list[Box]) -> None:
        await delete_all(self.kube, [sbx_path(b.ns, b.name) for b in boxes], self.args.concurrency)
        pods = [(self.ns, naming.pod_name(b.name)) for b in boxes]
        tracker = self.tracker
        await wait_until(
            "Sandboxes and pods gone",
            lambda: (
                all(b.gone for b in boxes)
                and all(tracker.pods[p].gone for p in pods if p in tracker.pods)
            ),
            180 + 2 * len(boxes),
        )

    def cpu_now(self) -> dict[str, float]:
        """CPU seconds so far of the operator and the local cluster's processes."""
        pids = component_pids()
        if self.op is not None:
            pids["operator"] = self.op.pid
        out = {n: cpu_seconds(pid) for n, pid in pids.items()}
        return {n: v for n, v in out.items() if v is not None}

    def cpu_since(self, before: dict[str, float]) -> dict[str, float]:
        after = self.cpu_now()
        return {n: after[n] - before[n] for n in after if n in before}

    async def writes_now(self) -> Counter[str]:
        return apiserver_writes(await self.kube.text("/metrics"))

    async def sandbox_burst(self, rt: str) -> tuple[Burst, dict[str, Any] | None]:
        """A burst of Sandboxes; also the pod the operator made for the first (the template)."""
        writes0 = await self.writes_now()
        before = self.cpu_now()
        boxes, t0 = await self.sandboxes(rt, self.args.burst, self.args.real_timeout)
        cpu = self.cpu_since(before)
        writes = await self.writes_now() - writes0
        ready = [b.ready for b in boxes if b.ready]
        burst = Burst(
            "Sandboxes",
            rt,
            len(boxes),
            len(ready),
            (max(ready) - t0) if ready and len(ready) == len(boxes) else math.nan,
            [b.ready - b.posted for b in boxes if b.ready and b.posted],
            cpu,
            writes,
        )
        template = None
        if boxes:
            pod = naming.pod_name(boxes[0].name)
            code, obj = await self.kube.request("GET", f"/api/v1/namespaces/{self.ns}/pods/{pod}")
            template = obj if code == 200 else None
        writes0 = await self.writes_now()
        await self.delete_sandboxes(boxes)
        burst.cleanup_writes = await self.writes_now() - writes0
        if self.op is not None:
            burst.operator_rss = rss_mib(self.op.pid)[0]
        return burst, template

    async def bare_burst(self, rt: str, template: dict[str, Any]) -> Burst:
        """The same number of pods with the operator's pod spec, created directly."""
        names = [self.next_name(f"bare-{rt}") for _ in range(self.args.burst)]
        keys = [(self.ns, n) for n in names]
        pods = self.tracker.pods
        posted: dict[str, float] = {}

        async def post(name: str) -> None:
            posted[name] = time.monotonic()
            code, obj = await self.kube.request(
                "POST", f"/api/v1/namespaces/{self.ns}/pods", bare_pod(template, name)
            )
            if code != 201:
                say(f"  bare pod {name}: HTTP {code} {str(obj)[:200]}")

        writes0 = await self.writes_now()
        before = self.cpu_now()
        t0 = time.monotonic()
        await gather_limited(self.args.concurrency, [functools.partial(post, n) for n in names])
        await wait_until(
            f"{len(names)} bare {rt} pods Ready",
            lambda: all(k in pods and pods[k].ready for k in keys),
            self.args.real_timeout,
        )
        cpu = self.cpu_since(before)
        writes = await self.writes_now() - writes0
        lats = [r - posted[k[1]] for k in keys if k in pods and (r := pods[k].ready)]
        ready = [r for k in keys if k in pods and (r := pods[k].ready)]
        burst = Burst(
            "bare pods",
            rt,
            len(names),
            len(ready),
            (max(ready) - t0) if ready and len(ready) == len(names) else math.nan,
            lats,
            cpu,
            writes,
        )
        paths = [f"/api/v1/namespaces/{self.ns}/pods/{n}" for n in names]
        writes0 = await self.writes_now()
        await delete_all(self.kube, paths, 32)
        await wait_until(
            "bare pods gone", lambda: all(pods[k].gone for k in keys if k in pods), 180
        )
        burst.cleanup_writes = await self.writes_now() - writes0
        return burst

    async def bursts(self) -> list[Burst]:
        """Per runtime, ``--rounds`` rounds of a Sandbox burst and a bare-pod burst; the order
        alternates between rounds (the first round needs the operator's pod as template)."""
        out: list[Burst] = []
        for rt in self.args.runtimes:
            template: dict[str, Any] | None = None
            for rnd in range(self.args.rounds):
                bare_first = rnd % 2 == 1 and template is not None
                if bare_first and template is not None:
                    out.append(await self.bare_burst(rt, template))
                burst, pod = await self.sandbox_burst(rt)
                out.append(burst)
                template = template or pod
                if not bare_first and template is not None:
                    out.append(await self.bare_burst(rt, template))
        return out

    async def room(self) -> int:
        """How many more pods the real node takes (its allocatable pods minus those on it)."""
        code, pods = await self.kube.request(
            "GET", "/api/v1/pods", params={"fieldSelector": f"spec.nodeName={self.node}"}
        )
        on_node = len(pods.get("items", [])) if code == 200 else 0
        code, node = await self.kube.request("GET", f"/api/v1/nodes/{self.node}")
        max_pods = int(node.get("status", {}).get("allocatable", {}).get("pods", 110))
        return max_pods - on_node

    async def idle(self) -> list[Idle]:
        """Per runtime: ``--idle-count`` Sandboxes, all Ready; memory per sandbox."""
        count = min(self.args.idle_count, await self.room() - 2)
        if count < self.args.idle_count:
            say(f"  node {self.node} has room for {count + 2} more pods: {count} per runtime")
        out = []
        for rt in self.args.runtimes:
            await asyncio.sleep(5)
            base_ws, _ = await node_memory(self.kube, self.node, datetime.now(UTC))
            base_avail = mem_available() if self.local else math.nan
            boxes, _ = await self.sandboxes(rt, count, max(self.args.real_timeout, 10.0 * count))
            ready = [b for b in boxes if b.ready]
            await asyncio.sleep(5)
            pods = {(b.ns, naming.pod_name(b.name)) for b in ready}
            ws, own = await node_memory(self.kube, self.node, datetime.now(UTC), pods)
            avail = mem_available() if self.local else math.nan
            per = max(len(ready), 1)
            served = Counter(b.backend for b in boxes)
            out.append(
                Idle(
                    rt,
                    len(boxes),
                    len(ready),
                    [b.ready - b.posted for b in ready if b.ready and b.posted],
                    (ws - base_ws) / per,
                    (base_avail - avail) / per,
                    own / per,
                    ",".join(f"{k}:{v}" for k, v in served.items()),
                )
            )
            await self.delete_sandboxes(boxes)
        return out

    async def close(self) -> None:
        for w in self.watches:
            w.cancel()
        await asyncio.gather(*self.watches, return_exceptions=True)
        await teardown(self.kube, [self.ns], self.op)


async def real_node(
    kube: Kube, args: argparse.Namespace, kubeconfig: str, local: bool, cleanup: list[str]
) -> tuple[list[Burst], list[Idle]]:
    step = RealNode(kube, args, kubeconfig, local)
    cleanup.append(step.ns)
    try:
        await step.setup()
        say(f"real node {step.node}: bursts of {args.burst} ({', '.join(args.runtimes)})")
        bursts = await step.bursts()
        say(f"real node {step.node}: {args.idle_count} idle Sandboxes per runtime")
        idles = await step.idle()
    except Exception:
        if step.op is not None:
            print(
                f"--- operator log (tail), {step.op.proc.log_path}:\n{step.op.proc.log()[-4000:]}"
            )
        raise
    finally:
        await step.close()
    return bursts, idles


# --------------------------------------------------------------------------------------------
# Tables


def f(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:,.{digits}f}"


def lat(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"{pct(values, 50):.2f} / {pct(values, 90):.2f} / {max(values):.2f}"


def per_s(count: float | None, seconds: float) -> str:
    return "n/a" if count is None or seconds <= 0 else f"{count / seconds:,.1f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i])
                       for i, c in enumerate(r)) for r in [header, *rows]]  # fmt: skip
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def per_sandbox_ms(phases: Iterable[Phase | None], n: int, who: str = "operator") -> float:
    """A controller's CPU in these phases, in ms per Sandbox (nan when one is missing)."""
    total = 0.0
    for p in phases:
        if p is None or who not in p.cpu or n <= 0:
            return math.nan
        total += p.cpu[who]
    return 1000 * total / n


def cost_rows(results: list[SizeResult]) -> list[list[str]]:
    """The controllers' own cost side by side (#40 item 6): CPU per Sandbox to make N Ready
    (the first POST until all are Ready) and to delete them (the operator's scope disposal and
    delete-all together: every Sandbox once), and the resident memory with all N Ready (the
    operator's after the idle phase, agent-sandbox's once its Sandboxes settled)."""

    def pair(ours: float, theirs: float, digits: int = 1) -> str:
        ratio = ours / theirs if theirs and not math.isnan(theirs) else math.nan
        shown = "n/a" if math.isnan(ratio) else f"{ratio:.2f}x"
        return f"{f(ours, digits)} / {f(theirs, digits)} = {shown}"

    def create(r: SizeResult) -> str:
        theirs = per_sandbox_ms([r.agent.create], r.n) if r.agent else math.nan
        return pair(per_sandbox_ms([r.create], r.n), theirs)

    def delete(r: SizeResult) -> str:
        theirs = per_sandbox_ms([r.agent.phase], r.n) if r.agent else math.nan
        return pair(per_sandbox_ms([r.scope, r.rest], r.n), theirs)

    def total(r: SizeResult) -> str:
        theirs = per_sandbox_ms([r.agent.create, r.agent.phase], r.n) if r.agent else math.nan
        return pair(per_sandbox_ms([r.create, r.scope, r.rest], r.n), theirs)

    def rss(r: SizeResult) -> str:
        return pair(r.rss[0], r.agent.rss[0] if r.agent else math.nan, 0)

    return [
        ["CPU ms/Sandbox, create: operator / agent-sandbox", *(create(r) for r in results)],
        ["CPU ms/Sandbox, delete: operator / agent-sandbox", *(delete(r) for r in results)],
        ["CPU ms/Sandbox, both: operator / agent-sandbox", *(total(r) for r in results)],
        ["RSS, all N Ready (MiB): operator / agent-sandbox", *(rss(r) for r in results)],
    ]


def size_table(results: list[SizeResult], idle_seconds: float) -> str:
    def row(label: str, fn: Callable[[SizeResult], str]) -> list[str]:
        return [label, *(fn(r) for r in results)]

    def phase(r: SizeResult, name: str) -> Phase | None:
        p: Phase | None = getattr(r, name)
        return p

    def calls(p: Phase | None, per: int = 0) -> str:
        if p is None:
            return "n/a"
        op = "n/a" if p.op.requests is None else f"{p.op.requests:,.0f}"
        api = "n/a" if p.api.requests is None else f"{p.api.requests:,.0f}"
        return f"{op} / {api}"

    def cpu(p: Phase | None, who: str = "operator") -> str:
        if p is None or who not in p.cpu or p.seconds <= 0:
            return "n/a"
        return f"{100 * p.cpu[who] / p.seconds:.0f}%"

    def create_cpu(r: SizeResult, who: str) -> str:
        return cpu(r.create, who)

    rows = [
        row("Sandboxes created (POSTs failed)", lambda r: f"{r.n} ({r.post_errors})"),
        row("client POST rate (/s)", lambda r: per_s(r.n - r.post_errors, r.post_seconds)),
        row("Admitted / Ready / refused", lambda r: f"{r.admitted} / {r.ready} / {r.refused}"),
        row("create->Admitted throughput (/s)", lambda r: per_s(r.admitted, r.admit_span)),
        row("create->Admitted p50 / p90 / max (s)", lambda r: lat(r.admit_lat)),
        row("create->Ready p50 / p90 / max (s)", lambda r: lat(r.ready_lat)),
        row("all Ready, seconds after the last create", lambda r: f(r.ready_after_last, 1)),
        row(
            "  the same pods bare: all Ready after last",
            lambda r: f"{f(r.bare_ready_after_last, 1)} ({r.bare_ready}/{r.n})",
        ),
        row("pod created->bound p50 / p90 / max (s)", lambda r: lat(r.bind_lat)),
        row("pod bound->Ready (kwok) p50/p90/max (s)", lambda r: lat(r.pod_ready_lat)),
        row("create phase: API requests op / all", lambda r: calls(r.create)),
        row(
            "create phase: operator requests/Sandbox",
            lambda r: (
                "n/a"
                if r.create is None or r.create.op.requests is None
                else f"{r.create.op.requests / max(r.n, 1):.1f}"
            ),
        ),
        row("create phase: operator CPU", lambda r: cpu(r.create)),
        row(
            f"idle {idle_seconds:.0f}s: operator requests/s",
            lambda r: per_s(r.idle.op.requests, r.idle.seconds) if r.idle else "n/a",
        ),
        row(
            f"idle {idle_seconds:.0f}s: operator resp. bytes/s",
            lambda r: per_s(r.idle.op.bytes, r.idle.seconds) if r.idle else "n/a",
        ),
        row(
            f"idle {idle_seconds:.0f}s: API requests/s, all clients",
            lambda r: per_s(r.idle.api.requests, r.idle.seconds) if r.idle else "n/a",
        ),
        row(f"idle {idle_seconds:.0f}s: operator CPU", lambda r: cpu(r.idle)),
        row("operator RSS now / peak (MiB)", lambda r: f"{f(r.rss[0], 0)} / {f(r.rss[1], 0)}"),
        row(
            "scope disposal: Sandboxes gone, time (s)",
            lambda r: f"{r.scope_gone}/{r.scope_n}, {f(r.scope_seconds)}",
        ),
        row("scope disposal: API requests op / all", lambda r: calls(r.scope)),
        row(
            "delete-all: Sandboxes gone, time (s)",
            lambda r: f"{r.rest_gone}/{r.rest_n}, {f(r.rest_seconds)}",
        ),
        row("delete-all: gone after p50 / p90 / max (s)", lambda r: lat(r.rest_lat)),
        row("delete-all: API requests op / all", lambda r: calls(r.rest)),
        row(
            "delete-all: operator / API server / etcd CPU",
            lambda r: f"{cpu(r.rest)} / {cpu(r.rest, 'kube-apiserver')} / {cpu(r.rest, 'etcd')}",
        ),
        *cost_rows(results),
        row(
            "  agent-sandbox: all Ready after last create",
            lambda r: (
                f"{f(r.agent.ready_after_last)} ({r.agent.ready}/{r.agent.n})" if r.agent else "n/a"
            ),
        ),
        row(
            "  agent-sandbox: delete-all gone, time (s)",
            lambda r: f"{r.agent.gone}/{r.agent.n}, {f(r.agent.seconds)}" if r.agent else "n/a",
        ),
        row(
            "  agent-sandbox: gone after p50 / p90 / max (s)",
            lambda r: lat(r.agent.gone_lat) if r.agent else "n/a",
        ),
        row(
            "  agent-sandbox: controller / API server / etcd CPU",
            lambda r: (
                (
                    f"{cpu(r.agent.phase)} / {cpu(r.agent.phase, 'kube-apiserver')} / "
                    f"{cpu(r.agent.phase, 'etcd')}"
                )
                if r.agent
                else "n/a"
            ),
        ),
        row(
            "  agent-sandbox: ... its pods gone (s)",
            lambda r: f(r.agent.pods_seconds) if r.agent else "n/a",
        ),
        row(
            "  agent-sandbox: delete-all API requests, all",
            lambda r: calls(r.agent.phase).split(" / ")[1] if r.agent and r.agent.phase else "n/a",
        ),
    ]
    # CPU of the cluster's processes in the create phase: who the bottleneck is.
    names = sorted({k for r in results if r.create for k in r.create.cpu} - {"operator"})
    for name in names:
        rows.append(row(f"create phase: {name} CPU", functools.partial(create_cpu, who=name)))
        rows.append(
            row(
                f"  bare pods: {name} CPU",
                lambda r, who=name: cpu(r.bare, who),  # type: ignore[misc]
            )
        )
    # CPU seconds (not shares): the same work takes different times.
    for name in ("kube-router", "kube-apiserver"):
        rows.append(
            row(
                f"{name} CPU seconds: Sandboxes / bare pods",
                lambda r, who=name: (
                    f"{f(r.create.cpu.get(who), 1) if r.create else 'n/a'} / "
                    f"{f(r.bare.cpu.get(who), 1) if r.bare else 'n/a'}"
                ),
            )
        )
    header = ["", *(f"N={r.n}" for r in results)]
    out = [table(header, rows)]
    for r in results:
        if r.idle and r.idle.op.by_kind:
            top = ", ".join(
                f"{k} {v / r.idle.seconds:.2f}/s" for k, v in r.idle.op.by_kind.most_common(4)
            )
            out.append(f"  N={r.n} idle, operator's busiest requests: {top}")
        if r.idle and r.idle.api.by_kind:
            top = ", ".join(
                f"{k} {v / r.idle.seconds:.2f}/s" for k, v in r.idle.api.by_kind.most_common(4)
            )
            out.append(f"  N={r.n} idle, API server's busiest (all clients): {top}")
        if r.rest and r.rest.op.by_kind:
            top = ", ".join(f"{k} {v:,.0f}" for k, v in r.rest.op.by_kind.most_common(8))
            out.append(f"  N={r.n} delete-all, operator's requests: {top}")
        for note in r.notes:
            out.append(f"  N={r.n}: {note}")
        if r.agent and r.agent.note:
            out.append(f"  N={r.n} agent-sandbox: {r.agent.note}")
    return "\n".join(out)


def writes_table(bursts: list[Burst]) -> str:
    """The API server's writes per object (every client: the operator, the kubelet, the
    scheduler, this script), create phase and cleanup, by kind: median of the rounds."""
    groups: dict[tuple[str, str], list[Burst]] = {}
    for b in bursts:
        groups.setdefault((b.runtime, b.what), []).append(b)

    def per(bs: list[Burst], which: str, kind: str | None = None) -> float:
        vals = []
        for b in bs:
            w: Counter[str] = getattr(b, which)
            total = w[kind] if kind is not None else sum(w.values())
            vals.append(total / max(b.count, 1))
        return statistics.median(vals) if vals else math.nan

    rows = []
    for (rt, what), bs in groups.items():
        for which, label in (("writes", "create"), ("cleanup_writes", "cleanup")):
            kinds: Counter[str] = Counter()
            for b in bs:
                kinds.update(getattr(b, which))
            top = [k for k, _ in kinds.most_common() if per(bs, which, k) >= 0.05]
            detail = ", ".join(f"{k} {per(bs, which, k):.1f}" for k in top)
            rows.append([f"{rt}: {what}", label, f(per(bs, which), 1), detail])
    for rt in dict.fromkeys(rt for rt, _ in groups):
        sbx, bare = groups.get((rt, "Sandboxes")), groups.get((rt, "bare pods"))
        if sbx and bare:
            for which, label in (("writes", "create"), ("cleanup_writes", "cleanup")):
                diff = per(sbx, which) - per(bare, which)
                rows.append([f"{rt}: Sandboxes - bare pods", label, f"{diff:+.1f}", ""])
    return "\n".join(
        [
            "API writes per object (the API server's apiserver_request_total, every client; "
            "median of the rounds)",
            table(["", "phase", "writes/object", "by verb and resource (per object)"], rows),
        ]
    )


def real_tables(bursts: list[Burst], idles: list[Idle]) -> str:
    out = []
    if bursts:
        rows = []
        for rt in dict.fromkeys(b.runtime for b in bursts):
            sbx = [b for b in bursts if b.runtime == rt and b.what == "Sandboxes"]
            bare = [b for b in bursts if b.runtime == rt and b.what == "bare pods"]
            for group in (sbx, bare):
                if not group:
                    continue
                spans = [b.all_ready for b in group]
                lats = [x for b in group for x in b.lat]
                rows.append([
                    f"{rt}: {group[0].count} {group[0].what}",
                    f"{sum(b.ready for b in group)}/{sum(b.count for b in group)}",
                    f(statistics.median(spans), 2),
                    f(pct(lats, 50), 2),
                    f(pct(lats, 90), 2),
                ])  # fmt: skip
            if sbx and bare:
                ratio = statistics.median(b.all_ready for b in sbx) / statistics.median(
                    b.all_ready for b in bare
                )
                rows.append([f"{rt}: ratio Sandboxes / bare pods", "", f(ratio, 2), "", ""])
        out.append("burst on the real node (rounds: median of the all-Ready times)")
        out.append(table(["", "Ready", "all Ready (s)", "p50 (s)", "p90 (s)"], rows))
        # Where the time goes: CPU seconds each process spent during a burst (median of the
        # rounds), Sandboxes against bare pods; the node's two cores are shared by all of them.
        groups = [
            [b for b in bursts if b.runtime == rt and b.what == what]
            for rt in dict.fromkeys(b.runtime for b in bursts)
            for what in ("Sandboxes", "bare pods")
        ]
        groups = [g for g in groups if g]
        names = sorted({n for b in bursts for n in b.cpu})
        if names:
            cpu_rows = [
                [n] + [f(statistics.median(b.cpu.get(n, 0.0) for b in g), 2) for g in groups]
                for n in names
            ]
            heads = [""] + [f"{g[0].runtime}: {g[0].what}" for g in groups]
            out.append("CPU seconds per burst (median of the rounds)")
            out.append(table(heads, cpu_rows))
        out.append(writes_table(bursts))
        rss = [
            (b.runtime, b.operator_rss)
            for b in bursts
            if b.what == "Sandboxes" and not math.isnan(b.operator_rss)
        ]
        if rss:
            out.append(
                "operator RSS after each Sandbox burst's cleanup (MiB, in order): "
                + ", ".join(f"{rt} {v:.0f}" for rt, v in rss)
            )
    if idles:
        mib = 1024 * 1024
        rows = [
            [
                f"{i.runtime} ({i.backend})",
                f"{i.ready}/{i.count}",
                f(i.ws_per / mib, 1),
                f(i.avail_per / mib, 1),
                f(i.pod_per / mib, 1),
                f(pct(i.lat, 50), 2),
                f(pct(i.lat, 90), 2),
            ]
            for i in idles
        ]
        out.append("idle Sandboxes on the real node")
        out.append(
            table(
                [
                    "",
                    "Ready",
                    "MiB/sbx: node WS",
                    "MemAvailable",
                    "pods' own WS",
                    "p50 (s)",
                    "p90 (s)",
                ],
                rows,
            )
        )
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# main


async def leftovers(kube: Kube, bench: str = "scale") -> list[str]:
    """Namespaces an earlier run of benchmark ``bench`` left (labelled BENCH_LABEL=bench)."""
    code, obj = await kube.request(
        "GET", "/api/v1/namespaces", params={"labelSelector": f"{BENCH_LABEL}={bench}"}
    )
    if code != 200:
        return []
    return [
        i["metadata"]["name"]
        for i in obj.get("items", [])
        if not i["metadata"].get("deletionTimestamp")
    ]


def delete_run_namespaces(kubeconfig: str, names: Iterable[str], bench: str) -> None:
    """Delete this run's namespaces that still exist (finalizers stripped: the operator may be
    gone), best effort, within 300 s; stop every operator subprocess first."""

    async def go() -> None:
        kube = Kube(kubeconfig, 16)
        try:
            live = set(await leftovers(kube, bench))
            gone = [n for n in dict.fromkeys(names) if n in live]
            if gone:
                await strip_and_delete(kube, gone)
        finally:
            await kube.aclose()

    try:
        asyncio.run(asyncio.wait_for(go(), 300))
    except Exception as exc:  # cleanup is best effort; say what is left
        say(f"cleanup failed ({type(exc).__name__}: {exc}): run the benchmark with --cleanup")


def stop_operators(operators: Iterable[Any] | None = None) -> None:
    """Stop the operator subprocesses (this script's, or the given ones), best effort."""
    for op in OPERATORS if operators is None else operators:
        with contextlib.suppress(Exception):
            op.stop()


def run_cleaning_up(run: Callable[[], Awaitable[None]], cleanup: Callable[[bool], None]) -> int:
    """Run the benchmark's coroutine; on the way out (done, failed, Ctrl-C or SIGTERM) call
    ``cleanup(interrupted)``. The exit status: 0 when it ran to its end."""

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    # Ctrl-C cleans up too, also when started with SIGINT ignored (a background job of a script).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    ok = False
    try:
        asyncio.run(run())  # type: ignore[arg-type]
        ok = True
    except KeyboardInterrupt:
        say("interrupted: cleaning up")
    finally:
        cleanup(not ok)
    return 0 if ok else 1


@dataclass
class Ceiling:
    """What this API server accepts with no operator running: the bound under any admission rate.

    ``post_s``: N Sandbox POSTs alone; ``admit_s``: N more, each POST followed by one status
    write (an Admitted condition), the least an admission can cost, pipelined the same way."""

    n: int
    concurrency: int
    post_s: float = 0.0
    admit_s: float = 0.0
    errors: int = 0
    apiserver_cpu: float | None = None
    etcd_cpu: float | None = None


async def api_ceiling(kube: Kube, n: int, args: argparse.Namespace, cleanup: list[str]) -> Ceiling:
    run_id = f"ceiling-{secrets.token_hex(3)}"
    ns = f"t-bench-scale-{run_id}"
    cleanup.append(ns)
    result = Ceiling(n, args.concurrency)
    say(f"ceiling N={n}: namespace {ns}, no operator")
    await create_namespaces(kube, [ns], run_id)
    pids = component_pids()
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    admitted = {
        "status": {
            "conditions": [
                {
                    "type": "Admitted",
                    "status": "True",
                    "reason": "Admitted",
                    "message": "bench",
                    "lastTransitionTime": now,
                }
            ]
        }
    }

    async def post(name: str, then_admit: bool) -> None:
        code, _obj = await kube.request("POST", sbx_path(ns), sandbox_body(name, "none", run_id))
        if code != 201:
            result.errors += 1
            return
        if then_admit:
            code, _obj = await kube.request(
                "PATCH",
                sbx_path(ns, name) + "/status",
                admitted,
                content_type="application/merge-patch+json",
            )
            if code != 200:
                result.errors += 1

    try:
        for then_admit in (False, True):
            prefix = "adm" if then_admit else "post"
            cpu0 = {c: cpu_seconds(pid) for c, pid in pids.items()}
            t0 = time.monotonic()
            await gather_limited(
                args.concurrency,
                [functools.partial(post, f"{prefix}-{i}", then_admit) for i in range(n)],
            )
            took = time.monotonic() - t0
            if then_admit:
                result.admit_s = took
                cpu = {c: cpu_seconds(pid) for c, pid in pids.items()}
                for comp, attr in (("kube-apiserver", "apiserver_cpu"), ("etcd", "etcd_cpu")):
                    before, after = cpu0.get(comp), cpu.get(comp)
                    if before is not None and after is not None:
                        setattr(result, attr, (after - before) / took)
            else:
                result.post_s = took
    finally:
        await strip_and_delete(kube, [ns])
    return result


def ceiling_table(c: Ceiling) -> str:
    def share(cpu: float | None) -> str:
        return "n/a" if cpu is None else f"{100 * cpu:.0f}%"

    rows = [
        ["Sandbox POSTs alone (/s)", per_s(c.n, c.post_s)],
        ["POST + one status write each (/s)", per_s(c.n, c.admit_s)],
        ["  API server CPU (share of a core)", share(c.apiserver_cpu)],
        ["  etcd CPU (share of a core)", share(c.etcd_cpu)],
        ["requests refused / failed", str(c.errors)],
    ]
    return table(["", f"N={c.n}, {c.concurrency} in flight"], rows)


async def amain(
    args: argparse.Namespace, kubeconfig: str, local: bool, state: dict[str, Any]
) -> None:
    kube = Kube(kubeconfig, max(args.concurrency, 8) + 8)
    state["kube"] = kube
    try:
        old = await leftovers(kube)
        if old:
            say(f"deleting namespaces an earlier run left: {', '.join(old)}")
            await strip_and_delete(kube, old)
        if args.cleanup:
            return
        if args.sizes:
            if await kwok_ready(kube) == 0:
                if not local:
                    raise SystemExit(
                        "no Ready kwok node / RuntimeClass kwok on this cluster: run "
                        "`hack/cluster.py kwok up` (or set up kwok there yourself)"
                    )
                cluster_py("up", timeout=3600)
                cluster_py("kwok", "up", "--nodes", str(args.kwok_nodes), timeout=1800)
                state["started_kwok"] = True
            say(f"kwok: {await kwok_ready(kube)} fake node(s) Ready")
        await apply_crds(kube)
        cleanup: list[str] = state.setdefault("namespaces", [])
        results: list[SizeResult] = []
        for n in args.sizes:
            results.append(await run_size(kube, n, args, kubeconfig, cleanup))
            print()
            print(
                f"scale on kwok fake nodes: 1 operator, {SCOPES} scopes over "
                f"{args.namespaces} namespace(s); operator figures: its Prometheus counters; "
                '"all": the API server\'s apiserver_request_total, every client'
            )
            print(size_table(results, args.idle_seconds), flush=True)
            print()
        if args.ceiling:
            ceiling = await api_ceiling(kube, args.ceiling, args, cleanup)
            print()
            print(
                "API server ceiling, no operator: what the API server alone accepts "
                "(an upper bound on admissions/s on this machine)"
            )
            print(ceiling_table(ceiling), flush=True)
        if args.real_node:
            bursts, idles = await real_node(kube, args, kubeconfig, local, cleanup)
            print()
            print(real_tables(bursts, idles), flush=True)
    finally:
        await kube.aclose()


def final_cleanup(kubeconfig: str, state: dict[str, Any], interrupted: bool) -> None:
    """Stop any operator still running; after an interruption or error also delete the
    namespaces of this run; bring kwok down if this run started it."""
    stop_operators()
    if interrupted:
        delete_run_namespaces(kubeconfig, state.get("namespaces", []), "scale")
    if state.get("started_kwok") and not state.get("keep_kwok"):
        with contextlib.suppress(Exception):
            cluster_py("kwok", "down", timeout=300)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--sizes", default="100,1000,10000", help="comma-separated N (default %(default)s)"
    )
    p.add_argument(
        "--smoke", action="store_true", help="CI: N=20, 10 s idle; --real-node: runc, burst 3"
    )
    p.add_argument("--idle-seconds", type=float, default=60)
    p.add_argument(
        "--namespaces", type=int, default=1, help="spread the 10 scopes over K namespaces"
    )
    p.add_argument("--concurrency", type=int, default=32, help="API requests in flight (creates)")
    p.add_argument("--kwok-nodes", type=int, default=3)
    p.add_argument("--keep-kwok", action="store_true", help="leave kwok up if this run started it")
    p.add_argument("--ready-timeout", type=float, default=None, help="default 120 s + 0.5 s * N")
    p.add_argument("--dispose-timeout", type=float, default=None, help="default 120 s + 0.2 s * n")
    p.add_argument("--resync-seconds", type=float, default=None, help="operator resyncSeconds")
    p.add_argument("--operator-log-level", default="info", choices=["debug", "info", "warning"])
    p.add_argument("--no-metrics", dest="metrics", action="store_false",
                   help="do not pass --metrics-port to the operator")  # fmt: skip
    p.add_argument("--real-node", action="store_true", help="also the real-node step")
    p.add_argument(
        "--ceiling", type=int, default=0, metavar="N",
        help="also N Sandbox POSTs (and N POST + status write) with no operator: the API "
        "server's own ceiling",
    )  # fmt: skip
    p.add_argument("--runtimes", default="runc,gvisor", help="real-node runtimes")
    p.add_argument("--burst", type=int, default=40, help="real-node burst size")
    p.add_argument("--rounds", type=int, default=3, help="real-node burst rounds (alternating)")
    p.add_argument("--idle-count", type=int, default=100, help="real-node idle sandboxes")
    p.add_argument("--real-timeout", type=float, default=600)
    p.add_argument("--cleanup", action="store_true", help="only delete what earlier runs left")
    p.add_argument(
        "--agent-sandbox", action="store_true",
        help=f"also agent-sandbox's controller ({AGENT_SANDBOX_VERSION}) per size, side by side",
    )  # fmt: skip
    args = p.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    args.runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    if args.smoke:
        args.sizes, args.idle_seconds = [20], min(args.idle_seconds, 10)
        args.ceiling = min(args.ceiling, 20) if args.ceiling else 20
        # With --real-node: one round of a burst of 3 and 2 idle Sandboxes, runc only.
        args.burst, args.rounds, args.idle_count = 3, 1, 2
        args.runtimes = ["runc"]
    if args.cleanup:
        args.sizes, args.real_node, args.ceiling = [], False, 0
        args.agent_sandbox = False
    if args.agent_sandbox and args.sizes:
        # (binary, CRD file), or why not: a note in the table instead of its rows.
        try:
            args.agent_sandbox = agent_sandbox_build()
        except (OSError, subprocess.SubprocessError, KeyError, ValueError) as exc:
            args.agent_sandbox = f"agent-sandbox not built: {type(exc).__name__}: {exc}"[:300]
            say(args.agent_sandbox)
    flags = "" if args.cleanup else operator_run_flags()
    args.metrics_host = "--metrics-host" in flags
    args.metrics_flag = "--metrics-port" in flags
    if args.metrics and not args.cleanup and "--metrics-port" not in flags:
        say("the operator's CLI has no --metrics-port yet: operator API figures are n/a")
        args.metrics = False
    kubeconfig = os.environ.get("KUBECONFIG") or str(LOCAL_KUBECONFIG)
    os.environ["KUBECONFIG"] = kubeconfig
    local = Path(kubeconfig).resolve() == LOCAL_KUBECONFIG.resolve()
    state: dict[str, Any] = {"keep_kwok": args.keep_kwok}
    return run_cleaning_up(
        lambda: amain(args, kubeconfig, local, state),
        lambda interrupted: final_cleanup(kubeconfig, state, interrupted),
    )


if __name__ == "__main__":
    sys.exit(main())
