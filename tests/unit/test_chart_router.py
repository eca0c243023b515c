"""The chart's optional ports router (docs/ports.md), rendered without a cluster: nothing by
default; with router.enabled the Deployment runs the router from the operator's image under the
operator's hardening, its configuration and the operator's router.baseUrl load in their models,
its metrics port exposed (and annotated for scraping), its RBAC is the reviews plus
list/watch/patch of Sandboxes, list/watch of pods and create of Events, and the NetworkPolicy
admits only the router's pods, only to the sandbox pods' declared-port names."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from sandbox_operator import labels as lbl
from sandbox_operator.backends.base import EnsureRequest, SandboxRef
from sandbox_operator.backends.egress_proxy_objects import proxy_labels
from sandbox_operator.backends.runtimeclass import build_pod
from sandbox_operator.config import OperatorConfig, RuntimeClassBackendConfig
from sandbox_operator.contract import IsolationScope, SandboxKey, SandboxSpec
from sandbox_operator.contract.ports import PORTS_MAX_ITEMS, port_slot_name
from sandbox_operator.router.config import RouterConfig
from tests.fixtures.chart import by_kind, template, template_error

ON = {"router.enabled": "true"}
NAME = "so-sandbox-operator-router"


def _named(objs: list[dict[str, Any]], kind: str, name: str) -> list[dict[str, Any]]:
    return [o for o in by_kind(objs, kind) if o["metadata"]["name"] == name]


def _operator_config(objs: list[dict[str, Any]]) -> OperatorConfig:
    (cm,) = _named(objs, "ConfigMap", "so-sandbox-operator-config")
    return OperatorConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or ():
        assert expr["operator"] == "Exists"
        if expr["key"] not in labels:
            return False
    return True


def test_nothing_of_the_router_is_rendered_by_default() -> None:
    objs = template()
    assert not [o for o in objs if "router" in o["metadata"]["name"]]
    assert _operator_config(objs).router is None


def test_the_deployment_runs_the_router_from_the_operator_image_hardened() -> None:
    objs = template({**ON, "watchNamespaces": "{agents}"})
    (deploy,) = _named(objs, "Deployment", NAME)
    (operator,) = _named(objs, "Deployment", "so-sandbox-operator")
    pod, op_pod = deploy["spec"]["template"]["spec"], operator["spec"]["template"]["spec"]
    (container,), (op_container,) = pod["containers"], op_pod["containers"]
    assert container["image"] == op_container["image"]
    assert container["command"][:3] == ["python3", "-m", "sandbox_operator.router"]
    assert container["securityContext"] == op_container["securityContext"]
    assert pod["securityContext"] == op_pod["securityContext"]
    assert pod["serviceAccountName"] == NAME
    # Its own selector: never the operator's pods.
    selector = deploy["spec"]["selector"]["matchLabels"]
    assert not _matches(
        {"matchLabels": selector}, operator["spec"]["template"]["metadata"]["labels"]
    )
    (service,) = _named(objs, "Service", NAME)
    assert service["spec"]["selector"] == selector
    (cm,) = _named(objs, "ConfigMap", NAME)
    config = RouterConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))
    assert config.namespaces == ("agents",)
    assert config.wake_timeout_seconds == 60
    assert container["ports"][0]["containerPort"] == config.listen_port


def test_the_router_serves_its_metrics_on_a_port_of_their_own() -> None:
    (deploy,) = _named(template(ON), "Deployment", NAME)
    pod = deploy["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    (cm,) = _named(template(ON), "ConfigMap", NAME)
    config = RouterConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))
    assert ports == {"http": config.listen_port, "metrics": config.metrics_port}
    assert config.metrics_port == 9090 != config.listen_port
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "9090"
    assert annotations["prometheus.io/scrape"] == "true"
    # Off: no port, no annotations, and the router told to serve none.
    (deploy,) = _named(template({**ON, "router.metricsPort": "0"}), "Deployment", NAME)
    pod = deploy["spec"]["template"]
    assert [p["name"] for p in pod["spec"]["containers"][0]["ports"]] == ["http"]
    assert "prometheus.io/scrape" not in pod["metadata"]["annotations"]
    (cm,) = _named(template({**ON, "router.metricsPort": "0"}), "ConfigMap", NAME)
    assert yaml.safe_load(cm["data"]["config.yaml"])["metricsPort"] == 0


def test_the_operator_is_told_the_routers_url() -> None:
    router = _operator_config(template(ON)).router
    assert router is not None
    assert router.base_url == "http://so-sandbox-operator-router.sandbox-operator-system.svc"
    custom = {**ON, "router.baseUrl": "https://sandboxes.example.com"}
    router = _operator_config(template(custom)).router
    assert router is not None and router.base_url == "https://sandboxes.example.com"
    assert "baseUrl" in template_error({**ON, "router.baseUrl": "sandboxes.example.com"})


def _grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


@pytest.mark.parametrize("named", [True, False], ids=["watchNamespaces", "all"])
def test_the_router_may_review_watch_and_patch_sandboxes_and_nothing_else(named: bool) -> None:
    objs = template({**ON, "watchNamespaces": "{agents,team}"} if named else ON)
    roles = [r for r in by_kind(objs, "ClusterRole") if r["metadata"]["name"].startswith(NAME)]
    grants = set().union(*(_grants(r) for r in roles))
    assert grants == {
        ("authentication.k8s.io", "tokenreviews", "create"),
        ("authorization.k8s.io", "subjectaccessreviews", "create"),
        ("sandbox-operator.dev", "sandboxes", "list"),
        ("sandbox-operator.dev", "sandboxes", "watch"),
        ("sandbox-operator.dev", "sandboxes", "patch"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "events", "create"),
    }
    bindings = [
        b
        for kind in ("RoleBinding", "ClusterRoleBinding")
        for b in by_kind(objs, kind)
        if b["roleRef"]["name"] == f"{NAME}-sandboxes"
    ]
    if named:
        assert sorted(b["metadata"]["namespace"] for b in bindings) == ["agents", "team"]
        assert {b["kind"] for b in bindings} == {"RoleBinding"}
    else:
        assert [b["kind"] for b in bindings] == ["ClusterRoleBinding"]


def _pod_labels(ports: list[dict[str, Any]]) -> tuple[dict[str, str], list[str]]:
    key = SandboxKey(scope="t", thread_id="1", agent_dir="a")
    request = EnsureRequest(
        sandbox=SandboxRef("agents", "sbx", "uid"),
        key=key,
        spec=SandboxSpec.model_validate({"kind": "k", "image": "i", "ports": ports}),
        isolation_scope=IsolationScope.CONVERSATION,
        labels=lbl.object_labels(key, "sbx", "runc", kind="k"),
        annotations={},
    )
    backend = RuntimeClassBackendConfig(
        type="runtimeClass", name="runc", runtime_class_name="runc", isolation="container"
    )
    pod = build_pod(request, backend)
    names = [p["name"] for p in pod["spec"]["containers"][0].get("ports", ())]
    return pod["metadata"]["labels"], names


def test_the_ingress_policy_admits_only_the_router_to_declared_port_names() -> None:
    objs = template({**ON, "watchNamespaces": "{agents}", "router.sandboxNamespaces": "{agents,b}"})
    policies = _named(objs, "NetworkPolicy", f"{NAME}-ingress")
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["agents", "b"]
    spec = policies[0]["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    # Selects sandbox pods, not the egress proxy's (which sandboxes must still reach).
    labels, names = _pod_labels([{"name": "web", "port": 8080}, {"name": "db", "port": 5432}])
    assert _matches(spec["podSelector"], labels)
    assert not _matches(spec["podSelector"], proxy_labels())
    (rule,) = spec["ingress"]
    (peer,) = rule["from"]
    (deploy,) = _named(objs, "Deployment", NAME)
    (operator,) = _named(objs, "Deployment", "so-sandbox-operator")
    assert _matches(peer["podSelector"], deploy["spec"]["template"]["metadata"]["labels"])
    assert not _matches(peer["podSelector"], operator["spec"]["template"]["metadata"]["labels"])
    assert peer["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "sandbox-operator-system"}
    }
    # Exactly the names the pod builder gives declared ports: every slot, and nothing else.
    admitted = [p["port"] for p in rule["ports"]]
    assert admitted == [port_slot_name(i) for i in range(PORTS_MAX_ITEMS)]
    assert set(names) <= set(admitted)
    assert {p["protocol"] for p in rule["ports"]} == {"TCP"}


@pytest.mark.parametrize("boundary", [False, True])
def test_the_agent_role_grants_connect_on_ports_only_without_the_boundary(boundary: bool) -> None:
    values = {
        "agentRole.create": "true",
        "agentRole.namespaces": "{agents}",
        "agentRole.conversationBoundary": str(boundary).lower(),
    }
    for enabled in (False, True):
        objs = template({**values, "router.enabled": str(enabled).lower()})
        role = next(r for r in by_kind(objs, "Role") if r["metadata"]["name"].endswith("-agent"))
        granted = ("sandbox-operator.dev", "sandboxes/ports", "connect") in _grants(role)
        assert granted == (enabled and not boundary)


def test_the_routers_pod_annotations_roll_it_as_make_up_sets_them() -> None:
    """hack/up.sh sets router.podAnnotations to the image's content key, so a rebuilt image
    under the same tag rolls the router's pods as it rolls the operator's."""
    key = "router.podAnnotations.sandbox-operator\\.dev/image-key"
    (deploy,) = _named(template({**ON, key: "abc123"}), "Deployment", NAME)
    annotations = deploy["spec"]["template"]["metadata"]["annotations"]
    assert annotations["sandbox-operator.dev/image-key"] == "abc123"
