"""The Helm chart on a real cluster: the install lifecycle works the way a user runs it (that the
API server accepts what it renders is tests/integration/test_chart_dry_run.py).

* `helm install` with the chart's default floor (microvm) on a cluster without a microVM runtime
  -> operator pod Ready -> examples/ applied -> the Sandbox is refused with a condition that says
  why -> `helm upgrade` lowering the floor to hardened_container takes effect (the operator pods
  roll, the same Sandbox becomes Ready on gVisor, a command runs in it) -> an `egress:
  allowlist` Sandbox is served through the egress proxy the chart-installed operator runs in the
  namespace (its RBAC is the chart's: allowed.test answers, denied.test gets 403, the direct
  route is blocked) -> `helm uninstall` leaves no operator object behind (the CRDs stay, by
  design).

The operator reaches the API server through the `kubernetes` Service, as on any cluster (the
chart's `apiServer` override is not used).

The install watches only the test's namespace, so it never acts on other tests' sandboxes. The
operator image is built and imported into the local cluster's containerd by
operator/build-image.sh; against another cluster set OPERATOR_IMAGE to an image it can pull.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from sandbox_operator.egress.probe import (
    ProbeTarget,
    Via,
    expect_answered,
    expect_blocked,
    expect_proxy_refused,
    judge,
)
from tests.fixtures.chart import CHART, ROOT, helm_binary, local_values
from tests.fixtures.cluster import TEST_LABEL, fresh_namespace, kubectl_command
from tests.fixtures.egress_probe import DEADLINE, SLACK, Outside, probe_in_pod

# exclusive: installs a release with cluster-wide objects (run alone, after the concurrent part).
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.exclusive]

Kubectl = Callable[..., subprocess.CompletedProcess[str]]
EXAMPLES = ROOT / "examples"
GROUP = "sandbox-operator.dev"


def helm(
    kubeconfig: str, *args: str, check: bool = True, explain: Callable[[], str] | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [helm_binary(), "--kubeconfig", kubeconfig, *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if check and result.returncode != 0:
        context = explain() if explain else ""
        pytest.fail(
            f"helm {' '.join(args[:2])} failed:\n{result.stdout}\n{result.stderr}\n{context}"
        )
    return result


def explainer(kubectl: Kubectl, namespace: str) -> Callable[[], str]:
    """What the cluster says about the namespace: pods, node readiness, recent events."""

    def explain() -> str:
        parts = []
        for args in (
            ("get", "pods", "-n", namespace, "-o", "wide"),
            ("get", "nodes"),
            ("get", "events", "-n", namespace, "--sort-by=.lastTimestamp"),
        ):
            out = kubectl(*args, check=False)
            parts.append(f"$ kubectl {' '.join(args)}\n{(out.stdout + out.stderr)[-2500:]}")
        return "\n".join(parts)

    return explain


def _objects_of_release(kubectl: Kubectl, release: str, namespace: str) -> list[str]:
    selector = f"app.kubernetes.io/instance={release}"
    found: list[str] = []
    namespaced = "deployments,replicasets,pods,configmaps,serviceaccounts,roles,rolebindings"
    result = kubectl("get", namespaced, "-n", namespace, "-l", selector, "-o", "name", check=False)
    found += result.stdout.split()
    cluster = "clusterroles,clusterrolebindings,runtimeclasses,validatingadmissionpolicies"
    result = kubectl("get", cluster, "-l", selector, "-o", "name", check=False)
    found += result.stdout.split()
    result = kubectl("get", "kopfpeerings", "-n", namespace, "-o", "name", check=False)
    found += result.stdout.split()
    return found


def _condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    for cond in obj.get("status", {}).get("conditions", []):
        if cond.get("type") == ctype:
            return dict(cond)
    return {}


def _get(kubectl: Kubectl, namespace: str, kind: str, name: str) -> dict[str, Any]:
    out = kubectl("get", kind, name, "-n", namespace, "-o", "json").stdout
    return dict(json.loads(out))


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(2)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}", pytrace=False)


@pytest.fixture
def release(kubeconfig: str, namespace: str, kubectl: Kubectl) -> Iterator[str]:
    name = f"e2e-chart-{uuid.uuid4().hex[:6]}"
    yield name
    # Whatever happened, leave nothing behind: sandboxes first (while the operator may still
    # run their finalizers), then the release.
    kubectl(
        "delete",
        "sandboxes,sandboxscopes",
        "--all",
        "-n",
        namespace,
        "--wait=true",
        "--timeout=60s",
        check=False,
    )
    helm(kubeconfig, "uninstall", name, "-n", namespace, "--wait", check=False)


def _metrics_of(kubectl: Kubectl, namespace: str, selector: str) -> dict[Any, float]:
    """Scrape /metrics of the live operator pod (its pod IP is reachable from the node)."""
    from prometheus_client.parser import text_string_to_metric_families

    pods = json.loads(kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout)
    live = [
        p for p in pods["items"]
        if not p["metadata"].get("deletionTimestamp") and p["status"].get("podIP")
        and _condition(p, "Ready").get("status") == "True"
    ]  # fmt: skip
    if len(live) != 1:
        return {}
    port = next(
        c["containerPort"]
        for c in live[0]["spec"]["containers"][0]["ports"]
        if c.get("name") == "metrics"
    )
    url = f"http://{live[0]['status']['podIP']}:{port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    out: dict[Any, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _wait_metrics(
    kubectl: Kubectl, namespace: str, selector: str, ok: Callable[[dict[Any, float]], Any]
) -> dict[Any, float]:
    deadline = time.monotonic() + 60
    seen: dict[Any, float] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            seen = _metrics_of(kubectl, namespace, selector)
            if ok(seen):
                return seen
        time.sleep(1)
    names = sorted({k[0] for k in seen})
    raise AssertionError(f"the operator's /metrics never showed it; metric names: {names}")


def test_install_refuses_below_floor_upgrade_lowers_it_uninstall_is_clean(
    kubeconfig: str,
    kubectl: Kubectl,
    namespace: str,
    release: str,
    operator_image: tuple[str, str],
    tmp_path: Path,
    core_v1: client.CoreV1Api,
    outside: Outside,
) -> None:
    repo, tag = operator_image
    # The local configuration, but with the chart's default floor (microvm) and a Kata backend
    # declared microvm whose RuntimeClass this cluster does not have: what a plain install on a
    # cluster without a microVM runtime looks like.
    config = yaml.safe_load((EXAMPLES / "config-local.yaml").read_text())
    config["hostPolicy"]["minIsolation"] = "microvm"
    gvisor = next(b for b in config["backends"] if b["name"] == "gvisor")
    config["backends"].append(
        {**gvisor, "name": "kata", "runtimeClassName": "kata-absent", "isolation": "microvm"}
    )
    # Allowlist through the proxy the operator runs (config-local declares it): the proxy is the
    # image installed here, and it admits exactly the node address this test's server is on.
    config["egressProxy"].update(
        image=f"{repo}:{tag}",
        imagePullPolicy="Never",
        hostAliases=[{"ip": outside.address, "hostnames": ["allowed.test", "denied.test"]}],
        config={
            "allowedPorts": [outside.port],
            "admittedNetworks": [f"{outside.address}/32"],
        },
    )
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "config": config,
                "watchNamespaces": [namespace],
            }
        )
    )
    common = [
        "--namespace",
        namespace,
        "--set",
        f"image.repository={repo}",
        "--set",
        f"image.tag={tag}",
        "--wait",
        "--timeout",
        "5m",
    ]
    selector = f"app.kubernetes.io/instance={release}"

    # 1. install: the operator pod becomes Ready (its readiness probe is the health endpoint).
    explain = explainer(kubectl, namespace)
    helm(
        kubeconfig,
        "install",
        release,
        str(CHART),
        "-f",
        str(values),
        "--take-ownership",
        *common,
        explain=explain,
    )
    deployment = f"deployment/{release}-sandbox-operator"
    kubectl("rollout", "status", deployment, "-n", namespace, "--timeout=120s")
    pods = json.loads(kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout)[
        "items"
    ]
    assert pods and all(_condition(p, "Ready").get("status") == "True" for p in pods)
    first_pods = {p["metadata"]["name"] for p in pods}

    # 2. the examples: below the microvm floor the Sandbox is refused, saying why, and no pod
    #    is created for it.
    kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        str(EXAMPLES / "sandboxscope.yaml"),
        "-f",
        str(EXAMPLES / "sandbox.yaml"),
    )
    name = yaml.safe_load((EXAMPLES / "sandbox.yaml").read_text())["metadata"]["name"]

    def ready_condition() -> dict[str, Any]:
        return _condition(_get(kubectl, namespace, "sandboxes.sandbox-operator.dev", name), "Ready")

    # gVisor is below the microvm floor, so the spec's route is Kata (the first backend that
    # passes the checks), whose RuntimeClass this cluster lacks: the route never moves with
    # availability, so the Sandbox fails with Kata's BackendUnavailable.
    _wait(
        lambda: ready_condition().get("reason") == "BackendUnavailable",
        120,
        "the Sandbox to be refused: routed to Kata, which is unavailable",
    )
    message = ready_condition()["message"]
    assert ready_condition()["status"] == "False"
    assert "'kata'" in message and "unavailable" in message, message
    sandbox_pods = f"{GROUP}/sandbox={name}"
    assert kubectl("get", "pods", "-n", namespace, "-l", sandbox_pods, "-o", "name").stdout == ""
    # ... and the chart-installed operator's /metrics (the port the chart exposes) counted it.
    refused = _wait_metrics(
        kubectl,
        namespace,
        selector,
        lambda m: m.get(("sandbox_operator_admissions_total",
                         (("reason", "BackendUnavailable"), ("result", "refused")))),
    )  # fmt: skip
    assert any(
        name == "sandbox_operator_sandboxes" and ("reason", "BackendUnavailable") in labels
        and value >= 1
        for (name, labels), value in refused.items()
    ), refused  # fmt: skip

    # 3. helm upgrade lowering the floor to hardened_container takes effect: the operator pods
    #    roll onto the new configuration and the same Sandbox becomes Ready, on gVisor.
    helm(
        kubeconfig,
        "upgrade",
        release,
        str(CHART),
        "--reuse-values",
        "--set",
        "config.hostPolicy.minIsolation=hardened_container",
        *common,
        explain=explain,
    )
    kubectl("rollout", "status", deployment, "-n", namespace, "--timeout=120s")
    cm = _get(kubectl, namespace, "configmap", f"{release}-sandbox-operator-config")
    assert yaml.safe_load(cm["data"]["config.yaml"])["hostPolicy"]["minIsolation"] == (
        "hardened_container"
    )
    now = json.loads(kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout)
    # A finished rollout may still list the old pods while they terminate: count the live ones.
    live = [
        p["metadata"]["name"] for p in now["items"] if not p["metadata"].get("deletionTimestamp")
    ]
    assert live and first_pods.isdisjoint(live), f"pods did not roll: {live} vs {first_pods}"
    waited = kubectl(
        "wait",
        "--for=condition=Ready",
        f"sandboxes.sandbox-operator.dev/{name}",
        "-n",
        namespace,
        "--timeout=180s",
        check=False,
    )
    assert waited.returncode == 0, f"Sandbox not Ready after the upgrade: {ready_condition()}"
    (pod,) = json.loads(
        kubectl("get", "pods", "-n", namespace, "-l", sandbox_pods, "-o", "json").stdout
    )["items"]
    assert pod["spec"]["runtimeClassName"] == "gvisor"
    # The new operator pod's /metrics after Ready: the admission, the create->Ready latency,
    # the census, its reconciles and its API requests (ours and kopf's watches).
    ready = _wait_metrics(
        kubectl,
        namespace,
        selector,
        lambda m: m.get(("sandbox_operator_create_to_ready_seconds_count",
                         (("backend", "gvisor"),))),
    )  # fmt: skip
    assert ready[("sandbox_operator_admissions_total",
                  (("reason", "Admitted"), ("result", "admitted")))] >= 1  # fmt: skip
    assert ready[("sandbox_operator_sandboxes", (("backend", "gvisor"), ("reason", "Ready")))] >= 1
    assert any(
        k[0] == "sandbox_operator_reconcile_duration_seconds_count" and v >= 1
        for k, v in ready.items()
    )
    requests = {dict(k[1])["client"]: v for k, v in ready.items()
                if k[0] == "sandbox_operator_api_requests_total"}  # fmt: skip
    assert requests.get("operator") and requests.get("kopf"), requests
    out = kubectl(
        "exec",
        "-n",
        namespace,
        pod["metadata"]["name"],
        "--",
        "python3",
        "-c",
        "import os; print('uid', os.getuid())",
    ).stdout
    assert out.strip() == "uid 65532"

    # 3b. egress allowlist end to end with the chart's RBAC: the operator creates the proxy in
    #     this namespace, the sandbox reaches allowed.test through it and is refused denied.test.
    allow = {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": "egress"},
        "spec": {
            "scopeRef": yaml.safe_load((EXAMPLES / "sandboxscope.yaml").read_text())["metadata"][
                "name"
            ],
            "agentDir": "agents/egress",
            "kind": "python",
            "image": "sandbox-operator.dev/python:1",
            "requires": ["exec"],
            "egress": "allowlist",
            "egressAllow": ["allowed.test"],
        },
    }
    manifest = tmp_path / "allowlist-sandbox.yaml"
    manifest.write_text(yaml.safe_dump(allow))
    kubectl("apply", "-n", namespace, "-f", str(manifest))
    waited = kubectl(
        "wait", "--for=condition=Ready", "sandboxes.sandbox-operator.dev/egress",
        "-n", namespace, "--timeout=180s",
        check=False,
    )  # fmt: skip
    egress_obj = _get(kubectl, namespace, "sandboxes.sandbox-operator.dev", "egress")
    assert waited.returncode == 0, f"allowlist Sandbox not Ready: {egress_obj.get('status')}"
    (egress_pod,) = json.loads(
        kubectl(
            "get", "pods", "-n", namespace, "-l", f"{GROUP}/sandbox=egress", "-o", "json"
        ).stdout
    )["items"]
    targets = [
        ProbeTarget("allowed", "allowed.test", outside.port, via=Via.CONNECT),
        ProbeTarget("denied", "denied.test", outside.port, via=Via.CONNECT),
        ProbeTarget("direct", outside.address, outside.port),
    ]
    # Ready means the proxy serves it: the first attempt after Ready must already be decided.
    assert egress_obj["status"]["egress"]["admitted"], egress_obj["status"]
    results, _ = probe_in_pod(core_v1, namespace, egress_pod["metadata"]["name"], targets)
    r = {x.name: x for x in results}
    checks = [
        expect_answered(r["allowed"], body_contains=outside.token),
        expect_proxy_refused(r["denied"], status=403, reason="HostNotAllowed"),
        expect_blocked(r["direct"], within=DEADLINE + SLACK),
    ]
    assert all(c.ok for c in checks), judge(checks) + "\n" + explain()
    proxy = _get(kubectl, namespace, "deployment", "sandbox-egress-proxy")
    owners = {o["name"] for o in proxy["metadata"].get("ownerReferences") or []}
    assert owners == {"egress"}, owners

    # 4. delete the sandboxes while the operator runs, then uninstall: nothing of the operator
    #    is left; the CRDs stay (helm.sh/resource-policy: keep).
    kubectl(
        "delete",
        "sandboxes,sandboxscopes",
        "--all",
        "-n",
        namespace,
        "--wait=true",
        "--timeout=120s",
    )
    assert kubectl("get", "pods", "-n", namespace, "-l", sandbox_pods, "-o", "name").stdout == ""
    helm(kubeconfig, "uninstall", release, "-n", namespace, "--wait", "--timeout", "2m")
    _wait(
        lambda: not _objects_of_release(kubectl, release, namespace),
        120,
        "the release's objects to be gone",
    )
    for crd in (f"sandboxes.{GROUP}", f"sandboxscopes.{GROUP}"):
        kept = json.loads(kubectl("get", "crd", crd, "-o", "json").stdout)
        assert kept["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_switching_watch_namespaces_leaves_nothing_the_outgoing_pod_needs(
    kubeconfig: str,
    kubectl: Kubectl,
    namespace: str,
    release: str,
    operator_image: tuple[str, str],
    tmp_path: Path,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
) -> None:
    """A release serving named namespaces, with peering, `helm upgrade`d to serve another one:
    the outgoing pod stops without one forbidden request (its last peering write meets a deleted
    object, which kopf ignores, not a revoked Role, which it retries for its grace period); the
    new pod publishes into the namespace it now serves; and a Sandbox created where the release
    no longer serves is refused at admission at once, naming what it serves."""
    repo, tag = operator_image
    with contextlib.ExitStack() as stack:
        second = stack.enter_context(fresh_namespace(core_v1, "chart-second"))
        # Served by nothing: no served-by label (unlike the test suite's namespaces).
        unserved = f"t-chart-unserved-{uuid.uuid4().hex[:6]}"
        core_v1.create_namespace(
            client.V1Namespace(
                metadata=client.V1ObjectMeta(name=unserved, labels={TEST_LABEL: "true"})
            )
        )
        stack.callback(core_v1.delete_namespace, unserved, propagation_policy="Background")
        common = ["--namespace", namespace, "--set", f"image.repository={repo}", "--set",
                  f"image.tag={tag}", "--wait", "--timeout", "5m"]  # fmt: skip
        explain = explainer(kubectl, namespace)
        values = local_values(tmp_path, watchNamespaces=[namespace])
        helm(kubeconfig, "install", release, str(CHART), "-f", str(values), "--take-ownership",
             *common, explain=explain)  # fmt: skip
        selector = f"app.kubernetes.io/instance={release}"
        (old,) = json.loads(
            kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
        )["items"]
        old_pod = old["metadata"]["name"]
        # Follow the outgoing pod's log until its container ends.
        follow = subprocess.Popen(
            [*kubectl_command(kubeconfig), "logs", "-f", "-n", namespace, old_pod],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        stack.callback(follow.kill)
        helm(kubeconfig, "upgrade", release, str(CHART), "-f", str(values), "--set",
             f"watchNamespaces={{{second}}}", *common, explain=explain)  # fmt: skip
        _wait(
            lambda: not kubectl("get", "pod", old_pod, "-n", namespace, check=False).stdout,
            120,
            f"the outgoing pod {old_pod} to be gone",
        )
        log, _ = follow.communicate(timeout=60)
        forbidden = [line for line in log.splitlines() if "403" in line or "orbidden" in line]
        assert not forbidden, "\n".join(forbidden[-10:])
        assert "Couldn't remove self from the peering" not in log, log[-3000:]

        # The new pod publishes into the namespace it now serves.
        _wait(
            lambda: bool(
                kubectl(
                    "get", "configmap", "sandbox-operator-backends", "-n", second, check=False
                ).stdout
            ),
            60,
            f"the backends ConfigMap in {second}",
        )

        # Nothing serves `unserved`: a Sandbox there is refused at its create.
        sandbox = yaml.safe_load((EXAMPLES / "sandbox.yaml").read_text())
        with pytest.raises(ApiException) as refused:
            custom_objects.create_namespaced_custom_object(
                GROUP, "v1alpha1", unserved, "sandboxes", sandbox
            )
        body = str(refused.value.body)
        assert f"namespace {unserved} is not served by any sandbox-operator" in body, body
        if f"Release {release} " in body:
            assert f"serves the namespaces {second}" in body, body
        else:
            # Another release's policy (make up's) answered first: each refuses where it does not
            # serve; this release's says the same of the namespace it now serves.
            policy = client.AdmissionregistrationV1Api(
                core_v1.api_client
            ).read_validating_admission_policy(f"{release}-sandbox-operator-served-namespaces")
            (validation,) = policy.spec.validations
            assert f"serves the namespaces {second}" in validation.message_expression
        # The test suite's own namespaces carry the served-by label: not refused.
        created = custom_objects.create_namespaced_custom_object(
            GROUP, "v1alpha1", namespace, "sandboxes", {**sandbox, "spec": {**sandbox["spec"]}}
        )
        assert created["metadata"]["namespace"] == namespace
