"""Persistent work directories and suspend / resume on the local cluster (issue 16), under runc
and gVisor: a Sandbox with ``spec.storage`` works in a PersistentVolumeClaim of its own (the
local provisioner's ``sandbox-local`` class); suspending deletes its pod and keeps the claim,
the NetworkPolicy and the Sandbox; resuming starts a new pod on the same volume, re-admitted by
the policy. Idle auto-suspend, scope purge, TTL and an operator restart while suspended too."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from sandbox_operator import labels as lbl
from sandbox_operator import naming
from tests.fixtures.operator import DECLARATIONS, GROUP, VERSION, Kit, local_config
from tests.fixtures.suspend import BACKENDS, STORAGE, config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: What a test writes into the work dir and reads back after resuming: random bytes (read back
#: as base64, byte for byte) next to a plain line.
WRITE = (
    "head -c 4096 /dev/urandom > /workspace/keep.bin && echo 'kept across suspend' "
    "> /workspace/note.txt && mkdir -p /workspace/dir && echo nested > /workspace/dir/f"
)
READ = "base64 /workspace/keep.bin; cat /workspace/note.txt /workspace/dir/f; id -u"


def _wait(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def patch_spec(kit: Kit, name: str, **spec: Any) -> None:
    kit.custom.patch_namespaced_custom_object(
        GROUP, VERSION, kit.ns, "sandboxes", name, {"spec": spec}
    )


def touch(kit: Kit, name: str) -> None:
    """What the client does on every use: stamp the last-activity annotation."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    kit.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        kit.ns,
        "sandboxes",
        name,
        {"metadata": {"annotations": {lbl.LAST_ACTIVITY_ANNOTATION: stamp}}},
    )


