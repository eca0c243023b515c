"""The local cluster serves PersistentVolumeClaims (hack/local_path_provisioner.py, StorageClass
`sandbox-local`, docs/cluster.md "Volumes"): a claim of the default class is bound within a
second of its first pod (it binds on first consumer); a pod running as uid 65532 (runc and
gVisor) writes into the volume, and a second pod reads the same bytes after the first is gone;
deleting the claim deletes the volume and its directory. Needs the project's local cluster (the
directory is checked on this machine)."""

from __future__ import annotations

import base64
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.fixtures.cluster import LOCAL_STATE
from tests.fixtures.pods import plain_pod

pytestmark = pytest.mark.e2e

BUSYBOX = "sandbox-operator.dev/busybox:1"
STORAGE_CLASS = "sandbox-local"
PROVISIONER = "sandbox-operator.dev/local-path"
VOLUMES = LOCAL_STATE / "local-path"


@pytest.fixture(scope="module", autouse=True)
def local_storage(cluster_is_local: bool, api_client: client.ApiClient) -> None:
    if not cluster_is_local:
        pytest.skip("the local cluster's provisioner (hack/cluster.py up), not this cluster's")
    sc = client.StorageV1Api(api_client).read_storage_class(STORAGE_CLASS)
    assert sc.provisioner == PROVISIONER
    assert sc.metadata.annotations["storageclass.kubernetes.io/is-default-class"] == "true"
    assert sc.volume_binding_mode == "WaitForFirstConsumer"


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"{what}: not within {timeout:.0f}s")


def make_claim(core: client.CoreV1Api, namespace: str, name: str, size: str = "64Mi") -> float:
    """Create a claim of the default class (no storageClassName) and a first pod that mounts it
    (the class binds on first consumer); seconds from the claim's creation until it is Bound.
    The pod is deleted then (a pod that names a claim holds it, ended or not)."""
    body = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}},
    }
    started = time.monotonic()
    core.create_namespaced_persistent_volume_claim(namespace, body)
    core.create_namespaced_pod(namespace, pod(f"{name}-first", "runc", name, "true"))

    def bound() -> bool:
        pvc = core.read_namespaced_persistent_volume_claim(name, namespace)
        return pvc.status.phase == "Bound"

    wait_for(f"claim {name} Bound", bound, 60)
    seconds = time.monotonic() - started
    core.delete_namespaced_pod(f"{name}-first", namespace, grace_period_seconds=0)
    return seconds


def pod(name: str, runtime_class: str, claim: str, script: str) -> dict[str, Any]:
    """A pod as uid 65532 (no root, no capabilities) that runs `script` with the claim at /work."""
    return plain_pod(
        name,
        runtime_class,
        BUSYBOX,
        command=("sh", "-c", script),
        work_dir="/work",
        claim=claim,
        container="main",
    )


def run_to_end(core: client.CoreV1Api, namespace: str, body: dict[str, Any]) -> str:
    """Run the pod until it ends (it must succeed); its output; then delete it and wait."""
    name = body["metadata"]["name"]
    core.create_namespaced_pod(namespace, body)

    def ended() -> str | None:
        phase: str | None = core.read_namespaced_pod(name, namespace).status.phase
        return phase if phase in ("Succeeded", "Failed") else None

    phase = wait_for(f"pod {name} ended", ended, 180, 0.2)
    logs: str = core.read_namespaced_pod_log(name, namespace)
    assert phase == "Succeeded", f"pod {name}: {phase}: {logs}"
    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    def gone() -> bool:
        try:
            core.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(f"pod {name} gone", gone, 60, 0.2)
    return logs


# runc here; gVisor writes and reads a provisioned volume in tests/e2e/test_suspend_resume.py.
@pytest.mark.parametrize("runtime_class", ["runc"])
def test_a_claim_keeps_bytes_across_pods_and_goes_with_its_volume(
    core_v1: client.CoreV1Api, namespace: str, runtime_class: str
) -> None:
    seconds = make_claim(core_v1, namespace, "work")
    pvc = core_v1.read_namespaced_persistent_volume_claim("work", namespace)
    assert pvc.spec.storage_class_name == STORAGE_CLASS  # the default class
    pv = core_v1.read_persistent_volume(pvc.spec.volume_name)
    assert pv.metadata.annotations["pv.kubernetes.io/provisioned-by"] == PROVISIONER
    assert pv.spec.persistent_volume_reclaim_policy == "Delete"
    assert pv.spec.capacity["storage"] == "64Mi"
    directory = Path(pv.spec.host_path.path)
    assert directory.parent == VOLUMES.resolve()
    assert directory.is_dir()
    assert directory.stat().st_mode & 0o777 == 0o777

    payload = os.urandom(64 * 1024) + bytes(range(256))
    encoded = base64.b64encode(payload).decode()
    write = f"id -u; echo {encoded} | base64 -d > /work/data && mkdir -p /work/sub && sync"
    out = run_to_end(core_v1, namespace, pod("writer", runtime_class, "work", write))
    assert out.strip() == "65532"
    assert (directory / "data").read_bytes() == payload  # on this machine, as written
    assert (directory / "data").stat().st_uid == 65532

    out = run_to_end(core_v1, namespace, pod("reader", runtime_class, "work", "base64 /work/data"))
    assert base64.b64decode("".join(out.split())) == payload

    core_v1.delete_namespaced_persistent_volume_claim("work", namespace)

    def volume_gone() -> bool:
        try:
            core_v1.read_persistent_volume(pv.metadata.name)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(f"volume {pv.metadata.name} deleted", volume_gone, 60, 0.2)
    assert not directory.exists()
    print(f"\n{runtime_class}: claim Bound in {seconds:.2f}s")


def test_claims_are_bound_and_go_with_a_collection_delete(
    core_v1: client.CoreV1Api, namespace: str
) -> None:
    """Five claims are provisioned and bound, one after the other (the time each took is printed,
    not asserted); a collection delete takes their volumes and directories."""
    seconds = [make_claim(core_v1, namespace, f"c{i}") for i in range(5)]
    median = statistics.median(seconds)
    print(f"\nclaim -> Bound: median {median:.2f}s, all {[round(s, 2) for s in seconds]}")
    # The namespace goes with the test: its claims' volumes and directories go with it.
    names = [
        core_v1.read_namespaced_persistent_volume_claim(f"c{i}", namespace).spec.volume_name
        for i in range(5)
    ]
    core_v1.delete_collection_namespaced_persistent_volume_claim(namespace)

    def all_gone() -> bool:
        left = {pv.metadata.name for pv in core_v1.list_persistent_volume().items}
        return not (left & set(names))

    wait_for("the volumes deleted", all_gone, 60, 0.2)
    assert not [p for p in VOLUMES.iterdir() if p.name.split("_")[0] in names]
