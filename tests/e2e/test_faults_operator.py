"""Fault tests: the operator SIGKILLed at random points during a burst of creates, and two replicas
handing over through kopf peering during one. On kwok's fake nodes (the control plane is what is
tested; pods there go Ready at once), plus a small SIGKILL run on runc.

Each test watches the namespace from before its first create (tests/fixtures/faults.py): every
pod ever created (so a pod deleted and made again counts as a duplicate) and every Ready
transition (a Ready=True Sandbox going back to False, not being deleted, is a flap). The figures
go to the terminal in every run (CI's log too): creates, kills, duplicates, orphans, convergence
time.

The kill points come from a seeded random generator; the seed is printed, and
``SANDBOX_FAULTS_SEED=<seed>`` replays a run's schedule.
"""

from __future__ import annotations

import os
import random
import re
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest

from tests.fixtures.faults import (
    PEERING,
    Recorder,
    census,
    create_retrying,
    ensure_peering,
    kwok_config,
    namespace_empty,
    runc_config,
    sandbox_body,
    spread,
    terminal,
    wait_census,
)
from tests.fixtures.operator import OperatorProcess

# exclusive: kills operators in bursts on kwok fake nodes (run alone, after the concurrent part).
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.exclusive]

SCOPES = 3


@pytest.fixture
def say(request: pytest.FixtureRequest) -> Callable[[str], None]:
    return terminal(request.config)


def _seed() -> int:
    given = os.environ.get("SANDBOX_FAULTS_SEED")
    return int(given) if given else random.SystemRandom().randrange(2**31)


_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


def _paused(op: OperatorProcess) -> str:
    """How long one incarnation stood paused by kopf's peering before it acted: from its first
    log line to "Resuming operations" (its log's timestamps); "never resumed" when it was killed
    (or stopped) still paused, with how long its log covers."""
    stamps: list[float] = []
    resumed = None
    conflicts = 0
    for line in op.log().splitlines():
        m = _STAMP.match(line)
        if not m:
            continue
        t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        stamps.append(t)
        if "Possibly conflicting operators" in line:
            conflicts += 1
        if resumed is None and "Resuming operations" in line:
            resumed = t
    if not stamps:
        return "no log"
    if resumed is not None:
        return f"{resumed - stamps[0]:.1f}s ({conflicts} conflict warnings)"
    return f"never resumed ({stamps[-1] - stamps[0]:.1f}s of log, {conflicts} conflict warnings)"


def _first_write_after(rec: Recorder, t: float) -> float | None:
    """Seconds from ``t`` to the first pod created or Sandbox made Ready after it."""
    after = [s for _, s in rec.pods.values() if s > t] + [s for s in rec.ready_at.values() if s > t]
    return min(after) - t if after else None


@dataclass
class Kill:
    while_starting: bool  # before it answers /healthz, else while it acts
    delay: float  # seconds after its start (while starting) or after it answered /healthz
    down: float  # seconds the operator stays down before the next incarnation starts


def _kill_plan(rng: random.Random, kills: int) -> list[Kill]:
    """One kill in five lands while the incarnation starts (0-1.5 s after its start), the others
    while it acts, 0.3-5 s after it answers /healthz (mid-burst or in the convergence tail);
    after each the operator stays down 0-2 s."""
    plan = []
    for _ in range(kills):
        starting = rng.random() < 0.2
        delay = rng.uniform(0.0, 1.5) if starting else rng.uniform(0.3, 5.0)
        plan.append(Kill(starting, delay, rng.uniform(0.0, 2.0)))
    return plan


def _healthy(op: OperatorProcess) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{op.port}/healthz", timeout=0.3) as r:
            return bool(r.status == 200)
    except OSError:
        return False


