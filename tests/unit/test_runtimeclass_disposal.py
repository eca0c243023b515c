"""(#36 item 3) Disposal off the caller's path, on the runtime-class driver. With
``pod.disposalGracePeriodSeconds: 0`` (the opt-in) a disposal deletes a sandbox's pod with no
grace period, so the API server drops it with its answer, and what the answer says is gone leaves
the views at once and is not waited for; by default (null) every delete is sent as before (no
grace option) and the pod is waited for; a suspension gives the pod its own grace either way.
No cluster: a fake API that answers deletes as the API server does."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox_operator import naming
from sandbox_operator.backends.base import DisposalCode, DisposalError, SandboxRef
from sandbox_operator.backends.runtimeclass import CLAIM
from sandbox_operator.backends.runtimeclass.objects import deletion_landed
from sandbox_operator.config import parse_config
from sandbox_operator.contract import ConfigurationError
from sandbox_operator.reconcile.views import Views
from sandbox_operator.views import DeleteAnswerView
from tests.fixtures.runtimeclass import (
    NAME,
    NS,
    PROTECTION,
    UID,
    AnsweringApi,
    driver,
    fast_disposal_backend,
)

POD_NAME = naming.pod_name(NAME)
CLAIM_NAME = naming.work_volume_name(NAME)


def _populated(*, claim: bool = False) -> AnsweringApi:
    fake = AnsweringApi()
    fake.put("Pod", POD_NAME)
    if claim:
        fake.put(CLAIM, CLAIM_NAME)
    return fake


def test_what_a_delete_answer_says_is_gone() -> None:
    at = "2026-12-07T09:00:00Z"
    gone_pod = {"deletionTimestamp": at, "deletionGracePeriodSeconds": 0}
    assert deletion_landed("Pod", DeleteAnswerView({"kind": "Status", "status": "Success"}))
    assert deletion_landed("Pod", DeleteAnswerView({"kind": "Pod", "metadata": gone_pod}))
    assert deletion_landed(
        "NetworkPolicy", DeleteAnswerView({"kind": "NetworkPolicy", "metadata": {}})
    )
    # Held: by its grace period, by a finalizer (someone else's, or pvc-protection).
    terminating = {"deletionTimestamp": at, "deletionGracePeriodSeconds": 5}
    assert not deletion_landed("Pod", DeleteAnswerView({"kind": "Pod", "metadata": terminating}))
    held = {**gone_pod, "finalizers": ["example.com/hold"]}
    assert not deletion_landed("Pod", DeleteAnswerView({"kind": "Pod", "metadata": held}))
    claim = {"deletionTimestamp": at, "finalizers": [PROTECTION]}
    assert not deletion_landed(CLAIM, DeleteAnswerView({"kind": CLAIM, "metadata": claim}))
    # An answer of another kind proves nothing about this one.
    assert not deletion_landed("Pod", DeleteAnswerView({"kind": CLAIM, "metadata": {}}))


async def test_a_watched_disposal_deletes_the_pod_with_no_grace_and_does_not_wait_for_it() -> None:
    fake = _populated(claim=True)
    views = Views()
    d = driver(fake, views=views, config=fast_disposal_backend())
    remaining = await d.request_disposal(SandboxRef(NS, NAME, UID))
    by_kind = {kind: options for kind, _, options in fake.options}
    assert by_kind["Pod"] == {"grace_period_seconds": 0}
    assert by_kind[CLAIM] == {}  # a claim has no grace period to give
    # The pod is gone with the answer: out of the views at once, nothing to wait for. The claim
    # is still there (pvc-protection): seen being deleted, waited for.
    assert views.pods.get(NS, POD_NAME) is None
    assert [(o.kind, o.deleting) for o in remaining] == [(CLAIM, False)]
    claim = views.persistent_volume_claims.get(NS, CLAIM_NAME)
    assert claim is not None and claim["metadata"]["deletionTimestamp"]
    # The next pass deletes nothing again and waits for the claim only.
    fake.options.clear()
    remaining = await d.request_disposal(SandboxRef(NS, NAME, UID))
    assert fake.options == [] and [(o.kind, o.deleting) for o in remaining] == [(CLAIM, True)]


async def test_a_pod_held_by_a_finalizer_is_still_waited_for() -> None:
    """A pod that stays in the API server (a finalizer of someone else's) could still be
    reached by exec while its containers run: the disposal waits for it (and, past the
    timeout, reports DisposalFailed, as before)."""
    fake = _populated()
    fake.objects[("Pod", NS, POD_NAME)]["metadata"]["finalizers"] = ["example.com/hold"]
    original = fake._do

    def hold(verb: str, kind: str, *args: Any, **kw: Any) -> Any:
        answer = original(verb, kind, *args, **kw)
        if verb == "delete" and kind == "Pod":
            answer["metadata"]["finalizers"] = ["example.com/hold"]
            fake.objects[("Pod", NS, POD_NAME)] = answer
        return answer

    fake._do = hold  # type: ignore[method-assign]
    views = Views()
    d = driver(fake, views=views, config=fast_disposal_backend())
    remaining = await d.request_disposal(SandboxRef(NS, NAME, UID))
    assert [o.kind for o in remaining] == ["Pod"]
    pod = views.pods.get(NS, POD_NAME)
    assert pod is not None and pod["metadata"]["deletionTimestamp"]


async def test_dispose_without_views_and_a_scope_purge_delete_pods_with_no_grace() -> None:
    fast = fast_disposal_backend()
    fake = _populated()
    await driver(fake, config=fast).dispose(SandboxRef(NS, NAME, UID))
    assert ("Pod", POD_NAME, {"grace_period_seconds": 0}) in fake.options
    assert fake.names("Pod") == set()
    fake = _populated()
    await driver(fake, views=Views(), config=fast).request_conversation_disposal(NS, "tenant", "t1")
    pods = [options for kind, _, options in fake.options if kind == "Pod"]
    assert len(pods) == 1 and pods[0]["grace_period_seconds"] == 0


async def test_a_suspension_gives_the_pod_its_own_grace() -> None:
    """Suspending is not disposing: even with the opt-in, the pod is deleted with its
    terminationGracePeriodSeconds (no grace_period_seconds in the delete), and stays until its
    deletion event."""
    fake = _populated(claim=True)
    views = Views()
    d = driver(fake, views=views, config=fast_disposal_backend())
    remaining = await d.suspend(SandboxRef(NS, NAME, UID))
    assert fake.options == [("Pod", POD_NAME, {})]
    assert [o.kind for o in remaining] == ["Pod"]


async def test_by_default_a_disposal_sends_no_grace_and_waits_for_the_pod() -> None:
    """The default (disposalGracePeriodSeconds null) is the disposal as it always was: every
    delete without a grace option, so the pod keeps its own terminationGracePeriodSeconds and
    stays in the API server (its egress policy still selecting it) until the kubelet stopped it;
    the disposal waits for it and for the claim; the next pass deletes nothing again."""
    fake = _populated(claim=True)
    views = Views()
    d = driver(fake, views=views)
    remaining = await d.request_disposal(SandboxRef(NS, NAME, UID))
    assert sorted(fake.options) == sorted([("Pod", POD_NAME, {}), (CLAIM, CLAIM_NAME, {})])
    assert sorted((o.kind, o.deleting) for o in remaining) == [(CLAIM, False), ("Pod", False)]
    pod = views.pods.get(NS, POD_NAME)
    assert pod is not None and pod["metadata"]["deletionTimestamp"]
    fake.options.clear()
    remaining = await d.request_disposal(SandboxRef(NS, NAME, UID))
    assert fake.options == []
    assert sorted((o.kind, o.deleting) for o in remaining) == [(CLAIM, True), ("Pod", True)]
    # Without views (dispose): no grace option, and the pod, still terminating here, is waited
    # for until the disposal's timeout (with the opt-in it is gone with the answer: above).
    fake = _populated()
    with pytest.raises(DisposalError) as caught:
        await driver(fake).dispose(SandboxRef(NS, NAME, UID))
    assert caught.value.failure.code is DisposalCode.TIMEOUT
    assert [o for o in fake.options if o[0] == "Pod"] == [("Pod", POD_NAME, {})]
    # In a scope purge: no grace option either.
    fake = _populated()
    await driver(fake, views=Views()).request_conversation_disposal(NS, "tenant", "t1")
    assert [options for kind, _, options in fake.options if kind == "Pod"] == [
        {"label_selector": fake.options[0][2]["label_selector"]}
    ]


def _config(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        "hostPolicy": {"minIsolation": "hardened_container"},
        "backends": [
            {
                "name": "gvisor",
                "type": "runtimeClass",
                "runtimeClassName": "gvisor",
                "isolation": "hardened_container",
                "pod": pod,
            }
        ],
    }


def test_the_fast_path_is_opt_in_validated_and_warned_about() -> None:
    """null by default (no warning); 0 is accepted with a config warning that names the
    backend and the egress window; a negative grace is refused."""
    config, warnings = parse_config(_config({}))
    assert config.backends[0].pod.disposal_grace_period_seconds is None
    assert not [w for w in warnings if "disposalGracePeriodSeconds" in w]
    config, warnings = parse_config(_config({"disposalGracePeriodSeconds": 0}))
    assert config.backends[0].pod.disposal_grace_period_seconds == 0
    [warning] = [w for w in warnings if "disposalGracePeriodSeconds" in w]
    assert "backends[0] (gvisor)" in warning and "egress" in warning
    config, warnings = parse_config(_config({"disposalGracePeriodSeconds": 2}))
    assert not [w for w in warnings if "disposalGracePeriodSeconds" in w]
    with pytest.raises(ConfigurationError):
        parse_config(_config({"disposalGracePeriodSeconds": -1}))
