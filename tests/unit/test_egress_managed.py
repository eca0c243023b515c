"""The egress proxy the operator runs per namespace: configuration, the objects it applies, and
how it applies and checks them (against a fake API that keeps objects and their owners the way
server-side apply does). No cluster; the e2e proof is tests/e2e/test_egress_allowlist.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client.exceptions import ApiException

from sandbox_operator import labels as lbl
from sandbox_operator.backends import egress_proxy as ep
from sandbox_operator.backends.base import SandboxRef
from sandbox_operator.backends.egress_proxy_objects import CREDENTIALS_BINDING
from sandbox_operator.config import ManagedEgressProxySettings, parse_config
from sandbox_operator.contract import API_VERSION, ConfigurationError
from sandbox_operator.egress.config import ProxyConfig
from sandbox_operator.views import PodView

IMAGE = "sandbox-operator.dev/operator:0.1.0"
BACKEND = {
    "name": "runc",
    "type": "runtimeClass",
    "runtimeClassName": "runc",
    "isolation": "container",
    "declarations": {"egressModes": ["closed", "allowlist"], "osFamilies": ["posix"]},
}


def config(proxy: dict[str, Any] | None, backend_proxy: dict[str, Any] | None) -> dict[str, Any]:
    backend = dict(BACKEND)
    if backend_proxy is not None:
        backend["egressProxy"] = backend_proxy
    out: dict[str, Any] = {"hostPolicy": {"minIsolation": "container"}, "backends": [backend]}
    if proxy is not None:
        out["egressProxy"] = proxy
    return out


def settings(**kw: Any) -> ManagedEgressProxySettings:
    return ManagedEgressProxySettings.model_validate({"image": IMAGE, **kw})


# ---- configuration ---------------------------------------------------------------------------


def test_managed_mode_reads_the_operator_level_section() -> None:
    cfg, _ = parse_config(
        config(
            {
                "image": IMAGE,
                "port": 3130,
                "runtimeClassName": "gvisor",
                "hostAliases": [{"ip": "192.0.2.2", "hostnames": ["allowed.test"]}],
                "config": {
                    "allowedPorts": [443, 8443],
                    "admittedNetworks": ["192.0.2.2/32"],
                    "limits": {"headerTimeoutSeconds": 2},
                },
            },
            {"managed": True},
        )
    )
    assert cfg.egress_proxy is not None and cfg.backends[0].egress_proxy.managed
    proxy = cfg.egress_proxy.proxy_config()
    assert proxy.listen_port == 3130 and proxy.allowed_ports == (443, 8443)
    assert [str(n) for n in proxy.admitted_networks] == ["192.0.2.2/32"]
    assert proxy.limits.header_timeout_seconds == 2
    assert proxy.sandboxes == ()


def test_external_mode_is_unchanged() -> None:
    cfg, _ = parse_config(
        config(None, {"url": "http://p:3128", "port": 3128, "podSelector": {"app": "p"}})
    )
    proxy = cfg.backends[0].egress_proxy
    assert not proxy.managed and proxy.url == "http://p:3128" and proxy.port == 3128
    assert cfg.egress_proxy is None


@pytest.mark.parametrize(
    ("proxy", "backend_proxy", "entry", "words"),
    [
        (None, {"managed": True}, "backends[0].egressProxy.managed", "top-level egressProxy"),
        ({"image": IMAGE}, {"managed": True, "url": "http://p:1"}, "backends[0].egressProxy",
         "remove url"),
        ({"image": IMAGE}, {"managed": True, "podSelector": {}}, "backends[0].egressProxy",
         "remove podSelector"),
        (None, {"port": 3128}, "backends[0].egressProxy", "needs url"),
        ({}, {"managed": True}, "egressProxy.image", "required"),
        ({"image": ""}, {"managed": True}, "egressProxy.image", "at least 1"),
        ({"image": IMAGE, "port": 0}, {"managed": True}, "egressProxy.port", "greater"),
        ({"image": IMAGE, "runtimeClassName": "No"}, {"managed": True},
         "egressProxy.runtimeClassName", "pattern"),
        ({"image": IMAGE, "hostAliases": [{"ip": "1.2.3", "hostnames": ["a"]}]},
         {"managed": True}, "egressProxy.hostAliases[0].ip", "not an IP address"),
        ({"image": IMAGE, "hostAliases": [{"ip": "192.0.2.1", "hostnames": []}]},
         {"managed": True}, "egressProxy.hostAliases[0].hostnames", "at least 1"),
        ({"image": IMAGE, "config": {"sandboxes": [{"id": "a", "sourceIPs": ["10.0.0.1"]}]}},
         {"managed": True}, "egressProxy.config", "sandboxes must be empty"),
        ({"image": IMAGE, "config": {"identity": "token"}}, {"managed": True},
         "egressProxy.config", "use sourceIP"),
        ({"image": IMAGE, "config": {"listenPort": 9}}, {"managed": True},
         "egressProxy.config", "differs from egressProxy.port"),
        ({"image": IMAGE, "config": {"limits": {"headerTimeoutSeconds": 0}}},
         {"managed": True}, "egressProxy.config.limits.headerTimeoutSeconds", "greater"),
        ({"image": IMAGE, "config": {"admittedNetworks": ["10.0.0.0/33"]}}, {"managed": True},
         "egressProxy.config.admittedNetworks", ""),
        ({"image": IMAGE, "config": {"allowedPort": [80]}}, {"managed": True},
         "egressProxy.config.allowedPort", "Extra inputs"),
        ({"image": IMAGE, "resources": {"requests": {"gpu": "1"}}}, {"managed": True},
         "egressProxy.resources.requests", ""),
    ],
)  # fmt: skip
def test_bad_managed_configuration_is_refused_naming_the_field(
    proxy: dict[str, Any] | None, backend_proxy: dict[str, Any], entry: str, words: str
) -> None:
    with pytest.raises(ConfigurationError) as err:
        parse_config(config(proxy, backend_proxy))
    assert err.value.entry.startswith(entry), err.value
    assert words in err.value.problem, err.value


def test_a_listen_port_equal_to_the_port_is_accepted() -> None:
    assert settings(port=3129, config={"listenPort": 3129}).proxy_config().listen_port == 3129


# ---- builders ----------------------------------------------------------------------------------


def test_an_intercepting_proxy_gets_its_ca_key_and_the_sandboxes_only_the_certificate() -> None:
    """#38 item 1: with interception the namespace's CA key is in the proxy's Secret, mounted in
    the proxy's pod only; the ConfigMap carries the certificate and the bundle of the operator
    image's roots and the CA (what sandbox pods mount)."""
    import base64

    intercepting = settings(config={"interception": {"enabled": True}})
    ca = ep.ProxyCA("-----BEGIN CERTIFICATE-----\nCA\n", "KEY", "ROOTS\n")
    objs = {o["kind"]: o for o in ep.build_objects("team-a", intercepting, None, ca)}
    kinds = [o["kind"] for o in ep.build_objects("team-a", intercepting, None, ca)]
    assert kinds == ["ServiceAccount", "Role", "RoleBinding", "Secret", "ConfigMap",
                     "Deployment", "Service"]  # fmt: skip
    secret = objs["Secret"]["data"]
    assert base64.b64decode(secret["ca.key"]) == b"KEY"
    data = objs["ConfigMap"]["data"]
    assert data["ca.crt"] == ca.cert_pem and data["bundle.crt"] == "ROOTS\n" + ca.cert_pem
    assert "KEY" not in json.dumps(objs["ConfigMap"])
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    assert {
        "name": "ca",
        "secret": {"secretName": "sandbox-egress-proxy", "defaultMode": 0o440},
    } in pod["volumes"]
    (container,) = pod["containers"]
    assert container["command"][-2:] == ["--ca-dir", "/etc/sandbox-egress-proxy-ca"]
    assert {"name": "ca", "mountPath": "/etc/sandbox-egress-proxy-ca", "readOnly": True} in (
        container["volumeMounts"]
    )
    # A new CA rolls the proxy's pod (it must sign with the key of the certificate given out).
    other = ep.ProxyCA("-----BEGIN CERTIFICATE-----\nOTHER\n", "KEY2", "ROOTS\n")
    annotation = ep.CONFIG_CHECKSUM_ANNOTATION

    def checksum(c: ep.ProxyCA) -> str:
        deployment = ep.build_deployment("team-a", intercepting, c)
        return str(deployment["spec"]["template"]["metadata"]["annotations"][annotation])

    assert checksum(ca) != checksum(other)
    # Without interception: no Secret, no CA, nothing mounted.
    plain = ep.build_objects("team-a", settings(), None, None)
    assert "Secret" not in [o["kind"] for o in plain]
    assert "--ca-dir" not in json.dumps(plain)