class Killer:
    """Carries out a kill plan, one step at a time (called between creates): SIGKILL the running
    incarnation when its kill is due, start the next one once its downtime is over."""

    def __init__(self, plan: list[Kill], start: Any, label: str, say: Callable[[str], None]):
        self.say = say
        self.plan = list(plan)
        self.start = start  # () -> OperatorProcess, not waiting for it
        self.label = label
        self.t0 = time.monotonic()
        self.ops: list[OperatorProcess] = []
        self.kills: list[str] = []
        self.restarts: list[float] = []
        self.died = 0  # incarnations found exited (or never healthy) when their kill was due
        self.started = self.healthy_at = self.down_since = 0.0

    def first(self, op: OperatorProcess) -> None:
        self.ops.append(op)
        self.started = self.healthy_at = time.monotonic()

    def step(self) -> None:
        if not self.plan:
            return
        kill, now, op = self.plan[0], time.monotonic(), self.ops[-1]
        if self.down_since:
            if now - self.down_since >= kill.down:
                self.plan.pop(0)
                self.ops.append(self.start())
                self.started, self.healthy_at, self.down_since = now, 0.0, 0.0
                self.restarts.append(now)
            return
        if not self.healthy_at and not kill.while_starting and _healthy(op):
            self.healthy_at = now
        base = self.started if kill.while_starting else self.healthy_at
        if not base and now - self.started > 60:
            base = self.started - kill.delay  # never healthy: kill it now, counted as died
            self.died += 1
        if not base or now - base < kill.delay:
            return
        if not op.running:
            self.died += 1
        op.kill()
        self.down_since = now
        phase = "starting" if kill.while_starting else "acting"
        self.kills.append(f"{phase} +{now - base:.1f}s")
        since = "start" if kill.while_starting else "healthz"
        self.say(
            f"[faults {self.label}] SIGKILL #{len(self.kills)} at +{now - self.t0:.1f}s "
            f"({phase}: {now - base:.1f}s after its {since})"
        )


def _sigkill_burst(
    kit: Any,
    start_operator: Any,
    monkeypatch: Any,
    say: Callable[[str], None],
    api_client: Any,
    kubectl: Any,
    config: dict[str, Any],
    *,
    creates: int,
    kills: int,
    pace: float,
    converge_timeout: float,
    label: str,
) -> dict[str, Any]:
    seed = _seed()
    rng = random.Random(seed)
    say(f"[faults {label}] seed {seed} (SANDBOX_FAULTS_SEED={seed} replays the schedule)")
    ensure_peering(kubectl, kit.ns)
    # As the chart runs it: peering on, and what its Deployment gives the container (downward
    # API). A SIGKILLed container is restarted in the same pod, so every incarnation sees the
    # same POD_NAME (and so the same priority) as a fresh process.
    monkeypatch.setenv("POD_NAME", f"sandbox-operator-{kit.ns[-12:]}-5f6c8d-k2x9z")
    monkeypatch.setenv("POD_NAMESPACE", kit.ns)
    args = ("--peering", PEERING)
    ops = [start_operator(config, args=args)]
    rec = Recorder(api_client, kit.ns).start()
    try:
        for s in range(SCOPES):
            kit.scope(f"scope-{s}", thread_id=f"thread-{s}")
        names = [f"f{i:03d}" for i in range(creates)]
        killer = Killer(
            _kill_plan(rng, kills),
            lambda: start_operator(config, wait=False, args=args),
            label,
            say,
        )
        killer.first(ops[0])
        t0 = killer.t0 = time.monotonic()
        for i, name in enumerate(names):
            create_retrying(kit, "sandboxes", sandbox_body(kit, name, f"scope-{i % SCOPES}"))
            killer.step()
            time.sleep(max(0.0, t0 + (i + 1) * pace - time.monotonic()))
        last_create = time.monotonic()
        while killer.plan:
            killer.step()
            time.sleep(0.1)
        ops = killer.ops
        last_restart = killer.restarts[-1] if killer.restarts else t0
        killed = len(killer.kills)

        final, _ = wait_census(
            kit,
            lambda c: c.sandboxes == creates and c.converged,
            converge_timeout,
            f"{creates} Sandboxes Ready with one pod each after {killed} SIGKILLs",
        )
        converged = time.monotonic()
        time.sleep(3)  # and it stays so
        final = census(kit)
        assert final.converged and final.sandboxes == creates, final.brief()
        # One pod per Sandbox; one egress NetworkPolicy for them all (one backend, one egress
        # mode), however many incarnations raced to make it.
        assert final.pods == creates and final.policies == 1, final.brief()
        per = rec.pods_per_sandbox()
        duplicates = rec.duplicates()
        flaps = list(rec.flaps)
        latencies = rec.create_to_ready(names)
        pauses = [_paused(op) for op in ops]
        resumed = _first_write_after(rec, last_restart)

        # Deleting the scopes leaves nothing: no Sandbox, pod or NetworkPolicy.
        purge_start = time.monotonic()
        for s in range(SCOPES):
            kit.delete(f"scope-{s}", "sandboxscopes")
        deadline = purge_start + 120
        left = namespace_empty(kit)
        while any(left.values()) and time.monotonic() < deadline:
            time.sleep(1)
            left = namespace_empty(kit)
        purge = time.monotonic() - purge_start
    finally:
        rec.stop()

    figures = {
        "seed": seed,
        "creates": creates,
        "kills": killed,
        "kills (phase, seconds after start/healthz)": ", ".join(killer.kills),
        "incarnations": len(ops),
        "pods ever created": len(rec.pods),
        "duplicates": sum(duplicates.values()),
        "orphan pods": len(final.orphan_pods),
        "orphan NetworkPolicies": len(final.orphan_policies),
        "stuck (not Ready)": len(final.not_ready),
        "flaps": len(flaps),
        "converged after last create (s)": round(converged - last_create, 1),
        "converged after last restart (s)": round(converged - last_restart, 1),
        "first pod/Ready after last restart (s)": None if resumed is None else round(resumed, 1),
        "create->Ready p50/p90/max (s)": spread(latencies),
        "purge: left after (s)": f"{left} after {purge:.1f}",
        "watch reconnects/relists": f"{rec.reconnects}/{rec.relists} {rec.errors[-2:]}",
    }
    say(f"[faults {label}] figures:")
    for k, v in figures.items():
        say(f"    {k:42s} {v}")
    for i, paused in enumerate(pauses):
        say(f"[faults {label}] incarnation {i} paused by peering before acting: {paused}")

    assert not duplicates, f"Sandboxes that had more than one pod: {duplicates}"
    assert all(per.get(n) == 1 for n in names), {n: per.get(n) for n in names if per.get(n) != 1}
    assert not flaps, f"Ready went True -> False: {flaps[:5]}"
    assert not any(left.values()), f"deleting the scopes left {left} after {purge:.0f}s"
    assert killed == kills
    assert not killer.died, f"{killer.died} incarnation(s) exited or hung by themselves"
    return figures


