"""Warm pool benchmark: acquire -> Ready served from a SandboxWarmPool vs started cold vs a bare
pod, one at a time and in a burst, on the real local node under runc and gVisor. Prints tables.

    .venv/bin/python benchmarks/warm_pool.py [--runtimes runc,gvisor] [--count 30] [--burst 50]
    .venv/bin/python benchmarks/warm_pool.py --smoke        # CI: runc, count 3, burst 3, ~1-2 min
    .venv/bin/python benchmarks/warm_pool.py --cleanup      # remove what a killed run left

Needs the local cluster (``make cluster-up``) or ``$KUBECONFIG`` pointing at a cluster with a real
node and the RuntimeClasses ``runc`` and ``gvisor``. The CRDs are applied (server-side) first.

One namespace, one operator subprocess serving it (``python -m sandbox_operator.cli run
--standalone``, as benchmarks/scale.py's ``--real-node`` step: backends ``runc`` (isolation
container) and ``gvisor`` (hardened_container), host floor container, selection perSpec), one
SandboxScope. The gVisor Sandboxes and their pool carry ``minIsolation: hardened_container``,
which only gVisor reaches; the runc ones carry no floor, and runc is listed first. Per runtime:

1. **One at a time** (``--count`` N of each, alternating). A SandboxWarmPool ``warm-<runtime>``
   with ``--pool-replicas`` (2) idle pods of the spec S (busybox, kind shell, requires exec,
   requests 10m/16Mi, limits 500m/128Mi). Then N rounds; each round measures, in an order that
   rotates between rounds:

   * **warm**: a Sandbox with spec S (it claims one of the pool's idle Ready pods at admission);
   * **cold**: a Sandbox with spec S but a memory limit of 120Mi: no pool has that shape, so its
     pod is created for it (servedFrom "cold"), the usual path;
   * **bare pod**: a pod created directly with the pod spec of one of the pool's pods (copied,
     without its labels and owner, like scale.py's bare pods): what the node itself takes.

   Before every measurement the pool is full again (``--pool-replicas`` idle Ready pods and none
   starting: the refill after a claim is never measured as part of the next one), the previous
   object and its pod are gone, and no watch event came for 1 s. The figure is **create ->
   Ready as seen by this script's watch**: from just before the POST to the first watch event
   with Ready=True on the Sandbox (the pod's Ready=True condition for a bare pod). It is not the
   Python client's ``acquire()`` (benchmarks/client_roundtrip.py times that): acquire() adds its
   own round trips (it creates the SandboxScope and then waits on a watch of its own).

2. **Burst**: the pool scaled to ``--burst`` (50; fewer if the node has no room) idle pods with
   ``--max-creating`` (10) starting at once, all Ready and quiet; then ``--burst`` Sandboxes with
   spec S POSTed at once (as many requests in flight). The pool refills while they are admitted
   (``maxCreating`` at a time): that is part of what is measured, as it is in use.

Table "one at a time" (per runtime, rows warm / cold / bare pod):

* ``Ready``: how many of the N reached Ready within ``--timeout`` seconds;
* ``served from pool``: Sandboxes whose status.servedFrom is ``SandboxWarmPool/warm-<runtime>``
  (warm should be N/N, cold 0/N; a bare pod has no such field);
* ``p50 / p90 / max``: create -> Ready in seconds (nearest-rank percentiles);
* rows ``warm / cold`` and ``warm / bare pod``: the ratio of those p50s, p90s and maxima.

Table "where the time goes" (per runtime and kind; "p50 / p90" seconds after the POST, each as
first seen by the watches on Sandboxes and pods of the namespace):

* ``Sandbox seen (ADDED)``: the watch delivers the new Sandbox (API server + watch latency);
* ``metadata patched``: the operator's first write, its finalizer and the key labels;
* ``pod claimed``: the claim patch landed on the pool pod (warm only);
* ``pod created / bound / Ready``: the pod (cold and bare), scheduled, Ready=True;
* ``Sandbox Ready``: the status write with Ready=True;
* below the table, per kind, the operator's API requests from POST to Ready per acquire, from its
  ``sandbox_operator_api_requests_total`` counter (kopf's own watch requests left out): what one
  warm claim costs, refills that start before Ready included.

Table "refusal" (once, after the runtimes): ``--count`` Sandboxes, one at a time, whose floor
(``minIsolation: microvm``) no backend here reaches: create -> Admitted=False as the watch sees
it (p50 / p90 / max), and the operator's API requests per refusal (its status write; nothing is
made for a refused Sandbox, so no metadata patch either).

Table "burst" (per runtime):

* ``Ready``, ``served from pool`` as above (a Sandbox that found no idle pod starts cold and is
  counted as not served; the operator emits a PoolExhausted event for it);
* ``p50 / p90 / max``: create -> Ready per Sandbox, from its own POST;
* ``all Ready (s)``: from the first POST to the last Ready seen;
* ``refills started``: pool pods created from the first POST until the last Ready (the pool
  replacing the pods claimed, at most ``--max-creating`` starting at a time);
* ``claims lost (409)``: claim patches the API server refused because another Sandbox claimed
  that pod first (the operator's ``patch pods`` requests answered 409 during the burst); a
  Sandbox that loses every attempt starts cold.

Table "burst, where the time goes": the stages above, for the burst's Sandboxes served warm and
those that started cold (column header: how many), p50 / p90 / max seconds after each one's own
POST. Table "burst: CPU seconds per process": CPU time the operator, the local cluster's
processes (hack/cluster.py's pid files: API server, etcd, scheduler, controller-manager, kubelet,
containerd, kube-router, ...) and this script spent from the first POST to the last Ready, and
that wall-clock time; "(machine: all processes)" is the whole machine's busy CPU time from
/proc/stat (on the local cluster: everything the node runs too, containerd's shims and gVisor's
sandboxes, which the rows above do not count, and any other test suite). A machine figure near
the number of CPUs x wall clock means the burst was CPU-bound.

Caveats: this is one operator and one node, shared with whatever else runs on the cluster (other
test suites show up as noise: measure on a quiet cluster; the last line gives this machine's load
average during the run, which is the cluster's own when it is the local one). Ratios are per
runtime and per run.

Everything the script creates lives in a namespace labelled ``sandbox-operator.dev/bench=warm-pool``
and is deleted at the end, also on Ctrl-C or an error (``--cleanup`` deletes what a killed run
left). Every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import math
import os
import secrets
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from benchmarks.scale import (  # noqa: E402
    BENCH_LABEL,
    BUSYBOX,
    DECLARATIONS,
    GROUP,
    LIFETIME,
    RUN_LABEL,
    VERSION,
    Kube,
    apply_crds,
    bare_pod,
    component_pids,
    cpu_seconds,
    delete_all,
    delete_run_namespaces,
    f,
    gather_limited,
    leftovers,
    parse_metrics,
    pct,
    run_cleaning_up,
    stop_operators,
    strip_and_delete,
    table,
)
from benchmarks.scale import wait_until as scale_wait_until  # noqa: E402
from tests.fixtures.cluster import LOCAL_KUBECONFIG  # noqa: E402
from tests.fixtures.operator import OperatorProcess  # noqa: E402

from sandbox_operator import labels as lbl  # noqa: E402
from sandbox_operator import naming  # noqa: E402

BENCH = "warm-pool"  # the value of BENCH_LABEL on this script's namespaces
SCOPE = "bench"
POOLS = "sandboxwarmpools"
WARM_LIMIT, COLD_LIMIT = "128Mi", "120Mi"  # memory limits: the pool's shape, and another one
KINDS = ("warm", "cold", "bare")
KIND_LABEL = {"warm": "warm", "cold": "cold", "bare": "bare pod"}
PLURALS = ("sandboxes", POOLS, "sandboxscopes")


def say(msg: str) -> None:
    print(f"[warm-pool {time.strftime('%H:%M:%S')}] {msg}", flush=True)


#: Waits poll often: the one-at-a-time loop moves on as soon as the pool is full again (the
#: figures come from watch timestamps, not from these polls).
wait_until = functools.partial(scale_wait_until, every=15, poll=0.02)


# --------------------------------------------------------------------------------------------
# What the watches saw


def _cond(obj: dict[str, Any], ctype: str) -> str | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return str(c.get("status"))
    return None


@dataclass
class Sbx:
    name: str
    posted: float | None = None
    added: float | None = None
    patched: float | None = None  # first seen with a finalizer (the operator's metadata patch)
    ready: float | None = None
    gone: float | None = None
    refused: str | None = None
    refused_at: float | None = None  # first seen with Admitted=False
    served_from: str | None = None
    pod: str | None = None  # status.servedBy.name


@dataclass
class PodRec:
    name: str
    added: float | None = None
    bound: float | None = None
    ready: float | None = None
    claimed: float | None = None  # a pool pod first seen with a sandbox label
    gone: float | None = None
    deleting: bool = False
    pool: str | None = None
    sandbox: str | None = None
    pool_owned: bool = False
    obj: dict[str, Any] = field(default_factory=dict)

    @property
    def idle(self) -> bool:
        return bool(self.pool and self.pool_owned and not self.sandbox and not self.deleting)


class Tracker:
    def __init__(self) -> None:
        self.sbx: dict[str, Sbx] = {}
        self.pods: dict[str, PodRec] = {}
        self.last_event = time.monotonic()

    def box(self, name: str) -> Sbx:
        return self.sbx.setdefault(name, Sbx(name))

    def on_sandbox(self, kind: str, obj: dict[str, Any], t: float) -> None:
        meta = obj.get("metadata") or {}
        self.last_event = t
        box = self.box(str(meta.get("name", "")))
        box.added = box.added or t
        if kind == "DELETED":
            box.gone = box.gone or t
            return
        if meta.get("finalizers"):
            box.patched = box.patched or t
        status = obj.get("status") or {}
        if _cond(obj, "Ready") == "True":
            box.ready = box.ready or t
        if _cond(obj, "Admitted") == "False" and not box.refused:
            adm = next(c for c in status.get("conditions") or [] if c.get("type") == "Admitted")
            box.refused = f"{adm.get('reason')}: {str(adm.get('message', ''))[:200]}"
            box.refused_at = t
        box.served_from = status.get("servedFrom") or box.served_from
        box.pod = (status.get("servedBy") or {}).get("name") or box.pod

    def on_pod(self, kind: str, obj: dict[str, Any], t: float) -> None:
        meta = obj.get("metadata") or {}
        self.last_event = t
        name = str(meta.get("name", ""))
        rec = self.pods.setdefault(name, PodRec(name))
        rec.added = rec.added or t
        if kind == "DELETED":
            rec.gone = rec.gone or t
            rec.deleting = True
            return
        labels = meta.get("labels") or {}
        rec.pool = labels.get(lbl.POOL_LABEL)
        rec.sandbox = labels.get(lbl.SANDBOX_LABEL)
        rec.pool_owned = any(
            o.get("kind") == "SandboxWarmPool" for o in meta.get("ownerReferences") or []
        )
        rec.deleting = bool(meta.get("deletionTimestamp"))
        if rec.pool and rec.sandbox:
            rec.claimed = rec.claimed or t
        if (obj.get("spec") or {}).get("nodeName"):
            rec.bound = rec.bound or t
        if _cond(obj, "Ready") == "True":
            rec.ready = rec.ready or t
        rec.obj = obj

    def pool_pods(self, pool: str) -> list[PodRec]:
        value = lbl.sandbox_label_value(pool)
        return [p for p in self.pods.values() if p.pool == value and not p.gone]

    def pool_full(self, pool: str, replicas: int) -> bool:
        """``replicas`` idle Ready pods and none starting."""
        idle = [p for p in self.pool_pods(pool) if p.idle]
        return len(idle) == replicas and all(p.ready for p in idle)

    def pool_progress(self, pool: str) -> str:
        pods = self.pool_pods(pool)
        idle = [p for p in pods if p.idle]
        return (
            f"pool {pool}: {sum(1 for p in idle if p.ready)} idle Ready, "
            f"{sum(1 for p in idle if not p.ready)} starting, "
            f"{sum(1 for p in pods if p.sandbox)} claimed"
        )

    def quiet(self, seconds: float) -> bool:
        return time.monotonic() - self.last_event >= seconds


# --------------------------------------------------------------------------------------------
# Objects


#: Its namespaces are t-* and carry this label, like the test suite's: on the local cluster `make
#: up`'s release serves every other namespace, and a second operator there would fight this one.
SERVED_BY = "sandbox-operator.dev/served-by"


def ns_body(name: str, run_id: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {BENCH_LABEL: BENCH, RUN_LABEL: run_id, SERVED_BY: "bench"},
        },
    }


def workload(rt: str, memory: str) -> dict[str, Any]:
    """The pod-shaping spec fields (a pool template; a Sandbox adds its key and lifetime)."""
    spec: dict[str, Any] = {
        "kind": "shell",
        "image": BUSYBOX,
        "workDir": "/workspace",
        "requires": ["exec"],
        "resources": {
            "requests": {"cpu": "10m", "memory": "16Mi"},
            "limits": {"cpu": "500m", "memory": memory},
        },
    }
    if rt == "gvisor":
        spec["minIsolation"] = "hardened_container"
    return spec


def sandbox_body(
    name: str, rt: str, memory: str, run_id: str, floor: str | None = None
) -> dict[str, Any]:
    """A Sandbox of the workload; ``floor`` raises its minIsolation (``microvm``: above every
    backend here, so refused)."""
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": name, "labels": {RUN_LABEL: run_id}},
        "spec": {
            "scopeRef": SCOPE,
            "agentDir": f"agents/{name}",
            **workload(rt, memory),
            "lifetime": LIFETIME,
        },
    }
    if floor is not None:
        body["spec"]["minIsolation"] = floor
    return body


def pool_body(name: str, rt: str, replicas: int, max_creating: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxWarmPool",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "maxCreating": max_creating,
            "template": workload(rt, WARM_LIMIT),
        },
    }


def operator_config() -> dict[str, Any]:
    def backend(name: str, isolation: str) -> dict[str, Any]:
        return {
            "name": name,
            "type": "runtimeClass",
            "runtimeClassName": name,
            "isolation": isolation,
            "declarations": DECLARATIONS,
        }

    return {
        "hostPolicy": {"minIsolation": "container", "selection": "perSpec"},
        "backends": [backend("runc", "container"), backend("gvisor", "hardened_container")],
    }


def path(ns: str, plural: str, name: str = "") -> str:
    if plural == "pods":
        base = f"/api/v1/namespaces/{ns}/pods"
    else:
        base = f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{plural}"
    return f"{base}/{name}" if name else base


#: Every operator subprocess started, so that an interrupted run still stops them.
OPERATORS: list[OperatorProcess] = []


# --------------------------------------------------------------------------------------------
# Results


@dataclass
class Sample:
    kind: str  # warm | cold | bare
    name: str
    latency: float | None  # create -> Ready (s); None: not Ready in time
    warm: bool  # served from the pool
    stages: dict[str, float]  # stage -> seconds after the POST
    requests: Counter[str]  # operator API requests "verb resource" from POST to Ready


@dataclass
class BurstResult:
    count: int
    ready: int
    warm: int
    lat: list[float]
    all_ready: float
    refills: int
    lost: int
    stages: dict[str, list[dict[str, float]]]  # "warm" / "cold" -> stages per Sandbox
    cpu: dict[str, float]  # process -> CPU seconds from the first POST to the last Ready
    seconds: float  # from the first POST to the last Ready
    note: str = ""


@dataclass
class RuntimeResult:
    runtime: str
    samples: list[Sample] = field(default_factory=list)
    burst: BurstResult | None = None
    notes: list[str] = field(default_factory=list)


STAGES = (
    "Sandbox seen (ADDED)",
    "metadata patched",
    "pod claimed",
    "pod created",
    "pod bound",
    "pod Ready",
    "Sandbox Ready",
)


# --------------------------------------------------------------------------------------------
# The run


class Bench:
    def __init__(self, kube: Kube, args: argparse.Namespace, kubeconfig: str) -> None:
        self.kube, self.args, self.kubeconfig = kube, args, kubeconfig
        self.run_id = f"wp-{secrets.token_hex(3)}"
        self.ns = f"t-bench-warmpool-{self.run_id}"
        self.tracker = Tracker()
        self.counter = 0
        self.node = ""
        self.watches: list[asyncio.Task[None]] = []
        self.op: OperatorProcess | None = None

    def next_name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}-{self.counter:04d}"

    async def setup(self) -> None:
        kube, ns = self.kube, self.ns
        code, obj = await kube.request("POST", "/api/v1/namespaces", ns_body(ns, self.run_id))
        if code != 201:
            raise RuntimeError(f"namespace {ns}: HTTP {code} {str(obj)[:300]}")
        for _ in range(120):  # pods are refused until the default ServiceAccount exists
            code, _obj = await kube.request(
                "GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default"
            )
            if code == 200:
                break
            await asyncio.sleep(0.5)
        else:
            raise RuntimeError(f"namespace {ns}: no default ServiceAccount after 60s")
        code, nodes = await kube.request("GET", "/api/v1/nodes", params={"labelSelector": "!type"})
        real = [n["metadata"]["name"] for n in nodes.get("items", [])] if code == 200 else []
        if not real:
            raise RuntimeError("no real node (every node is labelled type=...)")
        self.node = real[0]
        t = self.tracker
        self.watches = [
            asyncio.create_task(kube.watch(path(ns, "sandboxes"), t.on_sandbox)),
            asyncio.create_task(kube.watch(path(ns, "pods"), t.on_pod)),
        ]
        workdir = Path(tempfile.mkdtemp(prefix="bench-warmpool-"))
        cfg = workdir / "operator.yaml"
        cfg.write_text(yaml.safe_dump(operator_config()))
        extra = ("--standalone", "--log-level", self.args.operator_log_level)
        self.op = OperatorProcess(cfg, ns, workdir / "operator.log", self.kubeconfig, extra)
        OPERATORS.append(self.op)
        self.op.start(wait=True)
        say(f"operator pid {self.op.proc.pid if self.op.proc else '?'}, log {self.op.log_path}")
        scope = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxScope",
            "metadata": {"name": SCOPE, "labels": {RUN_LABEL: self.run_id}},
            "spec": {"scope": "bench", "threadId": f"thread-{self.run_id}"},
        }
        code, obj = await kube.request("POST", path(ns, "sandboxscopes"), scope)
        if code != 201:
            raise RuntimeError(f"scope: HTTP {code} {str(obj)[:300]}")

    async def op_requests(self, code: bool = False) -> Counter[str]:
        """The operator's API requests so far by "verb resource" (kopf's own left out); with
        ``code``, by "verb resource code"."""
        out: Counter[str] = Counter()
        if self.op is None:
            return out
        try:
            async with httpx.AsyncClient(timeout=5) as h:
                resp = await h.get(f"http://127.0.0.1:{self.op.metrics_port}/metrics")
        except httpx.HTTPError:
            return out
        name = "sandbox_operator_api_requests_total"
        for labels, value in parse_metrics(resp.text, (name,))[name]:
            if labels.get("client") == "kopf":
                continue
            key = f"{labels.get('verb', '?')} {labels.get('resource', '?')}"
            out[f"{key} {labels.get('code', '?')}" if code else key] += int(value)
        return out

    async def room(self) -> int:
        """How many more pods the real node takes (allocatable pods minus its live pods)."""
        code, pods = await self.kube.request(
            "GET", "/api/v1/pods", params={"fieldSelector": f"spec.nodeName={self.node}"}
        )
        on_node = sum(
            1
            for p in (pods.get("items", []) if code == 200 else [])
            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        )
        code, node = await self.kube.request("GET", f"/api/v1/nodes/{self.node}")
        max_pods = int(node.get("status", {}).get("allocatable", {}).get("pods", 110))
        return max_pods - on_node

    # -- the pool

    async def put_pool(self, name: str, rt: str, replicas: int) -> None:
        body = pool_body(name, rt, replicas, self.args.max_creating)
        code, obj = await self.kube.request("POST", path(self.ns, POOLS), body)
        if code == 409:
            code, obj = await self.kube.request(
                "PATCH",
                path(self.ns, POOLS, name),
                {"spec": {"replicas": replicas}},
                content_type="application/merge-patch+json",
            )
        if code not in (200, 201):
            raise RuntimeError(f"pool {name}: HTTP {code} {str(obj)[:300]}")

    async def pool_status(self, name: str) -> dict[str, Any]:
        code, obj = await self.kube.request("GET", path(self.ns, POOLS, name))
        return (obj.get("status") or {}) if code == 200 else {}

    async def wait_pool(self, name: str, replicas: int, limit: float) -> bool:
        t = self.tracker
        ok = await wait_until(
            f"pool {name} full ({replicas})",
            lambda: t.pool_full(name, replicas),
            limit,
            lambda: t.pool_progress(name),
        )
        if not ok:
            status = await self.pool_status(name)
            say(f"  pool {name} status: {status}")
        return ok

    async def settle(self, seconds: float = 1.0) -> None:
        await wait_until("quiet", lambda: self.tracker.quiet(seconds), 15)

    # -- one object at a time

    def stages_of(self, box: Sbx) -> dict[str, float]:
        """Seconds from the POST to each thing the watches saw of a Sandbox (and its pod)."""
        stages: dict[str, float] = {}
        t0 = box.posted
        if t0 is None:
            return stages

        def stage(label: str, at: float | None) -> None:
            if at is not None:
                stages[label] = at - t0

        stage("Sandbox seen (ADDED)", box.added)
        stage("metadata patched", box.patched)
        pod = self.tracker.pods.get(box.pod or naming.pod_name(box.name))
        if pod is not None:
            if pod.pool:
                stage("pod claimed", pod.claimed)
            else:
                stage("pod created", pod.added)
                stage("pod bound", pod.bound)
                stage("pod Ready", pod.ready)
        stage("Sandbox Ready", box.ready)
        return stages

    def cpu_now(self) -> dict[str, float]:
        """CPU seconds so far of the operator, the local cluster's processes and this script."""
        pids = component_pids()
        if self.op is not None and self.op.proc is not None:
            pids["operator"] = self.op.proc.pid
        out = {n: cpu_seconds(pid) for n, pid in pids.items()}
        found = {n: v for n, v in out.items() if v is not None}
        found["benchmark"] = sum(os.times()[:2])
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
            # user nice system idle iowait irq softirq steal: all but idle and iowait
            busy = sum(int(v) for i, v in enumerate(fields[:8]) if i not in (3, 4))
            found["(machine: all processes)"] = busy / os.sysconf("SC_CLK_TCK")
        return found

    async def one_sandbox(self, rt: str, kind: str, pool: str) -> Sample:
        name = self.next_name(f"{rt}-{kind}")
        box = self.tracker.box(name)
        memory = WARM_LIMIT if kind == "warm" else COLD_LIMIT
        before = await self.op_requests()
        box.posted = time.monotonic()
        code, obj = await self.kube.request(
            "POST", path(self.ns, "sandboxes"), sandbox_body(name, rt, memory, self.run_id)
        )
        if code != 201:
            raise RuntimeError(f"Sandbox {name}: HTTP {code} {str(obj)[:300]}")
        await wait_until(
            f"Sandbox {name} Ready", lambda: bool(box.ready or box.refused), self.args.timeout
        )
        after = await self.op_requests()
        if box.refused:
            say(f"  Sandbox {name} refused: {box.refused}")
        requests = Counter(after)
        requests.subtract(before)
        sample = Sample(
            kind,
            name,
            (box.ready - box.posted) if box.ready else None,
            box.served_from == f"SandboxWarmPool/{pool}",
            self.stages_of(box),
            +requests,
        )
        await self.kube.request("DELETE", path(self.ns, "sandboxes", name))
        pod_name = box.pod or naming.pod_name(name)
        pods = self.tracker.pods
        await wait_until(
            f"Sandbox {name} and its pod gone",
            lambda: bool(box.gone) and (pod_name not in pods or bool(pods[pod_name].gone)),
            120,
        )
        return sample

    async def one_refusal(self) -> Sample:
        """A Sandbox no backend here may serve (floor microvm): POST -> Admitted=False as the
        watch sees it, and the operator's requests for it."""
        name = self.next_name("refused")
        box = self.tracker.box(name)
        before = await self.op_requests()
        box.posted = time.monotonic()
        code, obj = await self.kube.request(
            "POST",
            path(self.ns, "sandboxes"),
            sandbox_body(name, "runc", COLD_LIMIT, self.run_id, floor="microvm"),
        )
        if code != 201:
            raise RuntimeError(f"Sandbox {name}: HTTP {code} {str(obj)[:300]}")
        await wait_until(
            f"Sandbox {name} refused", lambda: bool(box.refused or box.ready), self.args.timeout
        )
        if box.ready:
            raise RuntimeError(f"Sandbox {name} with floor microvm was admitted")
        await asyncio.sleep(0.5)  # anything the operator still does for it is counted
        requests = Counter(await self.op_requests())
        requests.subtract(before)
        latency = (box.refused_at - box.posted) if box.refused_at else None
        sample = Sample("refused", name, latency, False, {}, +requests)
        await self.kube.request("DELETE", path(self.ns, "sandboxes", name))
        await wait_until(f"Sandbox {name} gone", lambda: bool(box.gone), 120)
        return sample

    async def refusals(self) -> list[Sample]:
        say(f"{self.args.count} refusals, one at a time")
        out = []
        for _ in range(self.args.count):
            await self.settle()
            out.append(await self.one_refusal())
        return out

    async def one_bare(self, rt: str, template: dict[str, Any]) -> Sample:
        name = self.next_name(f"bare-{rt}")
        body = bare_pod(template, name)
        posted = time.monotonic()
        code, obj = await self.kube.request("POST", path(self.ns, "pods"), body)
        if code != 201:
            raise RuntimeError(f"bare pod {name}: HTTP {code} {str(obj)[:300]}")
        pods = self.tracker.pods
        await wait_until(
            f"bare pod {name} Ready",
            lambda: name in pods and bool(pods[name].ready),
            self.args.timeout,
        )
        rec = pods.get(name, PodRec(name))
        stages = {
            label: at - posted
            for label, at in (
                ("pod created", rec.added),
                ("pod bound", rec.bound),
                ("pod Ready", rec.ready),
            )
            if at is not None
        }
        sample = Sample(
            "bare", name, (rec.ready - posted) if rec.ready else None, False, stages, Counter()
        )
        await self.kube.request("DELETE", path(self.ns, "pods", name))
        await wait_until(
            f"bare pod {name} gone", lambda: name in pods and bool(pods[name].gone), 120
        )
        return sample

    async def alternating(self, rt: str, pool: str, result: RuntimeResult) -> None:
        args, t = self.args, self.tracker
        replicas = args.pool_replicas
        await self.put_pool(pool, rt, replicas)
        if not await self.wait_pool(pool, replicas, args.fill_timeout):
            raise RuntimeError(f"pool {pool} never filled: {t.pool_progress(pool)}")
        status = await self.pool_status(pool)
        if status.get("backend") != rt:
            raise RuntimeError(f"pool {pool} is on backend {status.get('backend')}, not {rt}")
        idle = next(p for p in t.pool_pods(pool) if p.idle and p.ready)
        template = idle.obj
        say(f"{rt}: {args.count} rounds of warm / cold / bare pod (order rotating)")
        for i in range(args.count):
            order = KINDS[i % 3 :] + KINDS[: i % 3]
            for kind in order:
                if not await self.wait_pool(pool, replicas, args.fill_timeout):
                    result.notes.append(f"round {i}: pool not full before {kind}")
                await self.settle()
                if kind == "bare":
                    sample = await self.one_bare(rt, template)
                else:
                    sample = await self.one_sandbox(rt, kind, pool)
                result.samples.append(sample)
            done = [s for s in result.samples if s.latency is not None]
            say(
                f"{rt}: round {i + 1}/{args.count}: "
                + ", ".join(f"{s.kind} {s.latency:.2f}s" for s in done[-3:])
            )

    # -- a burst

    async def burst(self, rt: str, pool: str, result: RuntimeResult) -> None:
        args, t = self.args, self.tracker
        count = args.burst
        room = await self.room() + len([p for p in t.pool_pods(pool) if p.idle])
        note = ""
        if room - 2 < count:
            count = max(room - 2, 1)
            note = f"node {self.node} had room for {room} pods: burst of {count}, not {args.burst}"
            say(f"{rt}: {note}")
        say(f"{rt}: burst: pool {pool} to {count} idle pods")
        await self.put_pool(pool, rt, count)
        if not await self.wait_pool(pool, count, args.fill_timeout + 3 * count):
            raise RuntimeError(f"pool {pool} never filled: {t.pool_progress(pool)}")
        await self.settle(2.0)
        names = [self.next_name(f"{rt}-burst") for _ in range(count)]
        boxes = [t.box(n) for n in names]
        known = set(t.pods)

        async def post(box: Sbx) -> None:
            box.posted = time.monotonic()
            code, obj = await self.kube.request(
                "POST",
                path(self.ns, "sandboxes"),
                sandbox_body(box.name, rt, WARM_LIMIT, self.run_id),
            )
            if code != 201:
                say(f"  Sandbox {box.name}: HTTP {code} {str(obj)[:200]}")
                box.refused = f"HTTP {code}"

        say(f"{rt}: burst of {count} Sandboxes")
        before = await self.op_requests(code=True)
        cpu_before = self.cpu_now()
        t0 = time.monotonic()
        await gather_limited(count, [functools.partial(post, b) for b in boxes])
        await wait_until(
            f"burst of {count} Ready",
            lambda: all(b.ready or b.refused for b in boxes),
            args.timeout + 2 * count,
            lambda: f"{sum(1 for b in boxes if b.ready)}/{count} Ready",
        )
        cpu_after = self.cpu_now()
        after = await self.op_requests(code=True)
        ready = [b.ready for b in boxes if b.ready]
        last = max(ready) if ready else math.inf
        refills = sum(
            1
            for name, p in t.pods.items()
            if name not in known and p.pool and p.added is not None and p.added <= last
        )
        served = f"SandboxWarmPool/{pool}"
        result.burst = BurstResult(
            count,
            len(ready),
            sum(1 for b in boxes if b.served_from == served),
            [b.ready - b.posted for b in boxes if b.ready and b.posted],
            (last - t0) if len(ready) == count else math.nan,
            refills,
            after["patch pods 409"] - before["patch pods 409"],
            {
                "warm": [self.stages_of(b) for b in boxes if b.served_from == served],
                "cold": [self.stages_of(b) for b in boxes if b.ready and b.served_from != served],
            },
            {n: cpu_after[n] - cpu_before[n] for n in cpu_after if n in cpu_before},
            (last - t0) if ready else math.nan,
            note,
        )
        say(f"{rt}: burst: {len(ready)}/{count} Ready, {result.burst.warm} served from the pool")
        # Scale the pool to nothing before the Sandboxes go: no refill for what they free.
        await self.put_pool(pool, rt, 0)
        await delete_all(self.kube, [path(self.ns, "sandboxes", n) for n in names], 32)
        await wait_until(
            "burst Sandboxes gone",
            lambda: all(b.gone for b in boxes),
            120 + 2 * count,
            lambda: f"{sum(1 for b in boxes if b.gone)}/{count} gone",
        )

    async def drop_pool(self, pool: str) -> None:
        await self.kube.request("DELETE", path(self.ns, POOLS, pool))
        t = self.tracker
        await wait_until(
            f"pool {pool}'s pods gone",
            lambda: not t.pool_pods(pool),
            180,
            lambda: f"{len(t.pool_pods(pool))} left",
        )

    async def runtime(self, rt: str) -> RuntimeResult:
        result = RuntimeResult(rt)
        pool = f"warm-{rt}"
        await self.alternating(rt, pool, result)
        if self.args.burst > 0:
            await self.burst(rt, pool, result)
        await self.drop_pool(pool)
        return result

    async def close(self) -> None:
        for w in self.watches:
            w.cancel()
        await asyncio.gather(*self.watches, return_exceptions=True)
        await teardown(self.kube, [self.ns], self.op)


