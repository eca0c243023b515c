"""The operator publishes the backends it serves (reconcile/publish.py) against a real API server:
the ConfigMap appears in the served namespace with the configuration's document, a restart with
the same configuration writes nothing, and a changed configuration is republished."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from sandbox_operator.config import parse_config
from sandbox_operator.contract.published import (
    PUBLISHED_CONFIGMAP,
    PUBLISHED_KEY,
    PublishedBackends,
)
from sandbox_operator.reconcile.publish import published_backends
from tests.fixtures.cluster import TEST_NAMESPACE_LABELS
from tests.fixtures.operator import Kit, OperatorProcess, local_config

pytestmark = pytest.mark.integration


def _read(core: client.CoreV1Api, namespace: str) -> client.V1ConfigMap | None:
    try:
        return core.read_namespaced_config_map(PUBLISHED_CONFIGMAP, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _version(core: client.CoreV1Api, namespace: str) -> str | None:
    cm = _read(core, namespace)
    return cm.metadata.resource_version if cm is not None else None


def _wait_log(proc: OperatorProcess, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in proc.log():
        if time.monotonic() > deadline:
            raise AssertionError(f"operator never logged {text!r}:\n{proc.log()}")
        time.sleep(0.3)


def _document(cm: client.V1ConfigMap) -> PublishedBackends:
    return PublishedBackends.model_validate_json(cm.data[PUBLISHED_KEY])


def _configmap_writes(proc: OperatorProcess) -> float:
    return sum(
        n
        for (verb, resource), n in proc.api_requests().items()
        if resource == "configmaps" and verb not in ("get", "list", "watch")
    )


def test_published_configmap_follows_the_configuration(kit: Kit, start_operator: Any) -> None:
    config = local_config()
    expected = published_backends(parse_config(config)[0])
    assert _read(kit.core, kit.ns) is None

    first = start_operator(config)
    _wait_log(first, f"namespace {kit.ns}: published")
    cm = _read(kit.core, kit.ns)
    assert cm is not None
    assert cm.metadata.labels["app.kubernetes.io/managed-by"] == "sandbox-operator"
    assert _document(cm) == expected
    assert _configmap_writes(first) == 1
    version = cm.metadata.resource_version
    first.stop()

    # Same configuration: read, found current, nothing written.
    second = start_operator(config)
    _wait_log(second, f"namespace {kit.ns}: already current")
    cm = _read(kit.core, kit.ns)
    assert cm is not None and cm.metadata.resource_version == version
    assert _configmap_writes(second) == 0
    second.stop()

    # A changed configuration is republished.
    changed = local_config(floor="hardened_container", selection="fixed", pinned="gvisor")
    third = start_operator(changed)
    _wait_log(third, f"namespace {kit.ns}: published")
    cm = _read(kit.core, kit.ns)
    assert cm is not None and cm.metadata.resource_version != version
    assert _document(cm) == published_backends(parse_config(changed)[0])
    assert _document(cm).host_policy.pinned_backend == "gvisor"


def test_serving_a_pattern_it_publishes_into_each_namespace_as_it_appears(
    kit: Kit, kubeconfig: str, tmp_path: Path
) -> None:
    """Serving a pattern (as serving all namespaces), the operator publishes into every
    namespace it serves, a new one within moments of its creation, so a client always reads its
    own namespace; a restart lists what is there once and writes nothing."""
    config = local_config()
    expected = published_backends(parse_config(config)[0])
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    later = f"{kit.ns}-later"  # served: it matches the pattern
    pattern = f"{kit.ns}*"
    first = OperatorProcess(config_path, pattern, tmp_path / "first.log", kubeconfig)
    second = OperatorProcess(config_path, pattern, tmp_path / "second.log", kubeconfig)
    try:
        first.start()
        _wait_log(first, f"namespace {kit.ns}: published")
        kit.core.create_namespace(
            client.V1Namespace(
                metadata=client.V1ObjectMeta(name=later, labels=TEST_NAMESPACE_LABELS)
            )
        )
        created = time.monotonic()
        while (cm := _read(kit.core, later)) is None:
            assert time.monotonic() - created < 10, f"never published into {later}:\n{first.log()}"
            time.sleep(0.1)
        print(f"published into a new namespace {time.monotonic() - created:.2f}s after its create")
        assert _document(cm) == expected
        versions = {ns: _version(kit.core, ns) for ns in (kit.ns, later)}
        first.stop()

        second.start()
        _wait_log(second, "2 namespaces served, 0 to publish into")
        assert _configmap_writes(second) == 0
        assert {ns: _version(kit.core, ns) for ns in versions} == versions
    finally:
        first.stop()
        second.stop()
        with contextlib.suppress(ApiException):
            kit.core.delete_namespace(later, propagation_policy="Background")