def test_sigkill_at_random_points_during_100_creates_over_3_scopes_kwok(
    kit, start_operator, api_client, kubectl, kwok_nodes, monkeypatch, say
):
    """100 creates over 3 scopes, the operator SIGKILLed 5 times at random points (starting,
    mid-burst, converging): every Sandbox Ready with exactly one pod ever, no orphan pod or
    NetworkPolicy, no flap; deleting the scopes then leaves nothing."""
    assert kwok_nodes, "no kwok fake node Ready"
    _sigkill_burst(
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


def test_sigkill_at_random_points_during_creates_on_runc(
    kit, start_operator, api_client, kubectl, monkeypatch, say
):
    """The same on the real node (runc), smaller: 12 creates, 2 SIGKILLs."""
    _sigkill_burst(
        kit,
        start_operator,
        monkeypatch,
        say,
        api_client,
        kubectl,
        runc_config(),
        creates=12,
        kills=2,
        pace=0.5,
        converge_timeout=150,
        label="sigkill/runc",
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
    per = rec.pods_per_sandbox()
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
    assert not duplicates, f"Sandboxes that had more than one pod: {duplicates}"
    assert all(per.get(n) == 1 for n in names), {n: per.get(n) for n in names if per.get(n) != 1}
    assert not rec.flaps, f"Ready went True -> False: {rec.flaps[:5]}"
    # Both handovers happened: the standby resumed when the active one left, and paused again
    # when it came back.
    assert "Resuming operations" in low.log(), standby
    assert standby_pods > 0, "the standby never acted: no handover happened during the burst"
    assert low.log().count("Pausing operations") >= 2, standby
