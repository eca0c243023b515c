"""The chart grants the operator exactly the API verbs its code uses: no more, no fewer.

The verbs are read off the operator's source (not a list kept by hand):

* every reference to a method of a kubernetes_asyncio API object (``self._core =
  client.CoreV1Api(api)`` ... ``self._core.create_namespaced_pod``) gives (group, resource, verb);
  for ``CustomObjectsApi`` the plural argument is resolved through the module constants and, when
  it is a parameter, through every caller of the enclosing function;
* every kopf handler decorator gives list + watch on its resource, and the state-keeping handlers
  (create/update/delete/resume/timer/daemon) also patch it and its status (finalizers, progress);
* kopf itself posts Events, watches CRDs to notice served resources, uses its peering object and,
  serving named namespaces, lists and watches namespaces.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandbox_operator.backends import egress_proxy
from sandbox_operator.backends.egress_proxy_objects import CREDENTIALS_BINDING
from sandbox_operator.contract.published import PUBLISHED_CONFIGMAP
from sandbox_operator.reconcile import access
from sandbox_operator.views import SandboxScopeView
from tests.fixtures.chart import ROOT, acas_values, by_kind, managed_proxy_values, template

SRC = ROOT / "src" / "sandbox_operator"
# The operator process: everything but the client library, its conformance suites, the egress
# proxy and the ports router (programs of their own, with their own Roles: the router's is
# checked in tests/unit/test_chart_router.py), and the maf-sandbox backend over the client (none
# of them is run by the operator and none holds operator credentials).
EXCLUDED = ("client", "conformance", "egress", "maf", "router")
#: The module publishing the backends ConfigMap (granted by name: test_published_configmap_...).
PUBLISHER = Path("reconcile/publish.py")

Grant = tuple[str, str, str]  # (apiGroup, resource, verb)

API_GROUPS = {
    "CoreV1Api": "",
    "NetworkingV1Api": "networking.k8s.io",
    "NodeV1Api": "node.k8s.io",
    "AppsV1Api": "apps",
    "BatchV1Api": "batch",
    "CoordinationV1Api": "coordination.k8s.io",
    "EventsV1Api": "events.k8s.io",
    "RbacAuthorizationV1Api": "rbac.authorization.k8s.io",
    "ApiextensionsV1Api": "apiextensions.k8s.io",
    "PolicyV1Api": "policy",
    "CustomObjectsApi": "*custom*",
}
VERBS = {
    "create": "create",
    "read": "get",
    "get": "get",
    "list": "list",
    "patch": "patch",
    "replace": "update",
    "delete": "delete",
    "delete_collection": "deletecollection",
}
# kubernetes_asyncio method stems whose plural is not "<stem without _>s".
PLURALS = {"network_policy": "networkpolicies", "runtime_class": "runtimeclasses"}
METHOD = re.compile(
    r"^(delete_collection|create|read|get|list|patch|replace|delete)_(namespaced_)?([a-z_]+?)"
    r"(_status)?(_for_all_namespaces)?$"
)
KOPF_STATEFUL = {"create", "update", "delete", "resume", "timer", "daemon", "field"}


def modules(
    *, only: Path | None = None, skip: Path | None = None
) -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel.parts[0] in EXCLUDED or rel == skip or (only is not None and rel != only):
            continue
        yield path, ast.parse(path.read_text(), str(path))


def contract_constants() -> dict[str, str]:
    import sandbox_operator.contract as contract

    return {k: v for k, v in vars(contract).items() if k.isupper() and isinstance(v, str)}


@dataclass
class Scan:
    grants: set[Grant] = field(default_factory=set)
    unresolved: list[str] = field(default_factory=list)
    kopf_resources: set[tuple[str, str]] = field(default_factory=set)


class Resolver:
    """Resolves a plural expression through constants and the callers of its function."""

    def __init__(self, trees: list[tuple[Path, ast.Module]]) -> None:
        self.constants = contract_constants()
        self.functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        self.calls: dict[str, list[ast.Call]] = {}
        self.parents: dict[ast.AST, ast.AST] = {}
        for _, tree in trees:
            for node in ast.walk(tree):
                for child in ast.iter_child_nodes(node):
                    self.parents[child] = node
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    self.functions.setdefault(node.name, []).append(node)
                    for const in _module_constants(tree):
                        self.constants.setdefault(*const)
                if isinstance(node, ast.Call):
                    name = _callee_name(node.func)
                    if name:
                        self.calls.setdefault(name, []).append(node)

    def enclosing_function(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                return node
        return None

    def resolve(self, expr: ast.expr, at: ast.AST, depth: int = 0) -> set[str] | None:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return {expr.value}
        if isinstance(expr, ast.Name | ast.Attribute):
            name = expr.id if isinstance(expr, ast.Name) else expr.attr
            if name in self.constants:
                return {self.constants[name]}
            func = self.enclosing_function(at)
            if isinstance(expr, ast.Name) and func is not None and depth < 8:
                return self._resolve_parameter(func, name, depth)
        return None

    def _resolve_parameter(
        self, func: ast.FunctionDef | ast.AsyncFunctionDef, name: str, depth: int
    ) -> set[str] | None:
        params = [a.arg for a in func.args.posonlyargs + func.args.args]
        if params and params[0] in ("self", "cls"):
            params = params[1:]
        if name not in params + [a.arg for a in func.args.kwonlyargs]:
            return None
        index = params.index(name) if name in params else None
        found: set[str] = set()
        callers = self.calls.get(func.name, [])
        if not callers:
            return None
        for call in callers:
            arg: ast.expr | None = None
            if index is not None and index < len(call.args):
                arg = call.args[index]
            for kw in call.keywords:
                if kw.arg == name:
                    arg = kw.value
            if arg is None:
                return None
            got = self.resolve(arg, call, depth + 1)
            if got is None:
                return None
            found |= got
        return found


def _module_constants(tree: ast.Module) -> Iterable[tuple[str, str]]:
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id.isupper():
                    yield target.id, node.value.value


def _callee_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _api_attributes(tree: ast.Module) -> dict[str, str]:
    """Attribute or variable names bound to an API object: {"_core": "CoreV1Api", ...}."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Call):
            api = _callee_name(node.value.func)
            if api not in API_GROUPS:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                name = (
                    _callee_name(target) if isinstance(target, ast.Attribute | ast.Name) else None
                )
                if name:
                    out[name] = api
    return out


