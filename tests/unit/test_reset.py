"""Reset (``spec.resets``, docs/reset.md) without a cluster: when a reset is due, how the pass
judges the pod that replaces the old one, the driver's immediate delete, the client's wait and
count. (The API server's rules and the whole pass: tests/integration/test_reset_api.py.)"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from sandbox_operator import naming
from sandbox_operator.backends.base import (
    Observation,
    ObservedPhase,
    Resettable,
    SandboxRef,
    ServedBy,
    resets,
)
from sandbox_operator.client.resets import next_reset
from sandbox_operator.client.status import RESET_REFUSED, ResetTo, evaluate_for
from sandbox_operator.contract import SandboxResourceSpec
from sandbox_operator.reconcile import compute, reset
from sandbox_operator.reconcile.seal import Seal
from sandbox_operator.reconcile.views import Views
from sandbox_operator.views import SandboxStatusView, SandboxView
from tests.fixtures.compute import NOW, SPEC, admit, admitted_status, rfc, sandbox
from tests.fixtures.runtimeclass import (
    NAME,
    NS,
    UID,
    AnsweringApi,
    FakeApi,
    driver,
    fast_disposal_backend,
)

POD_NAME = naming.pod_name(NAME)


def spec_of(**fields: Any) -> SandboxResourceSpec:
    return SandboxResourceSpec.model_validate({**SPEC, **fields})


# ---- when a reset is due --------------------------------------------------------------------


def test_a_reset_is_due_while_the_spec_asks_for_more_than_the_status_served() -> None:
    assert reset.reset_wanted(spec_of(), SandboxStatusView({})) is None
    assert reset.reset_wanted(spec_of(resets=1), SandboxStatusView({})) == 1
    assert reset.reset_wanted(spec_of(resets=1), SandboxStatusView({"resets": 1})) is None
    assert reset.reset_wanted(spec_of(resets=3), SandboxStatusView({"resets": 1})) == 3
    # Refused once (the backend cannot): not tried again on every pass.
    assert (
        reset.reset_wanted(
            spec_of(resets=2), SandboxStatusView({"resets": 1, "resetRefused": "no"})
        )
        is None
    )
    fields = reset.reset_fields(2, NOW)
    assert fields["resets"] == 2 and fields["resetRefused"] is None
    assert fields["resetAt"].startswith("2099-01-01T12:00:00")


def test_the_model_refuses_a_reset_with_storage() -> None:
    with pytest.raises(ValidationError, match="resets needs a sandbox without storage"):
        spec_of(resets=1, storage={"size": "1Gi"})
    with pytest.raises(ValidationError):
        spec_of(resets=-1)
    # Never written by the acquirer's apply: a spec without resets says nothing of it.
    assert "resets" not in spec_of().to_wire() or spec_of().to_wire()["resets"] == 0


# ---- the plan for what replaces the old pod --------------------------------------------------


def _ready_sandbox(**status: Any) -> Any:
    before = NOW - timedelta(minutes=5)
    return sandbox(
        {**SPEC, "resets": 1},
        {**admitted_status(before, ready=True, ready_at=before), **status},
    )


def _plan(obj: Any, obs: Observation, **kw: Any) -> compute.Plan:
    spec = SandboxResourceSpec.model_validate(obj["spec"])
    return compute.plan(
        obj, spec, admit(obj), obs, key_unclean=None, scope_problem="", now=NOW, **kw
    )


def test_a_new_cold_pod_after_a_reset_is_starting_not_failed() -> None:
    obj = _ready_sandbox()
    starting = Observation(ObservedPhase.STARTING, ServedBy("Pod", "p", "ns"), created_at=NOW)
    plan = _plan(obj, starting, resetting=True)
    ready = [c for c in plan.conditions if c[0] == compute.READY]
    assert ready and ready[0][1] is False and ready[0][2] == compute.R.CREATING
    assert not plan.dispose and plan.verdict is not None and not plan.verdict.terminal
    # The startup deadline counts from the reset, not from the admission five minutes ago.
    assert plan.requeue_after is not None and plan.requeue_after > 60
    # Absent (nothing created yet) while resetting: create, never "disappeared after Ready".
    absent = _plan(obj, Observation(ObservedPhase.ABSENT), resetting=True)
    assert absent.create and not absent.dispose
    # Without the reset, the same absence after Ready is a failure (the rule the reset escapes).
    failed = _plan(obj, Observation(ObservedPhase.ABSENT))
    assert failed.dispose and failed.verdict is not None and failed.verdict.terminal


def test_a_pool_pod_claimed_by_a_reset_is_judged_again_for_the_seal() -> None:
    obj = _ready_sandbox(servedFrom="SandboxWarmPool/old", sealedUntilClaim=True)
    claimed = Observation(
        ObservedPhase.READY,
        ServedBy("Pod", "sbx-wp-new-1", "ns"),
        created_at=NOW - timedelta(minutes=1),
        ready_at=NOW - timedelta(minutes=1),
        served_from="SandboxWarmPool/new",
    )
    unsealed = Seal(None, "not sealed")
    plan = _plan(obj, claimed, resetting=True, seal=unsealed)
    assert plan.fields["sealedUntilClaim"] is False  # the old pod's True is not carried over
    assert plan.fields["servedFrom"] == "SandboxWarmPool/new"
    assert any(c[0] == compute.READY and c[1] is True for c in plan.conditions)
    # Kept once judged, without a reset.
    assert _plan(obj, claimed, seal=unsealed).fields["sealedUntilClaim"] is True
    # Reset from a pool pod to a cold one: the pool's judgement goes.
    cold = Observation(ObservedPhase.STARTING, ServedBy("Pod", "p", "ns"), served_from="cold")
    assert _plan(obj, cold, resetting=True).fields["sealedUntilClaim"] is None


def test_the_startup_clock_of_later_passes_starts_at_the_recorded_reset() -> None:
    long_ago = NOW - timedelta(hours=1)
    status = admitted_status(long_ago)
    status["resetAt"] = rfc(NOW - timedelta(seconds=5))
    obj = sandbox({**SPEC, "resets": 1}, {**status, "resets": 1})
    starting = Observation(ObservedPhase.STARTING, ServedBy("Pod", "p", "ns"))
    plan = _plan(obj, starting)
    assert plan.verdict is not None and not plan.verdict.terminal  # not StartupTimeout


# ---- the driver -------------------------------------------------------------------------------


async def test_retire_deletes_the_pod_as_a_disposal_does() -> None:
    """A reset deletes the pod with the backend's disposal grace: by default none is sent (the
    pod's own grace: it stays, confined, until the node stopped it, and is reported still
    there); with ``disposalGracePeriodSeconds: 0`` it is gone with the answer. The
    NetworkPolicy stays for the next pod either way."""
    for config, grace, left in ((None, {}, [POD_NAME]), (fast_disposal_backend(), _NO_GRACE, [])):
        fake = AnsweringApi()
        fake.put("Pod", POD_NAME)
        fake.put("NetworkPolicy", "sbx-policy")
        views = Views()
        d = (
            driver(fake, views=views)
            if config is None
            else driver(fake, views=views, config=config)
        )
        assert isinstance(d, Resettable) and resets(d)
        views.pods.upsert(fake.objects[("Pod", NS, POD_NAME)])
        still = await d.retire(SandboxRef(NS, NAME, UID))
        assert [o.name for o in still] == left
        assert fake.options == [("Pod", POD_NAME, grace)]
        assert (views.pods.get(NS, POD_NAME) is None) == (not left)
        assert fake.names("NetworkPolicy") == {"sbx-policy"}
        # Asked again while it stops: not deleted again, still reported.
        fake.options.clear()
        assert [o.name for o in await d.retire(SandboxRef(NS, NAME, UID))] == left
        assert fake.options == []
    # Without the operator's views there is no reset (nothing says which pods serve it).
    assert not resets(driver(FakeApi()))


async def test_a_pool_pod_stopping_is_not_in_the_replacements_way() -> None:
    """A claimed pool pod (another name than the sandbox's own) stops in the background: the
    replacement takes no name of it, so the reset goes on at once (by default its deletion
    keeps the pod, confined, until the node stopped it)."""
    fake = AnsweringApi()
    pool_pod = "sbx-wp-warm-abc12"
    fake.put("Pod", pool_pod)
    views = Views()
    d = driver(fake, views=views)
    views.pods.upsert(fake.objects[("Pod", NS, pool_pod)])
    served = SandboxRef(NS, NAME, UID, ServedBy("Pod", pool_pod, NS))
    assert await d.retire(served) == []
    assert fake.options == [("Pod", pool_pod, {})]  # deleted with its own grace
    pod = views.pods.get(NS, pool_pod)
    assert pod is not None and pod["metadata"]["deletionTimestamp"]  # still stopping


_NO_GRACE = {"grace_period_seconds": 0}


# ---- the client --------------------------------------------------------------------------------


def _obj(generation: int, spec_resets: int, **status: Any) -> dict[str, Any]:
    ready = status.pop("ready", True)
    return {
        "metadata": {"name": "s", "generation": generation, "resourceVersion": "1"},
        "spec": {"resets": spec_resets},
        "status": {
            "observedGeneration": status.pop("observed", generation),
            "conditions": [
                {"type": "Admitted", "status": "True", "reason": "Admitted", "message": ""},
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "Ready" if ready else "Creating",
                    "message": "",
                },
            ],
            **status,
        },
    }


def test_the_client_asks_for_one_more_than_any_asked_or_served() -> None:
    assert next_reset({"spec": {}, "status": {}}) == 1
    assert next_reset(_obj(3, 2, resets=1)) == 3
    assert next_reset(_obj(3, 0, resets=4)) == 5


def test_a_reset_wait_ends_only_on_ready_for_the_new_count() -> None:
    goal = ResetTo(2)
    # Ready for the old pod (the status has not caught up): still waiting.
    assert evaluate_for(_obj(2, 2, resets=1, observed=1), goal)[0] == "pending"
    assert evaluate_for(_obj(2, 2, resets=1), goal)[0] == "pending"
    # The reset made, the new pod starting, then Ready.
    assert evaluate_for(_obj(2, 2, resets=2, ready=False), goal)[0] == "pending"
    assert evaluate_for(_obj(2, 2, resets=2), goal)[0] == "ready"
    # Refused by the operator for this generation: terminal, with its reason.
    state, reason, message = evaluate_for(_obj(2, 2, resets=1, resetRefused="no reset"), goal)
    assert (state, reason, message) == ("terminal", RESET_REFUSED, "no reset")
    # A refusal written before this request (stale) is not this request's answer.
    stale = _obj(2, 2, resets=1, resetRefused="no reset", observed=1)
    assert evaluate_for(stale, goal)[0] == "pending"


def test_the_views_keep_what_a_reset_pass_reads() -> None:
    """The operator's passes read a Sandbox from its views: a status field the view dropped
    would make every pass see no reset served yet, and reset again (deleting the new pod)."""
    from sandbox_operator.reconcile.slim import slim_sandbox

    obj = sandbox({**SPEC, "resets": 2}, {"resets": 2, "resetAt": rfc(NOW), "resetRefused": "x"})
    slim = slim_sandbox(SandboxView(obj))
    assert slim["spec"]["resets"] == 2
    assert {k: slim["status"][k] for k in ("resets", "resetAt", "resetRefused")} == {
        "resets": 2,
        "resetAt": rfc(NOW),
        "resetRefused": "x",
    }


def test_the_client_knows_the_crds_refusal_of_a_lower_count() -> None:
    """A handle whose object is older than the Sandbox (another process reset it since) asks
    for a count the CRD refuses; the client tells that refusal by its message and asks again
    from a fresh read: the message it looks for is the CRD's."""
    from sandbox_operator.client.resets import RESETS_ONLY_GROW
    from sandbox_operator.crdrules import SANDBOX_RESETS_RULE

    assert RESETS_ONLY_GROW in SANDBOX_RESETS_RULE["message"]


class _Objects:
    """What the client's reset uses of the namespace's objects: a read and the patch, answered
    as an API server whose Sandbox CRD has no ``spec.resets`` answers (the field dropped)."""

    namespace = "ns"

    def __init__(self) -> None:
        self.patched: list[int] = []

    async def get_sandbox(self, name: str) -> SandboxView:
        return SandboxView({"metadata": {"name": name}, "spec": {}, "status": {}})

    async def patch_resets(self, name: str, count: int) -> SandboxView:
        self.patched.append(count)
        return SandboxView({"metadata": {"name": name}, "spec": {}, "status": {}})


async def test_a_crd_without_resets_is_refused_at_once_not_waited_out() -> None:
    from typing import cast

    from sandbox_operator.client.errors import SandboxNotResettable
    from sandbox_operator.client.kube import SandboxObjects
    from sandbox_operator.client.resets import Resets
    from sandbox_operator.client.watching import Watches

    objects = _Objects()
    resets_ = Resets(cast(SandboxObjects, objects), cast(Watches, None))
    with pytest.raises(SandboxNotResettable, match="predates reset"):
        await resets_.reset("s", timeout=60)
    assert objects.patched == [1]
