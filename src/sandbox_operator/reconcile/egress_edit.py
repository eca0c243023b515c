"""Egress edits on a live Sandbox (docs/egress.md, "Editing egress on a live Sandbox"), as pure
functions: whether ``spec.egressAllow`` / ``spec.egressRules`` differ from what is enforced, the
judgement of the difference, and what the status and an Event say of it.

Its own module because an edit is its own decision beside admission and the plan: the sandbox
was admitted once and keeps its backend, floor and pod; only its allowlist is judged again, by
the policy's egress check (``policy.check_egress``) against the backend serving it, with the
host's policy of now. The egress proxy enforces ``status.admittedEgressAllow`` and
``admittedEgressRules``, never the live spec, so a refused edit changes nothing it enforces:
the last accepted egress stays in force: ``status.egressPolicy`` says which generation that is,
``status.egressEditRefused`` why the latest edit was refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import ValidationError

from sandbox_operator.contract import (
    ConditionReason,
    Egress,
    SandboxRefusal,
    SandboxResourceSpec,
)
from sandbox_operator.contract.egressrules import EgressRule
from sandbox_operator.policy import BackendProfile, check_egress
from sandbox_operator.reconcile.conditions import now_rfc3339
from sandbox_operator.reconcile.statusfields import EgressEditRefusedStatus, StatusFields
from sandbox_operator.views import EgressEditRefusalView, SandboxStatusView

R = ConditionReason


@dataclass(frozen=True)
class EgressEdit:
    """What the pass writes for the sandbox's egress (``fields``, status fields in their wire
    spelling) and the Events it posts once that write is made: ``(type, reason, message)``."""

    fields: StatusFields = field(default_factory=lambda: StatusFields())
    events: tuple[tuple[str, str, str], ...] = ()


def _hosts(value: object) -> frozenset[str]:
    return frozenset(str(h) for h in value) if isinstance(value, Sequence) else frozenset()


def _rules(value: object) -> dict[str, EgressRule] | None:
    """Rules by host as models (one spelling), so an order or default-only difference is no
    edit; None when what status holds does not parse (then it is replaced)."""
    if not isinstance(value, Sequence):
        return {}
    try:
        parsed = [EgressRule.model_validate(r) for r in value]
    except ValidationError:
        return None
    return {r.host: r for r in parsed}


def _describe(allow: frozenset[str], rules: Iterable[str]) -> str:
    hosts = ", ".join(sorted(allow)) or "none"
    ruled = ", ".join(sorted(rules)) or "none"
    return f"egressAllow [{hosts}], egressRules for [{ruled}]"


def egress_edit(
    spec: SandboxResourceSpec,
    status: SandboxStatusView,
    admitted: StatusFields,
    *,
    generation: int,
    backend: BackendProfile | None,
    follows_edits: bool,
    allow_unrestricted: bool,
    now: datetime,
) -> EgressEdit:
    """The egress record of an admitted sandbox for this pass.

    ``admitted``: the status fields this pass's admission sets (a new admission records the
    spec's lists itself); ``generation``: the Sandbox's ``metadata.generation``; ``backend``: the
    profile of the backend serving it (None: no longer configured); ``follows_edits``: whether
    its driver enforces an edit on a live sandbox (``backends.base.follows_egress_edits``).

    Same lists as enforced: at most the record is written once (a new admission, a Sandbox from
    before edits, or the spec back at what is enforced after a refused edit: the refusal goes).
    Other lists: the edit is judged; accepted, they become the admitted lists with
    ``egressPolicy.generation`` and ``appliedAt`` (and an ``EgressEdited`` Event); refused, the
    admitted lists stay and ``egressEditRefused`` names the generation and why (and an
    ``EgressEditRefused`` Event).
    A generation already refused is not judged again; a later one (any spec edit) is, so a
    host policy or backend that changed since can let it through.
    """
    if spec.egress is not Egress.ALLOWLIST:
        return EgressEdit()
    # None: an admitted Sandbox whose status holds no lists (admitted before they were recorded,
    # or they were removed): the proxy enforces nothing for it, and the spec's lists are judged
    # as an edit from none, never taken as they are.
    held = status
    old_allow = admitted.get("admittedEgressAllow", held.admitted_egress_allow)
    raw_rules = admitted.get("admittedEgressRules", held.admitted_egress_rules)
    recorded = bool(held.egress_policy)
    recorded_generation = held.egress_policy_generation
    refusal = held.egress_edit_refused
    refused_at = EgressEditRefusalView(refusal).generation if refusal is not None else None
    new_allow = frozenset(spec.egress_allow)
    new_rules = {r.host: r for r in spec.egress_rules}
    # Cheap first (every pass of every allowlist sandbox asks): the lists exactly as written.
    new_wire = [r.to_wire() for r in new_rules.values()]
    same_rules = (raw_rules or []) == new_wire or _rules(raw_rules) == new_rules
    # This pass's admission records the spec's lists itself (a new admission, a resume judged
    # afresh): they are this generation's.
    fresh = "admittedEgressAllow" in admitted and recorded_generation != generation
    if old_allow is not None and _hosts(old_allow) == new_allow and same_rules:
        fields: StatusFields = {}
        if fresh or not recorded:
            fields["egressPolicy"] = {"generation": generation, "appliedAt": now_rfc3339(now)}
        if refusal is not None:
            fields["egressEditRefused"] = None  # back at what is enforced: nothing refused
        return EgressEdit(fields)
    if refused_at == generation:
        return EgressEdit()
    problem = _refusal(spec, backend, follows_edits, allow_unrestricted)
    if problem is not None:
        reason, message = problem
        kept = recorded_generation if recorded_generation is not None else 0
        text = (
            f"egress edit of generation {generation} refused ({reason}): {message}; the egress "
            f"of generation {kept} stays enforced"
        )
        refused = EgressEditRefusedStatus(generation=generation, reason=reason, message=message)
        return EgressEdit(
            {"egressEditRefused": refused}, (("Warning", R.EGRESS_EDIT_REFUSED.value, text),)
        )
    fields = {
        "admittedEgressAllow": list(spec.egress_allow),
        # Removed (None) when the edit leaves no rules: what a Sandbox admitted without holds.
        "admittedEgressRules": [r.to_wire() for r in spec.egress_rules] or None,
        "egressPolicy": {"generation": generation, "appliedAt": now_rfc3339(now)},
        "egressEditRefused": None,
    }
    text = f"egress of generation {generation} admitted: {_describe(new_allow, new_rules)}"
    return EgressEdit(fields, (("Normal", R.EGRESS_EDITED.value, text),))


def _refusal(
    spec: SandboxResourceSpec,
    backend: BackendProfile | None,
    follows_edits: bool,
    allow_unrestricted: bool,
) -> tuple[str, str] | None:
    """Why the serving backend cannot take the edited egress ((reason, message)), or None."""
    if backend is None or not follows_edits:
        name = backend.name if backend is not None else "serving the sandbox"
        return (
            R.EGRESS_EDIT_NOT_SUPPORTED.value,
            f"backend {name} cannot change the egress of a running sandbox; create a new "
            "Sandbox with the egress wanted",
        )
    try:
        check_egress(backend, spec.sandbox_spec(), allow_unrestricted=allow_unrestricted)
    except SandboxRefusal as refusal:
        return refusal.reason.value, refusal.message
    return None
