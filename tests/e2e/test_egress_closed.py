"""`egress: closed` is enforced, under runc and under gVisor: a sandbox created by the real
operator reaches nothing (an "outside" HTTP server on this machine, another pod, the API server
through its Service, DNS), while an unrestricted pod in the same namespace reaches that server by
name; and every blocked attempt ends within its deadline with a named outcome instead of hanging.

The "outside" host is an HTTP server this test starts on this machine, bound to the node's
address, reached by the name `outside.test` (hostAliases); nothing leaves this machine.
"""

from __future__ import annotations

import urllib.request

import pytest
from kubernetes import client

from sandbox_operator.egress.probe import (
    Outcome,
    ProbeTarget,
    expect_answered,
    expect_blocked,
    judge,
)
from tests.fixtures.egress_probe import (
    BRIDGE_GATEWAY,
    DEADLINE,
    SLACK,
    Outside,
    backend,
    check_egress_cli,
    probe_in_pod,
    unrestricted_pod,
)
from tests.fixtures.operator import PYTHON, egress_policy_of

pytestmark = pytest.mark.e2e

API_SERVICE = ProbeTarget("api-server-service", "10.96.0.1", 443)  # the `kubernetes` Service


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
