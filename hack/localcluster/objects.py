"""The API objects `up` makes sure of, through the admin user's client: the node Ready, the
default service account (the controllers run), the RuntimeClasses `runc` and `gvisor`, and the
default StorageClass `sandbox-local` served by hack/local_path_provisioner.py.

Each is created when missing and replaced when it differs (their fields are immutable)."""

from __future__ import annotations

from typing import Any

from .layout import LOCAL_PATH_PROVISIONER, LOGS, NODE_NAME, RUNTIME_CLASSES, STORAGE_CLASS
from .probes import api
from .steps import StepFailed, say, step
from .supervise import wait_for


def wait_node_ready() -> None:
    def ready() -> bool:
        code, node = api("GET", f"/api/v1/nodes/{NODE_NAME}")
        if code != 200:
            return False
        conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
        return conds.get("Ready") == "True"

    with step(f"wait for node {NODE_NAME} Ready", LOGS / "kubelet.log"):
        wait_for("node Ready", ready, 180, LOGS / "kubelet.log")


def ensure_runtime_classes() -> None:
    for name, handler in RUNTIME_CLASSES.items():
        code, obj = api("GET", f"/apis/node.k8s.io/v1/runtimeclasses/{name}")
        if code == 200 and obj.get("handler") == handler:
            continue
        if code == 200:
            api("DELETE", f"/apis/node.k8s.io/v1/runtimeclasses/{name}")
        body = {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": name, "labels": {"sandbox-operator.dev/cluster": "local"}},
            "handler": handler,
        }
        code, obj = api("POST", "/apis/node.k8s.io/v1/runtimeclasses", body)
        if code not in (200, 201, 409):
            raise StepFailed("runtime classes", f"creating {name}: HTTP {code} {obj}")
        say(f"RuntimeClass {name} -> handler {handler}")


def wait_default_service_account() -> None:
    def exists() -> bool:
        return api("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200

    wait_for("default service account", exists, 60, LOGS / "kube-controller-manager.log")


def storage_class() -> dict[str, Any]:
    """`WaitForFirstConsumer` binding, although there is one node: the scheduler then binds a
    pod's new claim itself (it asks for the volume and waits for the binding before it binds the
    pod). With `Immediate` binding a pod created beside its claim (as the operator does) is first
    refused ("unbound immediate PersistentVolumeClaims") and waits for the scheduler to requeue
    it when the claim binds; twice in CI that requeue was lost and the pod waited past its
    sandbox's startup timeout. A claim with no pod stays Pending (docs/cluster.md, "Volumes")."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "labels": {"sandbox-operator.dev/cluster": "local"},
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": LOCAL_PATH_PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowVolumeExpansion": False,
    }


def ensure_storage_class() -> None:
    body = storage_class()
    path = f"/apis/storage.k8s.io/v1/storageclasses/{STORAGE_CLASS}"
    code, obj = api("GET", path)
    if code == 200:
        keys = ("provisioner", "reclaimPolicy", "volumeBindingMode", "allowVolumeExpansion")
        annotations = obj["metadata"].get("annotations") or {}
        wanted = body["metadata"]["annotations"].items()
        if all(obj.get(k) == body[k] for k in keys) and wanted <= annotations.items():
            return
        api("DELETE", path)  # provisioner, reclaim policy and binding mode are immutable
    code, obj = api("POST", "/apis/storage.k8s.io/v1/storageclasses", body)
    if code not in (200, 201, 409):
        raise StepFailed("storage class", f"creating {STORAGE_CLASS}: HTTP {code} {obj}")
    say(f"StorageClass {STORAGE_CLASS} (default) -> provisioner {LOCAL_PATH_PROVISIONER}")
