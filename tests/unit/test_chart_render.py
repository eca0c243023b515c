"""The Helm chart lints clean, renders, and its values schema refuses bad floors and rungs.

No cluster: `helm lint` and `helm template` only. Helm itself is built from its Go module by
hack/build-binaries.sh and cached; these tests build it once if it is missing (about a minute).
The helpers shared with the other chart tests (unit and e2e) are in tests/fixtures/chart.py.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandbox_operator import labels as lbl
from tests.fixtures.chart import (
    CHART,
    KUBE_VERSION,
    by_kind,
    managed_proxy_values,
    one,
    run_helm,
    set_args,
    template,
    template_error,
)

RUNGS = ["none", "runtime", "os_process", "container", "hardened_container", "microvm", "vm"]
CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "ClusterKopfPeering",
    "RuntimeClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


@pytest.mark.parametrize("values", [{}, {"watchNamespaces": "{agents}"}], ids=["all", "named"])
def test_agent_reads_the_published_configmap_where_the_operator_writes_it(
    values: dict[str, str],
) -> None:
    """The operator publishes in every namespace it serves, serving all of them too: the agent
    Role of each agent namespace grants ``get`` on that one ConfigMap there, and no Role in the
    release's namespace grants agents anything."""
    objs = template(
        {
            **values,
            "agentRole.create": "true",
            "agentRole.namespaces": "{agents}",
            "agentRole.subjects[0].kind": "ServiceAccount",
            "agentRole.subjects[0].name": "agent",
            "agentRole.subjects[0].namespace": "agents",
        },
        namespace="so-system",
    )
    agent = next(r for r in by_kind(objs, "Role") if r["metadata"]["name"].endswith("-agent"))
    assert agent["metadata"]["namespace"] == "agents"
    assert [r for r in agent["rules"] if "configmaps" in r["resources"]] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["sandbox-operator-backends"],
            "verbs": ["get"],
        }
    ]
    assert not [
        r
        for r in by_kind(objs, "Role")
        if "agent" in r["metadata"]["name"] and r["metadata"]["namespace"] == "so-system"
    ]


def template_values_file(values: Path) -> Any:
    """Render with a values file that may be refused; return helm's completed process."""
    return run_helm(
        "template", "so", str(CHART), "--kube-version", KUBE_VERSION, "-f", str(values), check=False
    )


@pytest.fixture(scope="module")
def default_objs() -> Iterator[list[dict[str, Any]]]:
    yield template()