async def teardown(kube: Kube, namespaces: list[str], op: OperatorProcess | None) -> None:
    """Delete what is left while the operator still runs (its finalizers), stop it, strip any
    finalizer left, delete the namespaces. Bounded."""

    async def objects(with_finalizers: bool = False) -> list[str]:
        out = []
        for ns in namespaces:
            for plural in PLURALS:
                with contextlib.suppress(httpx.HTTPError):
                    code, obj = await kube.request("GET", path(ns, plural))
                    if code == 200:
                        out += [
                            path(ns, plural, i["metadata"]["name"])
                            for i in obj["items"]
                            if not with_finalizers or i["metadata"].get("finalizers")
                        ]
        return out

    paths = await objects()
    if paths and op is not None and op.running:
        say(f"cleanup: deleting {len(paths)} leftover object(s) with the operator running")
        await delete_all(kube, paths, 32)
        deadline = time.monotonic() + 60 + 0.1 * len(paths)
        while time.monotonic() < deadline:
            if not await objects():
                break
            await asyncio.sleep(1)
    if op is not None:
        op.stop()
    await strip_and_delete(kube, namespaces)


# --------------------------------------------------------------------------------------------
# Tables


def three(values: list[float]) -> list[str]:
    if not values:
        return ["n/a", "n/a", "n/a"]
    return [f(pct(values, 50), 3), f(pct(values, 90), 3), f(max(values), 3)]


