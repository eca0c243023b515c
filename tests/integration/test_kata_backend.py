"""A Kata backend on a real API server, short of the VM this machine cannot start: the operator
refuses a Sandbox routed to a Kata backend whose RuntimeClass is missing (``BackendUnavailable``,
no pod), and with the RuntimeClass in place routes per spec at the ``microvm`` floor and writes the
pod onto it. The RuntimeClass is docs/cluster.md's (handler, overhead, a node selector for Kata
nodes), so on a cluster without Kata nodes the pod stays Pending and nothing tries to boot a VM.

Each test names its own RuntimeClass, so none sees another's; creating one is a cluster-wide
write, hence ``exclusive``. maf's suites on a real Kata node: the maf tier's ``kata`` runtime.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.fixtures.admission import assert_refused
from tests.fixtures.kata import KATA_NODE_LABEL, kata_backend, kata_runtime_class_body
from tests.fixtures.operator import Kit, OperatorProcess, local_config

pytestmark = [pytest.mark.integration, pytest.mark.exclusive]


@pytest.fixture
def node_v1(api_client: client.ApiClient) -> client.NodeV1Api:
    return client.NodeV1Api(api_client)


@pytest.fixture
def runtime_class_name(node_v1: client.NodeV1Api) -> Iterator[str]:
    """A RuntimeClass name of this test's own, deleted afterwards if the test made it."""
    name = f"kata-t-{uuid.uuid4().hex[:8]}"
    yield name
    try:
        node_v1.delete_runtime_class(name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def _runc() -> dict[str, Any]:
    return next(b for b in local_config()["backends"] if b["name"] == "runc")


def test_a_missing_runtime_class_refuses_and_creates_nothing(
    kit: Kit, start_operator: Callable[..., OperatorProcess], runtime_class_name: str
) -> None:
    """At the default floor (microvm) with runc first per spec, the Sandbox is routed to Kata,
    whose RuntimeClass does not exist: refused BackendUnavailable naming it, never sent to runc."""
    config = local_config(floor="microvm", backends=[_runc(), kata_backend(runtime_class_name)])
    start_operator(config)
    kit.scope()
    kit.sandbox("wants-vm")
    obj = assert_refused(kit, "wants-vm", "BackendUnavailable")
    message = kit.condition(obj, "Admitted")["message"]
    assert runtime_class_name in message and "does not exist" in message, message
    assert obj["status"].get("backend") in (None, "kata")


def test_with_the_runtime_class_the_pod_is_written_onto_it(
    kit: Kit,
    start_operator: Callable[..., OperatorProcess],
    node_v1: client.NodeV1Api,
    runtime_class_name: str,
) -> None:
    """Per spec with the host floor at container: a Sandbox asking for ``microvm`` goes to Kata,
    a plain one to runc (the first that passes). The Kata pod names the RuntimeClass, whose
    admission adds the guest's overhead and the Kata node selector to it."""
    node_v1.create_runtime_class(kata_runtime_class_body(runtime_class_name))
    config = local_config(floor="container", backends=[_runc(), kata_backend(runtime_class_name)])
    start_operator(config)
    kit.scope()
    kit.sandbox("vm", minIsolation="microvm")
    kit.sandbox("plain")
    vm = kit.wait_condition("vm", "Admitted", status="True", timeout=60)
    plain = kit.wait_condition("plain", "Admitted", status="True", timeout=60)
    assert (vm["status"]["backend"], vm["status"]["isolation"]) == ("kata", "microvm")
    assert plain["status"]["backend"] == "runc"
    pod = kit.wait_pod("vm")
    assert pod.spec.runtime_class_name == runtime_class_name
    assert pod.spec.overhead == {"memory": "160Mi", "cpu": "250m"}
    assert (pod.spec.node_selector or {}).get(KATA_NODE_LABEL) == "true"
    assert pod.spec.security_context.run_as_non_root is True
    assert pod.spec.automount_service_account_token is False
    assert kit.wait_pod("plain").spec.runtime_class_name == "runc"