def claim(kit: Kit, name: str) -> client.V1PersistentVolumeClaim | None:
    try:
        pvc: client.V1PersistentVolumeClaim = kit.core.read_namespaced_persistent_volume_claim(
            naming.work_volume_name(name), kit.ns
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return pvc


def policy(kit: Kit) -> client.V1NetworkPolicy | None:
    """The namespace's NetworkPolicy of its sandboxes' backend and egress mode (one backend, all
    closed here), None when there is none. A Sandbox has no policy of its own: this one stays
    while the Sandbox is suspended and after it is gone."""
    nps = client.NetworkingV1Api(kit.core.api_client).list_namespaced_network_policy(kit.ns).items
    mine = [n for n in nps if lbl.EGRESS_LABEL in (n.metadata.labels or {})]
    assert len(mine) <= 1, [n.metadata.name for n in mine]
    return mine[0] if mine else None


def sh(kubectl: Callable[..., Any], kit: Kit, name: str, command: str) -> str:
    out = kubectl(
        "exec", "-n", kit.ns, naming.pod_name(name), "--", "/bin/sh", "-c", command, check=False
    )
    assert out.returncode == 0, out.stderr
    return str(out.stdout)


def ready(kit: Kit, name: str, timeout: float = 150) -> dict[str, Any]:
    return kit.wait_condition(name, reasons=("Ready",), status="True", timeout=timeout)


def suspended(kit: Kit, name: str, timeout: float = 90) -> dict[str, Any]:
    """Ready False ``Suspended``, and the pod gone."""
    kit.wait_condition(name, reasons=("Suspended",), status="False", timeout=timeout)
    _wait(lambda: kit.pod(name) is None, 60, f"the pod of {name} to go")

    def settled() -> dict[str, Any] | None:
        obj = kit.get(name)
        st = (obj or {}).get("status") or {}
        reason = (kit.condition(obj) or {}).get("reason")
        return obj if not st.get("servedBy") and reason == "Suspended" else None

    # The pod's deletion event brings the operator back to say it is gone (servedBy cleared).
    result: dict[str, Any] = _wait(settled, 30, f"{name} reported suspended with no pod")
    return result


def storage_sandbox(kit: Kit, name: str, **spec: Any) -> dict[str, Any]:
    return kit.sandbox(name, storage=dict(STORAGE), **spec)


@pytest.mark.parametrize("backend", ["runc", "gvisor"])
def test_suspend_keeps_the_work_dir_and_resume_brings_it_back(
    kit: Kit, start_operator: Any, kubectl: Any, storage_class: str, backend: str
) -> None:
    start_operator(config(backend))
    kit.scope()
    storage_sandbox(kit, "box")
    obj = ready(kit, "box")
    assert obj["status"]["backend"] == backend
    pod = kit.pod("box")
    assert pod is not None
    work = next(m for m in pod.spec.containers[0].volume_mounts if m.mount_path == "/workspace")
    volumes = {v.name: v for v in pod.spec.volumes}
    assert volumes[work.name].persistent_volume_claim.claim_name == naming.work_volume_name("box")
    assert volumes["tmp"].empty_dir is not None  # /tmp is still scratch
    pvc = claim(kit, "box")
    assert pvc is not None and pvc.status.phase == "Bound"
    assert pvc.spec.storage_class_name == storage_class
    assert pvc.spec.resources.requests["storage"] == "64Mi"
    assert pvc.metadata.owner_references[0].uid == obj["metadata"]["uid"]
    assert pvc.metadata.labels[lbl.SANDBOX_LABEL] == lbl.sandbox_label_value("box")
    sh(kubectl, kit, "box", WRITE)
    before = sh(kubectl, kit, "box", READ)
    assert before.splitlines()[-3:] == ["kept across suspend", "nested", "65532"]
    np_uid = policy(kit).metadata.uid  # type: ignore[union-attr]

    # Suspend: the pod goes, the claim and the NetworkPolicy stay.
    patch_spec(kit, "box", suspended=True)
    obj = suspended(kit, "box")
    st = obj["status"]
    assert st["suspendedBy"] == "spec" and st["suspendCount"] == 1 and st.get("suspendedAt")
    assert not st.get("servedBy")
    kept = claim(kit, "box")
    assert kept is not None and kept.metadata.uid == pvc.metadata.uid
    assert kept.metadata.deletion_timestamp is None
    assert policy(kit).metadata.uid == np_uid  # type: ignore[union-attr]
    assert kit.condition(obj, "Admitted")["status"] == "True"

    # Resume: a new pod on the same volume, the same bytes.
    patch_spec(kit, "box", suspended=False)
    obj = ready(kit, "box")
    again = kit.pod("box")
    assert again is not None and again.metadata.uid != pod.metadata.uid
    assert sh(kubectl, kit, "box", READ) == before
    st = obj["status"]
    assert st["resumeCount"] == 1 and st.get("resumedAt") and not st.get("suspendedBy")
    assert claim(kit, "box").metadata.uid == pvc.metadata.uid  # type: ignore[union-attr]

    # Disposal takes the claim along.
    kit.delete("box")
    kit.wait_gone("box", timeout=90)
    _wait(lambda: claim(kit, "box") is None, 60, "the claim to go with its Sandbox")
    assert policy(kit).metadata.uid == np_uid  # type: ignore[union-attr]  # the namespace's


@pytest.mark.parametrize("backend", ["runc", "gvisor"])
def test_idle_suspends_and_use_resumes(
    kit: Kit, start_operator: Any, kubectl: Any, storage_class: str, backend: str
) -> None:
    start_operator(config(backend))
    kit.scope()
    storage_sandbox(
        kit,
        "idler",
        lifetime={"idleTimeoutSeconds": 8, "idleAction": "suspend", "ttlSeconds": 600},
    )
    ready(kit, "idler")
    sh(kubectl, kit, "idler", WRITE)
    before = sh(kubectl, kit, "idler", READ)
    obj = suspended(kit, "idler", timeout=90)
    assert obj["status"]["suspendedBy"] == "idle"
    assert obj["spec"].get("suspended") in (None, False)  # the spec was not touched
    assert claim(kit, "idler") is not None and policy(kit) is not None
    # Nothing resumes it by itself.
    time.sleep(2)
    assert kit.pod("idler") is None
    # A use newer than the suspension (the client's activity stamp) resumes it.
    time.sleep(1.1)  # the stamp has a resolution of one second
    touch(kit, "idler")
    ready(kit, "idler")
    assert sh(kubectl, kit, "idler", READ) == before


@pytest.mark.parametrize("backend", ["runc", "gvisor"])
def test_deleting_the_scope_of_a_suspended_sandbox_takes_everything(
    kit: Kit, start_operator: Any, storage_class: str, backend: str
) -> None:
    start_operator(config(backend))
    kit.scope("conv")
    storage_sandbox(kit, "sleeper", scope_ref="conv")
    ready(kit, "sleeper")
    patch_spec(kit, "sleeper", suspended=True)
    suspended(kit, "sleeper")
    assert claim(kit, "sleeper") is not None
    kit.delete("conv", "sandboxscopes")
    kit.wait_gone("conv", "sandboxscopes", timeout=120)
    kit.wait_gone("sleeper", timeout=60)
    _wait(lambda: claim(kit, "sleeper") is None, 60, "the claim to go with the scope")
    assert policy(kit) is not None  # the namespace's, no conversation's: a purge leaves it
    assert kit.core.list_namespaced_persistent_volume_claim(kit.ns).items == []


@pytest.mark.parametrize("backend", ["runc", "gvisor"])
def test_ttl_ends_a_suspended_sandbox(
    kit: Kit, start_operator: Any, storage_class: str, backend: str
) -> None:
    start_operator(config(backend))
    kit.scope()
    storage_sandbox(
        kit,
        "mortal",
        lifetime={"startupTimeoutSeconds": 60, "ttlSeconds": 20, "idleTimeoutSeconds": 20},
    )
    ready(kit, "mortal", timeout=30)
    patch_spec(kit, "mortal", suspended=True)
    suspended(kit, "mortal", timeout=30)
    obj = kit.wait_condition("mortal", reasons=("Expired",), timeout=90)
    assert kit.condition(obj, "Ready")["status"] == "False"
    kit.wait_condition("mortal", "Disposed", status="True", timeout=90)
    _wait(lambda: claim(kit, "mortal") is None, 60, "the claim of the expired sandbox to go")
    assert kit.pod("mortal") is None and policy(kit) is not None  # the namespace's policy stays


def floor_config(floor: str) -> dict[str, Any]:
    """Per-spec selection over gVisor (no persistent storage) and runc (persistent storage): a
    spec with storage goes to runc while the floor allows it, and to nothing once it does not."""
    backends = [
        {
            "name": name,
            "type": "runtimeClass",
            "runtimeClassName": name,
            "isolation": BACKENDS[name],
            "declarations": {**DECLARATIONS, "persistentStorage": name == "runc"},
            "pod": {"terminationGracePeriodSeconds": 1},
        }
        for name in ("gvisor", "runc")
    ]
    return local_config(floor=floor, selection="perSpec", backends=backends)


def gvisor_floor_config(floor: str) -> dict[str, Any]:
    """gVisor (persistent storage) and a microVM backend this machine cannot run (its RuntimeClass
    is missing: registered, unavailable): the host floor may then be raised to microvm, above
    gVisor, and the configuration is still one the operator starts with."""
    backends = [
        {
            "name": "gvisor",
            "type": "runtimeClass",
            "runtimeClassName": "gvisor",
            "isolation": "hardened_container",
            "declarations": {**DECLARATIONS, "persistentStorage": True},
            "pod": {"terminationGracePeriodSeconds": 1},
        },
        {
            "name": "kata",
            "type": "runtimeClass",
            "runtimeClassName": "kata-not-here",
            "isolation": "microvm",
            "declarations": DECLARATIONS,
        },
    ]
    return local_config(floor=floor, selection="perSpec", backends=backends)


FLOORS = {
    # backend -> (its config at a floor, the floor it serves, the floor raised above it)
    "runc": (floor_config, "container", "hardened_container"),
    "gvisor": (gvisor_floor_config, "hardened_container", "microvm"),
}


@pytest.mark.parametrize("backend", ["runc", "gvisor"])
def test_resume_is_refused_after_the_floor_was_raised(
    kit: Kit, start_operator: Any, storage_class: str, backend: str
) -> None:
    make, served, raised = FLOORS[backend]
    first = start_operator(make(served))
    kit.scope()
    storage_sandbox(kit, "held")
    assert ready(kit, "held")["status"]["backend"] == backend
    patch_spec(kit, "held", suspended=True)
    suspended(kit, "held")
    pvc = claim(kit, "held")
    assert pvc is not None
    # The host raises its floor above what the backend gives while the sandbox sleeps.
    first.stop()
    start_operator(make(raised))
    # Still suspended, untouched, while nobody asks for it.
    time.sleep(2)
    obj = kit.wait_condition("held", reasons=("Suspended",), status="False", timeout=30)
    assert kit.condition(obj, "Admitted")["status"] == "True"
    patch_spec(kit, "held", suspended=False)
    obj = kit.wait_condition(
        "held", "Admitted", reasons=("NoBackendCanServe",), status="False", timeout=60
    )
    admitted = kit.condition(obj, "Admitted")
    assert "IsolationBelowFloor" in admitted["message"], admitted
    assert raised in admitted["message"]
    ready_cond = kit.condition(obj, "Ready")
    assert ready_cond["status"] == "False" and ready_cond["reason"] == "NoBackendCanServe"
    # Nothing started, and nothing was lost: the work volume waits for a host that allows it.
    time.sleep(2)
    assert kit.pod("held") is None
    kept = claim(kit, "held")
    assert kept is not None and kept.metadata.uid == pvc.metadata.uid
    assert kept.metadata.deletion_timestamp is None
    assert policy(kit) is not None


@pytest.mark.parametrize("backend", ["runc", "gvisor"])
def test_an_operator_restart_while_suspended_changes_nothing(
    kit: Kit, start_operator: Any, kubectl: Any, storage_class: str, backend: str
) -> None:
    op = start_operator(config(backend))
    kit.scope()
    storage_sandbox(kit, "dormant")
    ready(kit, "dormant")
    # The documented way: kubectl patch.
    kubectl(
        "patch", "sbx", "dormant", "-n", kit.ns, "--type", "merge",
        "-p", '{"spec":{"suspended":true}}',
    )  # fmt: skip
    suspended(kit, "dormant")
    time.sleep(3)  # let the last status write land
    before = kit.get("dormant")
    assert before is not None
    pvc = claim(kit, "dormant")
    np = policy(kit)
    assert pvc is not None and np is not None
    op.kill()
    op.restart()
    time.sleep(6)  # three resync periods (2 s) of a fresh operator
    after = kit.get("dormant")
    assert after is not None
    assert after["status"] == before["status"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert kit.pod("dormant") is None
    assert claim(kit, "dormant").metadata.uid == pvc.metadata.uid  # type: ignore[union-attr]
    assert policy(kit).metadata.uid == np.metadata.uid  # type: ignore[union-attr]
    # And it still resumes.
    patch_spec(kit, "dormant", suspended=False)
    ready(kit, "dormant")
    assert op.running


def test_a_resume_while_the_pod_is_still_stopping_starts_once_it_is_gone(
    kit: Kit, start_operator: Any, kubectl: Any, storage_class: str
) -> None:
    """Suspend and resume back to back: the new pod (same name, same volume) is made only once
    the old one is gone, and the sandbox ends Ready with its files."""
    start_operator(config("runc"))
    kit.scope()
    storage_sandbox(kit, "flip")
    ready(kit, "flip")
    sh(kubectl, kit, "flip", WRITE)
    before = sh(kubectl, kit, "flip", READ)
    old = kit.pod("flip")
    assert old is not None
    patch_spec(kit, "flip", suspended=True)
    kit.wait_condition("flip", reasons=("Suspended",), status="False", timeout=30)
    patch_spec(kit, "flip", suspended=False)
    obj = ready(kit, "flip", timeout=90)
    new = kit.pod("flip")
    assert new is not None and new.metadata.uid != old.metadata.uid
    assert sh(kubectl, kit, "flip", READ) == before
    assert kit.condition(obj, "Admitted")["status"] == "True"
