"""Operator configuration: validated as a whole, errors name the entry; check-config CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sandbox_operator.cli import main
from sandbox_operator.config import load_config, parse_config
from sandbox_operator.contract import ConfigurationError, Isolation, Selection

REPO = Path(__file__).resolve().parents[2]


def backend(name: str = "gvisor", isolation: str = "hardened_container", **kw):
    b = {
        "name": name,
        "type": "runtimeClass",
        "runtimeClassName": name,
        "isolation": isolation,
        "declarations": {"egressModes": ["closed"], "osFamilies": ["posix"]},
    }
    b.update(kw)
    return b


def test_example_config_is_valid():
    config, warnings = load_config(REPO / "examples/config-local.yaml")
    assert config.backend_names == ("gvisor", "runc")
    assert config.host_policy.min_isolation is Isolation.HARDENED_CONTAINER
    assert config.host_policy.selection is Selection.PER_SPEC
    assert any("runc" in w for w in warnings)
    assert config.backends[0].pod.run_as_user == 65532


def test_default_floor_is_microvm_and_fixed_backend_below_it_refuses_to_start():
    with pytest.raises(ConfigurationError) as err:
        parse_config({"backends": [backend()]})
    assert "backends" in err.value.entry or "pinnedBackend" in err.value.entry
    assert "gvisor" in str(err.value)


def test_unknown_rung_names_the_entry():
    with pytest.raises(ConfigurationError) as err:
        parse_config(
            {"hostPolicy": {"minIsolation": "none"}, "backends": [backend(isolation="process")]}
        )
    assert err.value.entry.startswith("backends[0]")


def test_malformed_entries_name_the_entry():
    with pytest.raises(ConfigurationError) as err:
        parse_config({"hostPolicy": {"minIsolation": "none"}, "backends": [backend(), {"x": 1}]})
    assert err.value.entry == "backends[1].type"
    with pytest.raises(ConfigurationError) as err:
        parse_config(
            {"hostPolicy": {"minIsolation": "none"}, "backends": [backend(runtimeClassName="A_B")]}
        )
    assert err.value.entry == "backends[0].runtimeClassName"
    with pytest.raises(ConfigurationError) as err:
        parse_config({"hostPolicy": {"minIsolation": "bogus"}, "backends": [backend()]})
    assert err.value.entry.startswith("hostPolicy.minIsolation")
    with pytest.raises(ConfigurationError) as err:
        parse_config({"hostPolicy": {"minIsolation": "none"}, "backends": [backend(), backend()]})
    assert err.value.entry == "backends[1].name"
    with pytest.raises(ConfigurationError) as err:
        parse_config({"hostPolicy": {"minIsolation": "none"}, "backends": []})
    assert err.value.entry == "backends"
    with pytest.raises(ConfigurationError):
        parse_config(["not", "a", "mapping"])
    with pytest.raises(ConfigurationError) as err:
        parse_config(
            {
                "hostPolicy": {"minIsolation": "none"},
                "backends": [backend(pod={"runAsUser": 0})],
            }
        )
    assert err.value.entry.startswith("backends[0].pod")


def test_not_yaml(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("hostPolicy: [unclosed\n")
    with pytest.raises(ConfigurationError) as err:
        load_config(p)
    assert err.value.entry == "(file)"


def test_check_config_cli_verdicts(tmp_path, capsys):
    cfg = REPO / "examples/config-local.yaml"
    assert main(["check-config", str(cfg)]) == 0
    assert (
        main(
            [
                "check-config",
                str(cfg),
                "--spec",
                str(REPO / "examples/sandbox.yaml"),
                "--scope",
                str(REPO / "examples/sandboxscope.yaml"),
            ]
        )
        == 0
    )
    assert "served by backend gvisor" in capsys.readouterr().out

    spec = tmp_path / "s.yaml"
    doc = yaml.safe_load((REPO / "examples/sandbox.yaml").read_text())
    doc["spec"]["minIsolation"] = "vm"
    spec.write_text(yaml.safe_dump(doc))
    assert main(["check-config", str(cfg), "--spec", str(spec)]) == 3
    assert "refused: NoBackendCanServe" in capsys.readouterr().out

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"backends": [backend()]}))
    assert main(["check-config", str(bad)]) == 1
    assert "configuration invalid" in capsys.readouterr().err


def test_run_refuses_to_start_on_bad_config(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {"hostPolicy": {"minIsolation": "none"}, "backends": [backend(isolation="process")]}
        )
    )
    assert main(["run", "--config", str(bad), "--namespace", "x"]) == 1
    assert "refusing to start" in capsys.readouterr().err


def test_check_config_accepts_a_bare_spec(tmp_path, capsys):
    spec = tmp_path / "bare.yaml"
    spec.write_text(yaml.safe_dump({"kind": "python", "image": "sandbox-operator.dev/python:1"}))
    cfg = REPO / "examples/config-local.yaml"
    assert main(["check-config", str(cfg), "--spec", str(spec)]) == 0
    assert "served by backend gvisor" in capsys.readouterr().out
    spec.write_text("kind: [")
    assert main(["check-config", str(cfg), "--spec", str(spec)]) == 2


def test_host_policy_resources_are_read_and_errors_name_the_entry():
    config, _ = parse_config(
        {
            "hostPolicy": {
                "minIsolation": "hardened_container",
                "resources": {
                    "defaultRequests": {"cpu": "20m", "memory": "48Mi"},
                    "defaultLimits": {"cpu": "500m", "memory": "256Mi"},
                    "maxRequests": {"cpu": "1"},
                    "maxLimits": {"cpu": "2", "memory": "4Gi"},
                },
            },
            "backends": [backend()],
        }
    )
    resources = config.host_policy.resources
    assert (resources.default_requests.cpu, resources.default_limits.memory) == ("20m", "256Mi")
    assert (resources.max_requests.cpu, resources.max_limits.memory) == ("1", "4Gi")
    for bad, needle in [
        ({"maxLimits": {"memory": "256Mi"}}, "defaultLimits.memory (512Mi) exceeds maxLimits"),
        ({"defaultRequests": {"cpu": "2"}}, "defaultRequests.cpu (2) exceeds defaultLimits.cpu"),
        ({"maxLimits": {"cpu": "much"}}, "not a quantity"),
        ({"ceiling": {"cpu": "1"}}, "Extra inputs are not permitted"),
    ]:
        with pytest.raises(ConfigurationError) as err:
            parse_config(
                {
                    "hostPolicy": {"minIsolation": "hardened_container", "resources": bad},
                    "backends": [backend()],
                }
            )
        assert err.value.entry.startswith("hostPolicy.resources"), err.value.entry
        assert needle in str(err.value)


def test_check_config_refuses_a_spec_above_the_host_ceiling(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    doc = yaml.safe_load((REPO / "examples/config-local.yaml").read_text())
    doc["hostPolicy"]["resources"] = {"maxLimits": {"memory": "1Gi"}}
    cfg.write_text(yaml.safe_dump(doc))
    spec = tmp_path / "s.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "kind": "python",
                "image": "sandbox-operator.dev/python:1",
                "resources": {"limits": {"memory": "2Gi"}},
            }
        )
    )
    assert main(["check-config", str(cfg), "--spec", str(spec)]) == 3
    out = capsys.readouterr().out
    assert "refused: ResourcesExceedCeiling" in out
    assert "limits.memory 2Gi > maxLimits.memory 1Gi" in out


@pytest.mark.parametrize(
    ("declarations", "extra", "names"),
    [
        ({"capabilities": ["exec", "snapshot"]}, {}, "declarations.capabilities"),
        ({"capabilities": ["exec", "attached_identity"]}, {}, "declarations.capabilities"),
        ({"osFamilies": ["posix", "windows"]}, {}, "declarations.osFamilies"),
        ({"egressModes": ["closed", "allowlist"]}, {}, "without egressProxy"),
        ({"observesEgress": True}, {}, "declarations.observesEgress"),
        (
            {"observesEgress": True, "egressModes": ["closed", "allowlist"]},
            {"egressProxy": {"url": "http://p:3128", "port": 3128}},
            "declarations.observesEgress",
        ),
        (
            {"egressRules": True, "egressModes": ["closed", "allowlist"]},
            {"egressProxy": {"url": "http://p:3128", "port": 3128}},
            "declarations.egressRules",
        ),
    ],
)
def test_a_runtime_class_backend_declares_only_what_it_serves(declarations, extra, names):
    """#25 item 4: a declaration the backend cannot keep is a configuration error naming the
    field (allowlist without a proxy admitted allowlist workloads onto a deny-all policy)."""
    entry = backend(**extra)
    entry["declarations"] = {**entry["declarations"], **declarations}
    with pytest.raises(ConfigurationError) as err:
        parse_config({"hostPolicy": {"minIsolation": "container"}, "backends": [entry]})
    assert names in str(err.value) and "backends[0]" in str(err.value)


def test_what_a_runtime_class_backend_serves_is_accepted():
    entry = backend(egressProxy={"managed": True})
    entry["declarations"] = {
        "capabilities": ["exec", "run_code", "files_in", "files_out", "files_list",
                         "files_delete", "host_tools"],
        "egressModes": ["closed", "allowlist"],
        "osFamilies": ["posix"],
        "observesEgress": True,
        "egressRules": True,
    }  # fmt: skip
    config, _warnings = parse_config(
        {
            "hostPolicy": {"minIsolation": "container"},
            "backends": [entry],
            "egressProxy": {"image": "sandbox-operator.dev/operator:0.1.0"},
        }
    )
    assert config.backend_names == ("gvisor",)


# ---- the operator's namespace: read once, here only --------------------------------------


def test_operator_namespace_is_pod_namespace_then_the_service_account_then_none(
    monkeypatch: pytest.MonkeyPatch, outside_a_pod: Path
) -> None:
    from sandbox_operator.config import operator_namespace

    assert operator_namespace() is None
    outside_a_pod.write_text("from-the-token\n")
    operator_namespace.cache_clear()
    assert operator_namespace() == "from-the-token"
    monkeypatch.setenv("POD_NAMESPACE", "from-the-downward-api")
    operator_namespace.cache_clear()
    assert operator_namespace() == "from-the-downward-api"


def test_operator_namespace_is_read_once_per_process(
    monkeypatch: pytest.MonkeyPatch, outside_a_pod: Path
) -> None:
    from sandbox_operator.config import operator_namespace

    monkeypatch.setenv("POD_NAMESPACE", "first")
    assert operator_namespace() == "first"
    monkeypatch.setenv("POD_NAMESPACE", "second")
    outside_a_pod.write_text("third")
    assert operator_namespace() == "first"


def test_pod_namespace_is_read_by_config_alone() -> None:
    import ast

    src = Path(__file__).resolve().parents[2] / "src" / "sandbox_operator"
    readers = sorted(
        str(path.relative_to(src))
        for path in src.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value == "POD_NAMESPACE"
    )
    assert readers == ["config.py"], f"read it through config.operator_namespace(): {readers}"