#: The calls that open a watch on the list call they are given: a ``Watch().stream`` and the
#: shared list-then-watch loop (kubecalls.py).
WATCHING_CALLS = frozenset({"stream", "list_then_watch"})


def _streams(func: ast.AST | None) -> bool:
    """Whether a function opens a watch (``watch.Watch(...).stream(...)``, ``list_then_watch``)."""
    return func is not None and any(
        isinstance(n, ast.Call) and _callee_name(n.func) in WATCHING_CALLS for n in ast.walk(func)
    )


def _plural(stem: str) -> str:
    return PLURALS.get(stem, stem.replace("_", "") + "s")


def scan(*, only: Path | None = None, skip: Path | None = None) -> Scan:
    trees = list(modules(only=only, skip=skip))
    resolver = Resolver(trees)
    result = Scan()
    for path, tree in trees:
        apis = _api_attributes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute | ast.Name):
                owner = _callee_name(node.value)
                if owner in apis:
                    _api_reference(result, resolver, apis[owner], node, path)
            # An API object used in place: client.CoreV1Api(api).read_namespaced_secret(...)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call):
                api = _callee_name(node.value.func)
                if api in API_GROUPS:
                    _api_reference(result, resolver, api, node, path)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for deco in node.decorator_list:
                    _kopf_decorator(result, resolver, deco)
    return result


