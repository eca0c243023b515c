"""A spec's ``labels``: the host's own words about a workload, carried verbatim (#25 item 9).

Stored as given (no trimming, no case folding, no coercion of a non-string), bounded only so the
API server's validation cost is, and judged by nothing: admission gives the same answer with or
without them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from sandbox_operator.contract import (
    BackendDeclarations,
    Egress,
    HostPolicy,
    Isolation,
    SandboxResourceSpec,
    SandboxSpec,
)
from sandbox_operator.contract.base import (
    LABEL_KEY_MAX_LENGTH,
    LABEL_VALUE_MAX_LENGTH,
    LABELS_MAX_ITEMS,
)
from sandbox_operator.policy.admission import BackendProfile, select_backend
from tests.fixtures.crds import (
    BASE,
    SANDBOX_FILE,
    evaluate,
    rules,
    spec_schema,
    spec_transition_rules_pass,
)

ODD = {"Tenant": "Contoso Ltd / EU", "cost centre": "  42  ", "ünï": "", "a.b/c": "\u200bx"}


def spec(**fields: Any) -> SandboxSpec:
    return SandboxSpec.model_validate({"kind": "k", "image": "i", **fields})


def test_labels_are_kept_exactly_as_given_and_round_trip_the_wire() -> None:
    given = dict(ODD)
    s = spec(labels=given)
    given["Tenant"] = "changed afterwards"
    assert s.labels == ODD
    assert s.to_wire()["labels"] == ODD
    again = SandboxSpec.model_validate(s.to_wire())
    assert again.labels == ODD and again == s


@pytest.mark.parametrize("bad", [{"n": 1}, {"n": None}, {"n": b"x"}, {"n": ["x"]}])
def test_a_non_string_value_is_refused_not_coerced(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        spec(labels=bad)


@pytest.mark.parametrize(
    ("labels", "ok"),
    [
        ({f"k{i}": "v" for i in range(LABELS_MAX_ITEMS)}, True),
        ({f"k{i}": "v" for i in range(LABELS_MAX_ITEMS + 1)}, False),
        ({"k" * LABEL_KEY_MAX_LENGTH: "v"}, True),
        ({"k" * (LABEL_KEY_MAX_LENGTH + 1): "v"}, False),
        ({"": "v"}, False),
        ({"k": "v" * LABEL_VALUE_MAX_LENGTH}, True),
        ({"k": "v" * (LABEL_VALUE_MAX_LENGTH + 1)}, False),
    ],
)
def test_bounds_and_the_crd_agree(labels: dict[str, str], ok: bool) -> None:
    try:
        spec(labels=labels)
        model_ok = True
    except ValidationError:
        model_ok = False
    assert model_ok == ok
    node = spec_schema(SANDBOX_FILE)["properties"]["labels"]
    crd_ok = (
        len(labels) <= node["maxProperties"]
        and all(len(v) <= node["additionalProperties"]["maxLength"] for v in labels.values())
        and all(evaluate(r, labels) for r in rules(node))
    )
    assert crd_ok == ok


def test_no_labels_no_field_on_the_wire() -> None:
    assert "labels" not in spec().to_wire()
    assert (
        "labels"
        not in SandboxResourceSpec.model_validate(
            {"kind": "k", "image": "i", "scopeRef": "s", "agentDir": "a"}
        ).to_wire()
    )


def test_labels_cannot_change_after_creation_like_the_rest_of_the_spec() -> None:
    old = {**BASE, "labels": {"tenant": "a"}}
    assert spec_transition_rules_pass(old, old)
    assert not spec_transition_rules_pass({**BASE, "labels": {"tenant": "b"}}, old)
    assert not spec_transition_rules_pass(BASE, old)


def test_admission_never_reads_them() -> None:
    host = HostPolicy(min_isolation=Isolation.CONTAINER)
    declared = BackendDeclarations(egress_modes=frozenset({Egress.CLOSED}))
    backends = [BackendProfile(name="runc", isolation="container", declarations=declared)]
    bare = select_backend(host, backends, spec())
    labelled = select_backend(host, backends, spec(labels=ODD))
    assert labelled.backend == bare.backend and labelled.floor == bare.floor
    assert labelled.spec is not None and labelled.spec.labels == ODD
