"""Whether idle warm-pool pods are sealed until claimed, as this operator can check it (#36 item 2).

A Sandbox served from a warm pool runs in a pod made before it: whatever reached that pod between
its creation and the claim reaches the Sandbox. The chart's ``sealIdlePoolPods`` policies
(templates/sealed-pool-pods-policy.yaml) refuse every way in (exec, attach, port-forward, an
update of the pod or its ephemeral containers) to every identity but the operator's. This module
does not assume they are there: it watches the four objects (two ValidatingAdmissionPolicies and
their bindings, named by ``--pool-seal``) and judges them (:func:`judge_seal`, pure) into a
:class:`Seal`: since when the seal has held unchanged, or why it does not hold.

A pool pod created after :attr:`Seal.since` was sealed from its creation on: any change to the
four objects (a deletion, an edit, a re-creation) moves ``since`` past the pods made before it,
so "sealed now, and since before the pod's creation" means sealed all along. That is what a claim
records on the Sandbox (``status.sealedUntilClaim``) and what the maf backend turns into
``freshly_created=True``. The node itself (the kubelet, containerd, root on the node) is outside
any admission policy, trusted as for every sandbox.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from sandbox_operator import labels as lbl
from sandbox_operator.kubecalls import call_json, list_then_watch
from sandbox_operator.views import (
    AdmissionPolicyView,
    ObjectView,
    PolicyBindingView,
    SelfSubjectReviewView,
)

log = logging.getLogger(__name__)

#: How long after its last change a policy is taken to be in force: the API server compiles it
#: and syncs its parameters' informer first (about a second here).
SETTLE: Final = timedelta(seconds=10)
#: Identities the chart exempts besides the operator: the garbage collector drops owner
#: references of pods whose pool is gone.
ALSO_EXEMPT: Final = frozenset(
    {
        "system:serviceaccount:kube-system:generic-garbage-collector",
        "system:kube-controller-manager",
    }
)
#: The ways into a pod the connect policy must refuse, and the updates the other one must.
CONNECT_RESOURCES: Final = frozenset({"pods/exec", "pods/attach", "pods/portforward"})
UPDATE_RESOURCES: Final = frozenset({"pods", "pods/ephemeralcontainers"})
#: The connect binding's parameters: the namespace's idle pool pods.
IDLE_SELECTOR: Final = {
    "matchExpressions": [
        {"key": lbl.POOL_LABEL, "operator": "Exists"},
        {"key": lbl.SANDBOX_LABEL, "operator": "DoesNotExist"},
    ]
}
#: One of the four watched objects: a policy or a binding.
SealObject = AdmissionPolicyView | PolicyBindingView
_EXEMPT = re.compile(r"^!\(request\.userInfo\.username in (\[.*\])\)$")


@dataclass(frozen=True)
class Seal:
    """``since``: pods created after it were sealed from their creation on (None: no pod is);
    ``reason``: what holds, or why not (for a log line and the docs' declarations table)."""

    since: datetime | None
    reason: str

    def covers(self, created: datetime | None) -> bool:
        """Whether a pod created at ``created`` has been sealed from its creation on."""
        return self.since is not None and created is not None and created > self.since


#: Before the operator has looked (or with no ``--pool-seal``): nothing is vouched for.
NOT_CONFIGURED: Final = Seal(None, "no seal to check: the operator runs without --pool-seal")


def seal_names(policy: str) -> tuple[str, str]:
    """The connect policy's name (also its binding's) and the update policy's."""
    return policy, f"{policy}-update"


def _rules_cover(policy: AdmissionPolicyView, operation: str, resources: frozenset[str]) -> bool:
    covered: set[str] = set()
    for rule in policy.resource_rules:
        if "" in rule.api_groups and operation in rule.operations:
            covered |= set(rule.resources)
    return resources <= covered


def _exemptions_ok(policy: AdmissionPolicyView, identity: str) -> str:
    """Why the policy's match conditions let someone else through ("" when they do not): the
    one exemption must name this operator's identity and nobody but the garbage collector's."""
    for condition in policy.match_conditions:
        if condition.name != "not-the-operator":
            continue
        found = _EXEMPT.match(condition.expression)
        try:
            exempt = set(json.loads(found.group(1))) if found else None
        except ValueError:
            exempt = None
        if exempt is None:
            return "its exemption is not the chart's (a list of usernames)"
        if identity not in exempt:
            return f"it exempts another operator identity, not this one ({identity})"
        if exempt - ALSO_EXEMPT - {identity}:
            return "it exempts identities besides the operator's and the garbage collector's"
        return ""
    return "it has no exemption for the operator, whose claim must update the pod"


def _judge_policy(
    name: str, policy: SealObject | None, operation: str, resources: frozenset[str],
    identity: str,
) -> str:  # fmt: skip
    if not isinstance(policy, AdmissionPolicyView):
        return f"ValidatingAdmissionPolicy {name} is not installed"
    if policy.failure_policy != "Fail":
        return f"ValidatingAdmissionPolicy {name} does not fail closed (failurePolicy)"
    if not _rules_cover(policy, operation, resources):
        return (
            f"ValidatingAdmissionPolicy {name} does not match {operation} of all of "
            + ", ".join(sorted(resources))
        )
    why = _exemptions_ok(policy, identity)
    return f"ValidatingAdmissionPolicy {name}: {why}" if why else ""


def _judge_binding(name: str, binding: SealObject | None, *, params: bool) -> str:
    if not isinstance(binding, PolicyBindingView):
        return f"ValidatingAdmissionPolicyBinding {name} is not installed"
    if binding.policy_name != name:
        return f"ValidatingAdmissionPolicyBinding {name} binds another policy"
    if "Deny" not in binding.validation_actions:
        return f"ValidatingAdmissionPolicyBinding {name} does not deny (validationActions)"
    if params:
        ref = binding.param_ref
        if ref.selector != IDLE_SELECTOR or ref.namespace:
            return f"ValidatingAdmissionPolicyBinding {name} does not take the idle pool pods"
    return ""


def _changed_at(obj: ObjectView) -> datetime | None:
    """The last time anyone changed what the object enforces: its creation or its newest
    managed-fields entry, but for its status (the API server records a policy's type checking
    there, seconds after any change: that changes nothing enforced, and counting it would leave
    the pods made meanwhile unvouched)."""
    meta = obj.metadata
    times = [meta.created]
    times += [m.time for m in meta.managed_fields if m.subresource != "status"]
    known = [t for t in times if t is not None]
    return max(known) if known else None


def judge_seal(objects: Mapping[str, SealObject | None], policy: str, identity: str) -> Seal:
    """The seal the four objects make. ``objects`` maps ``"policy/<name>"`` and
    ``"binding/<name>"`` to the object's view as watched (None or missing: not there; a view of
    the other kind counts as missing); ``policy`` is
    the connect policy's name (:func:`seal_names`); ``identity`` the username the API server
    knows this operator by."""
    connect, update = seal_names(policy)
    problems = [
        _judge_policy(connect, objects.get(f"policy/{connect}"), "CONNECT", CONNECT_RESOURCES,
                      identity),
        _judge_policy(update, objects.get(f"policy/{update}"), "UPDATE", UPDATE_RESOURCES,
                      identity),
        _judge_binding(connect, objects.get(f"binding/{connect}"), params=True),
        _judge_binding(update, objects.get(f"binding/{update}"), params=False),
    ]  # fmt: skip
    problem = next((p for p in problems if p), "")
    if problem:
        return Seal(None, f"idle pool pods are not sealed: {problem}")
    changes = [_changed_at(o) for o in objects.values() if o is not None]
    if any(c is None for c in changes):
        return Seal(None, "idle pool pods are not sealed: a policy object has no timestamps")
    since = max(c for c in changes if c is not None) + SETTLE
    return Seal(
        since, f"idle pool pods sealed by {connect} and {update} since {since:%Y-%m-%dT%H:%M:%SZ}"
    )


async def operator_identity(api: Any) -> str:
    """The username the API server authenticates this operator as (a SelfSubjectReview, which
    every authenticated identity may create)."""
    from kubernetes_asyncio import client

    review = await call_json(
        client.AuthenticationV1Api(api).create_self_subject_review,
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    return SelfSubjectReviewView(review).user_info.username


async def follow_seal(api: Any, policy: str, on_seal: Callable[[Seal], None]) -> None:
    """Watch the four objects for as long as the operator runs and call ``on_seal`` with each
    new verdict (only when it changes). Never raises but ``CancelledError``."""
    from kubernetes_asyncio import client

    try:
        identity = await operator_identity(api)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        status = getattr(exc, "status", None) or type(exc).__name__
        on_seal(Seal(None, f"idle pool pods are not vouched for: who this operator is ({status})"))
        return
    admission = client.AdmissionregistrationV1Api(api)
    held: dict[str, SealObject | None] = {}
    last: list[Seal] = []

    def judge() -> None:
        if len(held) < 4:  # each watch listed once first: no verdict on half of them
            return
        seal = judge_seal(held, policy, identity)
        if not last or last[-1] != seal:
            last[:] = [seal]
            log.info("warm pools: %s", seal.reason)
            on_seal(seal)

    def follower(
        kind: str, name: str
    ) -> tuple[Callable[[list[SealObject]], None], Callable[[str, SealObject], None]]:
        key = f"{kind}/{name}"

        def listed(items: list[SealObject]) -> None:
            held[key] = items[0] if items else None
            judge()

        def changed(change: str, item: SealObject) -> None:
            held[key] = None if change == "DELETED" else item
            judge()

        return listed, changed

    watches = []
    for name in seal_names(policy):
        kinds: tuple[tuple[str, Any, type[SealObject]], ...] = (
            ("policy", admission.list_validating_admission_policy, AdmissionPolicyView),
            ("binding", admission.list_validating_admission_policy_binding, PolicyBindingView),
        )
        for kind, call, view in kinds:
            listed, changed = follower(kind, name)
            watches.append(
                list_then_watch(
                    call,
                    view=view,
                    on_list=listed,
                    on_change=changed,
                    what=f"{kind} {name}",
                    field_selector=f"metadata.name={name}",
                )
            )
    await asyncio.gather(*watches)
