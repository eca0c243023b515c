"""Idle warm-pool pods sealed until a Sandbox claims them (#36 item 2), on the real API server.

The chart's ``sealIdlePoolPods`` policies (templates/sealed-pool-pods-policy.yaml) are rendered
for a release serving one fresh namespace and applied; then the cluster's administrator (the
test's own identity) tries every way into an idle pool pod: exec, attach, port-forward, a label
change, an ephemeral container. Each is refused by admission, before anything reaches a node
(this tier has none). A claimed pod and a pod of no pool are out of the policies' reach, and the
operator's own identity (impersonated) may still claim an idle pod.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.fixtures.cluster import TEST_LABEL, kubectl_command
from tests.fixtures.seal import applied_seal

pytestmark = [pytest.mark.integration]

POOL, SANDBOX = "sandbox-operator.dev/pool", "sandbox-operator.dev/sandbox"
SEALED = "is an idle warm-pool pod, sealed until a Sandbox claims it"


@pytest.fixture
def sealed_namespace(core_v1: client.CoreV1Api, kubeconfig: str) -> Iterator[tuple[str, str]]:
    """A namespace served (for the policies) by a release of its own, rendered and applied;
    its name and the release's operator identity. Not labelled served-by: that label exempts
    a namespace (another operator seals it)."""
    ns = f"t-sealed-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=ns, labels={TEST_LABEL: "true"}))
    )
    try:
        with applied_seal(kubeconfig, ns) as (policy, objs):
            assert {o["kind"] for o in objs} == {
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding",
            }, objs
            account = policy.removesuffix("-sealed-pool-pods")
            deadline = time.monotonic() + 60
            while True:
                try:
                    core_v1.read_namespaced_service_account("default", ns)
                    break
                except ApiException as exc:
                    assert exc.status == 404 and time.monotonic() < deadline, exc
                    time.sleep(0.2)
            yield ns, f"system:serviceaccount:{ns}:{account}"
    finally:
        core_v1.delete_namespace(ns, propagation_policy="Background")


def _pod(core: client.CoreV1Api, ns: str, name: str, labels: dict[str, str]) -> None:
    body = {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [{"name": "sandbox", "image": "busybox", "command": ["sleep", "1d"]}],
        },
    }
    core.create_namespaced_pod(ns, body)


def _eventually(check: Callable[[], str], want: str, what: str, timeout: float = 30) -> str:
    """Policies take a moment to be in force (compiled, their params' informer synced)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if want in got:
            return got
        assert time.monotonic() < deadline, f"{what}: {got!r}"
        time.sleep(0.5)


def test_an_idle_pool_pod_is_out_of_everyones_reach_but_the_operators(
    sealed_namespace: tuple[str, str], core_v1: client.CoreV1Api, kubeconfig: str
) -> None:
    ns, operator = sealed_namespace
    _pod(core_v1, ns, "idle", {POOL: "p"})
    _pod(core_v1, ns, "claimed", {POOL: "p", SANDBOX: "s"})
    _pod(core_v1, ns, "plain", {})
    kubectl = [*kubectl_command(kubeconfig), "-n", ns]

    def run(*args: str) -> str:
        done = subprocess.run([*kubectl, *args], capture_output=True, text=True, timeout=30)
        return done.stderr + done.stdout

    # The administrator's exec, attach and port-forward into the idle pod: refused, each naming
    # what it asked for.
    for verb, args in (
        ("exec", ("exec", "idle", "--", "true")),
        ("attach", ("attach", "idle")),
        # (kubectl port-forward looks at the pod's phase first: ask the API server itself)
        ("portforward", ("get", "--raw", f"/api/v1/namespaces/{ns}/pods/idle/portforward?ports=1")),
    ):
        got = _eventually(lambda a=args: run(*a), SEALED, f"{verb} into the idle pod")
        assert f"may {verb} it now" in got, got
    # The claimed and the plain pod are not sealed: their exec gets past admission and fails
    # only for want of a node.
    for name in ("claimed", "plain"):
        got = run("exec", name, "--", "true")
        assert SEALED not in got and "Forbidden" not in got, got
    # A label change (e.g. taking the pool label off to slip out of the params) and an
    # ephemeral container: refused.
    with pytest.raises(ApiException) as refused:
        core_v1.patch_namespaced_pod("idle", ns, {"metadata": {"labels": {POOL: None}}})
    assert refused.value.status == 403 and SEALED in str(refused.value.body)
    debug = {
        "spec": {
            "ephemeralContainers": [
                {"name": "debug", "image": "busybox", "command": ["sh"], "stdin": True}
            ]
        }
    }
    with pytest.raises(ApiException) as refused:
        core_v1.patch_namespaced_pod_ephemeralcontainers("idle", ns, debug)
    assert refused.value.status == 403 and SEALED in str(refused.value.body)
    assert core_v1.read_namespaced_pod("idle", ns).metadata.labels == {POOL: "p"}
    # The claimed pod may be changed by anyone RBAC lets.
    core_v1.patch_namespaced_pod("claimed", ns, {"metadata": {"labels": {"x": "y"}}})
    # The operator's own identity claims the idle pod (its RBAC granted here for the test).
    rbac = client.RbacAuthorizationV1Api(core_v1.api_client)
    rbac.create_namespaced_role(
        ns,
        {
            "metadata": {"name": "claim"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "claim"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "claim"},
            "subjects": [
                {
                    "kind": "ServiceAccount",
                    "name": operator.rsplit(":", 1)[1],
                    "namespace": ns,
                }
            ],
        },
    )
    claim = json.dumps({"metadata": {"labels": {SANDBOX: "s2"}}})
    got = _eventually(
        lambda: run("--as", operator, "patch", "pod", "idle", "--type=merge", "-p", claim),
        "patched",
        "the operator's claim",
    )
    assert SEALED not in got
    # Claimed now: the administrator's exec gets past the seal.
    got = _eventually(lambda: run("exec", "idle", "--", "true"), "", "exec after the claim")
    assert SEALED not in run("exec", "idle", "--", "true")
