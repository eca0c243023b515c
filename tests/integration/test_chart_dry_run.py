"""The Helm chart's rendering against a real API server: a server-side dry run of `helm template`
output, with the chart's defaults and with the local values plus the agent Role, RuntimeClasses,
two replicas, the egress credentials' policy and ClusterRole and the ports router, is accepted
(every object, including the agent Role and the ValidatingAdmissionPolicies whose CEL the API
server type-checks). Nothing is installed and no pod runs: the install itself is
tests/e2e/test_chart_install.py."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures.chart import CHART, local_values, run_helm

pytestmark = pytest.mark.integration

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def test_rendered_chart_passes_server_side_dry_run(
    kubeconfig: str, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    # The peering CRDs live in the chart's crds/ (Helm installs them before the templates);
    # apply them for real so the peering object's kind is known to the dry run.
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    for values in (
        ["--set", "config.hostPolicy.minIsolation=microvm"],
        [
            "-f",
            str(local_values(tmp_path)),
            "--set",
            f"watchNamespaces={{{namespace}}}",
            "--set",
            "agentRole.create=true",
            "--set",
            f"agentRole.namespaces={{{namespace}}}",
            "--set",
            "agentRole.subjects[0].kind=ServiceAccount",
            "--set",
            "agentRole.subjects[0].name=agent",
            "--set",
            f"agentRole.subjects[0].namespace={namespace}",
            "--set",
            "runtimeClasses.create=true",
            "--set",
            "replicaCount=2",
            "--set",
            "egressCredentials.enabled=true",  # its policy's CEL (the authorizer) type-checked
            "--set",
            "router.enabled=true",  # the ports router: its RBAC and its NetworkPolicy's named ports
        ],
    ):
        rendered = run_helm(
            "template",
            "dry",
            str(CHART),
            "--namespace",
            namespace,
            "--kube-version",
            "1.33.0",
            *values,
        ).stdout
        result = kubectl(
            "apply",
            "--server-side",
            "--dry-run=server",
            "--force-conflicts",
            "--field-manager=chart-dry-run",
            "-n",
            namespace,
            "-f",
            "-",
            input=rendered,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert "(server dry run)" in result.stdout, result.stdout
        assert "deployment.apps/dry-sandbox-operator" in result.stdout, result.stdout
