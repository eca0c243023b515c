"""The acquire-error table against both sides: every client acquire error (one per condition
reason the operator writes) has a row, every row names a type that exists, and every maf attach
refusal is either raised or named as never raised."""

from __future__ import annotations

import maf_sandbox as maf
import pytest
from maf_sandbox import _router

from sandbox_operator.client import errors as client_errors
from sandbox_operator.contract import ConditionReason
from sandbox_operator.maf import _errors
from sandbox_operator.maf._errors import ACQUIRE_ERRORS, NOT_RAISED, translate


def _subclasses(cls: type) -> set[type]:
    found: set[type] = set()
    sub: type
    for sub in cls.__subclasses__():
        found |= {sub} | _subclasses(sub)
    return found


def test_every_client_acquire_error_has_a_row() -> None:
    concrete = _subclasses(client_errors.SandboxAcquireError) - {client_errors.SandboxRefused}
    assert concrete - set(ACQUIRE_ERRORS) == set()


def test_every_condition_reason_reaches_a_row() -> None:
    for reason, cls in client_errors.CONDITION_ERRORS.items():
        if cls is not None:
            assert cls in ACQUIRE_ERRORS, reason
    decided = set(client_errors.CONDITION_ERRORS) | set(client_errors.NOT_SANDBOX_REASONS)
    assert set(ConditionReason) - decided == set()


def test_every_row_names_a_type_that_exists() -> None:
    for source, target in ACQUIRE_ERRORS.items():
        if target.__module__.startswith("maf_sandbox"):
            assert getattr(maf, target.__name__) is target, source
        else:
            assert getattr(_errors, target.__name__) is target, source
            assert issubclass(target, _errors.OperatorAcquireFailed)


def test_every_maf_attach_refusal_is_raised_or_explained() -> None:
    raised = set(ACQUIRE_ERRORS.values())
    refusal: type[Exception]
    for refusal in _router.ATTACH_REFUSALS:
        assert refusal in raised or refusal in NOT_RAISED, refusal.__name__
    assert set(NOT_RAISED) <= set(_router.ATTACH_REFUSALS)


@pytest.mark.parametrize("source", sorted(ACQUIRE_ERRORS, key=str))
def test_translate_raises_the_row(source: type[client_errors.SandboxAcquireError]) -> None:
    if source is client_errors.SandboxNotReadyInTime:
        exc: client_errors.SandboxAcquireError = source(sandbox="s", namespace="n", timeout=1.0)
    else:
        exc = source(sandbox="s", namespace="n", message="why")
    translated = translate(exc)
    assert type(translated) is ACQUIRE_ERRORS[source]
    if isinstance(translated, _errors.OperatorAcquireFailed):
        assert translated.reason == exc.reason


def test_fallback_only_where_nothing_is_retained() -> None:
    # SandboxBackendUnavailable permits fallback: only rows the backend disposes first.
    unavailable = {s for s, t in ACQUIRE_ERRORS.items() if t is maf.SandboxBackendUnavailable}
    assert unavailable == {
        client_errors.SandboxBackendUnavailable,
        client_errors.SandboxStartupTimeout,
    }
    assert maf.SandboxBackendUnavailable in _errors.NEEDS_DISPOSAL
