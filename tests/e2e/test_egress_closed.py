"""`egress: closed` is enforced, under runc and under gVisor: a sandbox created by the real
operator reaches nothing (an "outside" HTTP server on this machine, another pod, the API server
through its Service, DNS), while an unrestricted pod in the same namespace reaches that server by
name; and every blocked attempt ends within its deadline with a named outcome instead of hanging.

The "outside" host is an HTTP server this test starts on this machine, bound to the node's
address, reached by the name `outside.test` (hostAliases); nothing leaves this machine.
"""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest
from kubernetes import client

from sandbox_operator.egress.probe import (
    Outcome,
    ProbeTarget,
    expect_answered,
    expect_blocked,
    judge,
    run_probe,
)
from sandbox_operator.testing.egress import serve_http_in_thread
from tests.e2e.test_cluster_node import exec_in
from tests.fixtures.operator import DECLARATIONS, PYTHON, egress_policy_of, local_config

pytestmark = pytest.mark.e2e

DEADLINE = 3.0  # per probe target
SLACK = 2.0  # allowed on top of the deadline (exec round trip is not included in `seconds`)
BRIDGE_GATEWAY = "10.244.0.1"  # the node's address on the pod bridge (hack/cluster.py)
API_SERVICE = ProbeTarget("api-server-service", "10.96.0.1", 443)  # the `kubernetes` Service


@dataclass(frozen=True)
class Outside:
    address: str
    port: int
    token: str


def node_address(core: client.CoreV1Api) -> str:
    for node in core.list_node().items:
        for addr in node.status.addresses or []:
            if addr.type == "InternalIP":
                return str(addr.address)
    raise AssertionError("no node with an InternalIP")


@pytest.fixture
def outside(core_v1: client.CoreV1Api) -> Iterator[Outside]:
    """An HTTP server on this machine, on the node's address and an ephemeral port (never the
    two node ports kube-router exempts, 30000-30001)."""
    token = f"outside-{secrets.token_hex(4)}"
    address = node_address(core_v1)
    # On all of this machine's addresses (the node's and the pod bridge's gateway); a backlog
    # for the hundreds of tunnels that may connect at once.
    with serve_http_in_thread(token.encode()) as port:
        assert port not in (30000, 30001)
        yield Outside(address, port, token)


def backend(runtime_class: str) -> dict[str, object]:
    isolation = "hardened_container" if runtime_class == "gvisor" else "container"
    return local_config(
        floor="container",
        selection="fixed",
        pinned=runtime_class,
        backends=[
            {
                "name": runtime_class,
                "type": "runtimeClass",
                "runtimeClassName": runtime_class,
                "isolation": isolation,
                "declarations": DECLARATIONS,
            }
        ],
    )


def unrestricted_pod(
    core: client.CoreV1Api, namespace: str, name: str, runtime_class: str, outside: Outside
) -> client.V1Pod:
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app": name}),
        spec=client.V1PodSpec(
            runtime_class_name=runtime_class,
            restart_policy="Never",
            termination_grace_period_seconds=0,
            automount_service_account_token=False,
            host_aliases=[client.V1HostAlias(ip=outside.address, hostnames=["outside.test"])],
            containers=[
                client.V1Container(
                    name="main",
                    image=PYTHON,
                    image_pull_policy="Never",
                    command=["python3", "-m", "http.server", "8080", "-d", "/tmp"],
                )
            ],
        ),
    )
    core.create_namespaced_pod(namespace, pod)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        current: client.V1Pod = core.read_namespaced_pod(name, namespace)
        if current.status.phase == "Running" and current.status.pod_ip:
            return current
        assert current.status.phase != "Failed", current.status
        time.sleep(0.5)
    raise AssertionError(f"pod {name} not running")