def ratio(a: list[float], b: list[float]) -> list[str]:
    if not a or not b:
        return ["n/a", "n/a", "n/a"]
    return [
        f(pct(a, 50) / pct(b, 50), 3),
        f(pct(a, 90) / pct(b, 90), 3),
        f(max(a) / max(b), 3),
    ]


def one_at_a_time_table(results: list[RuntimeResult]) -> str:
    rows = []
    for r in results:
        lats = {
            k: [s.latency for s in r.samples if s.kind == k and s.latency is not None]
            for k in KINDS
        }
        for k in KINDS:
            of = [s for s in r.samples if s.kind == k]
            warm = "n/a" if k == "bare" else f"{sum(1 for s in of if s.warm)}/{len(of)}"
            rows.append([f"{r.runtime}: {KIND_LABEL[k]}", f"{len(lats[k])}/{len(of)}", warm,
                         *three(lats[k])])  # fmt: skip
        rows.append([f"{r.runtime}: warm / cold", "", "", *ratio(lats["warm"], lats["cold"])])
        rows.append([f"{r.runtime}: warm / bare pod", "", "", *ratio(lats["warm"], lats["bare"])])
    header = ["", "Ready", "served from pool", "p50 (s)", "p90 (s)", "max (s)"]
    return table(header, rows)


