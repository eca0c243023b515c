"""Client exceptions are generated from the contract's reasons and cannot drift."""

from __future__ import annotations

import pytest

from sandbox_operator.client import errors
from sandbox_operator.contract import ConditionReason, RefusalReason


def test_one_exception_per_refusal_reason() -> None:
    assert set(errors.REFUSAL_ERRORS) == set(RefusalReason)
    names = {cls.__name__ for cls in errors.REFUSAL_ERRORS.values()}
    assert len(names) == len(RefusalReason)
    for reason, cls in errors.REFUSAL_ERRORS.items():
        assert issubclass(cls, errors.SandboxRefused)
        assert cls.refusal_reason is reason
        assert cls.__name__ == f"Sandbox{reason.value}"
        assert getattr(errors, cls.__name__) is cls
        exc = cls(sandbox="s", namespace="n", message="m")
        assert exc.reason == reason.value


def test_generated_names_importable_from_package() -> None:
    from sandbox_operator.client import SandboxIsolationBelowFloor, SandboxNoBackendCanServe

    assert SandboxIsolationBelowFloor is errors.REFUSAL_ERRORS[RefusalReason.ISOLATION_BELOW_FLOOR]
    assert SandboxNoBackendCanServe.refusal_reason is RefusalReason.NO_BACKEND_CAN_SERVE


@pytest.mark.parametrize("reason", list(ConditionReason))
def test_every_condition_reason_has_a_decision(reason: ConditionReason) -> None:
    if reason.value in errors.NOT_SANDBOX_REASONS:
        return  # a SandboxWarmPool's condition or an Event's reason, never a Sandbox's
    cls = errors.acquire_error_for(reason.value)
    if reason.value in errors.PENDING_REASONS:
        assert cls is None
    else:
        assert cls is not None and issubclass(cls, errors.SandboxAcquireError)


@pytest.mark.parametrize(
    ("reason", "cls"),
    [
        ("StartupFailed", errors.SandboxStartupFailed),
        ("StartupTimeout", errors.SandboxStartupTimeout),
        ("Failed", errors.SandboxFailed),
        ("KeyUnclean", errors.SandboxKeyUnclean),
        ("ScopeNotFound", errors.SandboxScopeNotFound),
        ("Purged", errors.SandboxGone),
        ("SomethingNew", errors.SandboxFailed),
    ],
)
def test_terminal_reasons(reason: str, cls: type) -> None:
    assert errors.acquire_error_for(reason) is cls


def test_refusal_lookup() -> None:
    assert errors.refusal_error_for("EgressNotEnforced").__name__ == "SandboxEgressNotEnforced"
    with pytest.raises(ValueError):
        errors.refusal_error_for("Nope")


def test_messages_scrub_endpoints_and_secrets() -> None:
    exc = errors.SandboxStartupFailed(
        sandbox="s",
        namespace="n",
        message="pull from https://registry.example:5000/x failed at 10.0.0.7:443 token=abc123",
    )
    text = str(exc)
    assert "registry.example" not in text
    assert "10.0.0.7" not in text
    assert "abc123" not in text
    assert exc.reason == "StartupFailed"
    assert "StartupFailed" in text


def test_not_ready_in_time_fields() -> None:
    exc = errors.SandboxNotReadyInTime(
        sandbox="s", namespace="n", timeout=3, last_reason="Creating"
    )
    assert exc.reason == "NotReadyInTime"
    assert exc.timeout == 3
    assert exc.last_reason == "Creating"
