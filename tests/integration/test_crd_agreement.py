"""The API server and the models agree on every spec: what the models refuse, the CRD refuses with
a 422 naming the field (not an accepted Sandbox that then fails ``StartupFailed "spec is
invalid"``), and what the CRD accepts, the models accept.

Specs are generated from the models' constraints (hypothesis): a valid base with one to three
fields replaced by values at and across each constraint's edge (control characters, lengths,
signed and oversized quantities, requests against limits, duplicates, globs, system workDirs, IP
literals and metadata names). Every spec is created with ``dryRun=All``, so nothing is stored,
nothing reaches the operator and the run stays fast. A table of the issue's cases comes first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import urllib3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from sandbox_operator.contract import (
    GROUP,
    SANDBOX_KIND,
    SANDBOX_PLURAL,
    SANDBOX_SCOPE_KIND,
    SANDBOX_SCOPE_PLURAL,
    SANDBOX_WARM_POOL_KIND,
    SANDBOX_WARM_POOL_PLURAL,
    VERSION,
    SandboxResourceSpec,
    SandboxScopeResourceSpec,
    SandboxWarmPoolResourceSpec,
)

pytestmark = pytest.mark.integration

Spec = dict[str, Any]

BASE_SANDBOX: Spec = {"scopeRef": "conv", "agentDir": "agent", "kind": "python", "image": "py:1"}
BASE_SCOPE: Spec = {"scope": "tenant", "threadId": "thread"}
BASE_TEMPLATE: Spec = {"kind": "python", "image": "py:1"}

KINDS: dict[str, tuple[str, str]] = {
    SANDBOX_PLURAL: (SANDBOX_KIND, "sbx"),
    SANDBOX_SCOPE_PLURAL: (SANDBOX_SCOPE_KIND, "scope"),
    SANDBOX_WARM_POOL_PLURAL: (SANDBOX_WARM_POOL_KIND, "pool"),
}


def model_accepts(plural: str, spec: Spec) -> bool:
    """What the operator decides when it reads ``spec`` (reconcile/compute.py, pool.py)."""
    try:
        if plural == SANDBOX_PLURAL:
            SandboxResourceSpec.model_validate(spec).sandbox_spec()
        elif plural == SANDBOX_SCOPE_PLURAL:
            SandboxScopeResourceSpec.model_validate(spec)
        else:
            SandboxWarmPoolResourceSpec.model_validate(spec).template.sandbox_spec()
    except ValidationError:
        return False
    return True


Server = Callable[[str, Spec], tuple[bool, str, Spec | None]]


@pytest.fixture
def server(crds: None, namespace: str, custom_objects: client.CustomObjectsApi) -> Server:
    """Create a spec with dryRun=All: (accepted, error body, the defaulted spec when accepted).

    One retry on a dropped connection: another test may be restarting the API server.
    """

    def create(plural: str, spec: Spec) -> tuple[bool, str, Spec | None]:
        kind, name = KINDS[plural]
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": kind,
            "metadata": {"name": name},
            "spec": spec,
        }
        for attempt in range(2):
            try:
                obj = custom_objects.create_namespaced_custom_object(
                    GROUP, VERSION, namespace, plural, body, dry_run="All"
                )
                assert isinstance(obj, dict)
                return True, "", obj["spec"]
            except ApiException as exc:
                if exc.status in (422, 400) or attempt:
                    assert exc.status == 422, (exc.status, exc.body)
                    return False, str(exc.body), None
            except (urllib3.exceptions.HTTPError, ConnectionError):
                if attempt:
                    raise
            time.sleep(3)
        raise AssertionError("unreachable")

    return create


def assert_agree(server: Server, plural: str, spec: Spec) -> str:
    model_ok = model_accepts(plural, spec)
    server_ok, body, stored = server(plural, spec)
    assert server_ok == model_ok, (
        f"API server {'accepted' if server_ok else 'refused'} and the models "
        f"{'accept' if model_ok else 'refuse'} {plural} spec {spec!r}: {body}"
    )
    if stored is not None:  # what the operator reads back (with the CRD's defaults) is valid too
        assert model_accepts(plural, stored), stored
    else:
        assert "spec." in body, body  # the refusal names the field
    return body


# --- the issue's cases, one by one -------------------------------------------------------------

FILES_OUT = {"requires": ["exec", "files_in", "files_out"]}


def out(path: str, name: str | None = None) -> dict[str, str]:
    entry = {"path": path, "mediaType": "text/plain"}
    if name is not None:
        entry["name"] = name
    return entry


RULE: Spec = {"host": "api.example.com", "schemes": ["http"], "methods": ["GET"]}


def rules_spec(**entry: Any) -> Spec:
    """An allowlist spec with one egressRules entry (``None`` drops a field of :data:`RULE`)."""
    merged = {k: v for k, v in {**RULE, **entry}.items() if v is not None}
    return {"egress": "allowlist", "egressRules": [merged]}


ISSUE_CASES: list[tuple[str, Spec, str]] = [
    # Finding 6: accepted by the API server, refused by the models.
    ("agentDir control", {"agentDir": "a\x07b"}, "spec.agentDir"),
    ("agentDir NUL", {"agentDir": "a\x00"}, "spec.agentDir"),
    ("callId control", {"isolationScope": "call", "callId": "c\n1"}, "spec.callId"),
    ("workDir control", {"workDir": "/w\x1b"}, "spec.workDir"),
    # #28 item 6: invisible characters in key parts, a workDir that hides the shell.
    ("agentDir bidi override", {"agentDir": "a\u202eb"}, "spec.agentDir"),
    ("agentDir zero-width space", {"agentDir": "agent\u200b"}, "spec.agentDir"),
    ("callId byte-order mark", {"isolationScope": "call", "callId": "\ufeffc"}, "spec.callId"),
    ("workDir /bin", {"workDir": "/bin"}, "spec.workDir"),
    ("workDir /usr", {"workDir": "/usr"}, "spec.workDir"),
    ("output path control", {**FILES_OUT, "declaredOutputs": [out("a\tb")]}, "path"),
    ("output name control", {**FILES_OUT, "declaredOutputs": [out("a", "b\x7f")]}, "name"),
    ("cpu -1", {"resources": {"limits": {"cpu": -1}}}, "spec.resources.limits.cpu"),
    ("memory -1", {"resources": {"requests": {"memory": -1}}}, "resources.requests.memory"),
    (
        "requests above limits",
        {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}}},
        "spec.resources.requests.cpu",
    ),
    (
        "requests above limits, mixed units",
        {"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": 1073741824}}},
        "spec.resources.requests.memory",
    ),
    (
        "duplicate host",
        {"egress": "allowlist", "egressAllow": ["pypi.org", "pypi.org"]},
        "spec.egressAllow",
    ),
    (
        "duplicate output",
        {**FILES_OUT, "declaredOutputs": [out("a.png"), out("a.png")]},
        "spec.declaredOutputs",
    ),
    (
        "duplicate landing name",
        {**FILES_OUT, "declaredOutputs": [out("a.png"), out("b.png", "a.png")]},
        "spec.declaredOutputs",
    ),
    ("image with a vertical tab", {"image": "py\x0b:1"}, "spec.image"),
    # Finding 7: static bounds.
    ("workDir /proc", {"workDir": "/proc"}, "spec.workDir"),
    ("workDir /sys/x", {"workDir": "/sys/kernel"}, "spec.workDir"),
    ("workDir /etc", {"workDir": "/etc"}, "spec.workDir"),
    ("workDir /var/run", {"workDir": "/var/run/"}, "spec.workDir"),
    ("workDir /", {"workDir": "/"}, "spec.workDir"),
    ("workDir via ..", {"workDir": "/w/../etc"}, "spec.workDir"),
    ("workDir C:\\Windows", {"workDir": "C:\\Windows"}, "spec.workDir"),
    ("workDir c:/windows", {"workDir": "c:/windows/system32"}, "spec.workDir"),
    ("workDir short name", {"workDir": "C:\\PROGRA~1\\x"}, "spec.workDir"),
    (
        "Windows workDir on posix",
        {"workDir": "D:\\work", "requiresOsFamily": "posix"},
        "spec.workDir",
    ),
    ("output glob *", {**FILES_OUT, "declaredOutputs": [out("*")]}, "path"),
    ("output glob **/*", {**FILES_OUT, "declaredOutputs": [out("**/*")]}, "path"),
    ("output glob ?", {**FILES_OUT, "declaredOutputs": [out("a?.txt")]}, "path"),
    ("output glob [", {**FILES_OUT, "declaredOutputs": [out("a", "[ab].txt")]}, "name"),
    ("output drive", {**FILES_OUT, "declaredOutputs": [out("C:x")]}, "path"),
    ("egress IPv4", {"egress": "allowlist", "egressAllow": ["169.254.169.254"]}, "egressAllow"),
    ("egress IPv6", {"egress": "allowlist", "egressAllow": ["fd00:ec2::254"]}, "egressAllow"),
    ("egress hex IP", {"egress": "allowlist", "egressAllow": ["0x7f.0x1"]}, "egressAllow"),
    ("egress metadata", {"egress": "allowlist", "egressAllow": ["metadata"]}, "egressAllow"),
    (
        "egress GCE metadata",
        {"egress": "allowlist", "egressAllow": ["metadata.google.internal"]},
        "egressAllow",
    ),
    (
        "egress wildcard over metadata",
        {"egress": "allowlist", "egressAllow": ["*.internal"]},
        "egressAllow",
    ),
    (
        "egress EC2 name",
        {"egress": "allowlist", "egressAllow": ["instance-data.ec2.internal"]},
        "egressAllow",
    ),
    ("egress loopback", {"egress": "allowlist", "egressAllow": ["a.localhost"]}, "egressAllow"),
    # egressRules (#38 item 2): what the proxy cannot enforce is refused naming the field
    ("rule lower-case method", rules_spec(methods=["get"]), "spec.egressRules[0].methods[0]"),
    ("rule CONNECT", rules_spec(methods=["CONNECT"]), "spec.egressRules[0].methods[0]"),
    ("rule dot segment", rules_spec(paths=["/a/../b"]), "spec.egressRules[0].paths[0]"),
    ("rule ..; segment", rules_spec(paths=["/a/..;/b"]), "spec.egressRules[0].paths[0]"),
    ("rule encoded dot", rules_spec(paths=["/a/%2e%2e/b"]), "spec.egressRules[0].paths[0]"),
    ("rule inner *", rules_spec(paths=["/a/*/b"]), "spec.egressRules[0].paths[0]"),
    ("rule prefix a*", rules_spec(paths=["/a*"]), "spec.egressRules[0].paths[0]"),
    ("rule ftp", rules_spec(schemes=["ftp"]), "spec.egressRules[0].schemes[0]"),
    ("rule host only", rules_spec(methods=None), "spec.egressRules[0]"),
    ("rule IP host", rules_spec(host="10.0.0.1"), "spec.egressRules[0].host"),
    ("rule without allowlist", {**rules_spec(), "egress": "closed"}, "spec.egressRules"),
    (
        "rule host twice",
        {"egress": "allowlist", "egressRules": [RULE, {**RULE, "methods": ["PUT"]}]},
        "spec.egressRules",
    ),
    (
        "rule host also in egressAllow",
        {**rules_spec(), "egressAllow": ["api.example.com"]},
        "spec.egressRules",
    ),
]


@pytest.mark.parametrize(
    ("spec", "field"), [(c[1], c[2]) for c in ISSUE_CASES], ids=[c[0] for c in ISSUE_CASES]
)
def test_the_issue_cases_are_refused_by_the_api_server_naming_the_field(
    server: Server, spec: Spec, field: str
) -> None:
    body = assert_agree(server, SANDBOX_PLURAL, {**BASE_SANDBOX, **spec})
    assert field in body, body


@pytest.mark.parametrize(
    "spec",
    [
        {"workDir": "/workspace/"},
        {"workDir": "/var/runner"},
        {"workDir": "/procs"},
        {"workDir": "C:\\work"},
        {"resources": {"requests": {"cpu": "1"}, "limits": {"cpu": 1}}},
        {"resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "1073741824"}}},
        {"egress": "allowlist", "egressAllow": ["pypi.org", "*.pythonhosted.org", "1a.2b"]},
        {**FILES_OUT, "declaredOutputs": [out("a.png"), out("a.png", "b.png")]},
        {**rules_spec(paths=["/v1/*", "/health", "/a/.well-known"]), "egressAllow": ["pypi.org"]},
        rules_spec(methods=["GET", "PROPFIND"]),
        rules_spec(schemes=["http", "https"]),
    ],
)
def test_neighbours_of_the_refused_cases_are_accepted(server: Server, spec: Spec) -> None:
    assert_agree(server, SANDBOX_PLURAL, {**BASE_SANDBOX, **spec})
    assert model_accepts(SANDBOX_PLURAL, {**BASE_SANDBOX, **spec})


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"scope": "t\x00"}, "spec.scope"),
        ({"threadId": "a\nb"}, "spec.threadId"),
    ],
)
def test_scope_key_parts_with_control_characters_are_refused(
    server: Server, spec: Spec, field: str
) -> None:
    body = assert_agree(server, SANDBOX_SCOPE_PLURAL, {**BASE_SCOPE, **spec})
    assert field in body


@pytest.mark.parametrize(
    ("template", "field"),
    [
        ({"workDir": "/proc"}, "spec.template.workDir"),
        ({"resources": {"limits": {"cpu": -1}}}, "spec.template.resources.limits.cpu"),
        (
            {"resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "1Mi"}}},
            "spec.template.resources.requests.memory",
        ),
        (
            {"egress": "allowlist", "egressAllow": ["a.org", "a.org"]},
            "spec.template.egressAllow",
        ),
        ({"egress": "allowlist", "egressAllow": ["10.0.0.1"]}, "spec.template.egressAllow"),
    ],
)
def test_pool_templates_are_held_to_the_same_rules(
    server: Server, template: Spec, field: str
) -> None:
    body = assert_agree(
        server, SANDBOX_WARM_POOL_PLURAL, {"template": {**BASE_TEMPLATE, **template}}
    )
    assert field in body


# --- generated specs ----------------------------------------------------------------------------

#: Characters that sit on the constraints' edges: controls, whitespace, separators, globs, drive
#: colons, dots, Unicode spaces, and plain letters.
EDGE_CHARS = "\x00\x07\t\n\x0b\x1b\x1f\x7f\x85\xa0\u3000\u202e\u200b\ufeff /\\:*?[].~-_aZ09é"
edge_text = st.text(alphabet=EDGE_CHARS, min_size=0, max_size=6)
key_text = st.one_of(
    edge_text, st.just("x" * 253), st.just("x" * 254), st.sampled_from(["agent", "a b", ""])
)

quantity_text = st.builds(
    lambda sign, whole, frac, suffix: f"{sign}{whole}{frac}{suffix}",
    st.sampled_from(["", "", "-", "+"]),
    st.sampled_from(["0", "1", "2", "10", "512", "1024", "007", "", "9" * 25]),
    st.sampled_from(["", "", ".5", ".000000001", ".0000000001", ".", "e3"]),
    st.sampled_from(["", "m", "k", "M", "G", "Gi", "Mi", "Ki", "Pi", "P", "i", "mi", " "]),
)
quantity = st.one_of(
    quantity_text,
    st.integers(min_value=-3, max_value=2**64),
    st.sampled_from([2**63 - 1, 2**63, "1" * 64, "1" * 65]),
)
resource_list = st.fixed_dictionaries({}, optional={"cpu": quantity, "memory": quantity})
resources = st.fixed_dictionaries({}, optional={"requests": resource_list, "limits": resource_list})

work_dir = st.one_of(
    st.builds(
        lambda root, parts, sep: root + sep.join(parts),
        st.sampled_from(["/", "C:\\", "c:/", "D:", "", "\\\\srv\\"]),
        st.lists(
            st.sampled_from(
                [
                    "workspace",
                    "proc",
                    "etc",
                    "var",
                    "run",
                    "dev",
                    "Windows",
                    "program files (x86)",
                    "PROGRA~1",
                    "work.",
                    "work ",
                    "a:b",
                    ".",
                    "..",
                    "",
                    "tmp",
                    "w\x07",
                ]
            ),
            max_size=3,
        ),
        st.sampled_from(["/", "\\"]),
    ),
    edge_text.map(lambda t: "/" + t),
)

hosts = st.sampled_from(
    [
        "pypi.org",
        "*.pythonhosted.org",
        "example.com",
        "1.2.3.4",
        "169.254.169.254",
        "2130706433",
        "0x7f.0x1",
        "x.0xzz",
        "1a.2b",
        "metadata",
        "localhost",
        "a.localhost",
        "metadata.google.internal",
        "metadata.goog",
        "*.goog",
        "*.internal",
        "*.google.internal",
        "instance-data",
        "instance-data.ec2.internal",
        "[::1]",
        "::1",
        "Example.com",
        "a..b",
        "*",
        "*.*.a.org",
        "a.org:443",
    ]
)
output_paths = st.one_of(
    st.sampled_from(
        ["a.png", "out/a.png", "*", "**/*", "a?.txt", "[ab].txt", "C:x", "/abs", "a/../b", "./a"]
    ),
    st.sampled_from(["a\\b", "a//b", "", "a/", "b.png"]),
    edge_text,
)
outputs = st.lists(
    st.builds(
        lambda path, name: out(path, name),
        output_paths,
        st.none() | output_paths,
    ),
    max_size=3,
)

#: One hostile field each, with what it needs to be meaningful (egress allowlist, files_out).
sandbox_mutations = st.one_of(
    key_text.map(lambda v: {"agentDir": v}),
    key_text.map(lambda v: {"isolationScope": "call", "callId": v}),
    key_text.map(lambda v: {"callId": v}),
    work_dir.map(lambda v: {"workDir": v}),
    st.tuples(work_dir, st.sampled_from(["posix", "windows"])).map(
        lambda t: {"workDir": t[0], "requiresOsFamily": t[1]}
    ),
    edge_text.map(lambda v: {"image": "py" + v}),
    resources.map(lambda v: {"resources": v}),
    st.lists(hosts, max_size=3).map(lambda v: {"egress": "allowlist", "egressAllow": v}),
    outputs.map(lambda v: {**FILES_OUT, "declaredOutputs": v}),
    key_text.map(lambda v: {"scopeRef": v}),
    edge_text.map(lambda v: {"kind": "k" + v}),
    st.fixed_dictionaries(
        {},
        optional={
            name: st.integers(min_value=-1, max_value=700_000)
            for name in ("startupTimeoutSeconds", "ttlSeconds", "idleTimeoutSeconds")
        },
    ).map(lambda v: {"lifetime": v}),
    st.fixed_dictionaries(
        {},
        optional={
            name: st.sampled_from([-1, 0, 1, 64, 2**20, 2**40, 2**42 + 1])
            for name in ("maxBytesPerFile", "maxTotalBytes", "maxFiles")
        },
    ).map(lambda v: {"filesOut": v}),
)
sandbox_specs = st.lists(sandbox_mutations, min_size=1, max_size=3).map(
    lambda changes: {k: v for change in [BASE_SANDBOX, *changes] for k, v in change.items()}
)
scope_specs = st.fixed_dictionaries({"scope": key_text, "threadId": key_text})
template_mutations = st.one_of(
    work_dir.map(lambda v: {"workDir": v}),
    resources.map(lambda v: {"resources": v}),
    st.lists(hosts, max_size=3).map(lambda v: {"egress": "allowlist", "egressAllow": v}),
    edge_text.map(lambda v: {"image": "py" + v}),
)
pool_specs = st.lists(template_mutations, min_size=1, max_size=2).map(
    lambda changes: {
        "template": {k: v for change in [BASE_TEMPLATE, *changes] for k, v in change.items()}
    }
)

GENERATED = settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@GENERATED
@given(spec=sandbox_specs)
def test_generated_sandbox_specs_the_api_server_and_the_models_agree(
    server: Server, spec: Spec
) -> None:
    assert_agree(server, SANDBOX_PLURAL, spec)


@settings(GENERATED, max_examples=80)
@given(spec=scope_specs)
def test_generated_scope_specs_the_api_server_and_the_models_agree(
    server: Server, spec: Spec
) -> None:
    assert_agree(server, SANDBOX_SCOPE_PLURAL, spec)


@settings(GENERATED, max_examples=120)
@given(spec=pool_specs)
def test_generated_pool_specs_the_api_server_and_the_models_agree(
    server: Server, spec: Spec
) -> None:
    assert_agree(server, SANDBOX_WARM_POOL_PLURAL, spec)