def _api_reference(
    result: Scan, resolver: Resolver, api: str, node: ast.Attribute, path: Path
) -> None:
    match = METHOD.match(node.attr)
    if not match:
        return
    verb_word, _namespaced, stem, status, _all = match.groups()
    verb = VERBS[verb_word]
    group = API_GROUPS[api]
    if group != "*custom*":
        resource = _plural(stem) + ("/status" if status else "")
        result.grants.add((group, resource, verb))
        if verb == "list" and _streams(resolver.enclosing_function(node)):
            result.grants.add((group, resource, "watch"))  # a Watch().stream(list call) there
        return
    # CustomObjectsApi: the (group, version, [namespace,] plural) arguments of the calls made
    # with this method inside the enclosing function.
    func = resolver.enclosing_function(node)
    plurals: set[str] | None = None
    groups: set[str] | None = None
    for call in ast.walk(func) if func is not None else []:
        if isinstance(call, ast.Call) and len(call.args) >= 4:
            got_g = resolver.resolve(call.args[0], call)
            plural_arg = call.args[3] if "namespaced" in node.attr else call.args[2]
            got_p = resolver.resolve(plural_arg, call)
            if got_g is not None and got_p is not None:
                groups = (groups or set()) | got_g
                plurals = (plurals or set()) | got_p
    if groups is None or plurals is None:
        result.unresolved.append(f"{path.name}: {node.attr}")
        return
    for g in groups:
        for p in plurals:
            result.grants.add((g, p + ("/status" if status else ""), verb))


def _kopf_decorator(result: Scan, resolver: Resolver, deco: ast.expr) -> None:
    if not isinstance(deco, ast.Call):
        return
    chain = ast.unparse(deco.func)
    if not chain.startswith("kopf."):
        return
    kind = chain.rsplit(".", 1)[-1]
    args = [resolver.resolve(a, deco) for a in deco.args]
    if not args or any(a is None for a in args):
        return  # startup/cleanup/probe handlers name no resource
    values = [next(iter(a)) for a in args if a]
    group, plural = ("", values[0]) if len(values) == 1 else (values[0], values[-1])
    result.kopf_resources.add((group, plural))
    result.grants |= {(group, plural, "list"), (group, plural, "watch")}
    if kind in KOPF_STATEFUL:
        result.grants |= {(group, plural, "patch"), (group, f"{plural}/status", "patch")}


#: Grants the operator's code needs only in some configurations, granted by resource name then:
#: an acas backend whose credential is a Secret reads that one Secret.
CREDENTIAL_GRANTS = {("", "secrets", "get")}

#: The managed egress proxy's objects (backends/egress_proxy.py), granted by name when the chart
#: configures the proxy (config.egressProxy).
PROXY_RESOURCES = {
    (group, resource)
    for _, _, group, resource in egress_proxy.APPLIED + egress_proxy.INTERCEPTION_APPLIED
}


