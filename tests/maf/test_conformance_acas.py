"""maf-sandbox's own conformance suites through ``maf_sandbox.SandboxRouter`` **at maf's default
floor** (``MICROVM``, nothing lowered) over :class:`~sandbox_operator.maf.OperatorBackend` standing
for the operator's ``acas`` backend, which serves each Sandbox as a remote sandbox of the ACA
stand-in (``tests/acas_standin``, its own process on loopback, in its ``rooted`` mode: each remote
sandbox's directory is its ``/`` for the file API and executions alike, so two share nothing).

The operator is the real one (a subprocess, kopf against the real API server); Sandboxes and
SandboxScopes are real objects; the client reaches the remote sandboxes over the ACA data plane.
No node is needed: nothing runs in a pod. The declarations are the published ones: RECLAIM is
withheld (``sandbox_operator.maf.RECLAIM_WITHHELD``), so maf's reclaim suite is not owed and its
own gate refuses it; every other suite the declarations call for runs and must pass.

Not run here, and why (docs/maf.md, "Conformance"): the nothing-left-behind measure (it needs an
engine's view of the guest, which a remote microVM's service does not give, and the stand-in is
no VM), and a closed-egress probe (the stand-in records the egress policy but enforces none:
what the operator sends is asserted instead).
"""

from __future__ import annotations

import base64
import os
import warnings
from collections.abc import AsyncIterator, Iterator

import maf_sandbox as maf
import pytest
from kubernetes import client
from maf_sandbox import conformance
from tests.fixtures.acas_operator import SECRET, TOKEN, Standin, acas_backend
from tests.fixtures.maf_cluster import Served, assert_call_scope, assert_program_channel, serving
from tests.fixtures.operator import local_config

from sandbox_operator.acas import AcasBackendConfig, AcasClient, StaticTokenProvider
from sandbox_operator.client import SandboxClient
from sandbox_operator.client.dataplane.acas import acas_dataplanes
from sandbox_operator.maf import OperatorBackend, OperatorSandbox, sandbox_instance_id

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0, reason="the rooted stand-in needs root (unshare, mount, chroot)"
    ),
]

BACKEND = "acas"
FILE_CAPABILITIES = frozenset(
    {
        maf.Capability.EXEC,
        maf.Capability.FILES_IN,
        maf.Capability.FILES_OUT,
        maf.Capability.FILES_LIST,
        maf.Capability.FILES_DELETE,
    }
)
BASE = "/maf-sandbox/work"
WORK = f"{BASE}/probes/work"


class ProbeSkipped(UserWarning):
    """A maf probe that did not run, with maf's reason (shown in pytest's warnings summary)."""


def _config(standin: Standin, namespace: str) -> dict[str, object]:
    """The acas backend alone, pinned, at the host floor maf's router also defaults to."""
    acas = acas_backend(standin, namespace, observeIntervalSeconds=1)
    return local_config(floor="microvm", selection="fixed", pinned=BACKEND, backends=[acas])


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standin]:
    s = Standin(tmp_path_factory.mktemp("acas-standin") / "standin.log").start()
    s.configure(rooted=True)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def acas_served(
    kubeconfig: str,
    crds: None,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
    tmp_path_factory: pytest.TempPathFactory,
    standin: Standin,
) -> Iterator[Served]:
    def credential(namespace: str) -> None:
        secret = client.V1Secret(
            metadata=client.V1ObjectMeta(name=SECRET),
            data={"token": base64.b64encode(TOKEN.encode()).decode()},
        )
        core_v1.create_namespaced_secret(namespace, secret)

    with serving(
        BACKEND,
        lambda ns: _config(standin, ns),
        kubeconfig=kubeconfig,
        core_v1=core_v1,
        custom_objects=custom_objects,
        tmp=tmp_path_factory.mktemp("maf-acas"),
        isolation=maf.Isolation.MICROVM,
        before_start=credential,
    ) as served:
        yield served


@pytest.fixture
async def acas_client(acas_served: Served, standin: Standin) -> AsyncIterator[SandboxClient]:
    config = AcasBackendConfig.model_validate(acas_backend(standin, acas_served.namespace))
    remote = AcasClient(config, StaticTokenProvider(TOKEN))
    sc = await SandboxClient.from_kubeconfig(
        acas_served.namespace,
        kubeconfig=acas_served.kubeconfig,
        dataplanes=acas_dataplanes({BACKEND: remote}),
    )
    try:
        yield sc
    finally:
        await sc.close()
        await remote.aclose()


@pytest.fixture
async def backend(acas_client: SandboxClient) -> OperatorBackend:
    adapter = await OperatorBackend.connect(acas_client, backend=BACKEND, default_image="python")
    assert adapter.isolation is maf.Isolation.MICROVM
    return adapter


@pytest.fixture
def router(backend: OperatorBackend) -> maf.SandboxRouter:
    """maf's router with nothing lowered: its default floor is MICROVM."""
    return maf.SandboxRouter([backend])


def spec_for(
    backend: OperatorBackend, kind: str = "conformance", **fields: object
) -> maf.SandboxSpec:
    requires = FILE_CAPABILITIES & backend.declarations.capabilities
    return maf.SandboxSpec(kind=kind, requires=requires, **fields)  # type: ignore[arg-type]


def report(suite: str, results: tuple[conformance.ProbeResult, ...]) -> list[str]:
    for r in results:
        if r.skipped is not None:
            warnings.warn(f"{suite}: probe {r.probe.name} skipped: {r.skipped}", ProbeSkipped, 2)
    return [f"{suite}/{r.probe.name}: {r.failure}" for r in results if r.failure is not None]


