"""From what a backend reports to the Ready condition: pure rules, no I/O.

* ready and within ``ttlSeconds`` / ``idleTimeoutSeconds`` -> ``Ready`` (True);
* still starting within ``startupTimeoutSeconds`` -> ``Creating``; past it -> ``StartupTimeout``;
  objects that are up but still wait for something (``Observation.pending``, e.g. the egress
  proxy's admission) count as starting until the sandbox has been Ready once;
* cannot start (image missing, container crashed, API refused the pod) -> ``StartupFailed``;
* stopped or vanished after the Sandbox had reported Ready -> ``Failed``;
* ``ttlSeconds`` after creation, or ``idleTimeoutSeconds`` after the later of becoming ready and
  the last recorded activity -> ``Expired``; with ``lifetime.idleAction: suspend`` the idle
  timeout suspends instead (``Suspended``, not terminal: the work volume is kept).

"Before ready" and "after ready" are told apart by the Sandbox's own Ready condition: a sandbox a
watcher never saw Ready did not fail, it failed to start.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sandbox_operator.backends.base import Observation, ObservedPhase
from sandbox_operator.contract import ConditionReason, IdleAction, Lifetime

#: Ready reasons after which nothing is created again for this Sandbox.
TERMINAL_REASONS = frozenset(
    {
        ConditionReason.STARTUP_FAILED,
        ConditionReason.STARTUP_TIMEOUT,
        ConditionReason.FAILED,
        ConditionReason.EXPIRED,
    }
)


@dataclass(frozen=True)
class Verdict:
    ready: bool
    reason: ConditionReason
    message: str
    terminal: bool = False  # nothing more will be created
    dispose: bool = False  # backend objects should be removed now
    create: bool = False  # the serving objects do not exist yet and should be created
    suspend: bool = False  # stop the compute, keep the storage (lifetime.idleAction: suspend)


def judge(
    observation: Observation,
    *,
    lifetime: Lifetime,
    was_ready: bool,
    ready_since: datetime | None,
    sandbox_created: datetime | None,
    admitted_at: datetime | None,
    last_activity: datetime | None,
    now: datetime,
) -> Verdict:
    phase = observation.phase
    detail = observation.message or observation.detail_reason
    if phase is ObservedPhase.READY and observation.pending and not was_ready:
        # Up but not usable yet: still starting, under the startup timeout. Once Ready, a
        # pending wait (e.g. a restarted egress proxy re-admitting) does not take Ready back.
        phase, detail = ObservedPhase.STARTING, observation.pending

    if phase is ObservedPhase.READY:
        if sandbox_created is not None and now >= sandbox_created + timedelta(
            seconds=lifetime.ttl_seconds
        ):
            return Verdict(
                False,
                ConditionReason.EXPIRED,
                f"ttlSeconds ({lifetime.ttl_seconds}) reached; the sandbox was disposed",
                terminal=True,
                dispose=True,
            )
        idle_from = max(
            (t for t in (ready_since, observation.ready_at, last_activity) if t is not None),
            default=None,
        )
        if idle_from is not None and now >= idle_from + timedelta(
            seconds=lifetime.idle_timeout_seconds
        ):
            if lifetime.idle_action is IdleAction.SUSPEND:
                return Verdict(
                    False,
                    ConditionReason.SUSPENDED,
                    f"idle for idleTimeoutSeconds ({lifetime.idle_timeout_seconds}); suspended: "
                    "compute stopped, work volume kept (any use resumes it)",
                    suspend=True,
                )
            return Verdict(
                False,
                ConditionReason.EXPIRED,
                f"idle for idleTimeoutSeconds ({lifetime.idle_timeout_seconds}); "
                "the sandbox was disposed",
                terminal=True,
                dispose=True,
            )
        return Verdict(True, ConditionReason.READY, "sandbox is running and ready for exec")

    if phase is ObservedPhase.SUSPENDED:
        # Compute stopped, storage kept, and not by this operator (it does not plan a suspended
        # Sandbox): the backend stopped it (a remote service idling it). Recorded as an idle
        # suspension, resumed by use; before it was ever Ready (a resume on its way), start it.
        if was_ready:
            return Verdict(
                False,
                ConditionReason.SUSPENDED,
                "the backend stopped the sandbox's compute and kept its storage"
                + (f" ({detail})" if detail else "")
                + "; any use through the client resumes it",
                suspend=True,
            )
        return Verdict(False, ConditionReason.CREATING, "resuming the sandbox", create=True)

    if phase in (ObservedPhase.FAILED, ObservedPhase.STARTUP_FAILED):
        if was_ready:
            return Verdict(
                False,
                ConditionReason.FAILED,
                f"sandbox stopped after it was ready: {detail}",
                terminal=True,
                dispose=True,
            )
        return Verdict(
            False,
            ConditionReason.STARTUP_FAILED,
            f"sandbox could not start: {detail}",
            terminal=True,
            dispose=True,
        )

    if phase in (ObservedPhase.ABSENT, ObservedPhase.DISPOSING) and was_ready:
        return Verdict(
            False,
            ConditionReason.FAILED,
            "the objects serving the sandbox disappeared after it was ready",
            terminal=True,
            dispose=True,
        )

    # Starting, absent or being replaced before it was ever ready: bounded by the startup timeout.
    started = observation.created_at or admitted_at
    if started is not None and now >= started + timedelta(seconds=lifetime.startup_timeout_seconds):
        return Verdict(
            False,
            ConditionReason.STARTUP_TIMEOUT,
            f"not ready within startupTimeoutSeconds ({lifetime.startup_timeout_seconds})"
            + (f"; last seen: {detail}" if detail else ""),
            terminal=True,
            dispose=True,
        )
    if phase is ObservedPhase.ABSENT:
        return Verdict(False, ConditionReason.CREATING, "creating the sandbox", create=True)
    return Verdict(
        False,
        ConditionReason.CREATING,
        "starting" + (f": {detail}" if detail else ""),
    )
