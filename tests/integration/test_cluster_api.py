"""The API level is real: CEL validation, garbage collection, admission, RBAC, namespaces.

Runs against any cluster the `kubeconfig` fixture provides (the local one by default).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.integration


def eventually(check: Callable[[], Any], timeout: float = 60, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
        except ApiException as exc:
            last = exc
        else:
            if result:
                return result
        time.sleep(0.3)
    raise AssertionError(f"{what} not reached within {timeout:.0f}s (last error: {last})")


def api_message(exc: ApiException) -> str:
    """The API server's own message from a Status body."""
    message: str = json.loads(exc.body)["message"]
    return message


CEL_MESSAGE = "spec.min must not exceed spec.max"


@pytest.fixture
def cel_crd(api_client: client.ApiClient) -> Iterator[tuple[str, str, str]]:
    """A throwaway CRD whose schema carries a CEL rule; yields (group, version, plural)."""
    ext = client.ApiextensionsV1Api(api_client)
    group = f"t{uuid.uuid4().hex[:8]}.cluster-test.sandbox-operator.dev"
    plural = "ranges"
    body = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": "range", "kind": "Range"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["min", "max"],
                                    "properties": {
                                        "min": {"type": "integer"},
                                        "max": {"type": "integer"},
                                    },
                                    "x-kubernetes-validations": [
                                        {"rule": "self.min <= self.max", "message": CEL_MESSAGE}
                                    ],
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    ext.create_custom_resource_definition(body)

    def established() -> bool:
        crd = ext.read_custom_resource_definition(f"{plural}.{group}")
        conds = {c.type: c.status for c in (crd.status.conditions or [])}
        return conds.get("Established") == "True"

    try:
        eventually(established, 60, "CRD Established")
        yield group, "v1", plural
    finally:
        ext.delete_custom_resource_definition(f"{plural}.{group}")


def test_crd_cel_rule_rejects_bad_object_with_api_server_message(
    cel_crd: tuple[str, str, str], custom_objects: client.CustomObjectsApi, namespace: str
) -> None:
    group, version, plural = cel_crd

    def obj(name: str, lo: int, hi: int) -> dict[str, Any]:
        return {
            "apiVersion": f"{group}/{version}",
            "kind": "Range",
            "metadata": {"name": name},
            "spec": {"min": lo, "max": hi},
        }

    # The REST endpoint of a new CRD can lag its Established condition by a moment.
    eventually(
        lambda: custom_objects.create_namespaced_custom_object(
            group, version, namespace, plural, obj("good", 1, 2)
        ),
        30,
        "a valid object is accepted",
    )
    with pytest.raises(ApiException) as err:
        custom_objects.create_namespaced_custom_object(
            group, version, namespace, plural, obj("bad", 5, 2)
        )
    assert err.value.status == 422
    assert CEL_MESSAGE in api_message(err.value)
    assert "spec" in api_message(err.value)


def test_deleting_owner_garbage_collects_dependent(
    core_v1: client.CoreV1Api, namespace: str
) -> None:
    owner = core_v1.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
    )
    ref = client.V1OwnerReference(
        api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid
    )
    core_v1.create_namespaced_config_map(
        namespace,
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name="dependent", owner_references=[ref])),
    )
    core_v1.delete_namespaced_config_map("owner", namespace, propagation_policy="Background")

    def dependent_gone() -> bool:
        try:
            core_v1.read_namespaced_config_map("dependent", namespace)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    eventually(dependent_gone, 60, "the garbage collector deletes the dependent")


def test_pod_with_missing_runtime_class_is_refused(
    core_v1: client.CoreV1Api, namespace: str
) -> None:
    missing = f"no-such-class-{uuid.uuid4().hex[:6]}"
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="refused"),
        spec=client.V1PodSpec(
            runtime_class_name=missing,
            containers=[client.V1Container(name="c", image="sandbox-operator.dev/busybox:1")],
        ),
    )
    with pytest.raises(ApiException) as err:
        core_v1.create_namespaced_pod(namespace, pod)
    assert err.value.status == 403
    assert f'RuntimeClass "{missing}" not found' in api_message(err.value)


def test_validating_admission_policy_is_enforced(
    api_client: client.ApiClient, core_v1: client.CoreV1Api, namespace: str
) -> None:
    adm = client.AdmissionregistrationV1Api(api_client)
    name = f"t-{uuid.uuid4().hex[:8]}.cluster-test.sandbox-operator.dev"
    message = "configmaps labelled forbidden=yes are refused by policy"
    adm.create_validating_admission_policy(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["configmaps"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": "!has(object.metadata.labels) || "
                        "!('forbidden' in object.metadata.labels) || "
                        "object.metadata.labels['forbidden'] != 'yes'",
                        "message": message,
                    }
                ],
            },
        }
    )
    adm.create_validating_admission_policy_binding(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        }
    )
    try:
        attempt = iter(range(10_000))

        def refused() -> bool:
            cm = client.V1ConfigMap(
                metadata=client.V1ObjectMeta(
                    name=f"probe-{next(attempt)}", labels={"forbidden": "yes"}
                )
            )
            try:
                core_v1.create_namespaced_config_map(namespace, cm)
            except ApiException as exc:
                if exc.status == 422 and message in api_message(exc):
                    return True
                raise
            return False  # the policy is not loaded yet: try again

        eventually(refused, 60, "the policy refuses a labelled ConfigMap")
        core_v1.create_namespaced_config_map(
            namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="allowed"))
        )
    finally:
        adm.delete_validating_admission_policy_binding(name)
        adm.delete_validating_admission_policy(name)


def test_rbac_denies_a_service_account_without_roles(
    api_client: client.ApiClient, core_v1: client.CoreV1Api, namespace: str
) -> None:
    core_v1.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="nobody"))
    )
    token = core_v1.create_namespaced_service_account_token(
        "nobody", namespace, {"spec": {"audiences": []}}
    ).status.token
    cfg = client.Configuration()
    cfg.host = api_client.configuration.host
    cfg.ssl_ca_cert = api_client.configuration.ssl_ca_cert
    cfg.verify_ssl = api_client.configuration.verify_ssl
    cfg.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(cfg) as as_nobody:
        who = client.AuthenticationV1Api(as_nobody).create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        )
        assert who.status.user_info.username == f"system:serviceaccount:{namespace}:nobody"
        with pytest.raises(ApiException) as err:
            client.CoreV1Api(as_nobody).list_namespaced_secret(namespace)
    assert err.value.status == 403


def test_namespace_controller_finalizes_deleted_namespace(core_v1: client.CoreV1Api) -> None:
    name = f"t-ns-gone-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    core_v1.create_namespaced_config_map(
        name, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="content"))
    )
    core_v1.delete_namespace(name)

    def gone() -> bool:
        try:
            core_v1.read_namespace(name)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    eventually(gone, 90, "the namespace controller removes the namespace")
