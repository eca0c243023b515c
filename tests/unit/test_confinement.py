"""What confines a pod (#28 item 1): a pod found in the cluster is claimed from a warm pool or
adopted at a Sandbox's pod name only when it is confined exactly as the backend makes it. Labels,
annotations and owner references are copied in every forgery below; each differs in one field
that decides what the sandbox's code can reach, and each is refused, by the pure digest and by
the runtime-class driver's check."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from sandbox_operator.backends.confinement import (
    CONFINEMENT,
    confinement_difference,
    confinement_digest,
)
from sandbox_operator.backends.runtimeclass import RuntimeClassDriver, pod_manifest
from sandbox_operator.config import RuntimeClassBackendConfig
from sandbox_operator.contract import SandboxSpec
from sandbox_operator.reconcile.slim import slim_pod
from sandbox_operator.views import PodView
from sandbox_operator.views.pod import PodSpecView
from tests.fixtures.backends import gvisor_backend

SPEC = SandboxSpec.model_validate({"kind": "python", "image": "sandbox-operator.dev/python:1"})


def backend() -> RuntimeClassBackendConfig:
    return gvisor_backend()


def made() -> dict[str, Any]:
    """The pod the backend makes, as the API server stores it (false host flags omitted, the
    service account defaulted, the termination-message defaults added to the container)."""
    pod = pod_manifest(SPEC, backend(), {"name": "sbx-pool-p-1", "namespace": "ns"})
    spec = pod["spec"]
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        spec.pop(flag)
    spec["serviceAccountName"] = spec["serviceAccount"] = "default"
    spec["containers"][0]["terminationMessagePath"] = "/dev/termination-log"
    spec["schedulerName"] = "default-scheduler"
    return pod


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(spec: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = spec
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[last] = value

    return change


FORGERIES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "runc instead of gVisor": (_set("runtimeClassName", "runc"), "spec.runtimeClassName"),
    "no runtime class": (_set("runtimeClassName", None), "spec.runtimeClassName"),
    "a service-account token": (
        _set("automountServiceAccountToken", True),
        "spec.automountServiceAccountToken",
    ),
    "the token by default": (
        lambda s: s.pop("automountServiceAccountToken"),
        "spec.automountServiceAccountToken",
    ),
    "another service account": (_set("serviceAccountName", "admin"), "spec.serviceAccountName"),
    "root": (_set("securityContext", {"runAsUser": 0}), "spec.securityContext"),
    "privileged": (_set("containers.0.securityContext.privileged", True), "spec.containers"),
    "capabilities kept": (_set("containers.0.securityContext.capabilities", {}), "spec.containers"),
    "another image": (_set("containers.0.image", "evil:1"), "spec.containers"),
    "a proxy of its own": (
        _set("containers.0.env", [{"name": "HTTPS_PROXY", "value": "http://evil:3128"}]),
        "spec.containers",
    ),
    "a host path": (
        _set("volumes", [{"name": "work", "hostPath": {"path": "/"}}]),
        "spec.volumes",
    ),
    "the host network": (_set("hostNetwork", True), "spec.hostNetwork"),
    "the host's PIDs": (_set("hostPID", True), "spec.hostPID"),
    "the host's IPC": (_set("hostIPC", True), "spec.hostIPC"),
    "the host's users": (_set("hostUsers", False), "spec.hostUsers"),
    "a shared process namespace": (
        _set("shareProcessNamespace", True),
        "spec.shareProcessNamespace",
    ),
    "other arguments": (_set("containers.0.args", ["-c", "id"]), "spec.containers"),
    "another working directory": (_set("containers.0.workingDir", "/"), "spec.containers"),
    "environment from a Secret": (
        _set("containers.0.envFrom", [{"secretRef": {"name": "s"}}]),
        "spec.containers",
    ),
    "a block device": (
        _set("containers.0.volumeDevices", [{"name": "d", "devicePath": "/dev/x"}]),
        "spec.containers",
    ),
    "a sidecar": (
        lambda s: s["containers"].append(copy.deepcopy(s["containers"][0]) | {"name": "x"}),
        "spec.containers",
    ),
    "an init container": (
        lambda s: s.__setitem__("initContainers", [copy.deepcopy(s["containers"][0])]),
        "spec.initContainers",
    ),
}


def test_the_made_pod_and_its_stored_form_have_one_digest() -> None:
    written = pod_manifest(SPEC, backend(), {"name": "x"})
    assert confinement_digest(written["spec"]) == confinement_digest(made()["spec"])
    assert confinement_difference(PodSpecView(made()["spec"]), PodSpecView(written["spec"])) is None
    # What the views keep of a pod: the digest, beside the few fields reconciling reads.
    assert slim_pod(PodView(made()))["spec"][CONFINEMENT] == confinement_digest(written["spec"])


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_a_forgery_differs_in_the_field_it_changed(forgery: str) -> None:
    change, field = FORGERIES[forgery]
    forged = made()
    change(forged["spec"])
    expected = pod_manifest(SPEC, backend(), {})["spec"]
    assert confinement_digest(forged["spec"]) != confinement_digest(expected)
    assert confinement_difference(PodSpecView(forged["spec"]), PodSpecView(expected)) == field


def test_resources_and_scheduling_are_not_confinement() -> None:
    moved = made()
    moved["spec"]["nodeName"] = "node-2"
    moved["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1000m"}}
    assert confinement_digest(moved["spec"]) == confinement_digest(made()["spec"])


@pytest.mark.parametrize("forgery", ["runc instead of gVisor", "a service-account token", "root"])
async def test_the_driver_serves_only_a_pod_confined_as_it_makes_it(forgery: str) -> None:
    async with ApiClient(Configuration(host="http://127.0.0.1:9")) as api:
        driver = RuntimeClassDriver(backend(), api)
        assert driver.confines_as_made(PodView(slim_pod(PodView(made()))), SPEC, None)
        # a full pod, read from the API
        assert driver.confines_as_made(PodView(made()), SPEC, None)
        forged = made()
        FORGERIES[forgery][0](forged["spec"])
        assert not driver.confines_as_made(PodView(slim_pod(PodView(forged))), SPEC, None)
        assert not driver.pool_pod_serves(PodView(slim_pod(PodView(forged))), SPEC)
        assert driver.pool_pod_serves(PodView(slim_pod(PodView(made()))), SPEC)