def test_helm_lint_is_clean() -> None:
    result = run_helm("lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


def test_default_render_has_the_operator_objects(default_objs: list[dict[str, Any]]) -> None:
    kinds = sorted(o["kind"] for o in default_objs)
    for kind in ("ServiceAccount", "ConfigMap", "ClusterRole", "ClusterRoleBinding", "Deployment"):
        assert kind in kinds
    # Nothing optional by default: no RuntimeClass, no agent objects; the one policy pair is the
    # idle pool pods' seal (sealIdlePoolPods, on by default).
    assert "RuntimeClass" not in kinds
    assert sorted(
        p["metadata"]["name"] for p in by_kind(default_objs, "ValidatingAdmissionPolicy")
    ) == [
        "so-sandbox-operator-sealed-pool-pods",
        "so-sandbox-operator-sealed-pool-pods-update",
    ]
    for obj in default_objs:
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"]["namespace"] == "sandbox-operator-system", obj["metadata"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == "so"


def test_deployment_is_hardened_and_probed(default_objs: list[dict[str, Any]]) -> None:
    dep = one(default_objs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["enableServiceLinks"] is False
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc.get("privileged") is not True
    assert container["args"][0] == "run"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == "health"
        assert container[probe]["httpGet"]["path"].startswith("/")
    assert ports["health"] == 8080
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert container["image"] == "sandbox-operator.dev/operator:0.1.0"
    assert container["imagePullPolicy"] == "IfNotPresent"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/etc/sandbox-operator"]["readOnly"] is True


def test_replicas_and_image_tag_come_from_values() -> None:
    objs = template({"replicaCount": "3", "image.tag": "dev-abc"})
    dep = one(objs, "Deployment")
    assert dep["spec"]["replicas"] == 3
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":dev-abc")
    # Rolling one pod at a time with a surge never leaves zero operators running.
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_configmap_holds_the_values_config(default_objs: list[dict[str, Any]]) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    cm = one(default_objs, "ConfigMap")
    assert yaml.safe_load(cm["data"]["config.yaml"]) == values["config"]
    # The chart's default floor stays microvm.
    assert values["config"]["hostPolicy"]["minIsolation"] == "microvm"


def test_a_changed_floor_rolls_the_operator_pods(default_objs: list[dict[str, Any]]) -> None:
    lowered = template({"config.hostPolicy.minIsolation": "hardened_container"})
    cm = one(lowered, "ConfigMap")
    assert yaml.safe_load(cm["data"]["config.yaml"])["hostPolicy"]["minIsolation"] == (
        "hardened_container"
    )

    def checksum(objs: list[dict[str, Any]]) -> str:
        ann = one(objs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
        return str(ann["checksum/config"])

    assert checksum(lowered) != checksum(default_objs)


@pytest.mark.parametrize("rung", [r for r in RUNGS if r != "vm"])
def test_every_rung_the_default_backends_reach_is_accepted_as_floor(rung: str) -> None:
    template({"config.hostPolicy.minIsolation": rung})


def _floor_values(tmp_path: Path, floor: str, backends: list[dict[str, Any]]) -> Path:
    values = tmp_path / "v.yaml"
    values.write_text(
        yaml.safe_dump({"config": {"hostPolicy": {"minIsolation": floor}, "backends": backends}})
    )
    return values


GVISOR = {
    "name": "gvisor",
    "type": "runtimeClass",
    "runtimeClassName": "gvisor",
    "isolation": "hardened_container",
}


@pytest.mark.parametrize(
    ("floor", "backends", "accepted"),
    [
        ("vm", [GVISOR], False),
        ("microvm", [GVISOR], False),
        ("hardened_container", [GVISOR], True),
        ("microvm", [GVISOR, {"name": "aca", "type": "acas"}], True),  # a remote microVM
        ("vm", [GVISOR, {"name": "aca", "type": "acas"}], False),
        ("vm", [{**GVISOR, "name": "big", "runtimeClassName": "big", "isolation": "vm"}], True),
    ],
)
def test_a_floor_no_backend_reaches_is_refused_at_helm_time(
    tmp_path: Path, floor: str, backends: list[dict[str, Any]], accepted: bool
) -> None:
    """#28 item 6: the operator refuses to start when no backend clears the floor, so a
    `helm upgrade` with such values crash-looped the new pod while the old one kept serving the
    old floor. The chart's schema refuses them before anything reaches the cluster."""
    result = template_values_file(_floor_values(tmp_path, floor, backends))
    assert (result.returncode == 0) == accepted, result.stderr
    if not accepted:
        assert "config.backends: At least one of the items must match" in result.stderr


@pytest.mark.parametrize("bad", ["microVM", "gvisor", "kata", "strongest", ""])
def test_schema_rejects_a_bad_floor(bad: str) -> None:
    err = template_error({"config.hostPolicy.minIsolation": bad})
    assert "config.hostPolicy.minIsolation" in err


def test_schema_rejects_an_unknown_rung_on_a_backend(tmp_path: Path) -> None:
    values = tmp_path / "v.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "config": {
                    "hostPolicy": {"minIsolation": "microvm"},
                    "backends": [
                        {
                            "name": "fc",
                            "type": "runtimeClass",
                            "runtimeClassName": "firecracker",
                            "isolation": "firecracker",
                        }
                    ],
                }
            }
        )
    )
    result = run_helm(
        "template", "so", str(CHART), "--kube-version", KUBE_VERSION, "-f", str(values), check=False
    )
    assert result.returncode != 0
    assert "config.backends.0.isolation" in result.stderr


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("config.hostPolicy.selection", "roundRobin"),
        ("config.hostPolicy.minIsolationScope", "thread"),
        ("config.hostPolicy.floor", "microvm"),  # a typo of a key is refused, not ignored
        ("replicaCount", "-1"),
        ("image.pullPolicy", "Sometimes"),
    ],
)
def test_schema_rejects_other_bad_values(key: str, value: str) -> None:
    template_error({key: value})


def test_the_default_selection_is_the_contracts_fixed_on_the_floors_backend() -> None:
    """Routing is opt-in (#25 item 5): the chart's default is selection fixed with no pin, which
    is the first backend listed, and that is the one meeting the default microvm floor."""
    objs = template({})
    (cm,) = [o for o in by_kind(objs, "ConfigMap") if "config.yaml" in o.get("data", {})]
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert config["hostPolicy"]["selection"] == "fixed"
    assert config["hostPolicy"].get("pinnedBackend") is None
    assert config["hostPolicy"]["minIsolation"] == "microvm"
    assert [config["backends"][0][k] for k in ("name", "isolation")] == ["kata", "microvm"]
    template({"config.hostPolicy.selection": "fixed", "config.hostPolicy.pinnedBackend": "gvisor"})
    template({"config.hostPolicy.selection": "perSpec"})