def stages_table(results: list[RuntimeResult]) -> str:
    columns = [(r, k) for r in results for k in KINDS]
    header = ["", *(f"{r.runtime} {KIND_LABEL[k]}" for r, k in columns)]
    rows = []
    for stage in STAGES:
        row = [stage]
        for r, k in columns:
            vals = [s.stages[stage] for s in r.samples if s.kind == k and stage in s.stages]
            row.append(f"{pct(vals, 50):.3f} / {pct(vals, 90):.3f}" if vals else "-")
        rows.append(row)
    out = [table(header, rows)]
    for r in results:
        for k in ("warm", "cold"):
            of = [s for s in r.samples if s.kind == k and s.latency is not None]
            if not of:
                continue
            total: Counter[str] = Counter()
            for s in of:
                total.update(s.requests)
            per = ", ".join(f"{name} {v / len(of):.1f}" for name, v in total.most_common())
            out.append(
                f"  {r.runtime} {k}: operator API requests POST->Ready per acquire "
                f"({sum(total.values()) / len(of):.1f}): {per or 'n/a'}"
            )
    return "\n".join(out)


def burst_table(results: list[RuntimeResult]) -> str:
    rows = []
    notes = []
    for r in results:
        b = r.burst
        if b is None:
            continue
        rows.append([f"{r.runtime}: {b.count} Sandboxes", f"{b.ready}/{b.count}",
                     f"{b.warm}/{b.count}", *three(b.lat), f(b.all_ready, 3),
                     str(b.refills), str(b.lost)])  # fmt: skip
        if b.note:
            notes.append(f"  {r.runtime}: {b.note}")
    header = ["", "Ready", "served from pool", "p50 (s)", "p90 (s)", "max (s)", "all Ready (s)",
              "refills started", "claims lost (409)"]  # fmt: skip
    out = [table(header, rows), *notes]
    # Where the time goes in a burst: the stages, for the Sandboxes served warm and cold.
    columns = [
        (r.runtime, k, r.burst.stages[k])
        for r in results
        if r.burst is not None
        for k in ("warm", "cold")
        if r.burst.stages[k]
    ]
    if columns:
        srows = []
        for stage in STAGES:
            row = [stage]
            for _, _, per in columns:
                vals = [st[stage] for st in per if stage in st]
                row.append(f"{pct(vals, 50):.2f} / {pct(vals, 90):.2f} / {max(vals):.2f}"
                           if vals else "-")  # fmt: skip
            srows.append(row)
        out.append("")
        out.append("burst, where the time goes: seconds after each Sandbox's POST, p50 / p90 / max")
        out.append(table(["", *(f"{rt} {k} ({len(per)})" for rt, k, per in columns)], srows))
    bursts = [(r.runtime, r.burst) for r in results if r.burst is not None and r.burst.cpu]
    if bursts:
        names = sorted(
            {n for _, b in bursts for n in b.cpu},
            key=lambda n: (n.startswith("("), n == "benchmark", n),
        )
        crows = [[n, *(f(b.cpu.get(n, math.nan), 2) for _, b in bursts)] for n in names]
        crows.append(["(wall clock)", *(f(b.seconds, 2) for _, b in bursts)])
        out.append("")
        out.append("burst: CPU seconds per process from the first POST to the last Ready")
        out.append(table(["", *(rt for rt, _ in bursts)], crows))
    return "\n".join(out)


