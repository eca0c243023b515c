"""Disposal of what serves a Sandbox: on deletion (the finalizer), at a terminal verdict, and
what waits on a sandbox key that disposal frees.

Drivers whose objects the operator watches are asked to delete without waiting (the deletion
events bring the next pass); the others dispose synchronously. The outcome is the ``Disposed``
condition; a failure is retried after ``disposal_retry_seconds``.

A deletion is on its caller's path until the finalizer is removed, so the finalizer waits for
nothing a driver reports gone: on a runtime-class backend set to ``disposalGracePeriodSeconds:
0`` a pod deleted with no grace period is gone with the answer, and the kubelet stopping its
containers is not waited for; by default the pod keeps its own grace and is waited for
(docs/disposal.md).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from sandbox_operator import labels as lbl
from sandbox_operator import metrics
from sandbox_operator.backends.base import (
    BackendDriver,
    DisposalError,
    SandboxRef,
    WatchedDisposal,
)
from sandbox_operator.contract import (
    SANDBOX_PLURAL,
    DisposalCode,
    DisposalFailure,
    SandboxKey,
)
from sandbox_operator.reconcile import compute
from sandbox_operator.reconcile.runtime import FINALIZER, Runtime
from sandbox_operator.reconcile.status import (
    DISPOSED,
    READY,
    Draft,
    R,
    sandbox_gone,
    sandbox_ref,
)
from sandbox_operator.reconcile.step import Step, sooner
from sandbox_operator.views import SandboxStatusView, SandboxView

#: A deleted Sandbox whose objects are not gone after this long reports Disposing (before, its
#: status is left alone: the object is about to go). Longer than a pod's default termination grace
#: (5 s) plus the kubelet's teardown on a busy node (a backend whose disposals delete pods with no
#: grace period waits for less), so an ordinary disposal costs the finalizer's removal and nothing
#: more; one that takes longer (a larger grace, someone else's finalizer, a stuck volume) says so.
DISPOSING_REPORT_AFTER_SECONDS = 10.0

#: Once what served a Sandbox the egress proxy admitted is gone, how long its finalizer waits for
#: the proxy's final write (``status.egress.final``), so the write lands before the object goes
#: and whoever follows the Sandbox sees its egress record whole. The proxy writes it as soon as it
#: sees the deletionTimestamp, usually before the pod has even stopped: the wait is rarely felt.
#: It is woken by the write's watch event; the deadline only bounds a proxy that is down.
EGRESS_FINAL_WAIT_SECONDS = 10.0


async def key_unclean(
    rt: Runtime, namespace: str, key: SandboxKey, kind: str, uid: str
) -> str | None:
    """Why the sandbox's identity (key, kind) is not clean (an earlier sandbox of this key and
    kind is not disposed yet), or None.

    Found in the views by labels alone: another Sandbox of the key and kind that is being deleted
    or whose disposal failed, or backend objects of the key and kind that belong to another
    Sandbox. Another kind under the same key is another sandbox, and never holds this one back;
    a backend object without the kind label (made before it existed) is taken as this kind's.
    """
    for other in rt.views.sandboxes.select(namespace, lbl.KEY_LABEL, lbl.key_value(key)):
        view = SandboxView(other)
        ometa = view.metadata
        if ometa.uid == uid or view.sandbox_kind != kind:
            continue
        name = ometa.name
        if ometa.deleting:
            if FINALIZER not in ometa.finalizers:
                # Let go by the operator (what served it is disposed) or never taken on, and held
                # only by finalizers of someone else's: nothing of it is left to wait for. (Its
                # key labels may even be another key's: anyone who may create it could set them.)
                # Backend objects it left behind, if any, are found below by their own labels.
                continue
            return f"Sandbox {name} with the same key is still being disposed"
        disposed = view.status.conditions.find(DISPOSED)
        if disposed is not None and disposed.reason == R.DISPOSAL_FAILED:
            return f"disposal of Sandbox {name} with the same key failed and has not landed yet"
    for driver in rt.drivers.values():
        try:
            objects = await driver.list_by_key(namespace, key)
        except Exception as exc:
            return f"cannot list backend {driver.name} for this key: {type(exc).__name__}"
        for o in objects:
            if o.labels.get(lbl.KIND_LABEL, kind) != kind:
                continue
            if (o.owner_uid and o.owner_uid != uid) or o.deleting:
                return f"{o.kind} {o.name} of an earlier sandbox with this key is not disposed yet"
    return None


def drivers_for(rt: Runtime, status: SandboxStatusView) -> list[BackendDriver]:
    backend = status.backend
    if backend in rt.drivers:
        return [rt.drivers[backend]]
    return list(rt.drivers.values())


async def dispose_into(
    rt: Runtime, drivers: list[BackendDriver], ref: SandboxRef, draft: Draft
) -> float | None:
    """Ask each driver to dispose of the sandbox's objects and record the outcome in
    ``Disposed``. Returns when to look again (a requested deletion not seen landed yet, or a
    failed disposal's retry), None once disposed."""
    failure: DisposalFailure | None = None
    waiting: list[str] = []
    key = (ref.namespace, ref.name)
    # A scope purge asked for this sandbox's objects by collection a moment ago: within the
    # disposal timeout, only wait for them (the views may not show the deletions yet, and a
    # delete per object would only meet 404s); after it, ask again one by one.
    started_at = rt.disposal_started.get(key)
    requested = key in rt.purging and (
        started_at is None
        or time.monotonic() - started_at < rt.config.operator.dispose_timeout_seconds
    )
    for driver in drivers:
        try:
            if isinstance(driver, WatchedDisposal) and driver.watches_disposal:
                found = await driver.request_disposal(ref, requested=requested)
                waiting += [f"{o.kind} {o.name}" for o in found]
            else:
                await driver.dispose(ref)
        except DisposalError as exc:
            failure = failure or exc.failure
    timeout = rt.config.operator.dispose_timeout_seconds
    if failure is None and waiting:
        started = rt.disposal_started.setdefault(key, time.monotonic())
        elapsed = time.monotonic() - started
        if elapsed < timeout:
            if not draft.is_true(DISPOSED):
                draft.cond(DISPOSED, False, R.DISPOSING, "disposing backend objects")
            return timeout - elapsed + 0.05
        failure = DisposalFailure(
            code=DisposalCode.TIMEOUT,
            detail=f"{', '.join(waiting[:3])} still present after {timeout:g}s",
            backend=drivers[0].name if len(drivers) == 1 else "",
        )
    rt.disposal_started.pop(key, None)
    if failure is None:
        draft.cond(DISPOSED, True, R.DISPOSED, "backend objects removed")
        return None
    rt.purging.discard(key)  # the collection delete did not do it: from now on, one by one
    draft.cond(
        DISPOSED,
        False,
        R.DISPOSAL_FAILED,
        f"disposal failed ({failure.code.value}) on backend {failure.backend}: {failure.detail}",
    )
    return rt.config.operator.disposal_retry_seconds


def wake_key(rt: Runtime, namespace: str, labels: Mapping[str, str]) -> None:
    """Something of a key went away: Sandboxes held back by KeyUnclean may go ahead now."""
    value = labels.get(lbl.KEY_LABEL)
    if not value:
        return
    for other in rt.views.sandboxes.select_names(namespace, lbl.KEY_LABEL, value):
        summary = rt.views.sandboxes.summary_of(namespace, other)
        if not (summary and summary[2]):  # not admitted (yet)
            rt.enqueue_sandbox(namespace, other)


def egress_final_wait(rt: Runtime, obj: SandboxView) -> float | None:
    """Seconds the finalizer should still wait for the egress proxy's final write, or None: the
    proxy never admitted the Sandbox (no ``status.egress.admitted``), it wrote ``final``, or
    :data:`EGRESS_FINAL_WAIT_SECONDS` have passed since the wait began."""
    view = obj
    key = view.key
    egress = view.status.egress
    if not egress.admitted or egress.final:
        rt.egress_final_started.pop(key, None)
        return None
    started = rt.egress_final_started.setdefault(key, time.monotonic())
    left = EGRESS_FINAL_WAIT_SECONDS - (time.monotonic() - started)
    if left <= 0:
        rt.egress_final_started.pop(key, None)
        return None
    return left + 0.05


async def finalize_sandbox(rt: Runtime, obj: SandboxView) -> Step:
    """Dispose everything that serves a deleted Sandbox, then let it go (remove the finalizer).

    While disposal is under way or failed, the finalizer stays and the status says so; the pass
    runs again when a child's deletion is seen, or at the retry deadline. Once disposed, a
    Sandbox the egress proxy admitted is held until the proxy's final write is there (at most
    :data:`EGRESS_FINAL_WAIT_SECONDS`, see :func:`egress_final_wait`).
    """
    view = obj
    meta = view.metadata
    namespace, name = view.key
    finalizers = list(meta.finalizers)
    if FINALIZER not in finalizers:
        return Step.wait()  # never admitted by this operator, or already released
    draft = Draft(obj)
    terminal = compute.is_terminal(view.status)
    seen = rt.deletion_seen.setdefault((namespace, name), time.monotonic())
    requeue = await dispose_into(rt, drivers_for(rt, view.status), sandbox_ref(obj), draft)
    if draft.is_true(DISPOSED):
        hold = egress_final_wait(rt, view)
        if hold is not None:
            return Step.wait(hold)  # the proxy's final write (its event) or the deadline
        remaining = [f for f in finalizers if f != FINALIZER]
        released = await rt.kube.patch_metadata(
            SANDBOX_PLURAL,
            namespace,
            name,
            finalizers=remaining,
            resource_version=meta.resource_version or None,
        )
        rt.deletion_seen.pop((namespace, name), None)
        backend = view.status.backend
        metrics.DISPOSAL_LATENCY.labels(backend).observe(time.monotonic() - seen)
        if released is None:  # 404: it went already
            sandbox_gone(rt, obj)
            return Step.wait()
        released_view = SandboxView(released.raw)
        released_meta = released_view.metadata
        if released_meta.finalizers:
            # Still held, by finalizers of someone else's: no DELETED event will come for a while,
            # but it no longer holds its key (key_unclean), so what waits on the key goes ahead.
            rt.views.put_sandbox(released)
            wake_key(rt, namespace, released_meta.labels)
        else:
            # The API server removed it with this answer. A pass already queued (its pod's
            # deletion event arrives about now: the pod went in this very pass) must not find it
            # in the views and release it again (a patch answered 404); its DELETED event still
            # brings the rest (the key's waiters, the scope's count).
            sandbox_gone(rt, released_view)
        rt.purging.discard((namespace, name))
        return Step.wait()
    failed = draft.reason(DISPOSED) == R.DISPOSAL_FAILED
    if not failed:
        # Still waiting for the objects to go (their deletion events bring the next pass).
        # Usually that is a moment away: say "Disposing" only when it takes a while, so a scope
        # purge costs each Sandbox its finalizer's removal and nothing more.
        started = rt.disposal_started.get((namespace, name), time.monotonic())
        elapsed = time.monotonic() - started
        if (namespace, name) in rt.purging:
            # Its scope's purge: the scope reports it (status.lastPurge); a status write and two
            # Events per Sandbox of a conversation being purged would only add to the load.
            return Step.wait(requeue)
        if elapsed < DISPOSING_REPORT_AFTER_SECONDS:
            return Step.wait(sooner(requeue, DISPOSING_REPORT_AFTER_SECONDS - elapsed + 0.05))
    if not terminal:
        if failed:
            draft.cond(READY, False, R.DISPOSAL_FAILED, "disposal failed; see Disposed")
        else:
            draft.cond(READY, False, R.DISPOSING, "the Sandbox is being deleted")
    return Step.write(obj, draft, requeue=requeue)
