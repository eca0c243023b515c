"""Fault tests on kwok's fake nodes (the control plane is what is tested; pods there go Ready at
once, no node runs them): the operator SIGKILLed at random points during a burst of creates, and
two replicas handing over through kopf peering during one. The same SIGKILL run on the real node
is tests/e2e/test_faults_operator_runc.py; the run itself is tests/fixtures/sigkill.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.fixtures.faults import (
    PEERING,
    Recorder,
    assert_one_pod_each_and_no_flap,
    census,
    create_retrying,
    ensure_peering,
    kwok_config,
    sandbox_body,
    spread,
    terminal,
    wait_census,
)
from tests.fixtures.sigkill import SCOPES, sigkill_burst

# exclusive: kills operators in bursts on kwok fake nodes (run alone, after the concurrent part).
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.exclusive]


@pytest.fixture
def say(request: pytest.FixtureRequest) -> Callable[[str], None]:
    return terminal(request.config)


def test_sigkill_at_random_points_during_100_creates_over_3_scopes_kwok(
    kit, start_operator, api_client, kubectl, kwok_nodes, monkeypatch, say
):
    """100 creates over 3 scopes, the operator SIGKILLed 5 times at random points (starting,
    mid-burst, converging): every Sandbox Ready with exactly one pod ever, no orphan pod or
    NetworkPolicy, no flap; deleting the scopes then leaves nothing."""
    assert kwok_nodes, "no kwok fake node Ready"
    sigkill_burst(
        kit,
        start_operator,
        monkeypatch,
        say,
        api_client,
        kubectl,
        kwok_config(),
        creates=100,
        kills=5,
        pace=0.25,
        converge_timeout=150,
        label="sigkill/kwok",
    )


def test_two_peered_replicas_hand_over_during_50_creates_without_double_create_or_flap(
    kit, start_operator, api_client, kubectl, kwok_nodes, say
):
    """Two replicas on one KopfPeering (priorities 100 and 200, as two chart pods get distinct
    ones). During 50 creates the active one stops (SIGTERM: it withdraws, the standby takes
    over) and later comes back (it takes over again, the standby pauses): both handovers are
    windows where two replicas could act. No Sandbox ever gets a second pod, none flaps."""
    assert kwok_nodes, "no kwok fake node Ready"
    ensure_peering(kubectl, kit.ns)
    config = kwok_config()
    low = start_operator(config, args=("--peering", PEERING, "--priority", "100"))
    high = start_operator(config, args=("--peering", PEERING, "--priority", "200"))
    deadline = time.monotonic() + 30
    while "Pausing operations" not in low.log() and time.monotonic() < deadline:
        time.sleep(0.3)
    assert "Pausing operations" in low.log(), low.log()
    rec = Recorder(api_client, kit.ns).start()
    creates, pace = 50, 0.3
    names = [f"p{i:02d}" for i in range(creates)]
    try:
        for s in range(SCOPES):
            kit.scope(f"scope-{s}", thread_id=f"thread-{s}")
        t0 = time.monotonic()
        for i, name in enumerate(names):
            if i == 15:
                high.stop()  # a clean stop withdraws it from the peering: the standby resumes
                say(f"[faults peering] active replica stopped at +{time.monotonic() - t0:.1f}s")
            if i == 32:
                high = start_operator(
                    config, wait=False, args=("--peering", PEERING, "--priority", "200")
                )
                say(f"[faults peering] it is back at +{time.monotonic() - t0:.1f}s")
            create_retrying(kit, "sandboxes", sandbox_body(kit, name, f"scope-{i % SCOPES}"))
            time.sleep(max(0.0, t0 + (i + 1) * pace - time.monotonic()))
        last_create = time.monotonic()
        final, _ = wait_census(
            kit,
            lambda c: c.sandboxes == creates and c.converged,
            120,
            f"{creates} Sandboxes Ready with one pod each",
        )
        converged = time.monotonic()
        # The returned replica has taken over again: the standby pauses in its favour.
        deadline = time.monotonic() + 30
        while low.log().count("Pausing operations") < 2 and time.monotonic() < deadline:
            time.sleep(0.3)
        time.sleep(3)  # and it stays so
        final = census(kit)
        # What the standby did while it acted (its /metrics; it runs on).
        standby_pods = low.api_requests().get(("create", "pods"), 0.0)
    finally:
        rec.stop()
    duplicates = rec.duplicates()
    latencies = rec.create_to_ready(names)
    say(
        f"[faults peering] creates {creates}, pods ever created {len(rec.pods)}, duplicates "
        f"{sum(duplicates.values())}, flaps {len(rec.flaps)}, orphan pods "
        f"{len(final.orphan_pods)}, orphan NetworkPolicies {len(final.orphan_policies)}, "
        f"converged {converged - last_create:.1f}s after the last create, create->Ready "
        f"p50/p90/max {spread(latencies)}s"
    )
    standby = [ln[:140] for ln in low.log().splitlines() if "Pausing" in ln or "Resuming" in ln]
    say(f"[faults peering] pods the standby created while it acted: {standby_pods:.0f}")
    say(f"[faults peering] standby: {standby}")
    assert final.converged and final.sandboxes == creates, final.brief()
    assert_one_pod_each_and_no_flap(rec, names)
    # Both handovers happened: the standby resumed when the active one left, and paused again
    # when it came back.
    assert "Resuming operations" in low.log(), standby
    assert standby_pods > 0, "the standby never acted: no handover happened during the burst"
    assert low.log().count("Pausing operations") >= 2, standby
