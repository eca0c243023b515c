"""The maf tier's wiring: one operator per runtime per module, serving one namespace.

The operator runs as a subprocess (tests/fixtures/operator.py's :class:`OperatorProcess`) with a
configuration naming one backend only (runc, floor container; or gVisor), so every sandbox of the
module is served by that runtime and :class:`~sandbox_operator.maf.OperatorBackend` stands for it.
Module scope keeps CI time low: an operator start and a namespace per runtime, not per test. The
clients, backends and routers are per test (each test's own event loop).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import maf_sandbox as maf
import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from tests.fixtures.cluster import TEST_NAMESPACE_LABELS
from tests.fixtures.maf_cluster import RUNTIMES, Served
from tests.fixtures.operator import PYTHON, Kit, OperatorProcess, local_config

from sandbox_operator.client import SandboxClient
from sandbox_operator.contract.published import PUBLISHED_CONFIGMAP
from sandbox_operator.maf import OperatorBackend


def _namespace(core: client.CoreV1Api, runtime: str) -> str:
    name = f"t-maf-{runtime}-{uuid.uuid4().hex[:6]}"
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=TEST_NAMESPACE_LABELS))
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            core.read_namespaced_service_account("default", name)
            return name
        except ApiException as exc:
            if exc.status != 404:
                raise
        time.sleep(0.2)
    pytest.fail(f"namespace {name}: no default ServiceAccount", pytrace=False)


def _wait_published(core: client.CoreV1Api, ns: str, operator: OperatorProcess) -> None:
    """The operator publishes its backends at start; the adapter reads them at connect."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            core.read_namespaced_config_map(PUBLISHED_CONFIGMAP, ns)
            return
        except ApiException as exc:
            if exc.status != 404:
                raise
        time.sleep(0.3)
    pytest.fail(f"no {PUBLISHED_CONFIGMAP} in {ns} after 60s:\n{operator.log()}", pytrace=False)


@pytest.fixture(scope="module", params=sorted(RUNTIMES, reverse=True))
def served(
    request: pytest.FixtureRequest,
    kubeconfig: str,
    crds: None,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    """A namespace served by an operator whose only backend is ``runc`` or ``gvisor``."""
    runtime: str = request.param
    ns = _namespace(core_v1, runtime)
    backends = [b for b in local_config()["backends"] if b["name"] == runtime]
    config = local_config(floor="container", backends=backends)
    tmp = tmp_path_factory.mktemp(f"maf-{runtime}")
    config_path: Path = tmp / "operator-config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    operator = OperatorProcess(config_path, ns, tmp / "operator.log", kubeconfig)
    kit = Kit(custom_objects, core_v1, ns)
    try:
        operator.start()
        _wait_published(core_v1, ns, operator)
        yield Served(runtime, ns, kubeconfig, operator)
    finally:
        # Finalizers need the operator: delete while it runs, then stop it.
        try:
            kit.delete_all_while_served()
        finally:
            operator.stop()
            try:
                core_v1.delete_namespace(ns, propagation_policy="Background")
            except ApiException as exc:
                if exc.status != 404:
                    raise


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
