"""maf tool calls served from a warm pool whose pods the operator vouches for (#36 item 2).

With the chart's seal on idle pool pods in force and checked (``--pool-seal``), a Sandbox the
backend's acquire creates from a pool records ``sealedUntilClaim`` and the backend reports it
``freshly_created``: maf's router then uses it as it is, one Sandbox per acquire, instead of
treating it as unfamiliar (disposal and a second acquire). maf's guest suites pass on it.
With ``SNAPSHOT`` declared (the operator resets runtime-class Sandboxes), a reset puts a pool pod
in the old one's place, and the router cleans an unfamiliar instance by a reset (#36 item 1).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import maf_sandbox as maf
import pytest
from kubernetes import client
from maf_sandbox import conformance
from tests.fixtures.cluster import kubectl_command
from tests.fixtures.maf_cluster import Served, serving
from tests.fixtures.operator import BUSYBOX, GROUP, VERSION, Kit, local_config
from tests.fixtures.seal import applied_seal, whoami

from sandbox_operator import contract
from sandbox_operator.client import SandboxClient
from sandbox_operator.maf import OperatorBackend, OperatorSandbox
from sandbox_operator.maf._translate import operator_spec
from sandbox_operator.reconcile.seal import SETTLE

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

WORK = "/tmp/work"
SPEC = maf.SandboxSpec(
    kind="pooled", image=BUSYBOX, work_dir=WORK, requires=frozenset({maf.Capability.EXEC})
)
POOL = "warm"


def _wait(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


@pytest.fixture(scope="module")
def sealed(
    kubeconfig: str,
    crds: None,
    api_client: client.ApiClient,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    """A runc operator checking the seal on its namespace's idle pool pods, and a full pool of
    the spec's shape made after the seal took effect."""
    seal = contextlib.ExitStack()
    policy: list[str] = []

    def before_start(ns: str) -> None:
        name, _ = seal.enter_context(
            applied_seal(kubeconfig, ns, identity=whoami(api_client), label_exempt=False)
        )
        policy.append(name)

    runc = [b for b in local_config()["backends"] if b["name"] == "runc"]
    with (
        seal,
        serving(
            "pool-runc",
            lambda _ns: local_config(floor="container", backends=runc),
            kubeconfig=kubeconfig,
            core_v1=core_v1,
            custom_objects=custom_objects,
            tmp=tmp_path_factory.mktemp("maf-pool"),
            before_start=before_start,
            args_for=lambda _ns: ("--standalone", f"--pool-seal={policy[0]}"),
        ) as served,
    ):
        _wait(lambda: "idle pool pods sealed by" in served.operator.log(), 30, "the seal judged")
        time.sleep(SETTLE.total_seconds() + 1)  # pods made before are not covered
        fields = operator_spec(SPEC).model_dump(
            include=set(contract.WARM_POOL_TEMPLATE_FIELDS), exclude_unset=True
        )
        template = contract.WarmPoolTemplate.model_validate(fields).to_wire()
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxWarmPool",
            "metadata": {"name": POOL},
            "spec": {"replicas": 2, "maxCreating": 2, "template": template},
        }
        custom_objects.create_namespaced_custom_object(
            GROUP, VERSION, served.namespace, "sandboxwarmpools", body
        )
        wait_pool_full(served, custom_objects, core_v1)
        yield served


def wait_pool_full(
    served: Served, custom_objects: client.CustomObjectsApi, core_v1: client.CoreV1Api
) -> None:
    """Both idle pods Ready (a claim's refill is never part of the next test)."""
    kit = Kit(custom_objects, core_v1, served.namespace)

    def full() -> bool:
        status = (kit.get(POOL, "sandboxwarmpools") or {}).get("status") or {}
        return status.get("readyReplicas") == 2 and status.get("replicas") == 2

    _wait(full, 180, "the pool full")


