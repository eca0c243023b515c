"""Admission policy over the contract: pure functions, no Kubernetes."""

from .admission import (
    HOST,
    SCOPE,
    SPEC,
    Admission,
    BackendProfile,
    EffectiveFloor,
    EffectiveIsolationScope,
    admit_request,
    check_backend,
    check_call_key,
    effective_floor,
    effective_isolation_scope,
    resolve_fixed_backend,
    select_backend,
    validate_registration,
)
from .resources import (
    check_resources,
    limit_ceilings,
    resolve_resources,
    resolve_spec,
    resource_excesses,
)

__all__ = [
    "HOST",
    "SCOPE",
    "SPEC",
    "Admission",
    "BackendProfile",
    "EffectiveFloor",
    "EffectiveIsolationScope",
    "admit_request",
    "check_backend",
    "check_call_key",
    "check_resources",
    "effective_floor",
    "effective_isolation_scope",
    "limit_ceilings",
    "resolve_fixed_backend",
    "resolve_resources",
    "resolve_spec",
    "resource_excesses",
    "select_backend",
    "validate_registration",
]