def refusal_table(samples: list[Sample]) -> str:
    lats = [s.latency for s in samples if s.latency is not None]
    total: Counter[str] = Counter()
    for s in samples:
        total.update(s.requests)
    per = ", ".join(f"{name} {v / len(samples):.1f}" for name, v in total.most_common())
    rows = [["refusals", f"{len(lats)}/{len(samples)}", *three(lats)]]
    return "\n".join(
        [
            table(["", "refused", "p50 (s)", "p90 (s)", "max (s)"], rows),
            f"  operator API requests per refusal ({sum(total.values()) / len(samples):.1f}): "
            f"{per or 'none'}",
        ]
    )


def report(
    results: list[RuntimeResult], args: argparse.Namespace, refused: list[Sample] | None = None
) -> str:
    out = [
        f"one at a time: create -> Ready as seen by a watch, {args.count} of each, alternating; "
        f"pool of {args.pool_replicas} full before each",
        one_at_a_time_table(results),
        "",
        "where the time goes (one at a time): seconds after the POST, p50 / p90",
        stages_table(results),
    ]
    if any(r.burst for r in results):
        out += [
            "",
            "burst: concurrent acquires from a pool with as many idle Ready pods",
            burst_table(results),
        ]
    if refused:
        out += [
            "",
            "refusal: create -> Admitted=False as seen by a watch (floor microvm, above every "
            "backend), one at a time",
            refusal_table(refused),
        ]
    for r in results:
        out += [f"  {r.runtime}: {n}" for n in r.notes]
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# main