@pytest.fixture
async def backend(
    sealed: Served, custom_objects: client.CustomObjectsApi, core_v1: client.CoreV1Api
) -> AsyncIterator[OperatorBackend]:
    wait_pool_full(sealed, custom_objects, core_v1)
    sc = await SandboxClient.from_kubeconfig(sealed.namespace, kubeconfig=sealed.kubeconfig)
    try:
        yield await OperatorBackend.connect(sc, backend="runc")
    finally:
        await sc.close()


def _sandboxes(sealed: Served) -> list[dict[str, Any]]:
    import json
    import subprocess

    out = subprocess.run(
        [*kubectl_command(sealed.kubeconfig), "get", "sandboxes.sandbox-operator.dev",
         "-n", sealed.namespace, "-o", "json"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


async def test_a_sealed_pool_claim_is_freshly_created_and_the_router_keeps_it(
    sealed: Served, backend: OperatorBackend
) -> None:
    router = maf.SandboxRouter([backend], min_isolation=maf.Isolation.CONTAINER)  # runc
    key = maf.SandboxKey("tenant", f"thread-{uuid.uuid4().hex[:6]}", "agent", "")
    sandbox = await router.acquire(key, SPEC)
    try:
        assert isinstance(sandbox, OperatorSandbox)
        assert sandbox.freshly_created is True
        (obj,) = [o for o in _sandboxes(sealed) if o["metadata"]["name"] == sandbox.name]
        status = obj["status"]
        assert status["servedFrom"] == f"SandboxWarmPool/{POOL}", status
        assert status["sealedUntilClaim"] is True, status
        # One Sandbox for the acquire: the router did not dispose it and acquire again.
        assert len(_sandboxes(sealed)) == 1
        subject = conformance.PosixGuestSubject(
            sandbox, WORK, backend.declarations.capabilities, exec_timeout=60
        )
        failures = [
            f"{r.probe.name}: {r.failure}"
            for r in await conformance.run_exec_probes(subject)
            if r.failure is not None
        ]
        assert not failures, failures
    finally:
        await router.dispose(key)


async def test_fresh_acquire_from_a_sealed_pool(sealed: Served, backend: OperatorBackend) -> None:
    """maf's fresh-acquire suite on a pool claim: fresh when new, not when reacquired."""
    key = maf.SandboxKey("tenant", f"thread-{uuid.uuid4().hex[:6]}", "agent", "")
    first = await backend.acquire(key, SPEC)
    try:
        status = next(
            o["status"] for o in _sandboxes(sealed) if o["metadata"]["name"] == first.name
        )
        assert status["servedFrom"] == f"SandboxWarmPool/{POOL}", status
        await conformance.assert_fresh_acquire_conformance(
            first, lambda: backend.acquire(key, SPEC)
        )
    finally:
        assert await backend.dispose(key) is None


async def test_per_call_isolation_is_served_from_the_pool_too(
    sealed: Served, backend: OperatorBackend
) -> None:
    """(#36 item 4) A call-scoped spec (a fresh sandbox per tool call) is served from a pool
    like any other: the isolation scope shapes no pod. Two calls of one conversation get two
    pool pods, each fresh, sharing nothing."""
    router = maf.SandboxRouter([backend], min_isolation=maf.Isolation.CONTAINER)
    per_call = dataclasses.replace(SPEC, isolation_scope=maf.IsolationScope.CALL)
    thread = f"thread-{uuid.uuid4().hex[:6]}"
    keys = [maf.SandboxKey("tenant", thread, "agent", f"call-{i}") for i in (1, 2)]
    sandboxes = [await router.acquire(k, per_call) for k in keys]
    try:
        assert all(s.freshly_created for s in sandboxes), sandboxes
        assert all(isinstance(s, OperatorSandbox) for s in sandboxes)
        mine = {s.name for s in sandboxes}  # type: ignore[attr-defined]
        statuses = [o["status"] for o in _sandboxes(sealed) if o["metadata"]["name"] in mine]
        assert len(statuses) == 2, statuses
        assert {s["servedFrom"] for s in statuses} == {f"SandboxWarmPool/{POOL}"}, statuses
        assert len({s["servedBy"]["name"] for s in statuses}) == 2, statuses
    finally:
        for k in keys:
            await router.dispose(k)


async def test_a_reset_leaves_no_file_and_no_process_of_the_previous_instance(
    sealed: Served, backend: OperatorBackend, custom_objects: client.CustomObjectsApi
) -> None:
    """(#36 item 1) ``Sandbox.reset``: the pod goes with what it ran and wrote, a never-used
    pool pod takes its place; same Sandbox, new instance, the storage base prepared again."""
    assert maf.Capability.SNAPSHOT in backend.declarations.capabilities
    key = maf.SandboxKey("tenant", f"thread-{uuid.uuid4().hex[:6]}", "agent", "")
    sandbox = await backend.acquire(key, SPEC)
    try:
        assert isinstance(sandbox, OperatorSandbox)
        marker = f"left-{uuid.uuid4().hex[:6]}"
        started = await sandbox.exec(
            f"echo x > {WORK}/{marker}; (setsid sleep 1000 >/dev/null 2>&1 &); echo ok",
            working_directory=WORK,
            timeout=30,
        )
        assert started.exit_code == 0, started
        before_id, before_pod = sandbox.instance_id, sandbox.pod
        (before,) = [o for o in _sandboxes(sealed) if o["metadata"]["name"] == sandbox.name]
        try:
            await sandbox.reset(timeout=60)
        except TimeoutError:
            (now,) = [o for o in _sandboxes(sealed) if o["metadata"]["name"] == sandbox.name]
            raise AssertionError((now, sealed.operator.log()[-3000:])) from None
        assert sandbox.instance_id != before_id and sandbox.pod != before_pod
        (after,) = [o for o in _sandboxes(sealed) if o["metadata"]["name"] == sandbox.name]
        assert after["metadata"]["uid"] == before["metadata"]["uid"]  # the same Sandbox
        assert after["status"]["resets"] == 1
        assert after["status"]["servedFrom"] == f"SandboxWarmPool/{POOL}"
        left = await sandbox.exec(
            f"ls -A {WORK}; ps -o args 2>/dev/null || ps", working_directory=WORK, timeout=30
        )
        out = left.stdout if isinstance(left.stdout, str) else left.stdout.decode()
        assert marker not in out and "sleep 1000" not in out, out
    finally:
        assert await backend.dispose(key) is None
    wait_pool_full(sealed, custom_objects, client.CoreV1Api(custom_objects.api_client))


async def test_the_router_resets_an_unfamiliar_instance_instead_of_disposing_it(
    sealed: Served, backend: OperatorBackend, custom_objects: client.CustomObjectsApi
) -> None:
    """A Sandbox another acquire made (not freshly created for this router): with SNAPSHOT
    declared, maf's router cleans it by a reset: the same Sandbox, reset once, never a second
    one. And a conversation's call ends by a reset, not a disposal."""
    key = maf.SandboxKey("tenant", f"thread-{uuid.uuid4().hex[:6]}", "agent", "")
    first = await backend.acquire(key, SPEC)
    # The unfamiliar instance is reset whatever the host accepts; a call ends by a reset
    # only where the host accepts it (maf's default is disposal).
    default = maf.SandboxRouter([backend], min_isolation=maf.Isolation.CONTAINER)
    assert default.effective_cleanup(SPEC) is maf.Cleanup.DISPOSE
    router = maf.SandboxRouter(
        [backend], min_isolation=maf.Isolation.CONTAINER, min_cleanup=maf.Cleanup.RESET
    )
    assert router.effective_cleanup(SPEC) is maf.Cleanup.RESET
    try:
        adopted = await router.acquire(key, SPEC)
        assert adopted.instance_id != first.instance_id
        mine = [o for o in _sandboxes(sealed) if o["metadata"]["name"] == first.name]
        assert len(mine) == 1 and mine[0]["status"]["resets"] == 1, mine
        assert len(_sandboxes(sealed)) == 1
    finally:
        await router.dispose(key)
    wait_pool_full(sealed, custom_objects, client.CoreV1Api(custom_objects.api_client))