def test_watch_namespaces_gives_roles_not_a_cluster_wide_grant() -> None:
    objs = template({"watchNamespaces": "{team-a,team-b}"})
    roles = by_kind(objs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert len(by_kind(objs, "RoleBinding")) == 2
    # Only the cluster-scoped reads stay in a ClusterRole.
    (cluster_role,) = by_kind(objs, "ClusterRole")
    for rule in cluster_role["rules"]:
        assert "pods" not in rule["resources"]
        assert "sandboxes" not in rule["resources"]
    args = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    assert "--all-namespaces" not in args


def test_runtime_classes_are_optional() -> None:
    objs = template({"runtimeClasses.create": "true"})
    handlers = {rc["metadata"]["name"]: rc["handler"] for rc in by_kind(objs, "RuntimeClass")}
    assert handlers == {"gvisor": "runsc", "kata": "kata"}


def test_agent_role_grants_sandboxes_and_exec_only() -> None:
    objs = template(
        {
            "agentRole.create": "true",
            "agentRole.namespaces": "{agents}",
            "watchNamespaces": "{agents}",
            "agentRole.subjects[0].kind": "ServiceAccount",
            "agentRole.subjects[0].name": "agent",
            "agentRole.subjects[0].namespace": "agents",
        }
    )
    role = next(r for r in by_kind(objs, "Role") if r["metadata"]["name"].endswith("-agent"))
    assert role["metadata"]["namespace"] == "agents"
    grants = {
        (g, res, v)
        for r in role["rules"]
        for g in r["apiGroups"]
        for res in r["resources"]
        for v in r["verbs"]
    }
    sandbox_verbs = {v for g, res, v in grants if res == "sandboxes"}
    # patch: the client acquires by server-side apply and stamps last-activity (the metadata
    # policy and the CRD's rules keep what it may change); never update or everything.
    assert {"create", "get", "watch", "patch", "delete"} <= sandbox_verbs
    assert not {"update", "*"} & sandbox_verbs
    assert ("", "pods/exec", "create") in grants
    # Nothing that creates pods or touches other kinds of object.
    assert not {v for g, res, v in grants if res == "pods"} - {"get"}
    assert all(
        res in {"sandboxes", "sandboxscopes", "pods", "pods/exec", "configmaps"}
        for _, res, _ in grants
    )
    # The one ConfigMap it may read: the backends the operator publishes (by name, get only).
    named = [r for r in role["rules"] if "resourceNames" in r]
    assert named == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["sandbox-operator-backends"],
            "verbs": ["get"],
        }
    ]
    assert all("resourceNames" in r for r in role["rules"] if "configmaps" in r["resources"])
    binding = next(
        b for b in by_kind(objs, "RoleBinding") if b["roleRef"]["name"].endswith("-agent")
    )
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "agent", "namespace": "agents"}
    ]
    # The agents' policies (serving named namespaces adds the served-namespaces one: below).
    policies = {
        p["metadata"]["name"]: p
        for p in by_kind(objs, "ValidatingAdmissionPolicy")
        if "-agent-" in p["metadata"]["name"]
    }
    bindings = {
        b["spec"]["policyName"]: b
        for b in by_kind(objs, "ValidatingAdmissionPolicyBinding")
        if "-agent-" in b["spec"]["policyName"]
    }
    assert set(policies) == set(bindings)
    exec_policy = "so-sandbox-operator-agent-exec"
    idle_policy = f"{exec_policy}-idle"
    assert set(policies) == {exec_policy, idle_policy}
    for policy in policies.values():
        assert (
            "system:serviceaccount:agents:agent"
            in policy["spec"]["matchConditions"][0]["expression"]
        )
        rules = policy["spec"]["matchConstraints"]["resourceRules"]
        assert rules[0]["operations"] == ["CONNECT"]
        assert rules[0]["resources"] == ["pods/exec", "pods/attach"]
    prefix = policies[exec_policy]
    assert 'startsWith("sbx-")' in prefix["spec"]["validations"][0]["expression"]
    # Idle pool pods: the params are the pods of the request's namespace with the pool label and
    # no sandbox label (a claim adds it); an exec naming one is refused, none is an allow.
    idle = policies[idle_policy]
    assert idle["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "Pod"}
    assert idle["spec"]["validations"][0]["expression"] == "params.metadata.name != request.name"
    ref = bindings[idle_policy]["spec"]["paramRef"]
    assert "namespace" not in ref and ref["parameterNotFoundAction"] == "Allow"
    assert ref["selector"]["matchExpressions"] == [
        {"key": lbl.POOL_LABEL, "operator": "Exists"},
        {"key": lbl.SANDBOX_LABEL, "operator": "DoesNotExist"},
    ]


def render_notes(values: dict[str, str] | None = None, tmp: Path | None = None) -> str:
    """NOTES.txt as `helm install` prints it, rendered without a cluster.

    `helm template` skips NOTES.txt, and `helm install --dry-run` wants an API server, so a copy
    of the chart gets one more template that includes NOTES.txt by its template name.
    """
    assert tmp is not None
    chart = tmp / "sandbox-operator"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "zz-notes.yaml").write_text(
        'notes: {{ include "sandbox-operator/templates/NOTES.txt" . | toJson }}\n'
    )
    out = run_helm(
        "template",
        "so",
        str(chart),
        "--kube-version",
        KUBE_VERSION,
        "--namespace",
        "ns",
        "--show-only",
        "templates/zz-notes.yaml",
        *set_args(values),
    ).stdout
    return str(yaml.safe_load(out)["notes"])


def test_notes_say_how_to_check_and_what_a_microvm_floor_needs(tmp_path: Path) -> None:
    notes = render_notes(tmp=tmp_path / "a")
    assert "kubectl wait --for=condition=Ready" in notes
    assert "kubectl get sbx -o wide" in notes
    assert "Host isolation floor: microvm" in notes
    assert "minIsolation=hardened_container" in notes  # how to lower it knowingly
    assert "pinnedBackend=gvisor" in notes  # and route to it under the default fixed selection
    assert "RuntimeClass named kata" in notes  # how to declare a microVM runtime class
    lowered = render_notes({"config.hostPolicy.minIsolation": "hardened_container"}, tmp_path / "b")
    assert "Host isolation floor: hardened_container" in lowered
    assert "RuntimeClass named kata" not in lowered


@pytest.mark.parametrize(
    "values",
    [
        {},
        {
            "config.hostPolicy.minIsolation": "hardened_container",
            "config.hostPolicy.pinnedBackend": "gvisor",
        },
    ],
    ids=["default", "lowered-floor"],
)
def test_rendered_config_is_accepted_by_the_operator(values: dict[str, str]) -> None:
    from sandbox_operator.config import parse_config

    cm = one(template(values), "ConfigMap")
    config, _warnings = parse_config(yaml.safe_load(cm["data"]["config.yaml"]))
    assert config.backend_names == ("kata", "gvisor")
    assert str(config.host_policy.min_isolation) == values.get(
        "config.hostPolicy.minIsolation", "microvm"
    )


def test_replicas_need_peering_and_peering_matches_the_watch_scope() -> None:
    objs = template({"replicaCount": "3"})
    (peering,) = by_kind(objs, "ClusterKopfPeering")
    args = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--peering={peering['metadata']['name']}" in args
    env = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    # Each replica derives its own peering priority from its pod name.
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in env
    namespaced = template({"watchNamespaces": "{a,b}"})
    assert sorted(p["metadata"]["namespace"] for p in by_kind(namespaced, "KopfPeering")) == [
        "a",
        "b",
    ]
    assert not by_kind(namespaced, "ClusterKopfPeering")
    err = template_error({"replicaCount": "2", "peering.enabled": "false"})
    assert "needs peering.enabled=true" in err
    single = template({"peering.enabled": "false"})
    assert (
        "--standalone"
        in one(single, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    assert "kopf.dev" in (CHART / "crds" / "kopf-peering.yaml").read_text()


def test_api_server_address_can_be_overridden() -> None:
    def env(objs: list[dict[str, Any]]) -> dict[str, Any]:
        container = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value") for e in container["env"]}

    assert "KUBERNETES_SERVICE_HOST" not in env(template())
    got = env(template({"apiServer.host": "192.0.2.10", "apiServer.port": "6443"}))
    assert got["KUBERNETES_SERVICE_HOST"] == "192.0.2.10"
    assert got["KUBERNETES_SERVICE_PORT"] == "6443"


def test_schema_knows_every_runtime_class_backend_key() -> None:
    """`pod` and `egressProxy` are described key by key, exactly as the operator reads them."""
    import json

    from sandbox_operator.config import (
        EgressProxySettings,
        ManagedEgressProxySettings,
        PodSettings,
        RuntimeClassBackendConfig,
    )

    schema = json.loads((CHART / "values.schema.json").read_text())
    defs = schema["definitions"]

    def aliases(model: Any) -> set[str]:
        return {f.alias or name for name, f in model.model_fields.items()}

    assert set(defs["podSettings"]["properties"]) == aliases(PodSettings)
    assert set(defs["egressProxy"]["properties"]) == aliases(EgressProxySettings)
    assert set(defs["managedEgressProxy"]["properties"]) == aliases(ManagedEgressProxySettings)
    assert aliases(RuntimeClassBackendConfig) <= set(defs["backend"]["properties"])


RUNTIME_CLASS_BACKEND = {
    "name": "gvisor",
    "type": "runtimeClass",
    "runtimeClassName": "gvisor",
    "isolation": "hardened_container",
    "declarations": {"egressModes": ["closed", "allowlist"]},
    "pod": {"runAsUser": 1000, "runAsGroup": 1000, "imagePullPolicy": "Never"},
    "egressProxy": {
        "url": "http://egress-proxy.sandbox-operator-system:3128",
        "port": 3128,
        "podSelector": {"app.kubernetes.io/name": "egress-proxy"},
        "namespaceSelector": {"kubernetes.io/metadata.name": "sandbox-operator-system"},
    },
}


def _backend_values(tmp_path: Path, backend: dict[str, Any]) -> Path:
    values = tmp_path / "v.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "config": {
                    "hostPolicy": {
                        "minIsolation": "hardened_container",
                        "selection": "fixed",
                        "pinnedBackend": "gvisor",
                    },
                    "backends": [backend],
                }
            }
        )
    )
    return values


def test_schema_accepts_pod_and_egress_proxy_and_the_operator_reads_them(tmp_path: Path) -> None:
    from sandbox_operator.config import RuntimeClassBackendConfig, parse_config

    cm = one(template(values_files=[_backend_values(tmp_path, RUNTIME_CLASS_BACKEND)]), "ConfigMap")
    config, _ = parse_config(yaml.safe_load(cm["data"]["config.yaml"]))
    backend = config.backends[0]
    assert isinstance(backend, RuntimeClassBackendConfig)
    assert backend.pod.run_as_user == 1000
    assert backend.egress_proxy is not None and backend.egress_proxy.port == 3128


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"pod": {"runAsUsr": 1000}}, "runAsUsr"),
        ({"egressProxy": {"port": 3128}}, "url"),
        ({"egressProxy": {"url": "http://p:3128", "port": 0}}, "port"),
        ({"egressProxy": {"managed": True, "url": "http://p:3128"}}, "url"),
    ],
    ids=["pod-typo", "proxy-without-url", "proxy-bad-port", "managed-with-url"],
)
def test_schema_rejects_bad_pod_and_egress_proxy(
    tmp_path: Path, change: dict[str, Any], where: str
) -> None:
    backend = {**RUNTIME_CLASS_BACKEND, **change}
    result = template_values_file(_backend_values(tmp_path, backend))
    assert result.returncode != 0
    assert where in result.stderr


MANAGED_BACKEND = {
    **RUNTIME_CLASS_BACKEND,
    "egressProxy": {"managed": True},
}


def _managed_values(tmp_path: Path, proxy: dict[str, Any] | None) -> Path:
    path = _backend_values(tmp_path, MANAGED_BACKEND)
    values = yaml.safe_load(path.read_text())
    values["config"]["egressProxy"] = proxy
    path.write_text(yaml.safe_dump(values))
    return path


def test_managed_egress_proxy_runs_the_charts_operator_image_by_default(tmp_path: Path) -> None:
    """`config.egressProxy: {}` is enough: the proxy runs the operator's own image (which holds
    the proxy) with the chart's pull policy; the operator accepts the rendered file."""
    from sandbox_operator.config import parse_config

    objs = template(
        {"image.tag": "dev-abc", "image.pullPolicy": "Never"},
        values_files=[_managed_values(tmp_path, {})],
    )
    config, _ = parse_config(yaml.safe_load(one(objs, "ConfigMap")["data"]["config.yaml"]))
    assert config.egress_proxy is not None
    assert config.egress_proxy.image == "sandbox-operator.dev/operator:dev-abc"
    assert config.egress_proxy.image_pull_policy == "Never"
    assert config.backends[0].egress_proxy.managed

    own = {"image": "registry.example/proxy:1", "imagePullPolicy": "Always", "port": 8888,
           "runtimeClassName": "gvisor", "config": {"allowedPorts": [443]},
           "hostAliases": [{"ip": "192.0.2.2", "hostnames": ["a.test"]}]}  # fmt: skip
    objs = template(values_files=[_managed_values(tmp_path, own)])
    config, _ = parse_config(yaml.safe_load(one(objs, "ConfigMap")["data"]["config.yaml"]))
    assert config.egress_proxy is not None
    assert (config.egress_proxy.image, config.egress_proxy.port) == (own["image"], 8888)
    assert config.egress_proxy.proxy_config().allowed_ports == (443,)


def test_managed_backend_without_the_proxy_section_is_refused_by_the_operator(
    tmp_path: Path,
) -> None:
    from sandbox_operator.config import parse_config
    from sandbox_operator.contract import ConfigurationError

    objs = template(values_files=[_managed_values(tmp_path, None)])
    with pytest.raises(ConfigurationError) as err:
        parse_config(yaml.safe_load(one(objs, "ConfigMap")["data"]["config.yaml"]))
    assert err.value.entry == "backends[0].egressProxy.managed"


@pytest.mark.parametrize(
    ("proxy", "where"),
    [
        ({"port": 0}, "port"),
        ({"hostAliases": [{"ip": "192.0.2.2"}]}, "hostnames"),
        ({"imagePullPolicy": "Sometimes"}, "imagePullPolicy"),
        ({"runtimeClassName": "Not_A_Label"}, "runtimeClassName"),
        ({"replicas": 2}, "replicas"),
    ],
    ids=["port", "alias-without-names", "pull-policy", "runtime-class", "unknown-key"],
)
def test_schema_rejects_a_bad_managed_egress_proxy(
    tmp_path: Path, proxy: dict[str, Any], where: str
) -> None:
    result = run_helm(
        "template", "so", str(CHART), "--kube-version", KUBE_VERSION,
        "-f", str(_managed_values(tmp_path, proxy)), check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert where in result.stderr


def test_schema_accepts_host_resource_defaults_and_the_operator_reads_them(tmp_path: Path) -> None:
    """`hostPolicy.resources` is described key by key, exactly as the operator reads it."""
    import json

    from sandbox_operator.config import parse_config
    from sandbox_operator.contract import HostPolicy, ResourcePolicy

    schema = json.loads((CHART / "values.schema.json").read_text())
    host_schema = schema["properties"]["config"]["properties"]["hostPolicy"]
    assert set(host_schema["properties"]) == {
        f.alias or n for n, f in HostPolicy.model_fields.items()
    }
    assert set(host_schema["properties"]["resources"]["properties"]) == {
        f.alias or n for n, f in ResourcePolicy.model_fields.items()
    }
    resources = {
        "defaultRequests": {"cpu": "20m", "memory": "48Mi"},
        "defaultLimits": {"cpu": 1, "memory": "1Gi"},
        "maxLimits": {"cpu": "2", "memory": "4Gi"},
    }
    values = _backend_values(tmp_path, RUNTIME_CLASS_BACKEND)
    doc = yaml.safe_load(values.read_text())
    doc["config"]["hostPolicy"]["resources"] = resources
    values.write_text(yaml.safe_dump(doc))
    cm = one(template(values_files=[values]), "ConfigMap")
    config, _ = parse_config(yaml.safe_load(cm["data"]["config.yaml"]))
    assert config.host_policy.resources.default_limits.memory == "1Gi"
    assert config.host_policy.resources.max_limits.cpu == "2"
    doc["config"]["hostPolicy"]["resources"] = {"maxLimits": {"cpu": "lots"}}
    values.write_text(yaml.safe_dump(doc))
    result = run_helm(
        "template", "so", str(CHART), "--kube-version", KUBE_VERSION, "-f", str(values),
        check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "maxLimits" in result.stderr


def test_the_conversation_boundary_binds_agents_to_the_scopes_that_list_them() -> None:
    """(#25 item 2) With agentRole.conversationBoundary the agent Role grants no reads (each
    bound scope's own Role does, by name) and two policies ask the authorizer for `use` on the
    SandboxScope a Sandbox or a sandbox pod names; off, neither policy is rendered."""
    values = {
        "agentRole.create": "true",
        "agentRole.namespaces": "{agents}",
        "agentRole.subjects[0].kind": "ServiceAccount",
        "agentRole.subjects[0].name": "agent",
        "agentRole.subjects[0].namespace": "agents",
    }
    off = template(values)
    assert not [p for p in by_kind(off, "ValidatingAdmissionPolicy") if "conversation" in
                p["metadata"]["name"]]  # fmt: skip
    objs = template({**values, "agentRole.conversationBoundary": "true"})
    role = next(r for r in by_kind(objs, "Role") if r["metadata"]["name"].endswith("-agent"))
    reads = {"get", "list", "watch"}
    assert all(not reads & set(rule["verbs"]) for rule in role["rules"]
               if rule["resources"] not in (["configmaps"], ["pods/exec"]))  # fmt: skip
    policies = {p["metadata"]["name"]: p for p in by_kind(objs, "ValidatingAdmissionPolicy")}
    sandboxes = policies["so-sandbox-operator-conversation"]["spec"]
    assert sandboxes["matchConstraints"]["resourceRules"][0]["operations"] == [
        "CREATE", "UPDATE", "DELETE",
    ]  # fmt: skip
    agent = "system:serviceaccount:agents:agent"
    for spec in (sandboxes, policies["so-sandbox-operator-conversation-exec"]["spec"]):
        assert agent in spec["matchConditions"][0]["expression"]
        assert 'check("use")' in spec["validations"][0]["expression"]
    exec_binding = next(
        b for b in by_kind(objs, "ValidatingAdmissionPolicyBinding")
        if b["spec"]["policyName"] == "so-sandbox-operator-conversation-exec"
    )  # fmt: skip
    assert exec_binding["spec"]["paramRef"]["selector"]["matchExpressions"] == [
        {"key": "sandbox-operator.dev/sandbox", "operator": "Exists"}
    ]


@pytest.mark.parametrize(
    ("values", "expression", "served_words"),
    [
        ({"watchNamespaces": "{team-a,team-b}"}, 'request.namespace in ["team-a","team-b"]',
         "the namespaces team-a, team-b"),
        ({"ignoreNamespaces": "{t-*,scratch?}", "peering.enabled": "false"},
         "!(request.namespace.matches('^t-.*$') || request.namespace.matches('^scratch.$'))",
         "every namespace except those matching t-*, scratch?"),
    ],
    ids=["named", "ignored"],
)  # fmt: skip
def test_unserved_namespaces_are_refused_at_admission(
    values: dict[str, str], expression: str, served_words: str
) -> None:
    """Serving named namespaces, or all but some: one policy refuses a create of any of the
    three kinds outside them, naming what the release serves; a namespace another operator
    serves (labelled served-by) is exempt; changes and deletes are never refused."""
    objs = template(values, namespace="so-system")
    policy = one(
        [
            p
            for p in by_kind(objs, "ValidatingAdmissionPolicy")
            if "served" in p["metadata"]["name"]
        ],
        "ValidatingAdmissionPolicy",
    )
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [
        {
            "apiGroups": ["sandbox-operator.dev"],
            "apiVersions": ["*"],
            "operations": ["CREATE"],
            "resources": ["sandboxes", "sandboxscopes", "sandboxwarmpools"],
        }
    ]
    (validation,) = policy["spec"]["validations"]
    assert validation["expression"] == expression
    assert served_words in validation["messageExpression"]
    assert "Release so (in so-system)" in validation["messageExpression"]
    binding = one(
        [b for b in by_kind(objs, "ValidatingAdmissionPolicyBinding")
         if b["spec"]["policyName"] == policy["metadata"]["name"]],
        "ValidatingAdmissionPolicyBinding",
    )  # fmt: skip
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"] == [
        {"key": "sandbox-operator.dev/served-by", "operator": "DoesNotExist"}
    ]


def test_serving_every_namespace_refuses_none() -> None:
    for values in ({}, {"watchNamespaces": "{a}", "refuseUnservedNamespaces": "false"}):
        objs = template(values)
        assert not [
            p
            for p in by_kind(objs, "ValidatingAdmissionPolicy")
            if "served" in p["metadata"]["name"]
        ]


def test_ignored_namespaces_are_one_kopf_pattern_and_need_standalone() -> None:
    objs = template({"ignoreNamespaces": "{t-*,scratch}", "peering.enabled": "false"})
    args = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=!t-*,!scratch" in args and "--all-namespaces" not in args
    assert "--standalone" in args
    assert "peering.enabled=false" in template_error({"ignoreNamespaces": "{t-*}"})


HOST_VALUES = {
    "hostRole.create": "true",
    "hostRole.namespaces": "{hosts,more}",
    "hostRole.subjects[0].kind": "ServiceAccount",
    "hostRole.subjects[0].name": "maf-host",
    "hostRole.subjects[0].namespace": "hosts",
}


def test_the_maf_host_role_grants_scopes_sandboxes_exec_and_the_published_backends() -> None:
    """(#37 item 3) hostRole: in each listed namespace a Role and RoleBinding granting what the
    maf backend calls (create, read, patch and delete SandboxScopes and Sandboxes, exec, the
    published ConfigMap by name) and nothing else; two exec policies for its subjects only."""
    assert not [o for o in template() if o["metadata"].get("labels", {}).get(
        "app.kubernetes.io/component") == "host"]  # fmt: skip
    objs = template(HOST_VALUES)
    roles = [r for r in by_kind(objs, "Role") if r["metadata"]["name"].endswith("-host")]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["hosts", "more"]
    crud = {"create", "get", "list", "watch", "patch", "delete"}
    wanted = {
        ("sandbox-operator.dev", res, v) for res in ("sandboxscopes", "sandboxes") for v in crud
    } | {("", "pods/exec", "create"), ("", "pods/exec", "get")}
    for role in roles:
        unnamed = {
            (g, res, v) for r in role["rules"] if "resourceNames" not in r
            for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]
        }  # fmt: skip
        assert unnamed == wanted  # no secrets, pods, logs, status, RBAC or `use`
        assert [r for r in role["rules"] if "resourceNames" in r] == [
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": ["sandbox-operator-backends"],
                "verbs": ["get"],
            }
        ]
    bindings = [b for b in by_kind(objs, "RoleBinding") if b["roleRef"]["name"].endswith("-host")]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["hosts", "more"]
    assert all(b["subjects"] == [{"kind": "ServiceAccount", "name": "maf-host",
                                  "namespace": "hosts"}] for b in bindings)  # fmt: skip
    objs = [o for o in objs if "warm-pools" not in o["metadata"]["labels"].values()]  # the seal
    policies = {p["metadata"]["name"]: p for p in by_kind(objs, "ValidatingAdmissionPolicy")}
    assert set(policies) == {"so-sandbox-operator-host-exec", "so-sandbox-operator-host-exec-idle"}
    for policy in policies.values():
        match = policy["spec"]["matchConditions"][0]["expression"]
        assert '["system:serviceaccount:hosts:maf-host"]' in match
    prefix = policies["so-sandbox-operator-host-exec"]["spec"]["validations"][0]
    assert prefix["expression"] == 'request.name.startsWith("sbx-")'
    idle = policies["so-sandbox-operator-host-exec-idle"]["spec"]["validations"][0]
    assert idle["expression"] == "params.metadata.name != request.name"
    for binding in by_kind(objs, "ValidatingAdmissionPolicyBinding"):
        where = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
        assert where[0]["values"] == ["hosts", "more"]
    unrestricted = template(
        {**HOST_VALUES, "hostRole.restrictExec": "false", "sealIdlePoolPods": "false"}
    )
    assert not by_kind(unrestricted, "ValidatingAdmissionPolicy")