async def sample_load(out: list[float]) -> None:
    """This machine's 1-min load average every 5 s (the cluster's, when it is the local one)."""
    while True:
        with contextlib.suppress(OSError, ValueError):
            out.append(os.getloadavg()[0])
        await asyncio.sleep(5)


async def amain(args: argparse.Namespace, kubeconfig: str, state: dict[str, Any]) -> None:
    kube = Kube(kubeconfig, max(args.burst, 8) + 8)
    try:
        old = await leftovers(kube, BENCH)
        if old:
            say(f"deleting namespaces an earlier run left: {', '.join(old)}")
            await strip_and_delete(kube, old)
        if args.cleanup:
            return
        await apply_crds(kube)
        bench = Bench(kube, args, kubeconfig)
        state.setdefault("namespaces", []).append(bench.ns)
        results: list[RuntimeResult] = []
        loads: list[float] = []
        sampler = asyncio.create_task(sample_load(loads))
        try:
            await bench.setup()
            say(f"namespace {bench.ns}, node {bench.node}, runtimes {', '.join(args.runtimes)}")
            for rt in args.runtimes:
                results.append(await bench.runtime(rt))
            refused = await bench.refusals()
        except Exception:
            if bench.op is not None:
                print(f"--- operator log (tail), {bench.op.log_path}:\n{bench.op.log()[-4000:]}")
            raise
        finally:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
            await bench.close()
        print()
        print(report(results, args, refused), flush=True)
        if loads:
            print(
                f"  this machine's 1-min load average during the run (every 5 s): mean "
                f"{sum(loads) / len(loads):.1f}, max {max(loads):.1f}, on {os.cpu_count()} CPUs"
            )
        if bench.op is not None:
            print(f"  operator log: {bench.op.log_path}")
    finally:
        await kube.aclose()


