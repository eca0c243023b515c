"""A warm pool of `egress: allowlist` pods, under runc and gVisor, with the egress proxy the
operator runs: the pool applies the namespace's proxy and gives its pods the proxy's address; an
idle pod reaches nothing (not even the proxy); a Sandbox with the same spec claims a pod, is Ready
only once the proxy has admitted it, and its very first request to an allowed host is answered
while a host off its list is refused; the claimed Sandbox is an owner of the proxy objects, so
deleting the pool leaves the proxy to it."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from sandbox_operator import labels as lbl
from sandbox_operator.contract import GROUP, SANDBOX_WARM_POOL_PLURAL, VERSION
from sandbox_operator.egress.probe import (
    ProbeTarget,
    Via,
    expect_answered,
    expect_blocked,
    expect_proxy_refused,
)
from tests.fixtures.egress_probe import DEADLINE, SLACK, Outside, probe_in_pod
from tests.fixtures.egress_proxy import (
    PROXY_PORT,
    config_with_managed_proxy,
    proxy_objects,
    ready_and_served,
)
from tests.fixtures.operator import PYTHON

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ALLOW = ["allowed.test"]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.mark.parametrize("runtime_class", ["runc", "gvisor"])
def test_an_allowlist_pool_serves_through_the_operators_proxy(
    kit,
    start_operator,
    api_client: client.ApiClient,
    core_v1: client.CoreV1Api,
    outside: Outside,
    runtime_class: str,
    operator_image: tuple[str, str],
) -> None:
    ns = kit.ns
    start_operator(config_with_managed_proxy(runtime_class, ":".join(operator_image), outside))
    kit.scope()
    spec = kit.sandbox_body("x", image=PYTHON, requires=["exec"], egress="allowlist")["spec"]
    template = {k: spec[k] for k in ("kind", "image", "workDir", "requires", "resources")}
    template.update(egress="allowlist", egressAllow=ALLOW)
    kit.custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        ns,
        SANDBOX_WARM_POOL_PLURAL,
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxWarmPool",
            "metadata": {"name": "allow"},
            "spec": {"replicas": 2, "template": template},
        },
    )
    pool = wait_for(
        lambda: (
            (o := kit.get("allow", SANDBOX_WARM_POOL_PLURAL))
            and (o.get("status") or {}).get("readyReplicas") == 2
            and o
        ),
        240,
        "2 ready idle pods",
    )
    pool_uid = pool["metadata"]["uid"]

    # The pool made the namespace's proxy (owned by the pool) and gave its pods its address.
    objects = proxy_objects(api_client, ns)
    cluster_ip = objects["Service"].spec.cluster_ip
    for kind, o in objects.items():
        assert pool_uid in {r.uid for r in o.metadata.owner_references or []}, kind
    idle = [p for p in kit.pods(f"{lbl.POOL_LABEL}=allow") if p.status.phase == "Running"]
    assert len(idle) == 2
    env = {e.name: e.value for e in idle[0].spec.containers[0].env or []}
    assert env.get("HTTPS_PROXY") == f"http://{cluster_ip}:{PROXY_PORT}", env

    # An idle pod reaches nothing, not even the proxy: the pool's policy denies all.
    (to_proxy,), _ = probe_in_pod(
        core_v1,
        ns,
        idle[0].metadata.name,
        [ProbeTarget("idle-to-proxy", cluster_ip, PROXY_PORT)],
    )
    assert expect_blocked(to_proxy, within=DEADLINE + SLACK).ok, to_proxy.describe()

    # A Sandbox with the same spec claims one, is Ready once the proxy admitted it, and its
    # first request is served; a host off its list is refused by the proxy.
    kit.sandbox("claimer", image=PYTHON, requires=["exec"], egress="allowlist", egressAllow=ALLOW)
    first = ProbeTarget("allowed", "allowed.test", outside.port, via=Via.CONNECT)
    obj, _ = ready_and_served(kit, core_v1, "claimer", first, outside.token)
    assert obj["status"]["servedFrom"] == "SandboxWarmPool/allow"
    served = obj["status"]["servedBy"]["name"]
    assert served in {p.metadata.name for p in idle}
    (denied,), _ = probe_in_pod(
        core_v1, ns, served, [ProbeTarget("denied", "denied.test", outside.port, via=Via.CONNECT)]
    )
    assert expect_proxy_refused(denied, reason="HostNotAllowed").ok, denied.describe()

    # The claimed Sandbox owns the proxy too: deleting the pool leaves the proxy to it.
    sandbox_uid = obj["metadata"]["uid"]
    service = core_v1.read_namespaced_service("sandbox-egress-proxy", ns)
    assert sandbox_uid in {r.uid for r in service.metadata.owner_references or []}
    kit.delete("allow", SANDBOX_WARM_POOL_PLURAL)
    kit.wait_gone("allow", SANDBOX_WARM_POOL_PLURAL, timeout=60)
    # Deleting the pool deletes its idle pods (the garbage collector) and leaves the claimed one
    # to its Sandbox.
    wait_for(
        lambda: all(
            p.metadata.deletion_timestamp is not None
            for p in kit.pods(f"{lbl.POOL_LABEL}=allow")
            if p.metadata.name != served
        ),
        60,
        "the pool's idle pods deleted",
    )
    claimed = core_v1.read_namespaced_pod(served, ns)
    assert claimed.metadata.deletion_timestamp is None
    assert [o.uid for o in claimed.metadata.owner_references or []] == [sandbox_uid]
    time.sleep(5)  # the garbage collector's turn for the proxy objects
    service = core_v1.read_namespaced_service("sandbox-egress-proxy", ns)
    assert service.spec.cluster_ip == cluster_ip
    (again,), _ = probe_in_pod(core_v1, ns, served, [first])
    assert expect_answered(again, body_contains=outside.token).ok, again.describe()
