"""The status fields a reconcile pass writes, as typed dicts in their wire spelling.

Why its own module: the passes of the three kinds (``compute``, ``egress_edit``, ``reset``,
``pool``, ``scope``) each set a few status fields, which ``status.Draft`` gathers and
``status.send_status_patch`` turns into one merge patch (validated by the kind's status model
there, the encode boundary). Typed here, a misspelt key or a value of the wrong shape is a mypy
error where the field is set, not a test failure (at best) after the write. The keys are the
camelCase of the status models' fields; ``None`` removes a field (a merge patch's null). Every
key is optional: a pass sets only what it decides.

A value that is a contract model's own encoding (``to_wire``: a port's status, an egress rule,
a purge's summary) stays the JSON the model gives; the model is its schema.
"""

from __future__ import annotations

from typing import Any, TypedDict

from sandbox_operator.contract import ServedBy


class ServedByStatus(TypedDict, total=False):
    """``status.servedBy``: what serves the sandbox (no namespace for a remote resource)."""

    kind: str
    name: str
    namespace: str


class EgressPolicyStatus(TypedDict):
    """``status.egressPolicy``: the generation whose egress lists are enforced, and since when."""

    generation: int
    appliedAt: str


class EgressEditRefusedStatus(TypedDict):
    """``status.egressEditRefused``: the egress edit refused, at which generation and why."""

    generation: int
    reason: str
    message: str


class StatusFields(TypedDict, total=False):
    """The status fields (but the conditions) a pass of a Sandbox, SandboxScope or
    SandboxWarmPool sets; each kind's status model holds which of them it has."""

    observedGeneration: int | None
    # Sandbox: admission and what serves it.
    backend: str | None
    isolation: str | None
    effectiveFloor: str | None
    isolationScope: str | None
    servedBy: ServedByStatus | None
    servedFrom: str | None
    sealedUntilClaim: bool | None
    # Sandbox: suspend and resume.
    suspendedBy: str | None
    suspendedAt: str | None
    resumedAt: str | None
    suspendCount: int
    resumeCount: int
    # Sandbox: reset.
    resets: int
    resetAt: str
    resetRefused: str | None
    # Sandbox: declared ports (each a ``PortStatus.to_wire()``).
    ports: list[dict[str, Any]]
    # Sandbox: egress as admitted (rules: each an ``EgressRule.to_wire()``) and edits of it.
    admittedEgressAllow: list[str]
    admittedEgressRules: list[dict[str, Any]] | None
    egressPolicy: EgressPolicyStatus
    egressEditRefused: EgressEditRefusedStatus | None
    # SandboxScope (lastPurge: a ``ScopePurge`` encoded by its model).
    sandboxCount: int
    lastPurge: dict[str, Any]
    lastPurgeTime: str
    # SandboxWarmPool (backend and shape of its template, and its pods).
    shape: str | None
    selector: str
    claimed: int
    replicas: int
    readyReplicas: int


def served_by_wire(served: ServedBy | None) -> ServedByStatus | None:
    """The contract's ``ServedBy`` as ``status.servedBy`` holds it (its wire form: no namespace
    for a remote resource), or None."""
    if served is None:
        return None
    out = ServedByStatus(kind=served.kind, name=served.name)
    if served.namespace:
        out["namespace"] = served.namespace
    return out


class StatusWrite(StatusFields, total=False):
    """A status as a pass would write it: its fields and its conditions (each a
    ``Condition.to_wire()``), compared with the held status key by key."""

    conditions: list[dict[str, Any]]
