"""Unit tests of the generated CRDs: drift, structure, and the CEL rules for each invariant."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from sandbox_operator import crdgen
from sandbox_operator.contract import (
    ISOLATION_LADDER,
    Capability,
    Egress,
    IsolationScope,
    SandboxResourceSpec,
    SandboxResourceStatus,
    SandboxScopeResourceSpec,
    SandboxScopeResourceStatus,
)
from tests.fixtures.crds import (
    BASE,
    CRD_DIR,
    ROOT,
    SANDBOX_FILE,
    evaluate,
    load,
    root_schema,
    rules,
    spec_rules_pass,
    spec_schema,
    spec_transition_rules_pass,
)

SCOPE_FILE = "sandboxscopes.sandbox-operator.dev.yaml"
POOL_FILE = "sandboxwarmpools.sandbox-operator.dev.yaml"


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for key, child in node.get("properties", {}).items():
        yield from walk(child, f"{path}.{key}")
    if "items" in node:
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


# --- drift and determinism --------------------------------------------------------------------


@pytest.mark.parametrize("name", [SANDBOX_FILE, SCOPE_FILE, POOL_FILE])
def test_committed_yaml_matches_the_generator(name: str) -> None:
    generated = crdgen.all_crds()
    assert set(generated) == {SANDBOX_FILE, SCOPE_FILE, POOL_FILE}
    committed = (CRD_DIR / name).read_text(encoding="utf-8")
    assert committed == crdgen.render(generated[name]), (
        f"crds/{name} is out of date with the contract models: run `make crds` and commit it"
    )


def test_generation_is_byte_identical_across_hash_seeds(tmp_path: Path) -> None:
    outputs = []
    for seed in ("0", "4242"):
        out = tmp_path / seed
        code = (
            "import sys; from pathlib import Path; from sandbox_operator.crdgen import write_all;"
            f"write_all(Path({str(out)!r}))"
        )
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT)
        outputs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    assert outputs[0] == outputs[1]
    assert outputs[0][SANDBOX_FILE] == (CRD_DIR / SANDBOX_FILE).read_bytes()


# --- identity ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, kind, plural, short",
    [
        (SANDBOX_FILE, "Sandbox", "sandboxes", "sbx"),
        (SCOPE_FILE, "SandboxScope", "sandboxscopes", "sbxs"),
    ],
)
def test_crd_identity(name: str, kind: str, plural: str, short: str) -> None:
    crd = load(name)
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == f"{plural}.sandbox-operator.dev"
    spec = crd["spec"]
    assert spec["group"] == "sandbox-operator.dev"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == kind
    assert spec["names"]["plural"] == plural
    assert spec["names"]["shortNames"] == [short]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    assert root_schema(crd)["required"] == ["spec"]


def test_sandbox_printer_columns() -> None:
    (version,) = load(SANDBOX_FILE)["spec"]["versions"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    default = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert default == ["Ready", "Reason", "Backend", "Isolation", "Suspended", "Age"]
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Reason"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].reason'
    assert columns["Backend"]["jsonPath"] == ".status.backend"
    assert columns["Isolation"]["jsonPath"] == ".status.isolation"
    # Why it is suspended (spec or idle), empty while it is not.
    assert columns["Suspended"]["jsonPath"] == ".status.suspendedBy"
    assert columns["Age"] == {
        "name": "Age",
        "type": "date",
        "jsonPath": ".metadata.creationTimestamp",
    }


# --- structural schema ------------------------------------------------------------------------

FORBIDDEN = {"$ref", "$defs", "title", "uniqueItems", "const", "examples"}


@pytest.mark.parametrize("name", [SANDBOX_FILE, SCOPE_FILE])
def test_schemas_are_structural_and_documented(name: str) -> None:
    for path, node in walk(root_schema(load(name))):
        assert not FORBIDDEN & set(node), f"{path}: {FORBIDDEN & set(node)}"
        assert set(node) <= crdgen.ALLOWED_KEYWORDS, path
        if path == ".metadata":
            assert node == {"type": "object"}  # the API server allows nothing else here
            continue
        if "additionalProperties" in node:
            # A map (spec.labels): a value schema, never beside properties, bounded in size.
            assert isinstance(node["additionalProperties"], dict), path
            assert "properties" not in node and "maxProperties" in node, path
        if path.endswith("{}"):
            assert node.get("type") == "string", path  # a map's values: described by the map
            continue
        assert node.get("description"), f"{path} has no description"
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}]
        else:
            assert node.get("type") in {"object", "array", "string", "integer", "boolean"}, path
            assert "anyOf" not in node, path
        if node.get("type") == "object" and path:
            assert "properties" in node or "additionalProperties" in node, path
        for required in node.get("required", []):
            assert required in node["properties"], f"{path}: required {required} undefined"


@pytest.mark.parametrize("name", [SANDBOX_FILE, SCOPE_FILE])
def test_every_list_and_string_is_bounded_for_cel_cost(name: str) -> None:
    for path, node in walk(root_schema(load(name))):
        if not path.startswith((".spec", ".status")):
            continue
        if node.get("type") == "array":
            assert "maxItems" in node, f"{path} has no maxItems"
        if (
            node.get("type") == "string"
            and "enum" not in node
            and node.get("format") != "date-time"
        ):
            assert "maxLength" in node, f"{path} has no maxLength"


@pytest.mark.parametrize(
    "name, model, part",
    [
        (SANDBOX_FILE, SandboxResourceSpec, "spec"),
        (SANDBOX_FILE, SandboxResourceStatus, "status"),
        (SCOPE_FILE, SandboxScopeResourceSpec, "spec"),
        (SCOPE_FILE, SandboxScopeResourceStatus, "status"),
    ],
)
def test_schema_fields_are_the_model_fields(name: str, model: Any, part: str) -> None:
    schema = root_schema(load(name))["properties"][part]
    aliases = {f.alias or n for n, f in model.model_fields.items()}
    assert set(schema["properties"]) == aliases
    required = {f.alias or n for n, f in model.model_fields.items() if f.is_required()}
    assert set(schema.get("required", [])) == required


def test_enums_match_the_contract() -> None:
    props = spec_schema(SANDBOX_FILE)["properties"]
    ladder = [r.value for r in ISOLATION_LADDER]
    assert props["minIsolation"]["enum"] == ladder
    assert props["egress"]["enum"] == [e.value for e in Egress]
    assert props["isolationScope"]["enum"] == [s.value for s in IsolationScope]
    assert props["requires"]["items"]["enum"] == [c.value for c in Capability]
    assert props["requires"]["x-kubernetes-list-type"] == "set"
    assert "process" not in props["minIsolation"]["enum"]
    status = root_schema(load(SANDBOX_FILE))["properties"]["status"]["properties"]
    assert status["isolation"]["enum"] == ladder
    assert status["effectiveFloor"]["enum"] == ladder
    scope = spec_schema(SCOPE_FILE)["properties"]
    assert scope["minIsolation"]["enum"] == ladder


def test_defaults_match_the_models() -> None:
    props = spec_schema(SANDBOX_FILE)["properties"]
    assert props["egress"]["default"] == "closed"
    assert props["requires"]["default"] == ["exec", "files_in"]
    assert props["isolationScope"]["default"] == "conversation"
    assert props["callId"]["default"] == ""
    assert props["filesIn"]["default"] == {
        "maxBytesPerFile": 8 * 1024 * 1024,
        "maxTotalBytes": 32 * 1024 * 1024,
        "maxFiles": 64,
    }
    # A spec carrying exactly the CRD's defaults is what the models build from nothing.
    defaults = {k: v["default"] for k, v in props.items() if "default" in v}
    minimal = {"scopeRef": "c", "agentDir": "a", "kind": "python", "image": "py:1"}
    assert SandboxResourceSpec.model_validate({**minimal, **defaults}) == (
        SandboxResourceSpec.model_validate(minimal)
    )


def test_resources_have_no_crd_defaults_and_the_descriptions_state_them() -> None:
    # A default here would be stored in every object and look stated, so the host's defaults
    # could never apply: what is left out stays out, and the descriptions say what it gets.
    resources = spec_schema(SANDBOX_FILE)["properties"]["resources"]
    assert all("default" not in node for _, node in walk(resources))
    assert "10m cpu and 32Mi memory" in resources["description"]
    assert "1 cpu and 512Mi memory" in resources["description"]
    assert "ResourcesExceedCeiling" in resources["description"]
    props = resources["properties"]
    assert "10m cpu and 32Mi memory" in props["requests"]["description"]
    assert "capped at the limit" in props["requests"]["description"]
    assert "1 cpu and 512Mi memory" in props["limits"]["description"]
    for part in ("requests", "limits"):
        for r in ("cpu", "memory"):
            node = props[part]["properties"][r]
            assert node["x-kubernetes-int-or-string"] and node["pattern"], (part, r)


def test_status_has_no_defaults_and_conditions_are_a_map() -> None:
    for name in (SANDBOX_FILE, SCOPE_FILE):
        status = root_schema(load(name))["properties"]["status"]
        assert all("default" not in node for _, node in walk(status))
        conditions = status["properties"]["conditions"]
        assert conditions["x-kubernetes-list-type"] == "map"
        assert conditions["x-kubernetes-list-map-keys"] == ["type"]
        assert "type" in conditions["items"]["required"]


# --- CEL rules: present for each invariant ----------------------------------------------------


def test_cel_rules_present_for_each_sandbox_invariant() -> None:
    spec = spec_schema(SANDBOX_FILE)
    spec_rules = rules(spec)
    assert any("egressAllow" in r and "'allowlist'" in r for r in spec_rules)
    assert any("callId" in r and "'call'" in r for r in spec_rules)
    for field in ("scopeRef", "agentDir", "callId"):
        assert rules(spec["properties"][field]) == ["self == oldSelf"], field
    assert rules(spec["properties"]["lifetime"])
    assert rules(spec["properties"]["filesIn"]) and rules(spec["properties"]["filesOut"])


def test_cel_rule_makes_the_scope_spec_immutable() -> None:
    assert rules(spec_schema(SCOPE_FILE)) == ["self == oldSelf"]


# --- CEL rules: evaluated (cel-python) --------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"egress": "allowlist", "egressAllow": ["pypi.org"]},
        {"egress": "allowlist", "egressAllow": []},
        {"egressAllow": ["pypi.org"]},
        {"egress": "unrestricted", "egressAllow": ["pypi.org"]},
        {"isolationScope": "call", "callId": "c-1"},
        {"isolationScope": "call", "callId": ""},
        {"callId": "c-1"},
        {
            "requires": ["exec", "files_out"],
            "declaredOutputs": [{"path": "a", "mediaType": "text/plain"}],
        },
        {"declaredOutputs": [{"path": "a", "mediaType": "text/plain"}]},
        {
            "requires": ["files_out"],
            "declaredOutputs": [
                {"path": "a", "mediaType": "text/plain"},
                {"path": "b", "mediaType": "text/plain"},
            ],
        },
    ],
)
def test_cel_rules_and_models_agree(change: dict[str, Any]) -> None:
    obj = {**BASE, **change}
    try:
        SandboxResourceSpec.model_validate(obj)
        model_ok = True
    except ValidationError:
        model_ok = False
    assert spec_rules_pass(obj) == model_ok


def test_immutability_transition_rules() -> None:
    spec = spec_schema(SANDBOX_FILE)
    for field, old, new in [("scopeRef", "a", "b"), ("agentDir", "x", "y"), ("callId", "", "c")]:
        (rule,) = rules(spec["properties"][field])
        assert evaluate(rule, old, old)
        assert not evaluate(rule, new, old)
    (scope_rule,) = rules(spec_schema(SCOPE_FILE))
    before = {"scope": "t", "threadId": "1", "minIsolation": "microvm"}
    assert evaluate(scope_rule, before, before)
    assert not evaluate(scope_rule, {**before, "minIsolation": "container"}, before)
    assert not evaluate(scope_rule, {**before, "threadId": "2"}, before)


@pytest.mark.parametrize(
    ("change", "allowed"),
    [
        ({}, True),
        ({"lifetime": {"ttlSeconds": 60}}, True),
        ({"image": "py:2"}, False),
        ({"egress": "unrestricted"}, False),
        ({"requires": ["exec"]}, False),
        ({"minIsolation": "microvm"}, False),  # added
        ({"filesOut": {"maxBytesPerFile": 2, "maxTotalBytes": 2, "maxFiles": 1}}, False),
    ],
)
def test_only_the_lifetime_may_change_after_creation(change: dict[str, Any], allowed: bool) -> None:
    old = {**BASE, "lifetime": {"ttlSeconds": 30}}
    assert spec_transition_rules_pass({**old, **change}, old) == allowed
    # A field present at creation cannot be removed either.
    with_floor = {**old, "minIsolation": "vm"}
    assert not spec_transition_rules_pass(old, with_floor)


@pytest.mark.parametrize(
    "path, ok", [("a.png", True), ("out/a.png", True), ("a/../b", False), ("./a", False)]
)
def test_output_path_rule(path: str, ok: bool) -> None:
    items = spec_schema(SANDBOX_FILE)["properties"]["declaredOutputs"]["items"]
    (rule,) = rules(items["properties"]["path"])
    assert evaluate(rule, path) == ok


def test_nested_object_rules() -> None:
    props = spec_schema(SANDBOX_FILE)["properties"]
    (limits_rule,) = rules(props["filesIn"])
    assert evaluate(limits_rule, {"maxBytesPerFile": 1, "maxTotalBytes": 2, "maxFiles": 1})
    assert not evaluate(limits_rule, {"maxBytesPerFile": 3, "maxTotalBytes": 2, "maxFiles": 1})
    (lifetime_rule,) = rules(props["lifetime"])
    assert evaluate(
        lifetime_rule, {"startupTimeoutSeconds": 1, "ttlSeconds": 10, "idleTimeoutSeconds": 10}
    )
    assert not evaluate(
        lifetime_rule, {"startupTimeoutSeconds": 1, "ttlSeconds": 10, "idleTimeoutSeconds": 11}
    )


# --- issue 13: the constraints the models hold, carried into every CRD that holds the field ---


def workload_node(where: str) -> dict[str, Any]:
    """The Sandbox spec or the SandboxWarmPool template: both hold the workload fields."""
    if where == "sandbox":
        return spec_schema(SANDBOX_FILE)
    template: dict[str, Any] = spec_schema(POOL_FILE)["properties"]["template"]
    return template


@pytest.mark.parametrize("where", ["sandbox", "template"])
def test_workload_fields_carry_the_models_static_rules(where: str) -> None:
    node = workload_node(where)
    props = node["properties"]
    assert len(rules(props["workDir"])) == len(crdgen.WORK_DIR_RULES), where
    assert props["egressAllow"]["x-kubernetes-list-type"] == "set", where
    assert len(rules(props["egressAllow"]["items"])) == len(crdgen.EGRESS_HOST_RULES), where
    resource_rules = rules(props["resources"])
    assert [
        ("quantity(" in r and f"requests.{n}" in r)
        for r, n in zip(resource_rules, ("cpu", "memory"), strict=True)
    ] == [True, True]
    for part in ("requests", "limits"):
        for name in ("cpu", "memory"):
            quantity = props["resources"]["properties"][part]["properties"][name]
            assert quantity["minimum"] == 0 and quantity["maxLength"] == 64, (where, part, name)
    assert any("requiresOsFamily" in r for r in rules(node)), where
    assert "\\x00-\\x1f" in props["workDir"]["pattern"]


def test_key_parts_and_outputs_refuse_control_characters_and_globs_by_pattern() -> None:
    import re

    sandbox = spec_schema(SANDBOX_FILE)["properties"]
    scope = spec_schema(SCOPE_FILE)["properties"]
    for node in (sandbox["agentDir"], sandbox["callId"], scope["scope"], scope["threadId"]):
        assert re.search(node["pattern"], "a\x07") is None
        assert re.search(node["pattern"], "agent-1 é") is not None
        for invisible in ("\u202e", "\u200b", "\ufeff", "\x85"):  # #28 item 6
            assert re.search(node["pattern"], f"a{invisible}b") is None, repr(invisible)
    output = sandbox["declaredOutputs"]
    assert rules(output) == [crdgen.DECLARED_OUTPUTS_RULES[0]["rule"]]
    for field in ("path", "name"):
        pattern = output["items"]["properties"][field]["pattern"]
        for bad in ("*", "a/*.png", "a?", "[a]", "a\tb", "a\\b", "/a"):
            assert re.search(pattern, bad) is None, (field, bad)
        assert re.search(pattern, "out/a.png") is not None


WORK_DIRS = [
    "/workspace",
    "/workspace/",
    "/procs",
    "/proc",
    "/proc/1",
    "/var/run",
    "/var/runner",
    "/bin",
    "/usr/bin/x",
    "/usr",
    "/usr/src/app",
    "/var",
    "/var/lib/app",
    "/",
    "/w/../etc",
    "//etc",
    "/a/./b",
    "C:\\work",
    "C:\\",
    "C:\\Windows",
    "c:/program files (x86)/x",
    "C:\\PROGRA~1",
    "C:\\work.",
    "C:\\a:b",
]


@pytest.mark.parametrize("work_dir", WORK_DIRS)
def test_work_dir_rules_and_the_model_agree(work_dir: str) -> None:
    from sandbox_operator.contract.workdir import work_dir_problem

    node = spec_schema(SANDBOX_FILE)["properties"]["workDir"]
    cel_ok = all(evaluate(r, work_dir) for r in rules(node))
    assert cel_ok == (work_dir_problem(work_dir) is None)


@pytest.mark.parametrize(
    "host",
    [
        "pypi.org",
        "*.pythonhosted.org",
        "1a.2b",
        "169.254.169.254",
        "0x7f.0x1",
        "metadata",
        "metadata.google.internal",
        "instance-data.ec2.internal",
        "a.localhost",
    ],
)
def test_egress_host_rules_and_the_model_agree(host: str) -> None:
    from sandbox_operator.contract.egresshosts import egress_host_problem

    items = spec_schema(SANDBOX_FILE)["properties"]["egressAllow"]["items"]
    # The wildcard rule needs CEL's strings extension (substring), which cel-python lacks; the
    # integration test (tests/integration/test_crd_agreement.py) runs it on the API server.
    plain = [r for r in rules(items) if "substring" not in r]
    assert all(evaluate(r, host) for r in plain) == (egress_host_problem(host) is None)


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/*",
        "/v1/*",
        "/v1/models",
        "/a/.well-known",
        "/..a",
        "/a%20b",
        "/a/../b",
        "/a/./b",
        "/a/..;/b",
        "/a/%2e%2e/b",
        "/a/%2E",
        "/a%2fb",
        "/a%5Cb",
        "/a*",
        "/a/*/b",
        "/a?x",
        "/a\\b",
        "a/b",
    ],
)
def test_egress_rule_path_rules_and_the_model_agree(path: str) -> None:
    import re

    from sandbox_operator.contract.egressrules import PATH_PATTERN, egress_path_problem

    node = spec_schema(SANDBOX_FILE)["properties"]["egressRules"]["items"]["properties"]["paths"]
    items = node["items"]
    crd_ok = re.search(items["pattern"], path) is not None and all(
        evaluate(r, path) for r in rules(items)
    )
    model_ok = re.search(PATH_PATTERN, path) is not None and egress_path_problem(path) is None
    assert crd_ok == model_ok


@pytest.mark.parametrize(
    ("entry", "ok"),
    [
        ({"host": "a.example", "schemes": ["http"], "methods": ["GET"]}, True),
        ({"host": "a.example", "schemes": ["http"], "paths": ["/x"]}, True),
        ({"host": "a.example", "schemes": ["http"]}, False),
        ({"host": "a.example", "schemes": ["https"], "methods": ["GET"]}, True),
        ({"host": "a.example", "schemes": ["http", "https"], "methods": ["GET"]}, True),
    ],
)
def test_egress_rule_entry_rules_refuse_what_the_proxy_cannot_enforce(
    entry: dict[str, Any], ok: bool
) -> None:
    node = spec_schema(SANDBOX_FILE)["properties"]["egressRules"]["items"]
    assert all(evaluate(r, entry) for r in rules(node)) == ok


def test_egress_rule_methods_refuse_connect() -> None:
    node = spec_schema(SANDBOX_FILE)["properties"]["egressRules"]["items"]["properties"]
    items = node["methods"]["items"]
    assert [evaluate(r, "CONNECT") for r in rules(items)] == [False]
    assert [evaluate(r, "GET") for r in rules(items)] == [True]
