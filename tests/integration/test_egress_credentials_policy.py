"""Who may name a credential (#38 item 3), on the real API server: the chart's
``egressCredentials`` admission policy (templates/egress-credentials.yaml), rendered for a
release serving one test namespace and applied, asks the authorizer whether the requesting user
may ``get`` each Secret a Sandbox's egressRules credentials name.

A host ServiceAccount that may get Secret ``readable`` (and not ``hidden``) creates Sandboxes as
itself (impersonated): naming ``hidden`` is refused, naming the field; naming
``readable`` is stored. A user that may not read either still updates that Sandbox's metadata
(as the operator does): an update that leaves egressRules alone is not asked again.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.chart import managed_proxy_values, template
from tests.fixtures.cluster import kubectl_command

pytestmark = [pytest.mark.integration]

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def credentials_policy(kit: Any, kubeconfig: str, tmp_path: Path) -> Iterator[list[dict[str, Any]]]:
    """The chart's policy and binding for a release serving the test's namespace, applied."""
    release = f"t-cred-{uuid.uuid4().hex[:6]}"
    values = {"watchNamespaces": f"{{{kit.ns}}}", "egressCredentials.enabled": "true"}
    objs = [
        o
        for o in template(values, values_files=[managed_proxy_values(tmp_path)], release=release)
        if o["kind"] in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
        and (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
        == "egress-credentials"
    ]
    assert len(objs) == 2, objs
    manifest = yaml.safe_dump_all(objs)
    kubectl = kubectl_command(kubeconfig)
    subprocess.run([*kubectl, "apply", "-f", "-"], input=manifest, text=True, check=True,
                   capture_output=True)  # fmt: skip
    try:
        yield objs
    finally:
        subprocess.run([*kubectl, "delete", "--ignore-not-found", "-f", "-"], input=manifest,
                       text=True, capture_output=True)  # fmt: skip


def grant(kubectl: Kubectl, ns: str, account: str, rules: list[dict[str, Any]]) -> str:
    """A ServiceAccount holding exactly ``rules`` in ``ns``; its username."""
    objs = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": account}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": account},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}]},
    ]  # fmt: skip
    kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(objs))
    return f"system:serviceaccount:{ns}:{account}"


#: Fully qualified: another CRD's kind named "sandboxes" (agent-sandbox's) may be installed.
SANDBOX_RESOURCE = "sandboxes.sandbox-operator.dev"
SANDBOXES = {"apiGroups": ["sandbox-operator.dev"], "resources": ["sandboxes"],
             "verbs": ["create", "get", "patch", "delete"]}  # fmt: skip


def test_a_sandbox_naming_a_secret_its_requester_may_not_get_is_refused(
    kit: Any, kubectl: Kubectl, credentials_policy: list[dict[str, Any]]
) -> None:
    ns = kit.ns
    for name in ("readable", "hidden"):
        kubectl("create", "secret", "generic", name, "-n", ns, "--from-literal=token=x")
    host = grant(kubectl, ns, "host", [
        SANDBOXES,
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["readable"],
         "verbs": ["get"]},
    ])  # fmt: skip
    other = grant(kubectl, ns, "labeller", [SANDBOXES])

    def create(name: str, secret: str) -> subprocess.CompletedProcess[str]:
        rule = {"host": "api.example.com", "schemes": ["https"], "methods": ["GET"],
                "credential": {"secretName": secret, "key": "token"}}  # fmt: skip
        body = kit.sandbox_body(name, egress="allowlist", egressRules=[rule])
        return kubectl("create", "--as", host, "-n", ns, "-f", "-", input=json.dumps(body),
                       check=False)  # fmt: skip

    # The policy takes effect within moments of being applied: until the refusal is seen, a
    # stored Sandbox is deleted and the create tried again.
    deadline = time.monotonic() + 60
    while True:
        refused = create("hidden", "hidden")
        if refused.returncode != 0 or time.monotonic() > deadline:
            break
        kubectl("delete", SANDBOX_RESOURCE, "hidden", "-n", ns, "--wait=false")
        time.sleep(0.5)
    assert refused.returncode != 0, refused.stdout
    assert "spec.egressRules[].credential.secretName" in refused.stderr, refused.stderr
    assert "that the requester may not get" in refused.stderr, refused.stderr
    assert kit.get("hidden") is None

    stored = create("readable", "readable")
    assert stored.returncode == 0, stored.stderr
    credential = kit.get("readable")["spec"]["egressRules"][0]["credential"]
    assert credential["secretName"] == "readable"

    # A metadata update by a user who may read neither Secret (as the operator's finalizer
    # patches are) leaves egressRules alone and is not asked again.
    patched = kubectl("label", "--as", other, "-n", ns, SANDBOX_RESOURCE, "readable", "team=a",
                      check=False)  # fmt: skip
    assert patched.returncode == 0, patched.stderr
