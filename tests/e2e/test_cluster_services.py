"""Services work: kube-proxy routes a ClusterIP to its pod, and a pod reaches the API server
through the `kubernetes` Service (in-cluster configuration) without any override."""

from __future__ import annotations

import time

import pytest
from kubernetes import client
from kubernetes.stream import stream

from tests.fixtures.node import exec_in, run_pod

pytestmark = pytest.mark.e2e

PYTHON = "sandbox-operator.dev/python:1"


def test_cluster_ip_reaches_its_pod(core_v1: client.CoreV1Api, namespace: str) -> None:
    server = run_pod(
        core_v1,
        namespace,
        "web",
        command=["sh", "-c", "mkdir -p /www && echo served-by-web > /www/index.html "
                 "&& exec httpd -f -p 8080 -h /www"],
    )  # fmt: skip
    core_v1.patch_namespaced_pod("web", namespace, {"metadata": {"labels": {"app": "web"}}})
    svc = core_v1.create_namespaced_service(
        namespace,
        client.V1Service(
            metadata=client.V1ObjectMeta(name="web"),
            spec=client.V1ServiceSpec(
                selector={"app": "web"},
                ports=[client.V1ServicePort(port=80, target_port=8080)],
            ),
        ),
    )
    assert server.status.pod_ip
    run_pod(core_v1, namespace, "client")
    deadline = time.monotonic() + 60
    out = ""
    while "served-by-web" not in out and time.monotonic() < deadline:
        # busybox's own wget crashes in Debian's static build: speak HTTP through nc.
        out = exec_in(
            core_v1, namespace, "client", "sh", "-c",
            f'printf "GET / HTTP/1.0\\r\\n\\r\\n" | nc -w 3 {svc.spec.cluster_ip} 80',
        )  # fmt: skip
        time.sleep(0.5)
    assert "served-by-web" in out


def test_pod_reaches_the_api_server_through_the_kubernetes_service(
    core_v1: client.CoreV1Api, namespace: str
) -> None:
    run_pod(core_v1, namespace, "incluster", image=PYTHON)
    probe = (
        "import os, ssl, urllib.request\n"
        "host = os.environ['KUBERNETES_SERVICE_HOST']\n"
        "port = os.environ['KUBERNETES_SERVICE_PORT']\n"
        "ctx = ssl._create_unverified_context()\n"
        "print(urllib.request.urlopen(f'https://{host}:{port}/readyz', context=ctx,"
        " timeout=5).read().decode())\n"
    )
    out: str = stream(
        core_v1.connect_get_namespaced_pod_exec,
        "incluster",
        namespace,
        command=["python3", "-c", probe],
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
        _request_timeout=60,
    )
    assert out.strip().endswith("ok"), out
