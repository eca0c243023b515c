"""The maf tier's wiring: one operator per runtime per module, serving one namespace.

The operator runs as a subprocess (tests/fixtures/operator.py's :class:`OperatorProcess`) with a
configuration naming one backend only (runc, floor container; gVisor; or, on a cluster with Kata,
Kata at the default floor microvm), so every sandbox of the
module is served by that runtime and :class:`~sandbox_operator.maf.OperatorBackend` stands for it.
Module scope keeps CI time low: an operator start and a namespace per runtime, not per test. The
clients, backends and routers are per test (each test's own event loop).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import maf_sandbox as maf
import pytest
from kubernetes import client
from tests.fixtures.kata import kata_backend, kata_runtime_class
from tests.fixtures.maf_cluster import RUNTIMES, Served, serving
from tests.fixtures.operator import PYTHON, local_config

from sandbox_operator.client import SandboxClient
from sandbox_operator.maf import OperatorBackend


@pytest.fixture(scope="module", params=sorted(RUNTIMES, reverse=True))
def served(
    request: pytest.FixtureRequest,
    kubeconfig: str,
    crds: None,
    api_client: client.ApiClient,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    """A namespace served by an operator whose only backend is ``runc``, ``gvisor`` or, where
    the cluster has Kata, ``kata`` (at maf's default floor, microvm; skipped elsewhere, with
    the reason: this machine has no hardware virtualisation)."""
    runtime: str = request.param
    if runtime == "kata":
        runtime_class, why = kata_runtime_class(client.NodeV1Api(api_client), core_v1)
        if runtime_class is None:
            pytest.skip(f"kata: {why}")
        backends, floor = [kata_backend(runtime_class)], "microvm"
    else:
        backends = [b for b in local_config()["backends"] if b["name"] == runtime]
        floor = "container"
    with serving(
        runtime,
        lambda _ns: local_config(floor=floor, backends=backends),
        kubeconfig=kubeconfig,
        core_v1=core_v1,
        custom_objects=custom_objects,
        tmp=tmp_path_factory.mktemp(f"maf-{runtime}"),
    ) as served:
        yield served


@pytest.fixture
async def sandbox_client(served: Served) -> AsyncIterator[SandboxClient]:
    sc = await SandboxClient.from_kubeconfig(served.namespace, kubeconfig=served.kubeconfig)
    try:
        yield sc
    finally:
        await sc.close()


@pytest.fixture
async def backend(served: Served, sandbox_client: SandboxClient) -> OperatorBackend:
    """The adapter standing for the module's one operator backend (python image by default)."""
    adapter = await OperatorBackend.connect(
        sandbox_client, backend=served.runtime, default_image=PYTHON
    )
    assert adapter.isolation == served.isolation, adapter.declarations
    return adapter


@pytest.fixture
def router(served: Served, backend: OperatorBackend) -> maf.SandboxRouter:
    """maf's router over the adapter, the host's floor lowered to the runtime's rung."""
    return maf.SandboxRouter([backend], min_isolation=served.isolation)


@pytest.fixture
def key() -> maf.SandboxKey:
    """A conversation of its own for each test."""
    return maf.SandboxKey("maf-tier", f"thread-{uuid.uuid4().hex[:8]}", "agent")
