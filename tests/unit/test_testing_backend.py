"""The in-process backend in ``sandbox_operator.testing`` (#25 item 9): a workload's admission
judged by the operator's own policy, refused with the client's own types, without a cluster."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import sandbox_operator.testing as testing
from sandbox_operator import contract
from sandbox_operator.client import (
    CapabilityNotRequired,
    SandboxBackendUnavailable,
    SandboxCallIdRequired,
    SandboxCapabilityDenied,
    SandboxCapabilityNotSupported,
    SandboxEgressNotEnforced,
    SandboxIsolationBelowFloor,
    SandboxNoBackendCanServe,
    SandboxRefused,
    SandboxResourcesExceedCeiling,
    SandboxStorageNotSupported,
)
from sandbox_operator.contract import (
    Capability,
    Egress,
    HostPolicy,
    Isolation,
    SandboxSpec,
    Selection,
)
from sandbox_operator.testing import (
    FAKE_BACKEND_DECLARATIONS,
    FAKE_HOST_POLICY,
    FakeBackend,
    acquire,
    admit,
)


def spec(**fields: object) -> SandboxSpec:
    return SandboxSpec.model_validate({"kind": "report", "image": "python:3.12", **fields})


def test_the_kit_exports_it() -> None:
    for name in ("FakeBackend", "FAKE_BACKEND_DECLARATIONS", "FAKE_HOST_POLICY", "admit"):
        assert name in testing.__all__


def test_a_plain_spec_is_admitted_with_resources_resolved() -> None:
    admission = admit(spec())
    assert admission.backend.name == "in-process" and admission.floor is Isolation.NONE
    assert admission.spec is not None and admission.spec.resources.limits.memory is not None


def test_the_default_floor_refuses_the_fake_it_is_never_lowered_implicitly() -> None:
    with pytest.raises(SandboxIsolationBelowFloor) as caught:
        admit(spec(), host=HostPolicy())
    assert isinstance(caught.value.__cause__, contract.IsolationBelowFloor)
    assert caught.value.refusal_reason is contract.RefusalReason.ISOLATION_BELOW_FLOOR


@pytest.mark.parametrize(
    ("fields", "host", "backend", "error"),
    [
        (
            {"requires": ["exec", "snapshot"]},
            FAKE_HOST_POLICY,
            FakeBackend(),
            SandboxCapabilityNotSupported,
        ),
        ({"egress": "unrestricted"}, FAKE_HOST_POLICY, FakeBackend(), SandboxEgressNotEnforced),
        ({"storage": {"size": "1Gi"}}, FAKE_HOST_POLICY, FakeBackend(), SandboxStorageNotSupported),
        ({"isolationScope": "call"}, FAKE_HOST_POLICY, FakeBackend(), SandboxCallIdRequired),
        (
            {"requires": ["exec", "host_tools"]},
            FAKE_HOST_POLICY.model_copy(
                update={"denied_capabilities": frozenset({Capability.HOST_TOOLS})}
            ),
            FakeBackend(),
            SandboxCapabilityDenied,
        ),
        (
            {"resources": {"limits": {"cpu": "64"}}},
            FAKE_HOST_POLICY,
            FakeBackend(),
            SandboxResourcesExceedCeiling,
        ),
        ({}, FAKE_HOST_POLICY, FakeBackend(available=False), SandboxBackendUnavailable),
    ],
)
def test_each_refusal_is_the_clients_type(
    fields: dict[str, object], host: HostPolicy, backend: FakeBackend, error: type[SandboxRefused]
) -> None:
    with pytest.raises(error) as caught:
        admit(spec(**fields), host=host, backends=[backend])
    assert isinstance(caught.value.__cause__, error.refusal_type)
    assert caught.value.message == caught.value.__cause__.message


def test_declarations_are_overridden_with_replace_and_per_spec_names_each_refusal() -> None:
    closed_only = dataclasses.replace(
        FakeBackend(name="closed"),
        declarations=FAKE_BACKEND_DECLARATIONS.model_copy(
            update={"egress_modes": frozenset({Egress.CLOSED})}
        ),
    )
    per_spec = FAKE_HOST_POLICY.model_copy(update={"selection": Selection.PER_SPEC})
    allow = spec(egress="allowlist", egressAllow=["pypi.org"])
    with pytest.raises(SandboxNoBackendCanServe) as caught:
        admit(allow, host=per_spec, backends=[closed_only])
    assert "closed" in caught.value.message
    both = [closed_only, FakeBackend(name="open")]
    assert admit(allow, host=per_spec, backends=both).backend.name == "open"


def test_a_call_scoped_spec_with_a_call_id_is_admitted() -> None:
    assert admit(spec(isolationScope="call"), call_id="c-1").isolation_scope.value == "call"


async def test_acquire_gives_a_local_handle_gated_by_the_admitted_spec(tmp_path: Path) -> None:
    sandbox = acquire(spec(requires=["exec", "files_in"]), root=str(tmp_path))
    try:
        assert sandbox.spec.kind == "report" and sandbox.spec.resources.limits.cpu is not None
        assert (await sandbox.exec(["echo", "ran"])).stdout == b"ran\n"
        with pytest.raises(CapabilityNotRequired):
            await sandbox.read_file("x")
    finally:
        await sandbox.close()
    with pytest.raises(SandboxEgressNotEnforced):
        acquire(spec(egress="unrestricted"), root=str(tmp_path))
