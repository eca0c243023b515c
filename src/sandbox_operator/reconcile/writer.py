"""The one writer of a Sandbox's status, and the metrics of what a write changed.

Every path of a Sandbox pass (``sandbox.py``, and the finalizer's disposal in ``disposal.py``)
ends in a :class:`~sandbox_operator.reconcile.step.Step`; :func:`write_step` lays the step's plan
over its draft (a disposal the plan orders made first, so the write says how that went) and
writes the status once, only what differs. Its own module because the write has rules of its own,
apart from how a pass decides: the message debounce, the disposal the plan orders, and the
admission and create-to-ready metrics, counted here because only the writer knows what a write
changed.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from sandbox_operator import metrics
from sandbox_operator.contract import SANDBOX_PLURAL
from sandbox_operator.reconcile import compute
from sandbox_operator.reconcile.disposal import dispose_into
from sandbox_operator.reconcile.runtime import Runtime
from sandbox_operator.reconcile.status import (
    ADMITTED,
    DISPOSED,
    MESSAGE_DEBOUNCE_SECONDS,
    READY,
    Draft,
    R,
    message_only,
    recorded_served_by,
    sandbox_ref,
    write_status,
)
from sandbox_operator.reconcile.statusfields import served_by_wire
from sandbox_operator.reconcile.step import Step, sooner
from sandbox_operator.views import SandboxStatusView, SandboxView


async def write_step(rt: Runtime, step: Step) -> float | None:
    """The one place a Sandbox pass writes its status: the step's plan laid over its draft (a
    disposal it orders made first, so the write says how that went), then one status patch when
    anything differs; returns when to look again."""
    if step.draft is None or step.obj is None:
        return step.requeue
    obj, draft, plan = step.obj, step.draft, step.plan
    view = obj
    was_ready = view.status.conditions.is_true(READY)
    admitted = view.status.conditions.find(ADMITTED)
    was_admitted_reason = None if admitted is None else admitted.reason
    planned: float | None = None
    if plan is not None:
        for ctype, value, reason, message in plan.conditions:
            draft.cond(ctype, value, reason, message)
        draft.set(**plan.fields)
        planned = plan.requeue_after
        if plan.dispose:
            planned = await _dispose_planned(rt, obj, draft, plan)
    requeue = sooner(planned, step.requeue)
    key = view.key
    if step.debounce and message_only(view.status, draft):
        since = time.monotonic() - rt.status_written.get(key, 0.0)
        if since < MESSAGE_DEBOUNCE_SECONDS:
            return sooner(requeue, MESSAGE_DEBOUNCE_SECONDS - since + 0.05)
    written = await write_status(rt, SANDBOX_PLURAL, draft)
    if written:
        rt.status_written[key] = time.monotonic()
        _count(view, draft, step.admission, was_ready, was_admitted_reason)
        # What the written fields record (an egress edit) is told once, after it is recorded.
        for type_, what, message in step.admission.events if step.admission else ():
            await rt.kube.post_event(obj, type_=type_, reason=what, message=message)
    return requeue


async def _dispose_planned(
    rt: Runtime, obj: SandboxView, draft: Draft, plan: compute.Plan
) -> float | None:
    """Dispose what the plan's status records as serving (or, unrecorded, whatever the backend
    lists by the Sandbox's labels); the retry delay of a disposal not done yet."""
    served = recorded_served_by(SandboxStatusView({"servedBy": plan.fields.get("servedBy")}))
    target = sandbox_ref(obj, served)
    backend = plan.fields.get("backend") or obj.status.backend
    drivers = [rt.drivers[backend]] if backend in rt.drivers else list(rt.drivers.values())
    retry = await dispose_into(rt, drivers, target, draft)
    if draft.reason(DISPOSED) == R.DISPOSAL_FAILED and target.served_by:
        # Keep what is still to be disposed on record: the retry needs it, listed or not.
        draft.set(servedBy=plan.fields.get("servedBy") or served_by_wire(target.served_by))
    return retry


def _count(
    obj: SandboxView,
    draft: Draft,
    admission: compute.Admission | None,
    was_ready: bool,
    was_admitted_reason: str | None,
) -> None:
    """Metrics for what this write changed: an admission decided, a sandbox becoming Ready."""
    reason = draft.reason(ADMITTED)
    if reason is not None and reason != was_admitted_reason:
        result = "admitted" if draft.is_true(ADMITTED) else "refused"
        metrics.ADMISSIONS.labels(result, reason).inc()
    if draft.is_true(READY) and not was_ready:
        created = obj.metadata.created
        backend = str(draft.fields.get("backend") or obj.status.backend or None)
        if created is not None:
            seconds = (datetime.now(UTC) - created).total_seconds()
            metrics.READY_LATENCY.labels(backend).observe(max(seconds, 0.0))