def probe_in_pod(
    core: client.CoreV1Api,
    namespace: str,
    pod: str,
    targets: Sequence[ProbeTarget],
    cadata: str = "",
) -> tuple[list, float]:
    async def execute(argv: Sequence[str]) -> str:
        return await asyncio.to_thread(exec_in, core, namespace, pod, *argv)

    started = time.monotonic()
    results = asyncio.run(run_probe(execute, targets, timeout=DEADLINE, cadata=cadata))
    return results, time.monotonic() - started


@pytest.mark.parametrize("runtime_class", ["runc", "gvisor"])
def test_closed_sandbox_reaches_nothing_an_open_pod_reaches(
    kit, start_operator, core_v1: client.CoreV1Api, outside: Outside, runtime_class: str
) -> None:
    ns = kit.ns
    # The control: an unrestricted pod (no NetworkPolicy selects it) reaches the outside host by
    # name, so what the closed sandbox cannot reach is reachable in this cluster.
    peer = unrestricted_pod(core_v1, ns, "open-peer", runtime_class, outside)
    open_targets = [
        ProbeTarget("outside-by-name", "outside.test", outside.port),
        ProbeTarget("outside-by-address", outside.address, outside.port),
        ProbeTarget("bridge-gateway", BRIDGE_GATEWAY, outside.port),
    ]
    results, _ = probe_in_pod(core_v1, ns, "open-peer", open_targets)
    verdicts = [expect_answered(r, body_contains=outside.token) for r in results]
    # The API server through its Service: any HTTP answer (plain HTTP on its TLS port: 400).
    (api,) = probe_in_pod(core_v1, ns, "open-peer", [API_SERVICE])[0]
    verdicts.append(expect_answered(api))
    assert all(v.ok for v in verdicts), judge(verdicts)
    # The peer's own server answers from the node.
    with urllib.request.urlopen(f"http://{peer.status.pod_ip}:8080/", timeout=10) as resp:
        assert resp.status == 200

    # The closed sandbox, created by the real operator (spec.egress defaults to closed).
    start_operator(backend(runtime_class))
    kit.scope()
    kit.sandbox("closed", image=PYTHON, requires=["exec"])
    obj = kit.wait_condition("closed", reasons=("Ready",), status="True", timeout=150)
    assert obj["spec"].get("egress", "closed") == "closed"
    pod = obj["status"]["servedBy"]["name"]
    policy = egress_policy_of(kit, pod)
    assert "Egress" in policy.spec.policy_types and not policy.spec.egress

    closed_targets = [
        ProbeTarget("outside-by-address", outside.address, outside.port),
        ProbeTarget("bridge-gateway", BRIDGE_GATEWAY, outside.port),
        ProbeTarget("open-peer-pod", peer.status.pod_ip, 8080),
        API_SERVICE,
        ProbeTarget("dns-lookup", "outside.test", outside.port),
    ]
    results, wall = probe_in_pod(core_v1, ns, pod, closed_targets)
    verdicts = [expect_blocked(r, within=DEADLINE + SLACK) for r in results]
    assert all(v.ok for v in verdicts), judge(verdicts)
    # Bounded as a whole, too: no attempt hung past its deadline (plus one exec round trip).
    assert wall < len(closed_targets) * (DEADLINE + SLACK) + 15, wall
    # The name has no address here (no hostAliases, no DNS reachable).
    by_name = {r.name: r for r in results}
    assert by_name["dns-lookup"].outcome is Outcome.RESOLVE_FAILED
    print("\n" + judge(verdicts))

    # The same check as a command (check-egress): exit 0, every expectation held.
    out = check_egress_cli(
        ns, "closed", "--reachable", f"{outside.address}:{outside.port}",
        "--reachable", f"{BRIDGE_GATEWAY}:{outside.port}",
    )  # fmt: skip
    assert "egress closed" in out and "FAILED" not in out, out


def check_egress_cli(ns: str, sandbox: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "sandbox_operator.cli", "check-egress", "--namespace", ns,
         "--sandbox", sandbox, *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout
