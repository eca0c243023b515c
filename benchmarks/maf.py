"""maf-sandbox's route beside this project's own client: acquire -> first exec -> cleanup through
``maf_sandbox.SandboxRouter`` over :class:`sandbox_operator.maf.OperatorBackend`, and the same
sequence on :class:`sandbox_operator.client.SandboxClient`, cold and from a warm pool; a maf tool
call whose cleanup is a reset; the client's reset alone; a conversation of ten maf tool calls,
each ended by a reset; API writes per call. On the real local node under runc and gVisor. Prints
three tables per run.

    .venv-maf/bin/python benchmarks/maf.py [--runtimes runc,gvisor] [--count 10]
    .venv-maf/bin/python benchmarks/maf.py --smoke        # CI: runc, count 1, 3 calls, ~1 min
    .venv-maf/bin/python benchmarks/maf.py --conversations 3 --calls 10  # the defaults
    .venv-maf/bin/python benchmarks/maf.py --fast-disposal  # pod.disposalGracePeriodSeconds: 0
    .venv-maf/bin/python benchmarks/maf.py --seal         # idle pool pods sealed (#36 item 2)
    .venv-maf/bin/python benchmarks/maf.py --cleanup      # remove what a killed run left

Python 3.12 (``.venv-maf``: maf-sandbox's floor). Needs the local cluster (``make cluster-up``)
or ``$KUBECONFIG`` pointing at a cluster with a real node and the RuntimeClasses ``runc`` and
``gvisor``. The CRDs are applied (server-side) first.

Why this exists: a host that adopts maf-sandbox reaches the operator through the router and the
adapter, not through the client. What that layer costs per sandbox (the router's admission
checks, the adapter's translation, its scope bookkeeping, maf's storage-base check at acquire,
its label-listed disposal) is only visible measured beside the client it wraps, in one run, on
one cluster, in alternating order.

Per runtime, one namespace and one operator subprocess serving it (``python -m
sandbox_operator.cli run --standalone``) with a single backend (``runc``: isolation container,
``gvisor``: hardened_container; host floor container, selection fixed): how OperatorBackend is
meant to be used, one maf backend per operator backend, so every runtime is reachable without a
spec floor. One SandboxClient serves both routes (one connection pool, one watch code path):

* **maf**: ``SandboxRouter([OperatorBackend.connect(client, backend=<runtime>)],
  min_isolation=<the runtime's rung>)`` (maf's default floor is microvm, which neither runtime
  reaches; the router still checks the backend against it). The sequence is
  ``router.acquire(key, spec)``, ``sandbox.exec(["true"], working_directory=<work dir>)``,
  ``router.dispose(key)``. Each sample is a new key (agent ``agent-NNNN``) in one conversation.
* **own client**: ``client.acquire(scope, agent, spec)``, ``sandbox.exec(["true"])``,
  ``client.dispose(sandbox, wait=True)``. The spec is the one the adapter itself sends for the
  maf spec (``sandbox_operator.maf.operator_spec``), so both routes ask the operator for exactly
  the same Sandbox; ``wait=True`` because the adapter's dispose returns once the API server no
  longer has the Sandbox (maf's "landed"), and the client's own dispose returns after the DELETE.

The maf spec: kind ``bench-warm``, ``bench-cold`` or ``bench-conv``, image busybox, work dir
/workspace, requires exec (nothing else; resources at the host's defaults). A SandboxWarmPool
``warm-<runtime>`` with ``--pool-replicas`` (2) idle pods has the ``bench-warm`` spec as its
template (the template fields of the very contract spec both routes send); ``bench-cold``
differs only in its kind, so no pool has its shape and its pod is created for it;
``bench-conv``, the conversations' kind, has a pool of its own, ``conv-<runtime>``, of
``--conversation-pool`` (``--calls`` + 1: the first call's claim and one per reset) idle pods.

Two more rows use a second router over the same adapter, ``min_cleanup=maf.Cleanup.RESET``
(the adapter declares ``SNAPSHOT``, docs/reset.md), so a conversation-scoped call ends by a
reset, not a disposal:

* **maf, reset**: one tool call as maf's tool wrapper makes it: ``router.enter_call`` and
  ``router.acquire`` under that admission (timed together as ``acquire``; the admission does no
  I/O), the first exec, ``router.finish_call`` (``cleanup``: the reset, which claims a pool pod
  and, in the maf backend, prepares the storage base again). Kind ``bench-warm``: its acquire
  claims from the pool too. A reset maf escalated to a disposal (a router observer counts them)
  is a failed sample, not a slow reset. The Sandbox, still serving after it, is then disposed
  of, untimed;
* **own client, reset** (its own table): ``client.reset`` alone on a Ready Sandbox the client
  acquired from the pool, untimed, with the pool full again before the reset; then the first
  command in the new pod;
* **conversation** (its own table, maf route only): ``--conversations`` (3) times, ``--calls``
  (10) such tool calls on one new key of kind ``bench-conv``, timed from the first call's
  admission to the last call's cleanup, its pool full before each conversation.

Rounds: ``--count`` N rounds, each measuring maf cold, own cold, maf warm, own warm, maf reset,
own reset, in an order that rotates by one every round; then the conversations. Before every
measurement the pool is full (``--pool-replicas`` idle Ready pods, none starting: a refill is
never part of a measurement), the previous Sandbox and its pod are gone, and no watch event came
for 1 s. First ``--warmup`` (1) untimed cold round of each route and one maf reset call: the
adapter creates the conversation's SandboxScope once per process, and both routes open their
first connections; a host pays that once, not per sandbox.

Tables (per runtime; times ``time.perf_counter`` around each awaited call, seconds, "p50 / p90",
nearest rank):

* ``done``: samples where every step succeeded (exec exit 0), of N;
* ``from pool``: of those, Sandboxes whose status.servedFrom (as this script's watch saw it) is
  the pool (warm should be N/N, cold 0/N); for an acquire that created more than one, the last;
* ``Sandboxes``: Sandbox objects created per acquire (mean; the watch counts the uids under the
  key's name). 1.0 for the client. More on the maf route means maf's router disposed what the
  adapter handed it and acquired again: it does so with a sandbox the backend does not report
  ``freshly_created`` (one it cannot know is clean), and the time shows in ``acquire``;
* ``acquire``: until the call returns a usable handle (Ready; for maf also the router's checks,
  the adapter's published-backend match and maf's storage-base check, which execs in the guest);
* ``pool claims``: warm-pool claims per call (mean; the operator's
  ``sandbox_operator_warm_pool_claims_total``), with those that found the pool empty and started
  a pod instead ("+N empty"). Warm 1.0; maf's reset row 2.0 (its acquire and its reset); more on
  maf without ``--seal`` (the router resets a pool pod it cannot vouch for before use);
* ``first exec``: ``true`` in the work dir, the handle's first command from the caller;
* ``cleanup``: a disposal until the Sandbox is gone from the API server (its pod object is gone
  by then: by default the kubelet has stopped it; with ``--fast-disposal``, the backend's
  ``pod.disposalGracePeriodSeconds: 0``, it may still be stopping its containers:
  docs/disposal.md); on the reset row, maf's ``finish_call`` until the reset is done;
* ``total``: the three added per sample;
* ``writes op + client``: API writes per call (mean): the operator's, from its metrics port
  (``sandbox_operator_api_requests_total`` under create, update, patch, delete and
  deletecollection, kopf's own requests included, exec streams and access reviews not), and the
  client's POST, PUT, PATCH and DELETE requests (a hook on its ``ApiClient``; its exec streams
  not counted). Counted from before the first timed step until the pool has refilled what the
  call claimed and the watch is quiet, so the refill's pod creation counts to the call; a reset
  row's final disposal, untimed, does not;
* ``maf / own``: the ratio of those p50s and of those p90s, per temperature; ``maf reset / own
  warm``: the maf call that ends by a reset over the client's own warm claim that disposes.

The conversation table gives ``conversation`` (the whole conversation's seconds) and, over all
its calls, the same phases, pool claims and writes per call.

Caveats: one operator, one node, shared with whatever else runs on the cluster (the last line
gives this machine's load average during the run: measure on a quiet cluster). A run from an
older tree may apply CRDs without ``spec.resets`` meanwhile (the API server then prunes a reset's
patch and the reset waits out its timeout): before every measurement the script checks and
applies its own again, noted under the tables. Ratios are per
runtime and per run; with N = 10 the p90 is the 9th of 10 samples. On the local node the totals
fall close to whole seconds (the node reports pod starts and stops on a one-second beat, likely
the kubelet's 1 s relist), so a difference under a second in one phase often moves the total by
a whole second or not at all: compare the phases, not only the totals.

Everything the script creates lives in namespaces labelled ``sandbox-operator.dev/bench=maf``
and is deleted at the end, also on Ctrl-C or an error (``--cleanup`` deletes what a killed run
left). A run starts by deleting what earlier runs left, except namespaces whose run (the pid in
their label ``sandbox-operator.dev/bench-pid``) is still this script on this machine: the smoke
test and a manual run can share the cluster. Every wait is bounded. No latency is asserted
anywhere: the smoke test checks that every row was measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import sys
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

# maf-sandbox says once per process that it is experimental; known, and noise in a table.
warnings.filterwarnings("ignore", message="maf_sandbox is experimental")
try:
    import maf_sandbox as maf
except ImportError:  # pragma: no cover - the wrong interpreter
    sys.exit("benchmarks/maf.py needs maf-sandbox (Python 3.12): run it with .venv-maf/bin/python")

from benchmarks.scale import (  # noqa: E402
    BENCH_LABEL,
    BUSYBOX,
    DECLARATIONS,
    RUN_LABEL,
    Kube,
    apply_crds,
    delete_run_namespaces,
    leftovers,
    pct,
    run_cleaning_up,
    stop_operators,
    strip_and_delete,
    table,
)
from benchmarks.warm_pool import (  # noqa: E402
    POOLS,
    Tracker,
    path,
    sample_load,
    teardown,
    wait_until,
)
from tests.fixtures.cluster import LOCAL_KUBECONFIG  # noqa: E402
from tests.fixtures.operator import OperatorProcess  # noqa: E402

from sandbox_operator import contract, naming  # noqa: E402
from sandbox_operator.client import SandboxClient  # noqa: E402
from sandbox_operator.contract.published import PUBLISHED_CONFIGMAP  # noqa: E402
from sandbox_operator.maf import OperatorBackend, operator_spec  # noqa: E402

BENCH = "maf"  # the value of BENCH_LABEL on this script's namespaces
PID_LABEL = "sandbox-operator.dev/bench-pid"  # the process that made the namespace
SERVED_BY_LABEL = "sandbox-operator.dev/served-by"  # another operator's (the one this script runs)
SCOPE, WORK_DIR = "bench", "/workspace"
RUNTIMES = {"runc": "container", "gvisor": "hardened_container"}  # backend -> isolation
ROUTES = ("maf", "own")
TEMPS = ("cold", "warm")
#: one round's measurements; the order rotates by one per round. ``reset``: on maf a tool call
#: whose cleanup is a reset; on the client a reset alone, of a Sandbox acquired before it.
ROUND = (
    ("maf", "cold"),
    ("own", "cold"),
    ("maf", "warm"),
    ("own", "warm"),
    ("maf", "reset"),
    ("own", "reset"),
)
PHASES = ("acquire", "first exec", "cleanup", "total")
RESET_PHASES = ("reset", "first exec")  # the client's reset alone, then a command in the new pod
ROUTE_LABEL = {"maf": "maf router", "own": "own client"}
#: Requests the operator counts under a writing verb that store nothing: an exec or attach
#: stream, an access or token review.
NOT_STORED = ("/exec", "/attach", "reviews")
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
EXEC_TIMEOUT = 60.0
T = TypeVar("T")

#: Every operator subprocess started, so that an interrupted run still stops them.
OPERATORS: list[OperatorProcess] = []


def say(msg: str) -> None:
    print(f"[maf {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------------------------
# Specs and objects


def maf_spec(temp: str) -> maf.SandboxSpec:
    """The workload both routes run: only the kind differs between warm, cold and conv (the
    conversations', with a pool of its own)."""
    return maf.SandboxSpec(
        kind=f"bench-{temp}",
        image=BUSYBOX,
        work_dir=WORK_DIR,
        requires=frozenset({maf.Capability.EXEC}),
    )


def pool_template(spec: contract.SandboxSpec) -> dict[str, Any]:
    """The pool template of a contract spec: its template fields as the spec sets them."""
    fields = spec.model_dump(include=set(contract.WARM_POOL_TEMPLATE_FIELDS), exclude_unset=True)
    return contract.WarmPoolTemplate.model_validate(fields).to_wire()


def operator_config(rt: str, *, fast_disposal: bool = False) -> dict[str, Any]:
    """The script's operator's configuration: one backend, ``rt``, with the default disposal
    (the pod's own grace, waited for) unless ``fast_disposal`` (docs/disposal.md's opt-in)."""
    backend: dict[str, Any] = {
        "name": rt,
        "type": "runtimeClass",
        "runtimeClassName": rt,
        "isolation": RUNTIMES[rt],
        "declarations": DECLARATIONS,
    }
    if fast_disposal:
        backend["pod"] = {"disposalGracePeriodSeconds": 0}
    return {
        "hostPolicy": {"minIsolation": "container", "selection": "fixed", "pinnedBackend": rt},
        "backends": [backend],
    }


class Disposals(maf.SandboxObserver):
    """The reset router's disposals, counted: maf escalates a reset that failed to a disposal
    and, when that lands, reports the call's cleanup as done. A reset row's sample with a
    disposal in its cleanup did not measure a reset."""

    def __init__(self) -> None:
        self.count = 0

    def sandbox_disposed(self, event: maf.SandboxDisposed) -> None:
        self.count += 1


CRD_SANDBOXES = "sandboxes.sandbox-operator.dev"


async def crd_resets(kube: Kube) -> bool:
    """Whether the cluster's Sandbox CRD has ``spec.resets``. The cluster is shared, and a run
    from an older tree applies its CRD; the API server then prunes ``spec.resets`` from the
    client's patch, and a reset waits out its timeout."""
    code, crd = await kube.request(
        "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_SANDBOXES}"
    )
    versions = ((crd.get("spec") or {}).get("versions") or []) if code == 200 else []
    return any(
        "resets"
        in (
            (((v.get("schema") or {}).get("openAPIV3Schema") or {}).get("properties") or {})
            .get("spec", {})
            .get("properties", {})
        )
        for v in versions
    )


class Seen(Tracker):
    """warm_pool.py's watch record, plus every Sandbox object (by uid) seen under each name: an
    acquire may create more than one (maf's router disposes a sandbox it cannot tell is fresh
    and acquires again), and "gone" means the last of them is."""

    def __init__(self) -> None:
        super().__init__()
        self.uids: dict[str, list[str]] = {}
        self.live: dict[str, set[str]] = {}

    def on_sandbox(self, kind: str, obj: dict[str, Any], t: float) -> None:
        super().on_sandbox(kind, obj, t)
        meta = obj.get("metadata") or {}
        name, uid = str(meta.get("name", "")), str(meta.get("uid", ""))
        uids, live = self.uids.setdefault(name, []), self.live.setdefault(name, set())
        if uid and uid not in uids:
            uids.append(uid)
        if kind == "DELETED":
            live.discard(uid)
        elif uid:
            live.add(uid)


# --------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class Counts:
    """API writes and pool claims so far: the operator's (its metrics port) and the client's."""

    operator_writes: float = 0.0
    client_writes: float = 0.0
    warm_claims: float = 0.0
    exhausted: float = 0.0  # claims that found a matching pool empty and started cold

    def __sub__(self, other: Counts) -> Counts:
        return Counts(
            self.operator_writes - other.operator_writes,
            self.client_writes - other.client_writes,
            self.warm_claims - other.warm_claims,
            self.exhausted - other.exhausted,
        )


@dataclass
class Sample:
    route: str  # maf | own
    temp: str  # cold | warm | reset | conv (one call of a conversation)
    sandbox: str
    phases: dict[str, float] = field(default_factory=dict)  # phase -> seconds
    served_from: str | None = None
    created: int = 0  # Sandbox objects this sample's acquire created under its name
    failed: str | None = None  # the exception's type and message, when a step failed
    counts: Counts | None = None  # what the measured steps wrote and claimed (None: unread)
    step: str = "acquire"  # the step under way (a failure names it)


@dataclass
class Conversation:
    """One conversation: ``--calls`` maf tool calls on one key, each ended by a reset."""

    sandbox: str
    calls: list[Sample] = field(default_factory=list)
    seconds: float = 0.0  # the first call's enter_call to the last call's finish_call
    failed: str | None = None
    counts: Counts | None = None


@dataclass
class RuntimeResult:
    runtime: str
    pool: str
    samples: list[Sample] = field(default_factory=list)
    conversations: list[Conversation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def of(self, route: str, temp: str) -> list[Sample]:
        return [s for s in self.samples if s.route == route and s.temp == temp]


# --------------------------------------------------------------------------------------------
# One runtime


class RuntimeBench:
    """One namespace, one operator with the runtime's single backend, one client, one router."""

    def __init__(self, kube: Kube, args: argparse.Namespace, kubeconfig: str, rt: str) -> None:
        self.kube, self.args, self.kubeconfig, self.rt = kube, args, kubeconfig, rt
        self.run_id = f"maf-{secrets.token_hex(3)}"
        # t-*, labelled served-by like the test suite's namespaces: on the local cluster make up's
        # release serves every namespace but those (hack/up.sh), and a second operator serving
        # this one would fight ours over the pool's pods (docs/install.md).
        self.ns = f"t-bench-maf-{rt}-{self.run_id}"
        self.thread = f"thread-{self.run_id}"
        self.pool = f"warm-{rt}"
        self.conv_pool = f"conv-{rt}"  # the conversations' kind's own pool
        self.tracker = Seen()
        self.counter = 0
        self.watches: list[asyncio.Task[None]] = []
        self.op: OperatorProcess | None = None
        self.client: SandboxClient | None = None
        self.router: maf.SandboxRouter | None = None
        #: The same adapter under a router whose calls end by a reset (maf.Cleanup.RESET).
        self.reset_router: maf.SandboxRouter | None = None
        #: Writing requests (POST, PUT, PATCH, DELETE) the client sent, both routes'.
        self.client_writes = 0
        self.disposals = Disposals()
        #: With --seal: the chart's policies sealing idle pool pods, applied for this namespace.
        self.seal = contextlib.ExitStack()

    # -- setup

    async def setup(self) -> None:
        kube, ns = self.kube, self.ns
        labels = {
            BENCH_LABEL: BENCH,
            RUN_LABEL: self.run_id,
            PID_LABEL: str(os.getpid()),
            SERVED_BY_LABEL: "bench-maf",
        }
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}}
        code, obj = await kube.request("POST", "/api/v1/namespaces", body)
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
        t = self.tracker
        self.watches = [
            asyncio.create_task(kube.watch(path(ns, "sandboxes"), t.on_sandbox)),
            asyncio.create_task(kube.watch(path(ns, "pods"), t.on_pod)),
        ]
        workdir = Path(tempfile.mkdtemp(prefix=f"bench-maf-{self.rt}-"))
        cfg = workdir / "operator.yaml"
        config = operator_config(self.rt, fast_disposal=self.args.fast_disposal)
        cfg.write_text(yaml.safe_dump(config))
        extra: tuple[str, ...] = ("--standalone", "--log-level", self.args.operator_log_level)
        if self.args.seal:
            extra += (f"--pool-seal={self.apply_seal()}",)
        self.op = OperatorProcess(cfg, ns, workdir / "operator.log", self.kubeconfig, extra)
        OPERATORS.append(self.op)
        self.op.start(wait=True)
        say(f"{self.rt}: namespace {ns}, operator log {self.op.log_path}")
        if self.args.seal:
            await self.wait_sealed()
        self.client = await SandboxClient.from_kubeconfig(ns, kubeconfig=self.kubeconfig)
        self.count_client_writes(self.client)
        await self.client.create_scope(scope=SCOPE, thread_id=self.thread)
        pools = {self.pool: ("warm", self.args.pool_replicas)}
        if self.conversing:
            pools[self.conv_pool] = ("conv", self.args.conversation_pool)
        for pool, (temp, replicas) in pools.items():
            await self.put_pool(pool, temp, replicas)
        for pool, (_temp, replicas) in pools.items():
            if not await self.wait_pool(pool, replicas):
                raise RuntimeError(f"pool {pool} never filled: {t.pool_progress(pool)}")
            code, obj = await kube.request("GET", path(ns, POOLS, pool))
            backend = ((obj.get("status") or {}) if code == 200 else {}).get("backend")
            if backend != self.rt:
                raise RuntimeError(f"pool {pool} is on backend {backend!r}, not {self.rt}")
        if "maf" in self.args.routes:
            adapter = await self.connect()
            if maf.Capability.SNAPSHOT not in adapter.declarations.capabilities:
                raise RuntimeError(f"{self.rt}: the adapter declares no SNAPSHOT (no reset)")
            floor = maf.Isolation(RUNTIMES[self.rt])
            self.router = maf.SandboxRouter([adapter], min_isolation=floor)
            self.reset_router = maf.SandboxRouter(
                [adapter],
                min_isolation=floor,
                min_cleanup=maf.Cleanup.RESET,
                observer=self.disposals,
            )

    @property
    def conversing(self) -> bool:
        return "maf" in self.args.routes and self.args.conversations > 0

    def count_client_writes(self, client: SandboxClient) -> None:
        """Count the client's writing requests: every API call of its ``ApiClient`` goes through
        ``rest_client.request`` (exec streams go through its websocket client, not counted)."""
        rest = client.api.rest_client
        original = rest.request

        async def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            if method.upper() in WRITE_METHODS:
                self.client_writes += 1
            return await original(method, url, *args, **kwargs)

        rest.request = request  # type: ignore[method-assign]

    async def counts(self) -> Counts:
        """The operator's writes (every client of it, kopf's too; no exec stream or review)
        and warm-pool claims from its metrics port, and the client's writes so far."""
        op = self.op
        assert op is not None
        metrics = await asyncio.to_thread(op.metrics)
        writes = warm = exhausted = 0.0
        for (name, labels), value in metrics.items():
            lab = dict(labels)
            if name == "sandbox_operator_api_requests_total":
                resource = lab.get("resource", "")
                if lab.get("verb") in WRITE_VERBS and not resource.endswith(NOT_STORED):
                    writes += value
            elif name == "sandbox_operator_warm_pool_claims_total":
                if lab.get("result") == "warm":
                    warm += value
                elif lab.get("result") == "exhausted":
                    exhausted += value
        return Counts(writes, float(self.client_writes), warm, exhausted)

    def apply_seal(self) -> str:
        """The chart's seal on idle pool pods for this namespace, exempting the identity the
        operator runs as (this script's); the policy's name for ``--pool-seal``."""
        from kubernetes import config as kube_config
        from tests.fixtures.seal import applied_seal, whoami

        identity = whoami(kube_config.new_client_from_config(self.kubeconfig))
        policy, _ = self.seal.enter_context(
            applied_seal(self.kubeconfig, self.ns, identity=identity, label_exempt=False)
        )
        return policy

    async def wait_sealed(self) -> None:
        """Until the operator has judged the seal, then its settling time: pool pods made
        before it are not vouched for (reconcile/seal.py)."""
        from sandbox_operator.reconcile.seal import SETTLE

        assert self.op is not None
        deadline = time.monotonic() + 60
        while "idle pool pods sealed by" not in self.op.log():
            if time.monotonic() > deadline:
                raise RuntimeError("the operator never judged the seal sealing (see its log)")
            await asyncio.sleep(0.5)
        await asyncio.sleep(SETTLE.total_seconds() + 1)

    async def connect(self) -> OperatorBackend:
        """The adapter, once the operator has published its backends (it writes the ConfigMap
        after it starts; bounded)."""
        assert self.client is not None
        deadline = time.monotonic() + 60
        while True:
            code, _obj = await self.kube.request(
                "GET", f"/api/v1/namespaces/{self.ns}/configmaps/{PUBLISHED_CONFIGMAP}"
            )
            if code == 200 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        return await OperatorBackend.connect(self.client, backend=self.rt)

    def spec(self, temp: str) -> tuple[maf.SandboxSpec, contract.SandboxSpec]:
        """The maf spec and the contract spec the adapter sends for it."""
        ours = maf_spec(temp)
        return ours, operator_spec(ours)

    async def put_pool(self, pool: str, temp: str, replicas: int) -> None:
        body = {
            "apiVersion": f"{contract.GROUP}/{contract.VERSION}",
            "kind": "SandboxWarmPool",
            "metadata": {"name": pool},
            "spec": {
                "replicas": replicas,
                "maxCreating": max(replicas, 1),
                "template": pool_template(self.spec(temp)[1]),
            },
        }
        code, obj = await self.kube.request("POST", path(self.ns, POOLS), body)
        if code not in (200, 201):
            raise RuntimeError(f"pool {pool}: HTTP {code} {str(obj)[:300]}")

    async def wait_pool(self, pool: str = "", replicas: int = 0) -> bool:
        """Until ``pool`` (default: the warm one) has its idle Ready pods and none starting."""
        t = self.tracker
        pool, replicas = pool or self.pool, replicas or self.args.pool_replicas
        return await wait_until(
            f"pool {pool} full ({replicas})",
            lambda: t.pool_full(pool, replicas),
            self.args.fill_timeout,
            lambda: t.pool_progress(pool),
        )

    async def refilled(self, pool: str = "", replicas: int = 0) -> Counts:
        """Once the pool (default: the warm one) has refilled what a measurement took and the
        watch is quiet: the counts then (a measurement's writes include its claims' refill)."""
        await self.wait_pool(pool, replicas)
        await self.settle()
        return await self.counts()

    # -- one measurement

    def next_agent(self) -> str:
        self.counter += 1
        return f"agent-{self.counter:04d}"

    def key_and_name(self, agent: str, ours: contract.SandboxSpec) -> tuple[maf.SandboxKey, str]:
        key = maf.SandboxKey(SCOPE, self.thread, agent)
        ckey = contract.SandboxKey(scope=SCOPE, thread_id=self.thread, agent_dir=agent)
        return key, naming.sandbox_name(ckey, ours.kind)

    async def measure(self, route: str, temp: str) -> Sample:
        """One sample of a row, each step timed; then, untimed, the pool refilled, the Sandbox
        disposed (a reset row's Sandbox is still serving) and it and its pod gone. Its counts
        cover the timed steps and the pool's refill of what they claimed."""
        assert self.client is not None
        client = self.client
        agent = self.next_agent()
        spec, ours = self.spec("warm" if temp == "reset" else temp)
        key, name = self.key_and_name(agent, ours)
        sample = Sample(route, temp, name)
        box = self.tracker.box(name)
        before: Counts | None = None
        try:
            if route == "own" and temp == "reset":
                scope_ref = naming.scope_name(SCOPE, self.thread)
                handle = await client.acquire(scope_ref, agent, ours, timeout=self.args.timeout)
                before = await self.refilled()  # the acquire's claim refilled: a full pool
                await self.timed(
                    sample, "reset", lambda: client.reset(handle, timeout=self.args.timeout)
                )
                own = await self.timed(
                    sample, "first exec", lambda: handle.exec(["true"], timeout=EXEC_TIMEOUT)
                )
                exit_code = own.exit_code
            elif route == "maf":
                before = await self.counts()
                exit_code = await self.maf_call(sample, key, spec, reset=temp == "reset")
            else:
                before = await self.counts()
                exit_code = await self.own_call(sample, agent, ours)
            if exit_code != 0:
                raise RuntimeError(f"`true` exited {exit_code}")
        except Exception as exc:
            self.failed(sample, exc)
        phases = RESET_PHASES if route == "own" and temp == "reset" else PHASES[:3]
        sample.phases["total"] = sum(sample.phases.get(p, 0.0) for p in phases)
        if temp == "reset" and before is not None and not sample.failed:
            sample.counts = await self.refilled() - before
        if temp == "reset" or sample.failed:
            await self.dispose_untimed(route, key, name)
        t = self.tracker
        acquired = "acquire" in sample.phases or "reset" in sample.phases

        def gone() -> bool:
            pod = t.pods.get(box.pod or naming.pod_name(name))
            seen = bool(t.uids.get(name)) or not acquired
            return seen and not t.live.get(name) and (pod is None or bool(pod.gone))

        await wait_until(f"Sandbox {name} and its pod gone", gone, 120)
        if temp != "reset" and before is not None and not sample.failed:
            sample.counts = await self.refilled() - before
        sample.served_from = box.served_from
        sample.created = len(t.uids.get(name, ()))
        return sample

    def failed(self, sample: Sample, exc: BaseException) -> None:
        first = (str(exc).strip().splitlines() or [""])[0]
        sample.failed = f"{sample.step}: {type(exc).__name__}: {first[:200]}"
        say(f"  {self.rt} {sample.route} {sample.temp} {sample.sandbox}: {sample.failed}")

    async def dispose_untimed(self, route: str, key: maf.SandboxKey, name: str) -> None:
        """Dispose of what a sample leaves, through the route that made it (maf's router then
        forgets the key's instances)."""
        assert self.client is not None
        with contextlib.suppress(Exception):
            if route == "maf" and self.reset_router is not None:
                await self.reset_router.dispose(key)
            await self.client.dispose(name)

    async def own_call(self, sample: Sample, agent: str, ours: contract.SandboxSpec) -> int:
        """acquire -> first exec -> dispose on the client."""
        client = self.client
        assert client is not None
        scope_ref = naming.scope_name(SCOPE, self.thread)
        handle = await self.timed(
            sample,
            "acquire",
            lambda: client.acquire(scope_ref, agent, ours, timeout=self.args.timeout),
        )
        own = await self.timed(
            sample, "first exec", lambda: handle.exec(["true"], timeout=EXEC_TIMEOUT)
        )
        await self.timed(sample, "cleanup", lambda: client.dispose(handle, wait=True))
        return own.exit_code

    async def maf_call(
        self, sample: Sample, key: maf.SandboxKey, spec: maf.SandboxSpec, *, reset: bool
    ) -> int:
        """acquire -> first exec -> dispose on the router; with ``reset`` a tool call whose
        cleanup is a reset instead (:meth:`tool_call`)."""
        if reset:
            return await self.tool_call(sample, key, spec, owner=sample.sandbox)
        router = self.router
        assert router is not None
        sandbox = await self.timed(sample, "acquire", lambda: router.acquire(key, spec))
        result = await self.timed(
            sample,
            "first exec",
            lambda: sandbox.exec(["true"], working_directory=WORK_DIR, timeout=EXEC_TIMEOUT),
        )
        await self.timed(sample, "cleanup", lambda: router.dispose(key))
        return result.exit_code

    async def tool_call(
        self, sample: Sample, key: maf.SandboxKey, spec: maf.SandboxSpec, *, owner: str
    ) -> int:
        """One tool call as maf's tool wrapper makes it, on the router whose floor is
        ``Cleanup.RESET``: ``enter_call`` (timed with the acquire: it admits the call, no I/O),
        ``acquire`` under that admission, the first command, then ``finish_call``, which ends a
        conversation-scoped call by resetting its sandbox (a reset that fails is escalated to a
        disposal by maf, and reported here as a failure)."""
        router = self.reset_router
        assert router is not None
        start = time.perf_counter()
        admission = await router.enter_call(key, spec, owner=owner)
        sandbox: maf.Sandbox | None = None
        try:
            sandbox = await router.acquire(key, spec, _admission=admission)
            sample.phases["acquire"] = time.perf_counter() - start
            held = sandbox
            result = await self.timed(
                sample,
                "first exec",
                lambda: held.exec(["true"], working_directory=WORK_DIR, timeout=EXEC_TIMEOUT),
            )
        except BaseException:
            await router.finish_call(
                key, spec, admission=admission, sandbox=sandbox, owner=owner, unclean="failed"
            )
            raise
        disposals = self.disposals.count
        failure = await self.timed(
            sample,
            "cleanup",
            lambda: router.finish_call(key, spec, admission=admission, sandbox=held, owner=owner),
        )
        if failure is not None:
            raise RuntimeError(f"the call's cleanup: {failure}")
        if self.disposals.count != disposals:
            raise RuntimeError("the reset failed and maf disposed of the sandbox instead")
        return result.exit_code

    async def conversation(self) -> Conversation:
        """``--calls`` tool calls on one key of the conversations' kind, each ended by a reset
        (the pool's idle pods claimed one by one); timed from the first call's admission to the
        last call's cleanup. Then, untimed, the pool refilled and the Sandbox disposed."""
        agent = self.next_agent()
        spec, ours = self.spec("conv")
        key, name = self.key_and_name(agent, ours)
        conv = Conversation(name)
        box = self.tracker.box(name)
        before = await self.counts()
        start = time.perf_counter()
        for i in range(self.args.calls):
            call = Sample("maf", "conv", name)
            conv.calls.append(call)
            try:
                exit_code = await self.tool_call(call, key, spec, owner=f"{name}-{i}")
                if exit_code != 0:
                    raise RuntimeError(f"`true` exited {exit_code}")
            except Exception as exc:
                self.failed(call, exc)
                conv.failed = f"call {i + 1}: {call.failed}"
                break
            finally:
                call.phases["total"] = sum(call.phases.get(p, 0.0) for p in PHASES[:3])
        conv.seconds = time.perf_counter() - start
        if not conv.failed:
            conv.counts = await self.refilled(self.conv_pool, self.args.conversation_pool) - before
        await self.dispose_untimed("maf", key, name)
        t = self.tracker

        def gone() -> bool:
            pod = t.pods.get(box.pod or naming.pod_name(name))
            return not t.live.get(name) and (pod is None or bool(pod.gone))

        await wait_until(f"Sandbox {name} and its pod gone", gone, 120)
        return conv

    @staticmethod
    async def timed(sample: Sample, phase: str, call: Callable[[], Awaitable[T]]) -> T:
        sample.step = phase
        start = time.perf_counter()
        value = await call()
        sample.phases[phase] = time.perf_counter() - start
        return value

    # -- the run

    async def run(self, result: RuntimeResult) -> None:
        args = self.args
        warmups = [(route, "cold") for route in args.routes]
        if "maf" in args.routes:
            warmups.append(("maf", "reset"))  # the reset router's first call
        for _ in range(args.warmup):
            for route, temp in warmups:
                await self.wait_pool()
                await self.guard_crd(result, f"warm-up {route} {temp}")
                await self.settle()
                warm = await self.measure(route, temp)
                say(f"{self.rt}: warm-up {route} {temp}: {warm.failed or 'ok'} (not counted)")
        say(f"{self.rt}: {args.count} rounds of maf / own client, cold / warm / reset (rotating)")
        rounds = [(route, temp) for route, temp in ROUND if route in args.routes]
        for i in range(args.count):
            order = rounds[i % len(rounds) :] + rounds[: i % len(rounds)]
            for route, temp in order:
                if not await self.wait_pool():
                    result.notes.append(f"round {i}: pool not full before {route} {temp}")
                await self.guard_crd(result, f"round {i + 1} {route} {temp}")
                await self.settle()
                result.samples.append(await self.measure(route, temp))
            done = result.samples[-len(rounds) :]
            say(
                f"{self.rt}: round {i + 1}/{args.count}: "
                + ", ".join(
                    f"{s.route} {s.temp} {s.phases['total']:.2f}s"
                    if not s.failed
                    else f"{s.route} {s.temp} FAILED"
                    for s in done
                )
            )
        for i in range(args.conversations if self.conversing else 0):
            if not await self.wait_pool(self.conv_pool, args.conversation_pool):
                result.notes.append(f"conversation {i}: pool {self.conv_pool} not full")
            await self.guard_crd(result, f"conversation {i + 1}")
            await self.settle()
            conv = await self.conversation()
            result.conversations.append(conv)
            say(
                f"{self.rt}: conversation {i + 1}/{args.conversations}: "
                + (f"FAILED ({conv.failed})" if conv.failed else f"{conv.seconds:.2f}s")
                + f", {len(conv.calls)} calls"
            )

    async def guard_crd(self, result: RuntimeResult, before: str) -> None:
        """Apply this tree's CRDs again if another run's replaced them (:func:`crd_resets`),
        and say so under the table."""
        if await crd_resets(self.kube):
            return
        result.notes.append(
            f"the CRDs applied again before {before}: another run had replaced them"
        )
        await apply_crds(self.kube)
        await asyncio.sleep(2)  # the API server re-initialises the resource's storage

    async def settle(self, seconds: float = 1.0) -> None:
        await wait_until("quiet", lambda: self.tracker.quiet(seconds), 15)

    async def close(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.delete_scope(naming.scope_name(SCOPE, self.thread))
            with contextlib.suppress(Exception):
                await self.client.close()
        for w in self.watches:
            w.cancel()
        await asyncio.gather(*self.watches, return_exceptions=True)
        await teardown(self.kube, [self.ns], self.op)
        self.seal.close()


# --------------------------------------------------------------------------------------------
# Report


def cell(values: list[float]) -> str:
    return f"{pct(values, 50):.3f} / {pct(values, 90):.3f}" if values else "n/a"


def ratio(top: list[float], bottom: list[float]) -> str:
    if not top or not bottom:
        return "n/a"
    parts = []
    for q in (50, 90):
        b = pct(bottom, q)
        parts.append(f"{pct(top, q) / b:.2f}" if b > 0 else "n/a")
    return " / ".join(parts)


def writes(counted: list[Counts]) -> str:
    """Mean writes per sample, the operator's + the client's."""
    if not counted:
        return "n/a"
    n = len(counted)
    op = sum(c.operator_writes for c in counted) / n
    own = sum(c.client_writes for c in counted) / n
    return f"{op:.1f} + {own:.1f}"


def claims(counted: list[Counts], per: int = 1) -> str:
    """Mean warm-pool claims per sample (per call: ``per`` calls a sample), with the claims
    that found the pool empty (and started a pod cold) when there were any."""
    if not counted:
        return "n/a"
    n = len(counted) * per
    warm = sum(c.warm_claims for c in counted) / n
    empty = sum(c.exhausted for c in counted) / n
    return f"{warm:.1f}" + (f" (+{empty:.1f} empty)" if empty else "")


def counted(samples: list[Sample]) -> list[Counts]:
    return [s.counts for s in samples if s.counts is not None]


def call_rows(r: RuntimeResult, args: argparse.Namespace) -> list[list[str]]:
    """The tool-call rows: cold and warm on both routes, and maf's call ending in a reset."""
    rows: list[list[str]] = []
    served = f"SandboxWarmPool/{r.pool}"

    def row(label: str, samples: list[Sample]) -> list[Sample]:
        ok = [s for s in samples if not s.failed]
        pooled = sum(1 for s in ok if s.served_from == served)
        rows.append(
            [
                f"{r.runtime}: {label}",
                f"{len(ok)}/{len(samples)}",
                f"{pooled}/{len(ok)}",
                f"{sum(s.created for s in ok) / max(len(ok), 1):.1f}",
                claims(counted(ok)),
                *(cell([s.phases[p] for s in ok]) for p in PHASES),
                writes(counted(ok)),
            ]
        )
        return ok

    def ratio_row(label: str, top: list[Sample], bottom: list[Sample]) -> None:
        rows.append(
            [
                f"{r.runtime}: {label}",
                *([""] * 4),
                *(ratio([s.phases[p] for s in top], [s.phases[p] for s in bottom]) for p in PHASES),
                "",
            ]
        )

    ok: dict[tuple[str, str], list[Sample]] = {}
    for temp in TEMPS:
        for route in args.routes:
            ok[route, temp] = row(f"{ROUTE_LABEL[route]}, {temp}", r.of(route, temp))
        if len(args.routes) == len(ROUTES):
            ratio_row(f"maf / own, {temp}", ok["maf", temp], ok["own", temp])
    if "maf" in args.routes:
        ok["maf", "reset"] = row("maf router, reset", r.of("maf", "reset"))
        if "own" in args.routes:
            ratio_row("maf reset / own warm", ok["maf", "reset"], ok["own", "warm"])
    return rows


def reset_row(r: RuntimeResult) -> list[str]:
    samples = r.of("own", "reset")
    ok = [s for s in samples if not s.failed]
    served = f"SandboxWarmPool/{r.pool}"
    return [
        f"{r.runtime}: own client, reset",
        f"{len(ok)}/{len(samples)}",
        f"{sum(1 for s in ok if s.served_from == served)}/{len(ok)}",
        claims(counted(ok)),
        *(cell([s.phases[p] for s in ok]) for p in (*RESET_PHASES, "total")),
        writes(counted(ok)),
    ]


def conversation_row(r: RuntimeResult, args: argparse.Namespace) -> list[str]:
    convs = r.conversations
    ok = [c for c in convs if not c.failed]
    calls = [call for c in ok for call in c.calls]
    per_call = [
        Counts(
            c.counts.operator_writes / len(c.calls),
            c.counts.client_writes / len(c.calls),
            c.counts.warm_claims / len(c.calls),
            c.counts.exhausted / len(c.calls),
        )
        for c in ok
        if c.counts is not None
    ]
    return [
        f"{r.runtime}: maf, {args.calls} calls",
        f"{len(ok)}/{len(convs)}",
        claims(per_call),
        cell([c.seconds for c in ok]),
        *(cell([call.phases[p] for call in calls]) for p in PHASES),
        writes(per_call),
    ]


def report(results: list[RuntimeResult], args: argparse.Namespace) -> str:
    header = [
        "",
        "done",
        "from pool",
        "Sandboxes",
        "pool claims",
        *(f"{p} p50 / p90 (s)" for p in PHASES),
        "writes op + client",
    ]
    rows = [row for r in results for row in call_rows(r, args)]
    out = [
        f"one tool call: acquire -> first exec -> cleanup (dispose; reset on the 'reset' row), "
        f"{args.count} rounds (order rotating), pool of {args.pool_replicas} full before each; "
        "seconds (perf_counter), nearest rank",
        "disposal: "
        + (
            "pod.disposalGracePeriodSeconds 0 (--fast-disposal: the node not waited for)"
            if args.fast_disposal
            else "the default (the pod's own grace, waited for until the node stopped it)"
        ),
        "idle pool pods: "
        + (
            "sealed until claimed, checked by the operator (--seal: maf's claims are fresh)"
            if args.seal
            else "not sealed (maf's router disposes a pool claim and acquires again)"
        ),
        "writes: API writes per call, the operator's (its metrics) + the client's, including the "
        "pool's refill of what the call claimed (no exec stream counted)",
        table(header, rows),
    ]
    if "own" in args.routes:
        out += [
            "",
            "reset alone: client.reset on a Ready pooled Sandbox (the pool full again first), "
            "then a first command in the new pod",
            table(
                [
                    "",
                    "done",
                    "from pool",
                    "pool claims",
                    *(f"{p} p50 / p90 (s)" for p in (*RESET_PHASES, "total")),
                    "writes op + client",
                ],
                [reset_row(r) for r in results],
            ),
        ]
    if any(r.conversations for r in results):
        out += [
            "",
            f"conversation: {args.calls} maf tool calls on one key, each ended by a reset; "
            f"a pool of {args.conversation_pool} of its kind full before each; "
            "pool claims and writes per call, phases over all calls",
            table(
                [
                    "",
                    "done",
                    "pool claims",
                    "conversation p50 / p90 (s)",
                    *(f"call {p} p50 / p90 (s)" for p in PHASES),
                    "writes op + client",
                ],
                [conversation_row(r, args) for r in results if r.conversations],
            ),
        ]
    for r in results:
        out += [f"  {r.runtime}: {n}" for n in r.notes]
        out += [
            f"  {r.runtime}: {s.route} {s.temp} {s.sandbox} failed: {s.failed}"
            for s in r.samples
            if s.failed
        ]
        out += [
            f"  {r.runtime}: conversation {c.sandbox} failed: {c.failed}"
            for c in r.conversations
            if c.failed
        ]
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# main


def live_run(pid: str) -> bool:
    """Whether ``pid`` is another process running this script on this machine."""
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"benchmarks/maf.py" in cmdline


async def stale_namespaces(kube: Kube) -> list[str]:
    """This benchmark's namespaces that no live run on this machine owns."""
    stale = []
    for name in await leftovers(kube, BENCH):
        code, obj = await kube.request("GET", f"/api/v1/namespaces/{name}")
        labels = ((obj.get("metadata") or {}).get("labels") or {}) if code == 200 else {}
        if live_run(str(labels.get(PID_LABEL, ""))):
            say(f"namespace {name} belongs to a live run (pid {labels[PID_LABEL]}): left alone")
        else:
            stale.append(name)
    return stale


async def amain(args: argparse.Namespace, kubeconfig: str, state: dict[str, Any]) -> None:
    kube = Kube(kubeconfig, 16)
    try:
        old = await stale_namespaces(kube)
        if old:
            say(f"deleting namespaces an earlier run left: {', '.join(old)}")
            await strip_and_delete(kube, old)
        if args.cleanup:
            return
        await apply_crds(kube)
        results: list[RuntimeResult] = []
        loads: list[float] = []
        sampler = asyncio.create_task(sample_load(loads))
        try:
            for rt in args.runtimes:
                bench = RuntimeBench(kube, args, kubeconfig, rt)
                state.setdefault("namespaces", []).append(bench.ns)
                result = RuntimeResult(rt, bench.pool)
                try:
                    await bench.setup()
                    await bench.run(result)
                except Exception:
                    if bench.op is not None:
                        print(f"--- operator log (tail), {bench.op.log_path}:")
                        print(bench.op.log()[-4000:])
                    raise
                finally:
                    await bench.close()
                results.append(result)
        finally:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
        print()
        print(report(results, args), flush=True)
        if loads:
            print(
                f"  this machine's 1-min load average during the run (every 5 s): mean "
                f"{sum(loads) / len(loads):.1f}, max {max(loads):.1f}, on {os.cpu_count()} CPUs"
            )
    finally:
        await kube.aclose()


def final_cleanup(kubeconfig: str, state: dict[str, Any], interrupted: bool) -> None:
    """Stop any operator still running; after an interruption or error also delete this run's
    namespaces."""
    stop_operators(OPERATORS)
    if interrupted:
        delete_run_namespaces(kubeconfig, state.get("namespaces", []), BENCH)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--runtimes", default="runc,gvisor", help="comma-separated (runc, gvisor)")
    p.add_argument("--routes", default="maf,own", help="comma-separated (maf, own)")
    p.add_argument("--count", type=int, default=10, help="rounds (one sample of each row each)")
    p.add_argument("--warmup", type=int, default=1, help="untimed cold rounds first, per route")
    p.add_argument("--pool-replicas", type=int, default=2, help="the warm pool's idle pods")
    p.add_argument("--conversations", type=int, default=3, help="per runtime (maf route only)")
    p.add_argument("--calls", type=int, default=10, help="tool calls per conversation")
    p.add_argument(
        "--conversation-pool",
        type=int,
        default=0,
        help="idle pods of the conversations' pool (default: --calls + 1, one per claim)",
    )
    p.add_argument("--timeout", type=float, default=120, help="per acquire, seconds")
    p.add_argument("--fill-timeout", type=float, default=180, help="pool filling, seconds")
    p.add_argument("--operator-log-level", default="info", choices=["debug", "info", "warning"])
    p.add_argument(
        "--fast-disposal",
        action="store_true",
        help="the backend's pod.disposalGracePeriodSeconds: 0 (docs/disposal.md's opt-in); "
        "default: the disposal the configuration gives by default",
    )
    p.add_argument(
        "--seal",
        action="store_true",
        help="the chart's seal on idle pool pods, checked by the operator (--pool-seal): maf's "
        "pool claims are then freshly created (docs/warm-pools.md)",
    )
    p.add_argument("--smoke", action="store_true", help="CI: runc, count 1, 3 calls")
    p.add_argument("--cleanup", action="store_true", help="only delete what earlier runs left")
    args = p.parse_args(argv)
    args.runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    unknown = set(args.runtimes) - set(RUNTIMES)
    if unknown:
        p.error(f"unknown runtime(s): {', '.join(sorted(unknown))}")
    args.routes = [r for r in ROUTES if r in args.routes.split(",")]
    if not args.routes:
        p.error("--routes: maf, own or both")
    if args.smoke:
        args.runtimes, args.count, args.conversations, args.calls = ["runc"], 1, 1, 3
    args.conversation_pool = args.conversation_pool or args.calls + 1
    kubeconfig = os.environ.get("KUBECONFIG") or str(LOCAL_KUBECONFIG)
    os.environ["KUBECONFIG"] = kubeconfig
    state: dict[str, Any] = {}
    return run_cleaning_up(
        lambda: amain(args, kubeconfig, state),
        lambda interrupted: final_cleanup(kubeconfig, state, interrupted),
    )


if __name__ == "__main__":
    sys.exit(main())
