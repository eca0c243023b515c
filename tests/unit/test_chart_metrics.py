"""The chart's metrics parts: the operator's /metrics port, the scrape annotations, and the optional
ServiceMonitor with the Service it selects. `helm template` only (tests/unit/test_chart_render.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from sandbox_operator import cli
from tests.fixtures.chart import (
    CHART,
    KUBE_VERSION,
    by_kind,
    one,
    run_helm,
    set_args,
    template,
    template_error,
)

SCRAPE = ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path")


def pod_template(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(one(objs, "Deployment")["spec"]["template"])


def container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(pod_template(objs)["spec"]["containers"][0])


def ports(objs: list[dict[str, Any]]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container(objs)["ports"]}


def annotations(objs: list[dict[str, Any]]) -> dict[str, str]:
    return dict(pod_template(objs)["metadata"].get("annotations") or {})


def run_args(objs: list[dict[str, Any]]) -> Any:
    """The Deployment's args as the operator's own parser reads them."""
    return cli._parser().parse_args(container(objs)["args"])


@pytest.fixture(scope="module")
def default_objs() -> list[dict[str, Any]]:
    return template()


def test_metrics_are_on_by_default_with_scrape_annotations(
    default_objs: list[dict[str, Any]],
) -> None:
    assert run_args(default_objs).metrics_port == 8081
    assert ports(default_objs) == {"health": 8080, "metrics": 8081}
    ann = annotations(default_objs)
    assert {k: ann[k] for k in SCRAPE} == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8081",
        "prometheus.io/path": "/metrics",
    }
    assert "checksum/config" in ann
    # Nothing for prometheus-operator unless asked for.
    assert not by_kind(default_objs, "ServiceMonitor")
    assert not by_kind(default_objs, "Service")


def test_metrics_port_follows_the_value() -> None:
    objs = template({"metrics.port": "9102"})
    assert run_args(objs).metrics_port == 9102
    assert ports(objs)["metrics"] == 9102
    assert annotations(objs)["prometheus.io/port"] == "9102"


def test_metrics_disabled_turns_the_endpoint_off() -> None:
    objs = template({"metrics.enabled": "false"})
    assert run_args(objs).metrics_port == 0
    assert "metrics" not in ports(objs)
    assert not set(SCRAPE) & set(annotations(objs))


def test_scrape_annotations_can_be_turned_off_and_pod_annotations_win() -> None:
    objs = template({"metrics.scrapeAnnotations": "false"})
    assert not set(SCRAPE) & set(annotations(objs))
    assert ports(objs)["metrics"] == 8081  # the endpoint stays

    objs = template({"podAnnotations.prometheus\\.io/scrape": "false", "podAnnotations.n": "1"})
    ann = annotations(objs)
    assert ann["prometheus.io/scrape"] == "false"  # the value's own, one key, no duplicate
    assert ann["prometheus.io/port"] == "8081"
    assert ann["n"] == "1"  # annotation values are strings, whatever --set made of them


def test_service_monitor_and_its_service(default_objs: list[dict[str, Any]]) -> None:
    objs = template(
        {
            "metrics.serviceMonitor.enabled": "true",
            "metrics.serviceMonitor.interval": "15s",
            "metrics.serviceMonitor.labels.release": "kube-prometheus-stack",
        }
    )
    service = one(objs, "Service")
    monitor = one(objs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    for obj in (service, monitor):
        assert obj["metadata"]["namespace"] == "sandbox-operator-system"

    # The Service selects the operator pods and names their metrics port.
    pod_labels = pod_template(objs)["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["clusterIP"] == "None"
    (port,) = service["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("metrics", 8081, "metrics")

    # The ServiceMonitor selects that Service (and no other object of the release).
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    for other in objs:
        if other is not service and other["kind"] == "Service":
            assert not monitor["spec"]["selector"]["matchLabels"].items() <= (
                other["metadata"]["labels"].items()
            )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["sandbox-operator-system"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert endpoint["interval"] == "15s" and endpoint["scrapeTimeout"] == "10s"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_service_monitor_lints_clean() -> None:
    result = run_helm(
        "lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION,
        *set_args({"metrics.serviceMonitor.enabled": "true"}), check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


def test_service_monitor_needs_metrics() -> None:
    err = template_error({"metrics.serviceMonitor.enabled": "true", "metrics.enabled": "false"})
    assert "needs metrics.enabled=true" in err


def test_metrics_and_health_ports_must_differ() -> None:
    err = template_error({"metrics.port": "8080"})
    assert "must differ" in err
    template({"metrics.port": "8080", "health.port": "8090"})
    template({"metrics.port": "8080", "metrics.enabled": "false"})  # no endpoint, no clash


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("metrics.port", "80"),  # the pod runs as non-root
        ("metrics.port", "70000"),
        ("metrics.enabled", "yes-please"),
        ("metrics.path", "/m"),  # unknown key
        ("metrics.serviceMonitor.interval", "often"),
        ("metrics.serviceMonitor.scrapeTimeout", "10"),
        ("metrics.serviceMonitor.namespace", "monitoring"),
    ],
)
def test_schema_rejects_bad_metrics_values(key: str, value: str) -> None:
    err = template_error({key: value})
    assert "metrics" in err