def test_the_published_declarations_are_honest(backend: OperatorBackend) -> None:
    """What the router reads is what ACA can prove: no RECLAIM (its file API cannot refuse a
    link on the way), every file capability the suites below hold it to."""
    declared = backend.declarations.capabilities
    assert maf.Capability.RECLAIM not in declared
    assert declared >= FILE_CAPABILITIES
    assert declared.isdisjoint({maf.Capability.SNAPSHOT, maf.Capability.ATTACHED_IDENTITY})


async def test_guest_suites_on_one_sandbox(
    backend: OperatorBackend, router: maf.SandboxRouter, key: maf.SandboxKey
) -> None:
    """files in/out/delete, list, reach, then exec (byte fidelity included), on one sandbox
    acquired through the router at its default floor; maf's own reclaim gate refuses the suite
    (RECLAIM undeclared)."""
    sandbox = await router.acquire(key, spec_for(backend))
    try:
        assert isinstance(sandbox, OperatorSandbox) and sandbox.pod  # served: a remote id
        capabilities = backend.declarations.capabilities
        subject = conformance.PosixGuestSubject(sandbox, WORK, capabilities, exec_timeout=60)
        failures: list[str] = []
        failures += report("FILES_IN", await conformance.run_files_in_probes(subject))
        failures += report("FILES_OUT", await conformance.run_files_out_probes(subject))
        failures += report("FILES_DELETE", await conformance.run_files_delete_probes(subject))
        failures += report("REACH", await conformance.run_reach_probes(subject))
        with pytest.raises(Exception, match="RECLAIM"):
            await conformance.assert_reclaim_conformance(subject)
        failures += report("EXEC", await conformance.run_exec_probes(subject))
        assert not failures, f"{len(failures)} probes failed on acas:\n" + "\n".join(failures)
    finally:
        await router.dispose(key)


@pytest.mark.parametrize("work_dir", [None, "/opt/maf-explicit/work"], ids=["allocated", "image"])
async def test_storage_base(
    backend: OperatorBackend, router: maf.SandboxRouter, key: maf.SandboxKey, work_dir: str | None
) -> None:
    sandbox = await router.acquire(key, spec_for(backend, work_dir=work_dir))
    try:
        await conformance.assert_storage_base_conformance(
            sandbox, backend.declarations.capabilities
        )
    finally:
        await router.dispose(key)


async def test_fresh_acquire(backend: OperatorBackend, key: maf.SandboxKey) -> None:
    spec = spec_for(backend, kind="fresh")
    first = await backend.acquire(key, spec)
    try:
        await conformance.assert_fresh_acquire_conformance(
            first, lambda: backend.acquire(key, spec)
        )
    finally:
        assert await backend.dispose(key) is None


async def test_instance_disposal(backend: OperatorBackend, key: maf.SandboxKey) -> None:
    first = await backend.acquire(key, spec_for(backend, kind="first"))
    try:
        sibling = await backend.acquire(key, spec_for(backend, kind="second"))

        async def exists(identity: str) -> bool:
            listing = await backend.client.custom.list_namespaced_custom_object(
                "sandbox-operator.dev", "v1alpha1", backend.client.namespace, "sandboxes"
            )
            return any(
                sandbox_instance_id(item) == identity
                and not item["metadata"].get("deletionTimestamp")
                for item in listing["items"]
            )

        await conformance.assert_instance_disposal_conformance(
            backend, key, "first", first.instance_id, [sibling.instance_id], exists
        )
    finally:
        assert await backend.dispose(key) is None


async def test_call_scope(
    backend: OperatorBackend, router: maf.SandboxRouter, key: maf.SandboxKey
) -> None:
    """Two calls of one conversation get two remote sandboxes that share nothing."""
    spec = spec_for(backend, kind="per-call", isolation_scope=maf.IsolationScope.CALL)
    await assert_call_scope(backend, router, key, spec, BASE)


async def test_program_channel(
    backend: OperatorBackend, router: maf.SandboxRouter, key: maf.SandboxKey
) -> None:
    await assert_program_channel(router, key, spec_for(backend))


async def test_closed_egress_is_what_the_service_is_asked_for(
    backend: OperatorBackend, router: maf.SandboxRouter, key: maf.SandboxKey, standin: Standin
) -> None:
    """maf's default egress (closed) reaches the service as the inline deny-all policy of the
    create request itself (HTTP and L3/L4 default Deny, no host rule), so the remote sandbox
    never runs unconfined. Enforcing it is the service's; the stand-in only records it."""
    spec = spec_for(backend)
    assert spec.egress is maf.Egress.CLOSED
    sandbox = await router.acquire(key, spec)
    try:
        assert isinstance(sandbox, OperatorSandbox)
        remote = next(s for s in standin.sandboxes() if s["id"] == sandbox.pod)
        policy = remote["egressPolicy"]
        assert policy["http"]["defaultAction"] == "Deny"
        assert not policy["http"].get("hostRules")
        assert policy["transportRules"]["defaultAction"] == "Deny"
    finally:
        await router.dispose(key)


def test_router_admits_at_its_default_floor(backend: OperatorBackend) -> None:
    """maf's default floor (microvm) admits this backend with nothing lowered;
    ``ensure_can_serve`` admits a spec it serves and refuses one needing what it lacks."""
    router = maf.SandboxRouter([backend])
    router.ensure_can_serve(spec_for(backend))
    router.ensure_can_serve(maf.SandboxSpec(kind="vm", min_isolation=maf.Isolation.MICROVM))
    with pytest.raises(maf.SandboxCapabilityNotSupported):
        router.ensure_can_serve(
            maf.SandboxSpec(kind="needs-more", requires=frozenset({maf.Capability.SNAPSHOT}))
        )
