"""kopf handlers: the wiring from watch events, timers and deletions to the reconcilers.

Importing this module registers the handlers with kopf's default registry; ``sandbox-operator run``
imports it and runs kopf. Every handler calls an idempotent reconciler, so create, resume, update,
timer and pod events all converge on the same status whichever arrives first (or twice).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf

from sandbox_operator import labels as lbl
from sandbox_operator.config import load_config
from sandbox_operator.contract import (
    GROUP,
    SANDBOX_KIND,
    SANDBOX_PLURAL,
    SANDBOX_SCOPE_PLURAL,
    VERSION,
)
from sandbox_operator.reconcile import conditions as cnd
from sandbox_operator.reconcile.lifecycle import TERMINAL_REASONS
from sandbox_operator.reconcile.runtime import Runtime, make_api_client
from sandbox_operator.reconcile.sandbox import (
    DisposalPending,
    EnsurePending,
    egress_admitted,
    finalize_sandbox,
    reconcile_sandbox,
)
from sandbox_operator.reconcile.scope import purge_scope, reconcile_scope, scope_members

log = logging.getLogger(__name__)

FINALIZER = f"{GROUP}/finalizer"
CONFIG_ENV = "SANDBOX_OPERATOR_CONFIG"
RESYNC_ENV = "SANDBOX_OPERATOR_RESYNC_SECONDS"

# kopf fixes timer intervals when handlers are registered, so the resync period is read from the
# environment here (the CLI sets it from the config's operator.resyncSeconds before importing).
_RESYNC = float(os.environ.get(RESYNC_ENV, "10"))
# Unexpected errors (API hiccups) are retried soon; expected waits are handled by the timer.
_BACKOFF = 5.0
# A create that failed transiently is retried after _BACKOFF * 2**retry, at most this long
# (or after the backend's Retry-After, when it is longer and still below this bound).
_MAX_ENSURE_BACKOFF = 60.0


def ensure_retry_delay(retry: int, hint: float | None = None) -> float:
    """Exponential backoff for a transiently failed create: 5, 10, 20, 40, 60, 60, ... s."""
    delay = min(_MAX_ENSURE_BACKOFF, _BACKOFF * float(2 ** min(max(retry, 0), 10)))
    if hint is not None:
        delay = min(_MAX_ENSURE_BACKOFF, max(delay, hint))
    return delay


async def _reconcile_quietly(rt: Runtime, namespace: str, name: str) -> None:
    """For timers and watch events: a transient create failure is already in the status, and the
    Sandbox's own handler (or the next resync) retries it."""
    try:
        await reconcile_sandbox(rt, namespace, name)
    except EnsurePending as exc:
        log.info("sandbox %s/%s: create pending after a transient error: %s", namespace, name, exc)


def _runtime(memo: Any) -> Runtime:
    rt: Runtime = memo.runtime
    return rt


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    settings.batching.worker_limit = 64
    config = getattr(memo, "config", None)
    if config is None:
        path = os.environ.get(CONFIG_ENV)
        if not path:
            raise kopf.PermanentError(f"no configuration: set {CONFIG_ENV} or use --config")
        config, warnings = load_config(path)
        for w in warnings:
            log.warning("config: %s", w)
    api = await make_api_client()
    memo.runtime = await Runtime.start(config, api)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    rt = getattr(memo, "runtime", None)
    if rt is not None:
        await rt.close()


@kopf.on.probe(id="backends")
def probe_backends(memo: kopf.Memo, **_: Any) -> dict[str, str]:
    rt = getattr(memo, "runtime", None)
    if rt is None:
        return {}
    return {name: rt.unavailable.get(name, "available") for name in rt.drivers}


# ---- Sandbox -------------------------------------------------------------------------------


@kopf.on.resume(GROUP, VERSION, SANDBOX_PLURAL, backoff=_BACKOFF)
@kopf.on.create(GROUP, VERSION, SANDBOX_PLURAL, backoff=_BACKOFF)
@kopf.on.update(GROUP, VERSION, SANDBOX_PLURAL, backoff=_BACKOFF)
async def sandbox_changed(
    name: str, namespace: str | None, retry: int, memo: Any, **_: Any
) -> None:
    try:
        await reconcile_sandbox(_runtime(memo), namespace or "", name)
    except EnsurePending as exc:
        raise kopf.TemporaryError(
            f"create failed, retrying: {exc}", delay=ensure_retry_delay(retry, exc.delay)
        ) from None


