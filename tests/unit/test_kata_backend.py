"""A Kata backend (a RuntimeClass at the ``microvm`` rung) as far as no VM is needed: its entry is
a valid configuration, admission at the host's default floor (``microvm``) routes to it and
never below, its pod is the hardened pod on its RuntimeClass, and a missing RuntimeClass makes it
unavailable, which refuses a Sandbox routed to it (``BackendUnavailable``). No cluster.

The same on a real API server: tests/integration/test_kata_backend.py; maf's suites on a real
Kata node: the maf tier's ``kata`` runtime (tests/fixtures/kata.py says when it runs)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from sandbox_operator import labels as lbl
from sandbox_operator.backends.base import EnsureRequest, SandboxRef
from sandbox_operator.backends.runtimeclass import RuntimeClassDriver, build_pod
from sandbox_operator.config import RuntimeClassBackendConfig, parse_config, profiles
from sandbox_operator.contract import (
    BackendUnavailable,
    ConfigurationError,
    Isolation,
    IsolationScope,
    NoBackendCanServe,
    SandboxKey,
    SandboxSpec,
)
from sandbox_operator.policy import admit_request
from tests.fixtures.kata import kata_backend
from tests.fixtures.operator import local_config

KEY = SandboxKey(scope="tenant", thread_id="t1", agent_dir="agents/coder")


def _config(floor: str = "microvm", selection: str = "perSpec", **host: Any) -> Any:
    backends = [*local_config()["backends"], kata_backend()]
    config, _warnings = parse_config(
        local_config(floor=floor, selection=selection, backends=backends, **host)
    )
    return config


def _spec(**kw: Any) -> SandboxSpec:
    return SandboxSpec.model_validate(
        {"kind": "shell", "image": "sandbox-operator.dev/busybox:1", **kw}
    )


def _admit(config: Any, spec: SandboxSpec, unavailable: dict[str, str] | None = None) -> Any:
    return admit_request(config.host_policy, profiles(config, unavailable), spec, call_id="")


def test_the_documented_entry_is_a_valid_microvm_backend() -> None:
    config = _config()
    kata = next(b for b in config.backends if b.name == "kata")
    assert isinstance(kata, RuntimeClassBackendConfig)
    assert (kata.runtime_class_name, kata.isolation) == ("kata", "microvm")


def test_at_the_default_floor_only_kata_serves() -> None:
    """The host's default floor is microvm: per spec, gVisor and runc (first in the list) are
    passed over for Kata; pinning runc under that floor is a configuration error at start."""
    admitted = _admit(_config(), _spec())
    assert admitted.backend.name == "kata" and admitted.floor is Isolation.MICROVM
    with pytest.raises(ConfigurationError, match="below the host floor microvm"):
        _config(selection="fixed", pinned="runc")
    assert _admit(_config(selection="fixed", pinned="kata"), _spec()).backend.name == "kata"


def test_a_lower_host_floor_routes_by_the_spec() -> None:
    config = _config(floor="container")
    assert _admit(config, _spec()).backend.name == "gvisor"  # the first that passes
    asks = _admit(config, _spec(minIsolation="microvm"))
    assert asks.backend.name == "kata" and asks.floor_raised_by == ("spec",)
    with pytest.raises(NoBackendCanServe):
        _admit(config, _spec(minIsolation="vm"))  # above every rung here


def test_a_missing_runtime_class_refuses_what_is_routed_to_kata() -> None:
    """The route never depends on availability: a spec Kata must serve is refused with
    BackendUnavailable (the driver's reason), never sent to a lower rung."""
    why = {"kata": "RuntimeClass 'kata' does not exist in the cluster"}
    with pytest.raises(BackendUnavailable) as caught:
        _admit(_config(), _spec(), unavailable=why)
    assert "kata" in str(caught.value)


def test_the_pod_is_the_hardened_pod_on_the_kata_runtime_class() -> None:
    kata = next(b for b in _config().backends if b.name == "kata")
    assert isinstance(kata, RuntimeClassBackendConfig)
    request = EnsureRequest(
        sandbox=SandboxRef("ns", "sbx-vm", "uid-1"),
        key=KEY,
        spec=_spec(),
        isolation_scope=IsolationScope.CONVERSATION,
        labels=lbl.object_labels(KEY, "sbx-vm", "kata", kind="shell"),
        annotations=lbl.key_annotations(KEY),
    )
    pod = build_pod(request, kata)
    spec = pod["spec"]
    assert spec["runtimeClassName"] == "kata"
    assert pod["metadata"]["labels"][lbl.BACKEND_LABEL] == "kata"
    assert spec["automountServiceAccountToken"] is False
    assert spec["hostNetwork"] is spec["hostPID"] is spec["hostIPC"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    (container,) = spec["containers"]
    assert container["securityContext"]["privileged"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


class _NoRuntimeClass:
    """The RuntimeClass API of a cluster without Kata (a collaborator faked: no cluster here)."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.asked: list[str] = []

    async def read_runtime_class(self, name: str) -> Any:
        self.asked.append(name)
        raise ApiException(status=self.status)


@pytest.mark.parametrize(
    ("status", "why"), [(404, "does not exist"), (403, "cannot be read (HTTP 403)")]
)
async def test_the_driver_reports_a_missing_runtime_class(status: int, why: str) -> None:
    kata = next(b for b in _config().backends if b.name == "kata")
    assert isinstance(kata, RuntimeClassBackendConfig)
    driver = RuntimeClassDriver.__new__(RuntimeClassDriver)
    driver._config = kata
    driver._node = _NoRuntimeClass(status)
    availability = await driver.check_available()
    assert not availability.available
    assert "'kata'" in availability.reason and why in availability.reason
    assert driver._node.asked == ["kata"]
