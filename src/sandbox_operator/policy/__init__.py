"""Admission policy over the contract: pure functions, no Kubernetes."""

from .admission import (
    HOST,
    SCOPE,
    SPEC,
    Admission,
    BackendProfile,
    EffectiveFloor,
    EffectiveIsolationScope,
    check_backend,
    check_call_key,
    effective_floor,
    effective_isolation_scope,
    resolve_fixed_backend,
    select_backend,
    validate_registration,
)

__all__ = [
    "HOST",
    "SCOPE",
    "SPEC",
    "Admission",
    "BackendProfile",
    "EffectiveFloor",
    "EffectiveIsolationScope",
    "check_backend",
    "check_call_key",
    "effective_floor",
    "effective_isolation_scope",
    "resolve_fixed_backend",
    "select_backend",
    "validate_registration",
]
