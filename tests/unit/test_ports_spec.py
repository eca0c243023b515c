"""spec.ports (docs/ports.md): the model and the CRD's CEL agree on what a port may be, the pod
names its container ports by slot, and the status shows each http port's URL once a router is
configured."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from sandbox_operator.backends.base import EnsureRequest, SandboxRef
from sandbox_operator.backends.runtimeclass import build_pod
from sandbox_operator.config import OperatorConfig, RuntimeClassBackendConfig
from sandbox_operator.contract import IsolationScope, SandboxKey, SandboxResourceSpec, SandboxSpec
from sandbox_operator.contract.ports import port_slot_name
from sandbox_operator.reconcile.compute import port_fields
from tests.fixtures.crds import BASE, SANDBOX_FILE, evaluate, rules, spec_schema

WEB = {"name": "web", "port": 8080}


def _ports_schema() -> dict[str, Any]:
    ports: dict[str, Any] = spec_schema(SANDBOX_FILE)["properties"]["ports"]
    return ports


def _crd_accepts(ports: list[dict[str, Any]]) -> bool:
    """The CRD's structural bounds and CEL rules on spec.ports, as the API server runs them."""
    import re

    schema = _ports_schema()
    if len(ports) > schema["maxItems"]:
        return False
    item = schema["items"]
    for port in ports:
        name = port["name"]
        if not (1 <= len(name) <= item["properties"]["name"]["maxLength"]):
            return False
        if not re.fullmatch(item["properties"]["name"]["pattern"].strip("^$"), name):
            return False
        number = item["properties"]["port"]
        if not number["minimum"] <= port["port"] <= number["maximum"]:
            return False
        if port.get("protocol", "http") not in item["properties"]["protocol"]["enum"]:
            return False
    return all(evaluate(rule, ports) for rule in rules(schema))


def _model_accepts(ports: list[dict[str, Any]]) -> bool:
    try:
        SandboxResourceSpec.model_validate({**BASE, "ports": ports})
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize(
    "ports",
    [
        [WEB],
        [WEB, {"name": "mcp", "port": 9000, "protocol": "tcp"}],
        [WEB, {"name": "web", "port": 9000}],  # a name twice
        [WEB, {"name": "other", "port": 8080}],  # a number twice
        [{"name": "Web", "port": 80}],  # upper case
        [{"name": "8080", "port": 80}],  # no letter first
        [{"name": "a--b", "port": 80}],  # a double hyphen Kubernetes refuses on a pod
        [{"name": "web-", "port": 80}],
        [{"name": "a" * 16, "port": 80}],  # longer than a port name may be
        [{"name": "web", "port": 0}],
        [{"name": "web", "port": 65536}],
        [{"name": "web", "port": 80, "protocol": "udp"}],
        [{"name": f"p{i}", "port": 8000 + i} for i in range(9)],  # more than the slots
    ],
)
def test_the_crd_and_the_model_agree_on_ports(ports: list[dict[str, Any]]) -> None:
    assert _crd_accepts(ports) == _model_accepts(ports)


def test_duplicates_are_refused_naming_what_is_twice() -> None:
    with pytest.raises(ValidationError, match="name web more than once"):
        SandboxSpec.model_validate({"kind": "k", "image": "i", "ports": [WEB, WEB]})
    with pytest.raises(ValidationError, match="port 8080 more than once"):
        SandboxSpec.model_validate(
            {"kind": "k", "image": "i", "ports": [WEB, {"name": "b", "port": 8080}]}
        )


def test_ports_stay_off_the_wire_while_empty_and_are_fixed_after_creation() -> None:
    assert "ports" not in SandboxSpec(kind="k", image="i").to_wire()
    spec = _ports_schema()
    assert spec["items"]["properties"]["protocol"]["enum"] == ["http", "tcp"]
    # Not one of the fields an edit may change: the transition rules fix it.
    fixed = [r for r in rules(spec_schema(SANDBOX_FILE)) if "self.ports" in r]
    assert fixed and not evaluate(fixed[0], {"ports": [WEB]}, {"ports": []})


def _request(ports: list[dict[str, Any]]) -> EnsureRequest:
    key = SandboxKey(scope="t", thread_id="1", agent_dir="a")
    return EnsureRequest(
        sandbox=SandboxRef("ns", "sbx", "uid"),
        key=key,
        spec=SandboxSpec.model_validate({"kind": "k", "image": "i", "ports": ports}),
        isolation_scope=IsolationScope.CONVERSATION,
        labels={},
        annotations={},
    )


def test_the_pod_names_its_declared_ports_by_slot_and_serves_no_others() -> None:
    backend = RuntimeClassBackendConfig(
        type="runtimeClass", name="runc", runtime_class_name="runc", isolation="container"
    )
    ports = [WEB, {"name": "mcp", "port": 9000, "protocol": "tcp"}]
    (container,) = build_pod(_request(ports), backend)["spec"]["containers"]
    assert container["ports"] == [
        {"name": port_slot_name(0), "containerPort": 8080, "protocol": "TCP"},
        {"name": port_slot_name(1), "containerPort": 9000, "protocol": "TCP"},
    ]
    (plain,) = build_pod(_request([]), backend)["spec"]["containers"]
    assert "ports" not in plain


def test_status_shows_each_http_port_url_only_once_a_router_is_configured() -> None:
    spec = SandboxResourceSpec.model_validate(
        {**BASE, "ports": [WEB, {"name": "db", "port": 5432, "protocol": "tcp"}]}
    )
    without = port_fields(spec, "team-a", "sbx-1", None)["ports"]
    assert [p.get("url") for p in without] == [None, None]
    with_router = port_fields(spec, "team-a", "sbx-1", "https://r.example.com/")["ports"]
    assert with_router == [
        {
            "name": "web",
            "port": 8080,
            "protocol": "http",
            "url": "https://r.example.com/team-a/sbx-1/web/",
        },
        {"name": "db", "port": 5432, "protocol": "tcp"},
    ]
    assert port_fields(SandboxResourceSpec.model_validate(BASE), "n", "s", "https://r") == {}


def test_the_router_base_url_is_checked_in_the_operator_configuration() -> None:
    backends = [
        {
            "name": "runc",
            "type": "runtimeClass",
            "runtimeClassName": "runc",
            "isolation": "container",
        }
    ]
    cfg = OperatorConfig.model_validate(
        {"backends": backends, "router": {"baseUrl": "https://r.example.com"}}
    )
    assert cfg.router is not None and cfg.router.base_url == "https://r.example.com"
    for bad in ("r.example.com", "https://r.example.com/?q=1", "ftp://r"):
        with pytest.raises(ValidationError):
            OperatorConfig.model_validate({"backends": backends, "router": {"baseUrl": bad}})