def test_a_backend_declaring_https_rules_needs_the_proxy_to_terminate_tls() -> None:
    backend = dict(BACKEND)
    backend["declarations"] = {**BACKEND["declarations"], "egressRules": True,
                               "egressRulesHttps": True}  # fmt: skip
    backend["egressProxy"] = {"managed": True}
    with pytest.raises(ConfigurationError) as err:
        parse_config({"hostPolicy": {"minIsolation": "container"}, "backends": [backend],
                      "egressProxy": {"image": IMAGE}})  # fmt: skip
    assert err.value.entry == "backends[0].declarations.egressRulesHttps"
    parse_config({"hostPolicy": {"minIsolation": "container"}, "backends": [backend],
                  "egressProxy": {"image": IMAGE,
                                  "config": {"interception": {"enabled": True}}}})  # fmt: skip


def test_a_backend_declaring_credentials_needs_https_rules_on_an_intercepting_proxy() -> None:
    # #38 item 3: credentials are attached inside TLS the proxy terminates, nowhere else.
    backend = dict(BACKEND)
    backend["declarations"] = {**BACKEND["declarations"], "egressRules": True,
                               "egressCredentials": True}  # fmt: skip
    backend["egressProxy"] = {"managed": True}
    reader = {"credentialsClusterRole": "so-sandbox-operator-egress-credentials"}
    intercepting = {"image": IMAGE, "config": {"interception": {"enabled": True}}}
    for proxy, https in ((intercepting, False), ({**intercepting, **reader}, False),
                         (intercepting, True), ({"image": IMAGE, **reader}, True)):  # fmt: skip
        backend["declarations"]["egressRulesHttps"] = https
        with pytest.raises(ConfigurationError) as err:
            parse_config({"hostPolicy": {"minIsolation": "container"}, "backends": [backend],
                          "egressProxy": proxy})  # fmt: skip
        assert err.value.entry.startswith("backends[0].declarations.egress")
    backend["declarations"]["egressRulesHttps"] = True
    config, _ = parse_config({"hostPolicy": {"minIsolation": "container"}, "backends": [backend],
                           "egressProxy": {**intercepting, **reader}})  # fmt: skip
    # The proxy's ServiceAccount is bound to that ClusterRole, by the operator, in its namespace.
    assert config.egress_proxy is not None
    objs = ep.build_objects("team-a", config.egress_proxy)
    (binding,) = [o for o in objs if o["metadata"]["name"] == CREDENTIALS_BINDING]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": reader["credentialsClusterRole"]}  # fmt: skip
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": ep.PROXY_NAME,
                                    "namespace": "team-a"}]  # fmt: skip
    assert CREDENTIALS_BINDING not in json.dumps(ep.build_objects("team-a", settings()))


def test_every_object_is_named_labelled_and_in_the_namespace() -> None:
    objs = ep.build_objects("team-a", settings())
    assert [o["kind"] for o in objs] == [kind for _, kind, _, _ in ep.APPLIED]
    assert [o["apiVersion"] for o in objs] == [v for v, _, _, _ in ep.APPLIED]
    for obj in objs:
        meta = obj["metadata"]
        assert meta["name"] == "sandbox-egress-proxy" and meta["namespace"] == "team-a"
        assert meta["labels"] == {
            "app.kubernetes.io/name": "sandbox-egress-proxy",
            "app.kubernetes.io/managed-by": "sandbox-operator",
            "app.kubernetes.io/component": "egress-proxy",
        }
        assert "ownerReferences" not in meta


def test_role_grants_exactly_what_the_proxy_needs() -> None:
    role = ep.build_role("team-a")
    assert role["rules"] == [
        {"apiGroups": ["sandbox-operator.dev"], "resources": ["sandboxes"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["sandbox-operator.dev"], "resources": ["sandboxes/status"],
         "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["services"], "resourceNames": ["sandbox-egress-proxy"],
         "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    ]  # fmt: skip
    binding = ep.build_role_binding("team-a")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "sandbox-egress-proxy",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "sandbox-egress-proxy", "namespace": "team-a"}
    ]


def test_config_map_holds_the_proxy_config_without_sandboxes() -> None:
    s = settings(port=3130, config={"admittedNetworks": ["192.0.2.2/32"], "allowedPorts": [443]})
    cm = ep.build_config_map("team-a", s)
    data = yaml.safe_load(cm["data"]["proxy.yaml"])
    parsed = ProxyConfig.model_validate(data)  # what `python -m sandbox_operator.egress` reads
    assert parsed.sandboxes == () and data["sandboxes"] == []
    assert parsed.listen_port == 3130 and parsed.listen_host == "0.0.0.0"
    assert parsed.allowed_ports == (443,)
    assert [str(n) for n in parsed.admitted_networks] == ["192.0.2.2/32"]
    assert parsed.refused_networks == ProxyConfig().refused_networks  # defaults, spelled out


def test_deployment_runs_one_hardened_proxy_pod() -> None:
    s = settings(
        runtimeClassName="gvisor",
        imagePullPolicy="Never",
        nodeSelector={"role": "egress"},
        tolerations=[{"key": "egress", "operator": "Exists"}],
        hostAliases=[{"ip": "192.0.2.2", "hostnames": ["allowed.test", "denied.test"]}],
    )
    dep = ep.build_deployment("team-a", s)
    spec = dep["spec"]
    assert spec["replicas"] == 1
    template = spec["template"]
    assert spec["selector"]["matchLabels"] == template["metadata"]["labels"] == ep.proxy_labels()
    pod = template["spec"]
    assert pod["serviceAccountName"] == "sandbox-egress-proxy"
    assert pod["runtimeClassName"] == "gvisor"
    assert pod["hostNetwork"] is pod["hostPID"] is pod["hostIPC"] is False
    assert pod["enableServiceLinks"] is False
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["nodeSelector"] == {"role": "egress"}
    assert pod["tolerations"] == [{"key": "egress", "operator": "Exists"}]
    assert pod["hostAliases"] == [{"ip": "192.0.2.2", "hostnames": ["allowed.test", "denied.test"]}]
    (c,) = pod["containers"]
    assert c["image"] == IMAGE and c["imagePullPolicy"] == "Never"
    assert c["command"] == [
        "python3", "-m", "sandbox_operator.egress", "--config",
        "/etc/sandbox-egress/proxy.yaml", "--kube-namespace", "team-a",
        "--kube-service", "sandbox-egress-proxy",
    ]  # fmt: skip
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
    }
    assert c["readinessProbe"]["tcpSocket"] == {"port": 3128}
    assert c["ports"] == [{"name": "proxy", "containerPort": 3128, "protocol": "TCP"}]
    assert c["volumeMounts"] == [
        {"name": "config", "mountPath": "/etc/sandbox-egress", "readOnly": True}
    ]
    assert pod["volumes"] == [{"name": "config", "configMap": {"name": "sandbox-egress-proxy"}}]
    assert c["resources"] == {"requests": {"cpu": "50m", "memory": "64Mi"},
                              "limits": {"memory": "256Mi"}}  # fmt: skip
    # A plain deployment: no runtime class, aliases, selector or tolerations unless configured.
    plain = ep.build_deployment("team-a", settings())["spec"]["template"]["spec"]
    assert not {"runtimeClassName", "hostAliases", "nodeSelector", "tolerations"} & set(plain)


def test_a_changed_proxy_config_rolls_the_pod() -> None:
    def checksum(s: ManagedEgressProxySettings) -> str:
        ann = ep.build_deployment("ns", s)["spec"]["template"]["metadata"]["annotations"]
        return str(ann[ep.CONFIG_CHECKSUM_ANNOTATION])

    base = checksum(settings())
    assert checksum(settings()) == base  # deterministic: re-applying does not roll it
    assert checksum(settings(config={"allowedPorts": [443]})) != base
    assert checksum(settings(port=3129)) != base
    assert checksum(settings(image="other:1")) == base  # the image rolls it by itself


def test_service_selects_the_proxy_pods_on_the_port() -> None:
    svc = ep.build_service("team-a", settings(port=3130))
    assert svc["spec"] == {
        "type": "ClusterIP",
        "selector": ep.proxy_labels(),
        "ports": [{"name": "proxy", "port": 3130, "targetPort": 3130, "protocol": "TCP"}],
    }
    assert ep.build_service("team-a", settings(), "10.96.0.50")["spec"]["clusterIP"] == "10.96.0.50"


def test_owner_references_never_control_or_block() -> None:
    sbx = SandboxRef("team-a", "box", "uid-1")
    svc = ep.build_service("team-a", settings())
    full = ep.with_owner(svc, sbx)
    assert full["metadata"]["ownerReferences"] == [
        {"apiVersion": API_VERSION, "kind": "Sandbox", "name": "box", "uid": "uid-1",
         "controller": False, "blockOwnerDeletion": False}
    ]  # fmt: skip
    assert "ownerReferences" not in svc["metadata"]  # not modified in place
    only = ep.owner_only(svc, sbx)
    assert only == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "sandbox-egress-proxy",
            "namespace": "team-a",
            "ownerReferences": full["metadata"]["ownerReferences"],
        },
    }
    assert ep.sandbox_field_manager(sbx) == "sandbox-operator/egress/uid-1"
    assert "ownerReferences" not in ep.with_owner(svc, SandboxRef("team-a", "box"))["metadata"]


def test_proxy_address_round_trips() -> None:
    a = ep.ProxyAddress("10.96.0.9", 3128)
    assert (a.annotation, a.url) == ("10.96.0.9:3128", "http://10.96.0.9:3128")
    assert ep.ProxyAddress.parse(a.annotation) == a
    v6 = ep.ProxyAddress("fd00::9", 3128)
    assert v6.annotation == "[fd00::9]:3128" and ep.ProxyAddress.parse(v6.annotation) == v6
    for bad in ("", "10.96.0.9", "proxy:3128", "10.96.0.9:0", "10.96.0.9:x", "10.96.0.9:70000"):
        assert ep.ProxyAddress.parse(bad) is None, bad


def _pod(annotation: str | None, *, phase: str = "Running", deleting: bool = False) -> PodView:
    meta: dict[str, Any] = {"annotations": {}}
    if annotation is not None:
        meta["annotations"][ep.PROXY_ADDRESS_ANNOTATION] = annotation
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return PodView({"metadata": meta, "status": {"phase": phase}})


def test_recorded_address_is_what_live_pods_were_given() -> None:
    a = "10.96.0.9:3128"
    b = "10.96.0.10:3128"
    assert ep.recorded_address([]) is None
    assert ep.recorded_address([_pod(None), _pod("junk")]) is None
    got = ep.recorded_address([_pod(a), _pod(b), _pod(b), _pod(a, phase="Failed")])
    assert got == ep.ProxyAddress("10.96.0.10", 3128)
    assert ep.recorded_address([_pod(b, deleting=True), _pod(a)]) == ep.ProxyAddress.parse(a)


# ---- applying and checking (fake API) -----------------------------------------------------------


def _api_error(status: int, message: str) -> ApiException:
    exc = ApiException(status=status, reason="Error")
    exc.body = json.dumps({"message": message})
    return exc


class FakeCluster:
    """Objects by kind, applied the way server-side apply merges ownerReferences: each field
    manager's list of owners is kept, and the object's owners are the union of them."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.owners: dict[str, dict[str, dict[str, dict]]] = {}  # kind -> manager -> uid -> ref
        self.calls: list[tuple[str, str]] = []
        self.taken: set[str] = set()
        self.next_ip = 100
        self.refuse: dict[str, ApiException] = {}
        self.service_reads = 0

    def patcher(self, kind: str) -> Any:
        async def patch(name: str, namespace: str, body: dict, **kw: Any) -> dict:
            assert kw["_content_type"] == "application/apply-patch+yaml"
            assert kw["force"] is True
            manager = kw["field_manager"]
            self.calls.append((kind, manager))
            if kind in self.refuse:
                raise self.refuse[kind]
            existing = self.objects.get(kind)
            if existing is None and "spec" not in body and kind in ("Deployment", "Service"):
                raise _api_error(422, f"{kind} is invalid")
            obj = json.loads(json.dumps(existing or {}))
            for key, value in body.items():
                if key != "metadata":
                    obj[key] = json.loads(json.dumps(value))
            obj.setdefault("metadata", {}).update(
                {k: v for k, v in body["metadata"].items() if k != "ownerReferences"}
            )
            if kind == "Service":
                want = (body.get("spec") or {}).get("clusterIP")
                had = ((existing or {}).get("spec") or {}).get("clusterIP")
                if existing is None:
                    if want in self.taken:
                        raise _api_error(422, "provided IP is already allocated")
                    ip = want or f"10.96.0.{self.next_ip}"
                    self.next_ip += 1
                elif want and want != had:
                    raise _api_error(422, "field is immutable")
                else:
                    ip = had
                obj["spec"]["clusterIP"] = ip
            refs = {r["uid"]: r for r in body["metadata"].get("ownerReferences", [])}
            self.owners.setdefault(kind, {})[manager] = refs
            merged: dict[str, dict] = {}
            for by_manager in self.owners[kind].values():
                merged.update(by_manager)
            obj["metadata"]["ownerReferences"] = list(merged.values())
            self.objects[kind] = obj
            return obj

        return patch

    async def read_namespaced_service(self, name: str, namespace: str) -> dict:
        self.service_reads += 1
        if "Service" not in self.objects:
            raise ApiException(status=404, reason="Not Found")
        return self.objects["Service"]

    async def list_namespaced_pod(self, namespace: str, label_selector: str = "") -> Any:
        assert label_selector == f"{lbl.MANAGED_BY_LABEL}={lbl.MANAGED_BY_VALUE}"

        class Listing:
            items = self.pods

        return Listing()

    pods: list[dict] = []

    def delete_all(self) -> None:
        """What the garbage collector does when it (wrongly or rightly) decides nobody owns it."""
        self.objects.clear()
        self.owners.clear()

    def owner_uids(self, kind: str) -> set[str]:
        return {r["uid"] for r in self.objects[kind]["metadata"]["ownerReferences"]}


class FakeApiClient:
    def sanitize_for_serialization(self, obj: Any) -> Any:
        return obj


def managed(cluster: FakeCluster, **kw: Any) -> ep.ManagedEgressProxy:
    proxy = ep.ManagedEgressProxy(settings(**kw), FakeApiClient())

    class Api:
        def __getattr__(self, attr: str) -> Any:
            if attr.startswith("patch_namespaced_"):
                stem = attr.removeprefix("patch_namespaced_")
                kinds = {"service_account": "ServiceAccount", "role": "Role",
                         "role_binding": "RoleBinding", "config_map": "ConfigMap",
                         "deployment": "Deployment", "service": "Service"}  # fmt: skip
                return cluster.patcher(kinds[stem])
            return getattr(cluster, attr)

    proxy._core = proxy._rbac = proxy._apps = Api()
    return proxy


def run(coro: Any) -> Any:
    return asyncio.run(coro)


A = SandboxRef("team-a", "a", "uid-a")
B = SandboxRef("team-a", "b", "uid-b")


def test_ensure_applies_everything_with_each_sandbox_as_an_owner() -> None:
    cluster = FakeCluster()
    proxy = managed(cluster)
    first = run(proxy.ensure("team-a", A))
    assert first == ep.ProxyAddress("10.96.0.100", 3128)
    kinds = [kind for _, kind, _, _ in ep.APPLIED]
    # Each object: the full object under the common manager, then A's reference under A's own.
    assert cluster.calls == [
        (k, m) for k in kinds for m in ("sandbox-operator/egress", "sandbox-operator/egress/uid-a")
    ]
    second = run(proxy.ensure("team-a", B))
    assert second == first  # the Service is reused, same address
    for kind in kinds:
        assert cluster.owner_uids(kind) == {"uid-a", "uid-b"}, kind
        # The common manager holds only the latest; A's own manager keeps A's reference.
        assert set(cluster.owners[kind]["sandbox-operator/egress"]) == {"uid-b"}
        assert set(cluster.owners[kind]["sandbox-operator/egress/uid-a"]) == {"uid-a"}


def test_a_recreated_service_asks_for_the_address_running_sandboxes_were_given() -> None:
    cluster = FakeCluster()
    proxy = managed(cluster)
    given = run(proxy.ensure("team-a", A))
    cluster.delete_all()  # the garbage collector raced a new Sandbox
    cluster.pods = [_pod(given.annotation)]
    assert run(proxy.ensure("team-a", B)) == given
    assert cluster.owner_uids("Service") == {"uid-b"}


def test_a_new_sandbox_gets_a_fresh_address_when_the_recorded_one_is_taken() -> None:
    cluster = FakeCluster()
    proxy = managed(cluster)
    given = run(proxy.ensure("team-a", A))
    cluster.delete_all()
    cluster.pods = [_pod(given.annotation)]
    cluster.taken = {given.ip}
    fresh = run(proxy.ensure("team-a", B))
    assert fresh != given and fresh.port == 3128
    # ... and A, still running with the old address, is told so (not left without egress).
    problem = run(proxy.check("team-a", A, given))
    assert "another address" in problem


def test_check_is_one_read_when_all_is_well() -> None:
    cluster = FakeCluster()
    proxy = managed(cluster)
    given = run(proxy.ensure("team-a", A))
    cluster.calls.clear()
    cluster.service_reads = 0
    # Right after ensure, the Service it applied answers: passes over sandboxes read nothing.
    for _ in range(5):
        assert run(proxy.check("team-a", A, given)) == ""
    assert cluster.service_reads == 0 and cluster.calls == []
    # Once that is old (no periodic look ran), one read, and it answers the next checks.
    proxy._seen_service["team-a"] = (0.0, proxy._seen_service["team-a"][1])
    for _ in range(5):
        assert run(proxy.check("team-a", A, given)) == ""
    assert cluster.service_reads == 1 and cluster.calls == []


def test_the_periodic_look_is_one_read_per_namespace_and_wakes_only_on_change() -> None:
    cluster = FakeCluster()
    proxy = managed(cluster)
    run(proxy.ensure("team-a", A))
    run(proxy.ensure("team-a", B))
    woken: list[str] = []
    cluster.service_reads = 0
    run(proxy.look_once(woken.append))
    assert cluster.service_reads == 1 and woken == []  # two sandboxes, one namespace, no change
    cluster.delete_all()
    run(proxy.look_once(woken.append))
    assert woken == ["team-a"]


def test_check_restores_a_removed_proxy_at_the_recorded_address() -> None:
    cluster = FakeCluster()
    proxy = managed(cluster)
    given = run(proxy.ensure("team-a", A))
    cluster.delete_all()
    run(proxy.look_once(lambda ns: None))  # the periodic look sees it gone
    assert run(proxy.check("team-a", A, given)) == ""
    assert cluster.objects["Service"]["spec"]["clusterIP"] == given.ip
    assert set(cluster.objects) == {kind for _, kind, _, _ in ep.APPLIED}
    assert cluster.owner_uids("Deployment") == {"uid-a"}


def test_check_reports_a_proxy_that_cannot_have_its_address_back() -> None:
    cluster = FakeCluster()
    proxy = managed(cluster)
    given = run(proxy.ensure("team-a", A))
    cluster.delete_all()
    cluster.taken = {given.ip}
    run(proxy.look_once(lambda ns: None))
    problem = run(proxy.check("team-a", A, given))
    assert "could not be restored" in problem and "already allocated" in problem
    assert "Service" not in cluster.objects  # no fresh address behind the sandbox's back


def test_check_puts_back_a_missing_owner_reference() -> None:
    cluster = FakeCluster()
    proxy = managed(cluster)
    given = run(proxy.ensure("team-a", B))
    # A's ensure stopped before its own reference landed (and the common one moved on to B).
    assert run(proxy.check("team-a", A, given)) == ""
    assert cluster.owner_uids("Service") == {"uid-a", "uid-b"}


def test_check_does_not_fail_a_sandbox_on_a_transient_read_error() -> None:
    cluster = FakeCluster()
    proxy = managed(cluster)
    given = run(proxy.ensure("team-a", A))

    async def broken(name: str, namespace: str) -> dict:
        raise ApiException(status=503, reason="Unavailable")

    cluster.read_namespaced_service = broken  # type: ignore[method-assign]
    assert run(proxy.check("team-a", A, given)) == ""


@pytest.mark.parametrize(("status", "permanent"), [(403, True), (422, True), (500, False)])
def test_refusals_say_which_object_and_whether_to_retry(status: int, permanent: bool) -> None:
    cluster = FakeCluster()
    cluster.refuse["Role"] = _api_error(status, "roles is forbidden: attempt to grant extra")
    proxy = managed(cluster)
    with pytest.raises(ep.ProxyError) as err:
        run(proxy.ensure("team-a", A))
    assert err.value.permanent is permanent
    assert err.value.message.startswith("egress proxy Role sandbox-egress-proxy was refused")
    assert f"HTTP {status}" in err.value.message


def test_an_escalation_refusal_says_what_the_operator_lacks() -> None:
    cluster = FakeCluster()
    cluster.refuse["Role"] = _api_error(
        403,
        'roles.rbac.authorization.k8s.io "sandbox-egress-proxy" is forbidden: user "system:'
        'serviceaccount:so:so" (groups=["system:serviceaccounts" "system:authenticated"]) is '
        "attempting to grant RBAC permissions not currently held:\n"
        '{APIGroups:[""], Resources:["events"], Verbs:["patch"]}',
    )
    with pytest.raises(ep.ProxyError) as err:
        run(managed(cluster).ensure("team-a", A))
    assert err.value.permanent
    assert "does not hold every permission the proxy's Role grants" in err.value.message
    assert err.value.message.endswith(
        'missing: {APIGroups:[""], Resources:["events"], Verbs:["patch"]}'
    )
    assert "groups=" not in err.value.message


# ---- the driver ---------------------------------------------------------------------------------


def _ready_pod(annotation: str | None) -> dict[str, Any]:
    pod = _pod(annotation)
    pod["metadata"].update(
        {"name": "sbx-a", "namespace": "team-a", "uid": "pod-uid",
         "ownerReferences": [{"uid": "uid-a"}]}
    )  # fmt: skip
    pod["status"]["containerStatuses"] = [
        {"name": "sandbox", "ready": True, "state": {"running": {}}}
    ]
    return pod


def _driver(pod: dict[str, Any], problem: str) -> Any:
    from sandbox_operator.backends.runtimeclass import RuntimeClassDriver

    checks: list[tuple[str, ep.ProxyAddress]] = []

    class Proxy:
        async def check(self, namespace: str, sandbox: SandboxRef, given: ep.ProxyAddress) -> str:
            checks.append((namespace, given))
            return problem

    class Driver(RuntimeClassDriver):
        def __init__(self) -> None:
            self._proxy = Proxy()  # type: ignore[assignment]
            self.checks = checks

        async def _read_pod(self, namespace: str, name: str) -> PodView:
            return PodView(pod)

    return Driver()


def test_observe_reports_a_sandbox_whose_proxy_is_lost_as_failed() -> None:
    """A sandbox that lost its proxy address is Failed (and so disposed), never left Ready
    without egress."""
    from datetime import UTC, datetime

    from sandbox_operator.backends.base import ObservedPhase
    from sandbox_operator.contract import ConditionReason, Lifetime
    from sandbox_operator.reconcile.lifecycle import judge

    lost = "the namespace's egress proxy Service was re-created with another address"
    driver = _driver(_ready_pod("10.96.0.9:3128"), lost)
    obs = run(driver.observe(A))
    assert driver.checks == [("team-a", ep.ProxyAddress("10.96.0.9", 3128))]
    assert obs.phase is ObservedPhase.FAILED and obs.detail_reason == "EgressProxyLost"
    assert obs.message == lost and obs.served_by.name == "sbx-a"
    now = datetime.now(UTC)
    verdict = judge(obs, lifetime=Lifetime(), was_ready=True, ready_since=now,
                    sandbox_created=now, admitted_at=now, last_activity=None, now=now)  # fmt: skip
    assert verdict.reason is ConditionReason.FAILED and verdict.dispose
    assert lost in verdict.message

    fine = _driver(_ready_pod("10.96.0.9:3128"), "")
    assert run(fine.observe(A)).phase is ObservedPhase.READY
    # A pod that was given no managed proxy (closed, or external mode) costs no API call.
    closed = _driver(_ready_pod(None), lost)
    assert run(closed.observe(A)).phase is ObservedPhase.READY and closed.checks == []


def test_observe_keeps_a_ready_pod_pending_until_the_proxy_admitted_it() -> None:
    """A ready pod under a managed proxy is reported READY but pending (the operator keeps the
    Sandbox Creating) until the Sandbox's status says the proxy admitted it."""
    from dataclasses import replace
    from datetime import UTC, datetime

    from sandbox_operator.backends.base import ObservedPhase
    from sandbox_operator.backends.runtimeclass import EGRESS_PENDING

    driver = _driver(_ready_pod("10.96.0.9:3128"), "")
    obs = run(driver.observe(A))
    assert obs.phase is ObservedPhase.READY and obs.pending == EGRESS_PENDING
    assert "egress proxy" in EGRESS_PENDING
    admitted = replace(A, egress_admitted=datetime.now(UTC))
    assert run(driver.observe(admitted)).pending == ""
    # A lost proxy is still a failure, admitted or not.
    lost = _driver(_ready_pod("10.96.0.9:3128"), "the proxy is gone")
    assert run(lost.observe(A)).phase is ObservedPhase.FAILED
    # No managed proxy on the pod: nothing to wait for.
    assert run(_driver(_ready_pod(None), "").observe(A)).pending == ""
    # A pod still starting is just starting.
    starting = _ready_pod("10.96.0.9:3128")
    starting["status"]["containerStatuses"][0]["ready"] = False
    assert run(_driver(starting, "").observe(A)).pending == ""


def test_judge_keeps_pending_starting_before_ready_and_ready_after() -> None:
    from datetime import UTC, datetime, timedelta

    from sandbox_operator.backends.base import Observation, ObservedPhase
    from sandbox_operator.contract import ConditionReason, Lifetime
    from sandbox_operator.reconcile.lifecycle import judge

    now = datetime.now(UTC)
    obs = Observation(ObservedPhase.READY, pending="waiting for the egress proxy to admit it",
                      created_at=now - timedelta(seconds=10))  # fmt: skip
    kw: dict[str, Any] = dict(ready_since=None, sandbox_created=now, admitted_at=now,
                              last_activity=None, now=now)  # fmt: skip
    fresh = judge(obs, lifetime=Lifetime(), was_ready=False, **kw)
    assert not fresh.ready and fresh.reason is ConditionReason.CREATING and not fresh.terminal
    assert "waiting for the egress proxy" in fresh.message
    late = judge(obs, lifetime=Lifetime(startupTimeoutSeconds=5), was_ready=False, **kw)
    assert late.reason is ConditionReason.STARTUP_TIMEOUT and late.dispose
    assert "egress proxy" in late.message
    after = judge(obs, lifetime=Lifetime(), was_ready=True, **kw)
    assert after.ready and after.reason is ConditionReason.READY


def test_concurrent_restores_in_one_namespace_never_race_for_the_address() -> None:
    """The Service goes away; every allowlisted sandbox of the namespace is woken at once and
    restores it. Two creates racing for the recorded address would have the second refused (422,
    the IP is allocated), which reads as a permanent loss: restores take turns instead."""
    cluster = FakeCluster()
    proxy = managed(cluster)
    given = run(proxy.ensure("team-a", A))
    run(proxy.ensure("team-a", B))
    cluster.delete_all()
    plain = cluster.patcher

    def in_flight(kind: str) -> Any:
        patch = plain(kind)

        async def slow(name: str, namespace: str, body: dict, **kw: Any) -> dict:
            existed = kind in cluster.objects
            await asyncio.sleep(0.01)  # the request is in flight
            if kind == "Service" and not existed and kind in cluster.objects:
                raise _api_error(422, "provided IP is already allocated")
            return await patch(name, namespace, body, **kw)

        return slow

    cluster.patcher = in_flight  # type: ignore[method-assign]
    run(proxy.look_once(lambda ns: None))

    async def both() -> list[str]:
        return list(
            await asyncio.gather(proxy.check("team-a", A, given), proxy.check("team-a", B, given))
        )

    assert run(both()) == ["", ""]
    assert cluster.objects["Service"]["spec"]["clusterIP"] == given.ip
    assert cluster.owner_uids("Service") == {"uid-a", "uid-b"}
