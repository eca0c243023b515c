"""The node level is real: pods run under runc and under gVisor; exec and logs go through the
API server to the kubelet.

On the local cluster the node is this machine, so runc pods must report this machine's kernel.
On another cluster (KUBECONFIG) the gVisor pod is compared with a runc pod instead, and the
gVisor tests are skipped when that cluster has no `gvisor` RuntimeClass.
"""

from __future__ import annotations

import os
import time

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.fixtures.node import exec_in, run_pod

pytestmark = pytest.mark.e2e

PYTHON = "sandbox-operator.dev/python:1"


@pytest.fixture(scope="module")
def gvisor_available(api_client: client.ApiClient) -> None:
    try:
        rc = client.NodeV1Api(api_client).read_runtime_class("gvisor")
    except ApiException as exc:
        if exc.status == 404:
            pytest.skip("this cluster has no `gvisor` RuntimeClass")
        raise
    assert rc.handler


def test_runc_pod_sees_the_node_kernel(
    core_v1: client.CoreV1Api, namespace: str, cluster_is_local: bool
) -> None:
    run_pod(core_v1, namespace, "runc", runtime_class="runc")
    release = exec_in(core_v1, namespace, "runc", "uname", "-r").strip()
    assert release
    if cluster_is_local:
        assert release == os.uname().release


def test_gvisor_pod_runs_on_the_gvisor_kernel(
    core_v1: client.CoreV1Api, namespace: str, gvisor_available: None
) -> None:
    run_pod(core_v1, namespace, "gvisor", runtime_class="gvisor")
    dmesg = exec_in(core_v1, namespace, "gvisor", "dmesg")
    assert "Starting gVisor" in dmesg, dmesg
    gvisor_release = exec_in(core_v1, namespace, "gvisor", "uname", "-r").strip()
    run_pod(core_v1, namespace, "runc", runtime_class="runc")
    runc_release = exec_in(core_v1, namespace, "runc", "uname", "-r").strip()
    assert gvisor_release
    assert gvisor_release != runc_release
    assert gvisor_release != os.uname().release


def test_pod_logs_are_served_through_the_api_server(
    core_v1: client.CoreV1Api, namespace: str
) -> None:
    marker = f"hello-from-{namespace}"
    run_pod(core_v1, namespace, "logger", command=["sh", "-c", f"echo {marker}; sleep 3600"])
    deadline = time.monotonic() + 30
    logs = ""
    while marker not in logs and time.monotonic() < deadline:
        logs = core_v1.read_namespaced_pod_log("logger", namespace)
        time.sleep(0.3)
    assert marker in logs


def test_python_image_runs_python(core_v1: client.CoreV1Api, namespace: str) -> None:
    run_pod(core_v1, namespace, "py", image=PYTHON)
    out = exec_in(
        core_v1,
        namespace,
        "py",
        "python3",
        "-c",
        "import json, sys; print(json.dumps(sys.version_info[:2]))",
    )
    assert out.strip().startswith("[3,")