def _settled(status: Any, **_: Any) -> bool:
    """A terminal sandbox whose disposal landed needs no timer."""
    ready = cnd.reason_of(status, "Ready")
    return ready in TERMINAL_REASONS and cnd.is_true(status, "Disposed")


@kopf.timer(
    GROUP,
    VERSION,
    SANDBOX_PLURAL,
    interval=_RESYNC,
    initial_delay=_RESYNC,
    when=lambda status, **kw: not _settled(status),
)
async def sandbox_resync(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    await _reconcile_quietly(_runtime(memo), namespace or "", name)


def _egress_admitted_while_starting(status: Any, **_: Any) -> bool:
    """The egress proxy has admitted a sandbox that is not Ready yet (and not ended)."""
    if not egress_admitted(status) or cnd.is_true(status, "Ready"):
        return False
    return cnd.reason_of(status, "Ready") not in TERMINAL_REASONS


@kopf.on.event(GROUP, VERSION, SANDBOX_PLURAL, when=_egress_admitted_while_starting)
async def sandbox_egress_admitted(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    """The proxy wrote ``status.egress.admitted``: judge Ready at once. A status change is no
    update for kopf's change handlers, and the resync timer may be seconds away."""
    await _reconcile_quietly(_runtime(memo), namespace or "", name)


@kopf.on.delete(GROUP, VERSION, SANDBOX_PLURAL, backoff=_BACKOFF)
async def sandbox_deleted(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    try:
        await finalize_sandbox(_runtime(memo), namespace or "", name)
    except DisposalPending as exc:
        raise kopf.TemporaryError(str(exc), delay=exc.delay) from None


@kopf.on.event("", "v1", "pods", labels={lbl.MANAGED_BY_LABEL: lbl.MANAGED_BY_VALUE})
async def pod_event(body: Any, memo: kopf.Memo, **_: Any) -> None:
    """A sandbox pod changed: re-judge its Sandbox at once (startup, readiness, death)."""
    meta = body.get("metadata") or {}
    for owner in meta.get("ownerReferences") or []:
        if owner.get("kind") == SANDBOX_KIND and owner.get("apiVersion", "").startswith(GROUP):
            await _reconcile_quietly(
                _runtime(memo), str(meta.get("namespace", "")), str(owner.get("name", ""))
            )


# ---- SandboxScope --------------------------------------------------------------------------


@kopf.on.resume(GROUP, VERSION, SANDBOX_SCOPE_PLURAL, backoff=_BACKOFF)
@kopf.on.create(GROUP, VERSION, SANDBOX_SCOPE_PLURAL, backoff=_BACKOFF)
@kopf.on.update(GROUP, VERSION, SANDBOX_SCOPE_PLURAL, backoff=_BACKOFF)
async def scope_changed(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    rt = _runtime(memo)
    await reconcile_scope(rt, namespace or "", name)
    # Sandboxes that waited for this scope (ScopeNotFound) go ahead now.
    for sbx in await scope_members(rt, namespace or "", name):
        if not cnd.is_true(sbx.get("status"), "Admitted"):
            await _reconcile_quietly(rt, namespace or "", sbx["metadata"]["name"])


@kopf.timer(GROUP, VERSION, SANDBOX_SCOPE_PLURAL, interval=max(_RESYNC, 15.0), idle=5.0)
async def scope_resync(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    await reconcile_scope(_runtime(memo), namespace or "", name)


@kopf.on.delete(GROUP, VERSION, SANDBOX_SCOPE_PLURAL, backoff=_BACKOFF)
async def scope_deleted(name: str, namespace: str | None, retry: int, memo: Any, **_: Any) -> None:
    try:
        await purge_scope(_runtime(memo), namespace or "", name, attempt=retry)
    except DisposalPending as exc:
        raise kopf.TemporaryError(str(exc), delay=exc.delay) from None
