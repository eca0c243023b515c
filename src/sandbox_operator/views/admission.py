"""Views of the admission objects the operator judges: a ValidatingAdmissionPolicy and its
binding (admissionregistration.k8s.io/v1), and a SelfSubjectReview's answer.

Why its own module: the warm pools' seal (reconcile/seal.py) decides from these objects whether
idle pool pods are sealed; each field it judges is named here once, so a misspelt key is a type
error rather than a seal that silently never holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from sandbox_operator.views.fields import Field, mapping, raw_field, sequence, text, text_field
from sandbox_operator.views.objects import ObjectView, Raw, nested


def _texts(value: object) -> tuple[str, ...]:
    return tuple(text(v) for v in sequence(value))


class ResourceRuleView(Raw):
    """One of a policy's ``matchConstraints.resourceRules``."""

    __slots__ = ()
    api_groups = Field(_texts)
    operations = Field(_texts)
    resources = Field(_texts)


class MatchConditionView(Raw):
    """One of a policy's ``matchConditions``: a name and a CEL expression."""

    __slots__ = ()
    name = text_field()
    expression = text_field()


class AdmissionPolicyView(ObjectView):
    """A ValidatingAdmissionPolicy."""

    __slots__ = ()
    failure_policy = text_field(under="spec")
    match_constraints = Field(mapping, under="spec")
    match_conditions_raw = Field(sequence, "matchConditions", under="spec")

    @property
    def resource_rules(self) -> list[ResourceRuleView]:
        """``spec.matchConstraints.resourceRules``."""
        found = sequence(self.match_constraints.get("resourceRules"))
        return [ResourceRuleView(mapping(r)) for r in found]

    @property
    def match_conditions(self) -> list[MatchConditionView]:
        return [MatchConditionView(mapping(c)) for c in self.match_conditions_raw]


class ParamRefView(Raw):
    """A binding's ``paramRef``: which objects are the policy's parameters."""

    __slots__ = ()
    #: The label selector as written (compared whole against the one the chart writes).
    selector = raw_field()
    namespace = text_field()


class PolicyBindingView(ObjectView):
    """A ValidatingAdmissionPolicyBinding."""

    __slots__ = ()
    policy_name = text_field(under="spec")
    validation_actions: Field[Sequence[str]] = Field(_texts, under="spec")
    param_ref: Field[ParamRefView] = Field(nested(ParamRefView), under="spec")


class UserInfoView(Raw):
    """An authentication answer's ``userInfo``."""

    __slots__ = ()
    username = text_field()
    groups: Field[Sequence[str]] = Field(_texts)


class SelfSubjectReviewView(ObjectView):
    """A SelfSubjectReview as the API server answers it: who the caller is."""

    __slots__ = ()

    @property
    def user_info(self) -> UserInfoView:
        return UserInfoView(mapping(self.raw_status.get("userInfo")))
