"""Egress edits: a running Sandbox's allowlist (``spec.egressAllow``) and method and path rules
(``spec.egressRules``) narrowed or widened (docs/egress.md, "Editing egress on a live Sandbox").

An edit is a merge patch of those two fields as this client's ``-egress`` field manager. The CRD
refuses what it refuses at creation (a metadata host, an IP literal, a host in both lists: a 422
naming the field); the operator then judges the edit against the backend serving the sandbox and
either admits it (``status.admittedEgressAllow`` / ``admittedEgressRules``, ``status.egressPolicy``)
or refuses it (``status.egressEditRefused``), the egress in force before staying so. The edit
is in force once the egress proxy reports it enforces that generation
(``status.egress.policyGeneration``), which is what :meth:`EgressEdits.edit` waits for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from sandbox_operator.client.acquire_errors import (
    SandboxAcquireError,
    SandboxGone,
    SandboxNotReadyInTime,
)
from sandbox_operator.client.errors import SandboxEgressEditRefused
from sandbox_operator.client.kube import SandboxObjects
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.client.status import Verdict, effective_state
from sandbox_operator.client.watching import WaitNotes, Watches
from sandbox_operator.contract.egressrules import EgressRule, EgressRuleFields
from sandbox_operator.views import EgressEditRefusalView, SandboxView, on_the_wire

#: ``reason`` of an edit the API server refused (the CRD's rules).
INVALID = "Invalid"


def _rules(value: object) -> dict[str, object] | None:
    """Rules by host in one spelling; None when they do not parse."""
    if not isinstance(value, Sequence):
        return {}
    try:
        return {r.host: r.to_wire() for r in (EgressRule.model_validate(v) for v in value)}
    except ValidationError:
        return None


def edit_state(raw: SandboxView, generation: int) -> tuple[str, str, str]:
    """Where the edit made at ``generation`` stands: ("done" | "pending" | "refused", reason,
    message). Done once the admitted lists are the spec's and the egress proxy, where one reports
    (``status.egress``), enforces the generation they were admitted at. ``raw``: the Sandbox's
    view."""
    obj = SandboxView.of(raw)
    status = obj.status
    refusal = EgressEditRefusalView(status.egress_edit_refused)
    refused_at = refusal.generation
    if refused_at is not None and refused_at >= generation:
        return "refused", refusal.reason, refusal.message
    admitted = set(status.admitted_egress_allow or ())
    if admitted != set(obj.egress_allow) or _rules(status.admitted_egress_rules) != _rules(
        obj.egress_rules
    ):
        return "pending", "", "the operator has not admitted the edit yet"
    enforced = status.egress.policy_generation
    wanted = status.egress_policy_generation
    if on_the_wire(status.egress) and (
        not isinstance(enforced, int) or not isinstance(wanted, int) or enforced < wanted
    ):
        return "pending", "", "the egress proxy does not enforce the edit yet"
    return "done", "", ""


@dataclass(frozen=True)
class EgressEditAt:
    """The wait of the edit made at ``generation`` (:func:`edit_state`), as the client's watches
    wait for any goal (:meth:`~sandbox_operator.client.watching.Watches.until_goal`). A pending
    edit's reason is what it still waits for, which a timeout reports."""

    generation: int

    def verdict(self, obj: SandboxView) -> Verdict:
        state, reason, message = edit_state(obj, self.generation)
        if state == "pending":
            return "pending", message, message
        return ("ready" if state == "done" else "terminal"), reason, message


class EgressEdits:
    """Edit the egress of Sandboxes of one namespace (see the module)."""

    def __init__(self, objects: SandboxObjects, watches: Watches) -> None:
        self.objects = objects
        self.watches = watches

    async def edit(
        self,
        sandbox: Sandbox | str,
        *,
        allow: Sequence[str] | None,
        rules: Sequence[EgressRule | EgressRuleFields] | None,
        timeout: float,  # noqa: ASYNC109
    ) -> SandboxView:
        """:meth:`SandboxClient.edit_egress <sandbox_operator.client.SandboxClient.edit_egress>`,
        with ``timeout`` in seconds; returns the Sandbox as it is once the edit is in force."""
        name = sandbox if isinstance(sandbox, str) else sandbox.name
        fields: dict[str, object] = {}
        if allow is not None:
            fields["egressAllow"] = list(allow)
        if rules is not None:
            wire = [EgressRule.model_validate(r).to_wire() for r in rules]
            fields["egressRules"] = wire or None  # none: removed, as a Sandbox without rules is

        def refused(message: str) -> SandboxEgressEditRefused:
            return SandboxEgressEditRefused(
                sandbox=name, namespace=self.objects.namespace, reason=INVALID, message=message
            )

        obj = await self.objects.edit_spec(name, fields, manager="egress", refused=refused)
        generation = obj.metadata.generation
        last = WaitNotes()
        try:
            async with asyncio.timeout(timeout):
                obj = await self.watches.until_goal(name, obj, last, goal=EgressEditAt(generation))
        except TimeoutError:
            raise SandboxNotReadyInTime(
                sandbox=name,
                namespace=self.objects.namespace,
                timeout=timeout,
                last_reason=last.reason,
            ) from None
        except SandboxGone:
            raise
        except SandboxAcquireError as exc:  # the edit's verdict "terminal": the refusal
            raise SandboxEgressEditRefused(
                sandbox=name,
                namespace=self.objects.namespace,
                reason=exc.reason,
                message=exc.message,
            ) from None
        if isinstance(sandbox, Sandbox):
            sandbox.resource = obj
            old = sandbox.effective_state
            if old is not None:  # its egress_allow: the hosts admitted now
                sandbox.effective_state = effective_state(
                    obj, sandbox.spec, host_tools=old.host_tools, call=old.call
                )
        return obj
