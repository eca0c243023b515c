"""The client reads a Sandbox's status through the contract's models, leniently: what it cannot
read is dropped, never raised."""

from __future__ import annotations

from typing import Any

from sandbox_operator.client.status import evaluate, is_suspended, read_status, served_by
from sandbox_operator.contract import ConditionStatus, ConditionType, Isolation


def sandbox(status: Any, generation: int = 1) -> dict[str, Any]:
    return {"metadata": {"generation": generation}, "status": status}


READY = {"type": "Ready", "status": "True", "reason": "Ready"}


def test_status_reads_as_the_contract_model() -> None:
    status = read_status(
        sandbox(
            {
                "observedGeneration": 1,
                "isolation": "container",
                "servedBy": {"kind": "Pod", "name": "p", "namespace": "ns"},
                "conditions": [READY],
            }
        )
    )
    assert status.isolation is Isolation.CONTAINER
    [cond] = status.conditions
    assert cond.type == ConditionType.READY and cond.status is ConditionStatus.TRUE


def test_unknown_fields_are_ignored() -> None:
    obj = sandbox(
        {
            "observedGeneration": 1,
            "fromANewerOperator": {"x": 1},
            "servedBy": {"kind": "Pod", "name": "p", "extra": True},
            "conditions": [{**READY, "extra": "x"}],
        }
    )
    assert evaluate(obj)[0] == "ready"
    served = served_by(obj)
    assert served is not None and served.name == "p"


def test_what_does_not_validate_is_dropped_not_raised() -> None:
    obj = sandbox(
        {
            "observedGeneration": 1,
            "isolation": "no-such-rung",
            "suspendedBy": "idle",
            "conditions": [READY, {"type": "Admitted", "status": "Maybe", "reason": "X"}, 7],
        }
    )
    status = read_status(obj)
    assert status.isolation is None
    assert status.suspended_by == "idle"
    assert [c.type for c in status.conditions] == ["Ready"]
    assert is_suspended(obj)


def test_a_status_that_is_not_a_mapping_is_empty() -> None:
    raws: list[Any] = [None, [], "x", {}]
    for raw in raws:
        assert evaluate(sandbox(raw)) == ("pending", "Pending", "")