def final_cleanup(kubeconfig: str, state: dict[str, Any], interrupted: bool) -> None:
    """Stop any operator still running; after an interruption or error also delete this run's
    namespace."""
    stop_operators(OPERATORS)
    if interrupted:
        delete_run_namespaces(kubeconfig, state.get("namespaces", []), BENCH)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--runtimes", default="runc,gvisor", help="comma-separated (runc, gvisor)")
    p.add_argument("--count", type=int, default=30, help="one-at-a-time samples of each kind")
    p.add_argument("--burst", type=int, default=50, help="concurrent acquires (0: no burst)")
    p.add_argument("--pool-replicas", type=int, default=2, help="pool size, one-at-a-time part")
    p.add_argument("--max-creating", type=int, default=10, help="the pool's maxCreating")
    p.add_argument("--timeout", type=float, default=120, help="per acquire, seconds")
    p.add_argument("--fill-timeout", type=float, default=180, help="pool filling, seconds")
    p.add_argument("--operator-log-level", default="info", choices=["debug", "info", "warning"])
    p.add_argument("--smoke", action="store_true", help="CI: runc, count 3, burst 3")
    p.add_argument("--cleanup", action="store_true", help="only delete what earlier runs left")
    args = p.parse_args(argv)
    args.runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    unknown = set(args.runtimes) - {"runc", "gvisor"}
    if unknown:
        p.error(f"unknown runtime(s): {', '.join(sorted(unknown))}")
    if args.smoke:
        args.runtimes, args.count, args.burst = ["runc"], 3, 3
    kubeconfig = os.environ.get("KUBECONFIG") or str(LOCAL_KUBECONFIG)
    os.environ["KUBECONFIG"] = kubeconfig
    state: dict[str, Any] = {}
    return run_cleaning_up(
        lambda: amain(args, kubeconfig, state),
        lambda interrupted: final_cleanup(kubeconfig, state, interrupted),
    )


if __name__ == "__main__":
    sys.exit(main())
