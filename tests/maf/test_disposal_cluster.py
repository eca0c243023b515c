"""(#36 item 3) Disposal off the caller's path through maf-sandbox's protocol, on the real node
under runc and gVisor (one operator per runtime, as conftest's, with the opt-in
``pod.disposalGracePeriodSeconds: 0``; docs/disposal.md):
:meth:`OperatorBackend.dispose` and :meth:`~OperatorBackend.dispose_scope` return with no
``DisposalFailure`` once the API server no longer has the Sandbox, and by then its pod is gone,
deleted with no grace period and let go before the kubelet stopped it; the key acquired again
gets a new instance on a pod of its own. Times are measured in benchmarks/maf.py, never here."""

from __future__ import annotations

from collections.abc import Iterator

import maf_sandbox as maf
import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from tests.fixtures.disposal import PodHistory, assert_removed_without_grace, fast_disposal
from tests.fixtures.maf_cluster import Served, serving
from tests.fixtures.operator import local_config

from sandbox_operator.maf import OperatorBackend

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SPEC = maf.SandboxSpec(kind="disposed", requires=frozenset({maf.Capability.EXEC}))


@pytest.fixture(scope="module", params=["runc", "gvisor"])
def served(
    request: pytest.FixtureRequest,
    kubeconfig: str,
    crds: None,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    """conftest's namespace and operator for ``runc`` or ``gvisor``, its backend opted into
    disposals that do not wait for the node."""
    runtime: str = request.param
    backends = [b for b in local_config()["backends"] if b["name"] == runtime]
    with serving(
        runtime,
        lambda _ns: fast_disposal(local_config(floor="container", backends=backends)),
        kubeconfig=kubeconfig,
        core_v1=core_v1,
        custom_objects=custom_objects,
        tmp=tmp_path_factory.mktemp(f"maf-dispose-{runtime}"),
    ) as served:
        yield served


def pod_there(core: client.CoreV1Api, namespace: str, name: str, uid: str) -> bool:
    try:
        pod = core.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return bool(pod.metadata.uid == uid)


async def sandboxes_named(backend: OperatorBackend, name: str) -> list[str]:
    listing = await backend.client.custom.list_namespaced_custom_object(
        "sandbox-operator.dev", "v1alpha1", backend.client.namespace, "sandboxes"
    )
    return [i["metadata"]["uid"] for i in listing["items"] if i["metadata"]["name"] == name]


async def test_dispose_returns_with_the_pod_gone_and_the_key_acquires_anew(
    served: Served, backend: OperatorBackend, core_v1: client.CoreV1Api, key: maf.SandboxKey
) -> None:
    first = await backend.acquire(key, SPEC)
    ns = served.namespace
    with PodHistory(core_v1, ns, first.pod) as history:
        assert await backend.dispose(key) is None
        assert await sandboxes_named(backend, first.name) == []
        assert not pod_there(core_v1, ns, first.pod, history.uid)
        assert_removed_without_grace(history)
    again = await backend.acquire(key, SPEC)
    try:
        assert again.instance_id != first.instance_id
        assert not pod_there(core_v1, ns, again.pod, history.uid)
        assert (await again.exec(["true"], working_directory=".", timeout=60)).exit_code == 0
    finally:
        assert await backend.dispose(key) is None


async def test_dispose_scope_returns_with_every_pod_gone(
    served: Served, backend: OperatorBackend, core_v1: client.CoreV1Api, key: maf.SandboxKey
) -> None:
    other = maf.SandboxKey(key.scope, key.thread_id, "another-agent")
    sandboxes = [await backend.acquire(k, SPEC) for k in (key, other)]
    ns = served.namespace
    histories = [PodHistory(core_v1, ns, s.pod) for s in sandboxes]
    for history in histories:
        history.__enter__()
    try:
        purge = await backend.dispose_scope(key.scope, key.thread_id)
        assert purge == maf.ScopePurge(disposed=2, undisposed=None)
        for sandbox, history in zip(sandboxes, histories, strict=True):
            assert await sandboxes_named(backend, sandbox.name) == []
            assert not pod_there(core_v1, ns, sandbox.pod, history.uid)
            assert_removed_without_grace(history)
    finally:
        for history in histories:
            history.__exit__(None, None, None)