def test_the_host_and_the_agents_each_have_their_own_policies() -> None:
    """With both roles and the conversation boundary, the agents' policies match the agents only
    and the host's the host only: the host serves every conversation of its namespaces."""
    agents = {
        "agentRole.create": "true",
        "agentRole.namespaces": "{hosts}",
        "agentRole.subjects[0].kind": "ServiceAccount",
        "agentRole.subjects[0].name": "agent",
        "agentRole.subjects[0].namespace": "hosts",
        "agentRole.conversationBoundary": "true",
    }
    objs = template({**HOST_VALUES, **agents, "sealIdlePoolPods": "false"})
    host, agent = "system:serviceaccount:hosts:maf-host", "system:serviceaccount:hosts:agent"
    kinds = set()
    for policy in by_kind(objs, "ValidatingAdmissionPolicy"):
        match = policy["spec"]["matchConditions"][0]["expression"]
        is_host = policy["metadata"]["name"].startswith("so-sandbox-operator-host-")
        assert (host in match, agent in match) == (is_host, not is_host), policy["metadata"]
        kinds.add(is_host)
    assert kinds == {True, False}


def test_the_schema_refuses_bad_host_role_values() -> None:
    assert "kind" in template_error({**HOST_VALUES, "hostRole.subjects[0].kind": "Robot"})
    assert "hostRole" in template_error({"hostRole.verbs": "all"})