def proxy_role_grants(*, named: bool = False) -> set[Grant]:
    """What the proxy's Role grants: RBAC lets the operator create it only holding all of it.
    ``named``: its rules by resource name (each only for the proxy's own objects) instead."""
    rules = [r for r in egress_proxy.PROXY_ROLE_RULES if ("resourceNames" in r) == named]
    assert all(r.get("resourceNames", [egress_proxy.PROXY_NAME]) == [egress_proxy.PROXY_NAME]
               for r in rules)  # fmt: skip
    return {
        (g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
        for v in rule["verbs"]
    }  # fmt: skip


def proxy_object_grants() -> set[Grant]:
    """Verbs the code uses on the proxy's objects, plus create: server-side apply of a missing
    object is authorized as create (seen on the local cluster's API server)."""
    used = {g for g in scan(skip=PUBLISHER).grants if (g[0], g[1]) in PROXY_RESOURCES}
    assert {v for _, _, v in used} <= {"get", "patch"}, used
    return used | {(g, r, "create") for g, r in PROXY_RESOURCES}


def conversation_access_grants() -> set[Grant]:
    """A bound scope's Role and RoleBinding (reconcile/access.py): server-side applied (create
    when missing), and RBAC lets the operator grant in the Role only what it holds itself."""
    scope = SandboxScopeView({"metadata": {"name": "s", "namespace": "n", "uid": "u"}})
    role = access.role_manifest(scope, access.wanted_access(["agent"], ["sbx-a"]))
    held = {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
        for v in rule["verbs"]
    }  # fmt: skip
    rbac = "rbac.authorization.k8s.io"
    return held | {(rbac, r, v) for r in ("roles", "rolebindings") for v in ("create", "patch")}


def expected_grants(*, cluster_wide: bool = True, managed_proxy: bool = False) -> set[Grant]:
    found = scan()
    assert not found.unresolved, (
        f"cannot tell which resources these calls touch: {found.unresolved}"
    )
    assert found.grants >= CREDENTIAL_GRANTS, "the acas credential Secret is no longer read?"
    grants = set(found.grants) - CREDENTIAL_GRANTS
    grants = {g for g in grants if (g[0], g[1]) not in PROXY_RESOURCES}
    if managed_proxy:
        grants |= proxy_role_grants()
    grants |= conversation_access_grants()
    # kopf itself: posts Events for handler outcomes, watches CRDs to notice served resources,
    # and (peering) reads, watches and patches its peering object.
    grants.add(("", "events", "create"))
    grants |= {("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("list", "watch")}
    # Serving named namespaces, kopf lists and watches namespaces to notice them come and go
    # (serving all of them, the operator's publisher does: found above).
    grants |= {("", "namespaces", v) for v in ("list", "watch")}
    peering = "clusterkopfpeerings" if cluster_wide else "kopfpeerings"
    grants |= {("kopf.dev", peering, v) for v in ("get", "list", "watch", "patch")}
    # A status patch needs the status subresource only when the CRD has one; ours do, and kopf
    # writes through it. Resources without a CRD status subresource get no /status grant.
    return grants


def chart_grants(objs: list[dict[str, Any]]) -> set[Grant]:
    roles = by_kind(objs, "ClusterRole") + by_kind(objs, "Role")
    operator_roles = [r for r in roles if not r["metadata"]["name"].endswith("-agent")]
    out: set[Grant] = set()
    for role in operator_roles:
        for rule in role["rules"]:
            if "resourceNames" in rule:
                continue  # per-name grants: see test_acas_credential_secret_is_granted_by_name
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    for v in rule["verbs"]:
                        assert "*" not in (g, r, v), f"wildcard in {role['metadata']['name']}"
                        out.add((g, r, v))
    return out


def test_the_scanner_finds_the_operator_calls() -> None:
    found = scan()
    # Sanity: the scan sees what the operator obviously does.
    assert ("", "pods", "create") in found.grants
    assert ("sandbox-operator.dev", "sandboxes", "list") in found.grants
    assert ("sandbox-operator.dev", "sandboxes", "watch") in found.grants
    assert ("sandbox-operator.dev", "sandboxscopes", "watch") in found.grants


@pytest.mark.parametrize("managed_proxy", [False, True], ids=["no-proxy", "managed-proxy"])
@pytest.mark.parametrize("cluster_wide", [True, False], ids=["all-namespaces", "namespaced"])
def test_chart_rbac_equals_the_verbs_the_operator_uses(
    cluster_wide: bool, managed_proxy: bool, tmp_path: Path
) -> None:
    values = {} if cluster_wide else {"watchNamespaces": "{team-a}"}
    files = [managed_proxy_values(tmp_path)] if managed_proxy else []
    granted = chart_grants(template(values, values_files=files))
    wanted = expected_grants(cluster_wide=cluster_wide, managed_proxy=managed_proxy)
    missing = sorted(wanted - granted)
    extra = sorted(granted - wanted)
    assert not missing, f"the operator calls these but the chart does not grant them: {missing}"
    assert not extra, f"the chart grants these but the operator never uses them: {extra}"


def unpublished(rules: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rules by resource name other than the published ConfigMap's."""
    published = [PUBLISHED_CONFIGMAP]
    return [r for r in rules if r.get("resourceNames", published) != published]


def test_no_secret_access_and_no_escalation() -> None:
    objs = template()
    assert not unpublished(r for role in by_kind(objs, "Role") for r in role["rules"])
    granted = chart_grants(objs)
    assert not {g for g in granted if g[1] in ("secrets", "serviceaccounts/token")}
    assert not {g for g in granted if g[2] in ("escalate", "bind", "impersonate")}
    assert not {g for g in granted if g[1] in ("pods/exec", "pods/attach", "nodes/proxy")}


@pytest.mark.parametrize("namespace", [None, "creds"])
def test_acas_credential_secret_is_granted_by_name(tmp_path: Path, namespace: str | None) -> None:
    """The acas driver reads its credential Secret: get on that one Secret, by name, in its
    namespace (the release's unless the backend names one); no other Secret access."""
    credential: dict[str, Any] = {"source": "secret", "secretName": "acas-sp"}
    if namespace:
        credential["namespace"] = namespace
    objs = template(values_files=[acas_values(tmp_path, credential)], namespace="so-system")
    named = [
        (role["metadata"]["namespace"], rule)
        for role in by_kind(objs, "Role")
        for rule in unpublished(role["rules"])
    ]
    assert named == [
        (
            namespace or "so-system",
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "resourceNames": ["acas-sp"],
                "verbs": ["get"],
            },
        )
    ]
    bindings = [
        b for b in by_kind(objs, "RoleBinding") if b["metadata"]["name"].endswith("acas-west")
    ]
    assert len(bindings) == 1 and bindings[0]["subjects"][0]["namespace"] == "so-system"
    assert not {g for g in chart_grants(objs) if g[1] == "secrets"}


def test_workload_identity_credential_needs_no_secret(tmp_path: Path) -> None:
    objs = template(
        values_files=[acas_values(tmp_path, {"source": "workloadIdentity", "clientId": "x"})]
    )
    assert not unpublished(r for role in by_kind(objs, "Role") for r in role["rules"])


def named_grants(objs: list[dict[str, Any]]) -> dict[tuple[str, str], set[Grant]]:
    """Rules by resource name: {(role kind, resourceName): {(group, resource, verb)}}."""
    out: dict[tuple[str, str], set[Grant]] = {}
    for role in by_kind(objs, "ClusterRole") + by_kind(objs, "Role"):
        for rule in role["rules"]:
            for name in rule.get("resourceNames", []):
                if name == PUBLISHED_CONFIGMAP:
                    continue  # see test_published_configmap_is_granted_by_name
                out.setdefault((role["kind"], name), set()).update(
                    (g, r, v) for g in rule["apiGroups"] for r in rule["resources"]
                    for v in rule["verbs"]
                )  # fmt: skip
    return out


@pytest.mark.parametrize("cluster_wide", [True, False], ids=["all-namespaces", "namespaced"])
def test_managed_egress_proxy_objects_are_granted_by_name(
    cluster_wide: bool, tmp_path: Path
) -> None:
    """With config.egressProxy the operator may create and patch exactly the proxy's objects,
    by their one name, and read its Service; nothing at all without it."""
    values = {} if cluster_wide else {"watchNamespaces": "{team-a,team-b}"}
    values["sealIdlePoolPods"] = "false"  # its by-name grant: below
    objs = template(values, values_files=[managed_proxy_values(tmp_path)])
    kind = "ClusterRole" if cluster_wide else "Role"
    named = named_grants(objs)
    assert set(named) == {(kind, egress_proxy.PROXY_NAME)}
    assert named[(kind, egress_proxy.PROXY_NAME)] == proxy_object_grants()
    # The proxy's Role is within what the operator holds (else RBAC refuses to create it).
    assert proxy_role_grants() <= chart_grants(objs)
    assert proxy_role_grants(named=True) <= named[(kind, egress_proxy.PROXY_NAME)]
    assert ("", "services", "get") in proxy_role_grants(named=True)  # its own Service

    plain = template(values)
    assert not named_grants(plain)
    assert ("", "events", "patch") not in chart_grants(plain)


@pytest.mark.parametrize("cluster_wide", [True, False], ids=["all-namespaces", "namespaced"])
def test_published_configmap_is_granted_by_name(cluster_wide: bool) -> None:
    """The operator reads and applies its backends ConfigMap (reconcile/publish.py), by name,
    where it publishes: each served namespace, all of them when it serves all."""
    used = scan(only=PUBLISHER).grants
    published = {g for g in used if g[1] == "configmaps"}
    assert published == {
        ("", "configmaps", "get"),
        ("", "configmaps", "list"),  # by name across namespaces (a field selector)
        ("", "configmaps", "patch"),
    }
    wanted = published | {("", "configmaps", "create")}  # an apply of a missing one is a create
    values = {} if cluster_wide else {"watchNamespaces": "{team-a,team-b}"}
    objs = template(values, namespace="so-system")
    where: dict[str, set[Grant]] = {}
    for role in by_kind(objs, "Role") + by_kind(objs, "ClusterRole"):
        if role["metadata"]["name"].endswith("-agent") or "agent-" in role["metadata"]["name"]:
            continue
        for rule in role["rules"]:
            if rule.get("resourceNames") == [PUBLISHED_CONFIGMAP]:
                ns = role["metadata"].get("namespace", "*")
                where.setdefault(ns, set()).update(
                    (g, r, v) for g in rule["apiGroups"] for r in rule["resources"]
                    for v in rule["verbs"]
                )  # fmt: skip
    # Serving all namespaces: in every one of them (a ClusterRole), by name.
    expected = {"*"} if cluster_wide else {"team-a", "team-b"}
    assert where == dict.fromkeys(expected, wanted)
    assert not {g for g in chart_grants(objs) if g[1] == "configmaps"}  # nothing unnamed


@pytest.mark.parametrize("cluster_wide", [True, False], ids=["all-namespaces", "namespaced"])
def test_the_seal_policies_are_read_by_name(cluster_wide: bool) -> None:
    """(#36 item 2) The operator watches the two policies sealing idle pool pods and their
    bindings (reconcile/seal.py), by name, cluster-wide (they are cluster-scoped); nothing
    without sealIdlePoolPods."""
    values = {} if cluster_wide else {"watchNamespaces": "{team-a}"}
    named = named_grants(template(values))
    names = ("so-sandbox-operator-sealed-pool-pods", "so-sandbox-operator-sealed-pool-pods-update")
    for name in names:
        assert named[("ClusterRole", name)] == {
            ("admissionregistration.k8s.io", resource, verb)
            for resource in ("validatingadmissionpolicies", "validatingadmissionpolicybindings")
            for verb in ("get", "list", "watch")
        }
    off = named_grants(template({**values, "sealIdlePoolPods": "false"}))
    assert not [k for k in off if k[1] in names]


@pytest.mark.parametrize("cluster_wide", [True, False], ids=["all-namespaces", "namespaced"])
def test_egress_credentials_grant_the_operator_bind_not_the_secrets(
    cluster_wide: bool, tmp_path: Path
) -> None:
    """(#38 item 3) With egressCredentials.enabled the operator may write the proxy's credentials
    RoleBinding (by its one name) and bind the chart's Secrets reader ClusterRole (by its name):
    it never holds get on Secrets beyond the proxy's own CA Secret."""
    values = {} if cluster_wide else {"watchNamespaces": "{team-a,team-b}"}
    values |= {"sealIdlePoolPods": "false", "egressCredentials.enabled": "true"}
    objs = template(values, values_files=[managed_proxy_values(tmp_path)])
    kind = "ClusterRole" if cluster_wide else "Role"
    named = named_grants(objs)
    reader = "so-sandbox-operator-egress-credentials"
    assert named[(kind, CREDENTIALS_BINDING)] == {
        ("rbac.authorization.k8s.io", "rolebindings", "create"),
        ("rbac.authorization.k8s.io", "rolebindings", "patch"),
    }
    assert named[(kind, reader)] == {("rbac.authorization.k8s.io", "clusterroles", "bind")}
    operator = [
        r for role in by_kind(objs, "ClusterRole") + by_kind(objs, "Role")
        if role["metadata"]["name"] != reader for r in role["rules"]
    ]  # fmt: skip
    secrets = [r for r in operator if "secrets" in r["resources"]]
    assert all(r.get("resourceNames") == [egress_proxy.PROXY_NAME] for r in secrets), secrets
    # The binding the operator writes names that ClusterRole (the config the chart renders).
    config = yaml.safe_load(
        next(o for o in objs if o["kind"] == "ConfigMap")["data"]["config.yaml"]
    )
    assert config["egressProxy"]["credentialsClusterRole"] == reader