def _seal(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        o["kind"] + "/" + o["metadata"]["name"]: o
        for o in objs
        if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "warm-pools"
    }


def test_idle_pool_pods_are_sealed_by_default_against_all_but_the_operator() -> None:
    """(#36 item 2) By default two policies seal idle pool pods in the served namespaces: no
    exec, attach or port-forward (params: the namespace's idle pool pods), no update of the pod
    or its ephemeral containers; the operator's own identity (and the garbage collector's) is
    the one exempt; namespaces another operator serves are left to it."""
    objs = _seal(
        template({"ignoreNamespaces": "{t-*}", "peering.enabled": "false"}, namespace="so-system")
    )
    connect = objs["ValidatingAdmissionPolicy/so-sandbox-operator-sealed-pool-pods"]["spec"]
    update = objs["ValidatingAdmissionPolicy/so-sandbox-operator-sealed-pool-pods-update"]["spec"]
    assert connect["paramKind"] == {"apiVersion": "v1", "kind": "Pod"}
    assert connect["matchConstraints"]["resourceRules"][0]["resources"] == [
        "pods/exec", "pods/attach", "pods/portforward"
    ]  # fmt: skip
    assert update["matchConstraints"]["resourceRules"][0]["resources"] == [
        "pods", "pods/ephemeralcontainers"
    ]  # fmt: skip
    for spec in (connect, update):
        conditions = {c["name"]: c["expression"] for c in spec["matchConditions"]}
        assert conditions["served-namespace"] == "!(request.namespace.matches('^t-.*$'))"
        operator = "system:serviceaccount:so-system:so-sandbox-operator"
        assert operator in conditions["not-the-operator"]
        assert spec["failurePolicy"] == "Fail"
    assert "'sandbox-operator.dev/pool' in oldObject.metadata.labels" in next(
        c["expression"] for c in update["matchConditions"] if c["name"] == "idle-pool-pod"
    )
    bindings = [o for k, o in objs.items() if k.startswith("ValidatingAdmissionPolicyBinding/")]
    assert len(bindings) == 2
    for binding in bindings:
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"] == [
            {"key": "sandbox-operator.dev/served-by", "operator": "DoesNotExist"}
        ]
    assert not _seal(template({"sealIdlePoolPods": "false"}))


def test_egress_credentials_install_the_secret_check_and_keep_secrets_from_agents(
    tmp_path: Path,
) -> None:
    """(#38 item 3) With egressCredentials.enabled: the admission policy asking the authorizer
    whether the requester may get each named Secret, the Secrets reader the operator binds to
    the proxy, the operator's config naming it; and still no Secrets for the agents or the host."""
    subjects = {
        f"{role}.{key}": value
        for role in ("agentRole", "hostRole")
        for key, value in {
            "create": "true",
            "namespaces": "{agents}",
            "subjects[0].kind": "ServiceAccount",
            "subjects[0].name": "agent",
            "subjects[0].namespace": "agents",
        }.items()
    }
    values = {**subjects, "egressCredentials.enabled": "true"}
    objs = template(values, values_files=[managed_proxy_values(tmp_path)])
    name = "so-sandbox-operator-egress-credentials"
    policy = next(
        o for o in by_kind(objs, "ValidatingAdmissionPolicy") if o["metadata"]["name"] == name
    )
    unreadable = next(v for v in policy["spec"]["variables"] if v["name"] == "unreadable")
    assert 'resource("secrets")' in unreadable["expression"]
    assert 'check("get").allowed()' in unreadable["expression"]
    assert "spec.egressRules[].credential.secretName" in policy["spec"]["validations"][0]["message"]
    reader = next(o for o in by_kind(objs, "ClusterRole") if o["metadata"]["name"] == name)
    assert reader["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
    config = yaml.safe_load(one(objs, "ConfigMap")["data"]["config.yaml"])
    assert config["egressProxy"]["credentialsClusterRole"] == name
    theirs = [
        r for r in by_kind(objs, "Role") if r["metadata"]["name"].endswith(("-agent", "-host"))
    ]
    assert len(theirs) == 2
    assert not any("secrets" in rule["resources"] for role in theirs for rule in role["rules"])
    assert "egress-credentials" not in str(template(subjects))
    assert "egressCredentials.enabled needs config.egressProxy" in template_error(
        {"egressCredentials.enabled": "true"}
    )
