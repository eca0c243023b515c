"""Reconcile a SandboxScope: count its sandboxes; on delete, purge the whole conversation.

The purge finds what to dispose by listing, never by memory: every Sandbox carrying the
conversation's labels (or naming the scope in ``scopeRef``), and every backend object carrying the
conversation's labels (pods and NetworkPolicies left behind, remote sessions). So a replica that
never saw those sandboxes created purges them just as well.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from sandbox_operator import labels as lbl
from sandbox_operator.backends.base import DisposalError
from sandbox_operator.contract import (
    SANDBOX_SCOPE_PLURAL,
    ConditionReason,
    DisposalCode,
    DisposalFailure,
    SandboxScopeResourceSpec,
    ScopePurge,
)
from sandbox_operator.reconcile import conditions as cnd
from sandbox_operator.reconcile.kube import Conflict
from sandbox_operator.reconcile.runtime import Runtime
from sandbox_operator.reconcile.sandbox import (
    DISPOSED,
    READY,
    DisposalPending,
    Draft,
    _drivers_for,
    sandbox_ref,
    write_status,
)

log = logging.getLogger(__name__)
R = ConditionReason

PURGE_CONCURRENCY = 8


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = obj.get("metadata") or {}
    return meta


async def scope_members(rt: Runtime, namespace: str, name: str) -> list[dict[str, Any]]:
    """Sandboxes of a scope: those that name it, plus those labelled with its conversation."""
    scope = await rt.kube.get_scope(namespace, name)
    selector = None
    if scope is not None:
        try:
            spec = SandboxScopeResourceSpec.model_validate(scope.get("spec") or {})
            selector = lbl.scope_selector(spec.scope, spec.thread_id)
        except ValidationError:
            selector = None
    members: dict[str, dict[str, Any]] = {}
    if selector is not None:
        for s in await rt.kube.list_sandboxes(namespace, selector):
            members[_meta(s)["name"]] = s
    for s in await rt.kube.list_sandboxes(namespace):
        if (s.get("spec") or {}).get("scopeRef") == name:
            members[_meta(s)["name"]] = s
    return list(members.values())


async def reconcile_scope(rt: Runtime, namespace: str, name: str) -> None:
    for _ in range(3):
        scope = await rt.kube.get_scope(namespace, name)
        if scope is None or _meta(scope).get("deletionTimestamp"):
            return
        members = await scope_members(rt, namespace, name)
        draft = Draft(scope)
        draft.set(sandboxCount=len(members))
        try:
            SandboxScopeResourceSpec.model_validate(scope.get("spec") or {})
            draft.cond(READY, True, R.READY, f"{len(members)} sandbox(es) in this conversation")
        except ValidationError as exc:
            draft.cond(READY, False, R.PENDING, f"spec is invalid: {exc.errors()[0]['msg']}")
        try:
            await write_status(rt, SANDBOX_SCOPE_PLURAL, draft)
            return
        except Conflict:
            continue


async def purge_scope(rt: Runtime, namespace: str, name: str, attempt: int) -> ScopePurge:
    """Dispose every sandbox of the scope, record the purge, and decide whether to let it go.

    Raises :class:`DisposalPending` while something is undisposed and attempts remain.
    """
    scope = await rt.kube.get_scope(namespace, name)
    if scope is None:
        return ScopePurge()
    members = await scope_members(rt, namespace, name)
    sem = asyncio.Semaphore(PURGE_CONCURRENCY)

    async def dispose_member(sbx: Mapping[str, Any]) -> DisposalFailure | None:
        ref = sandbox_ref(sbx)
        async with sem:
            failure: DisposalFailure | None = None
            for driver in _drivers_for(rt, sbx.get("status") or {}):
                try:
                    await driver.dispose(ref)
                except DisposalError as exc:
                    failure = failure or exc.failure
            return failure

    results = await asyncio.gather(*(dispose_member(s) for s in members))
    undisposed = [f for f in results if f is not None]
    disposed = len(results) - len(undisposed)

    # Whatever carries the conversation's labels but belongs to no listed Sandbox.
    member_labels = {lbl.sandbox_label_value(_meta(s)["name"]) for s in members}
    spec: SandboxScopeResourceSpec | None
    try:
        spec = SandboxScopeResourceSpec.model_validate(scope.get("spec") or {})
    except ValidationError:
        spec = None
    if spec is not None:
        orphan_groups: dict[str, list[DisposalFailure]] = {}
        for driver in rt.drivers.values():
            try:
                objects = await driver.list_by_scope(namespace, spec.scope, spec.thread_id)
            except Exception as exc:
                undisposed.append(
                    DisposalFailure(
                        code=DisposalCode.UNREACHABLE,
                        detail=f"listing the conversation failed: {type(exc).__name__}",
                        backend=driver.name,
                    )
                )
                continue
            for o in objects:
                if o.sandbox_name in member_labels:
                    continue
                group = orphan_groups.setdefault(o.sandbox_name or o.name, [])
                try:
                    await driver.dispose_object(o)
                except DisposalError as exc:
                    group.append(exc.failure)
        for failures in orphan_groups.values():
            if failures:
                undisposed.append(failures[0])
            else:
                disposed += 1

    # The Sandbox objects go too; their own finalizers confirm (idempotently) and any whose
    # disposal failed stays with DisposalFailed and keeps retrying.
    for s in members:
        if not _meta(s).get("deletionTimestamp"):
            await rt.kube.delete_sandbox(namespace, _meta(s)["name"])
    names = {_meta(s)["name"] for s in members}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + rt.config.operator.dispose_timeout_seconds
    while names and loop.time() < deadline:
        left = set()
        for n in names:
            if await rt.kube.get_sandbox(namespace, n) is not None:
                left.add(n)
        names = left
        if names:
            await asyncio.sleep(0.5)

    purge = ScopePurge(disposed=disposed, undisposed=tuple(undisposed[:256]))
    draft = Draft(scope)
    draft.set(
        lastPurge=purge.model_dump(mode="json", by_alias=True),
        lastPurgeTime=cnd.now_rfc3339(datetime.now(UTC)),
        sandboxCount=len(names),
    )
    if purge.complete:
        msg = f"purged: {disposed} sandbox(es) disposed"
        draft.cond(DISPOSED, True, R.PURGED, msg)
    else:
        each = "; ".join(f"{f.backend}: {f.code.value}: {f.detail}" for f in undisposed[:10])
        msg = f"purge incomplete: {disposed} disposed, {len(undisposed)} undisposed ({each})"
        draft.cond(DISPOSED, False, R.PURGE_INCOMPLETE, msg)
    try:
        await write_status(rt, SANDBOX_SCOPE_PLURAL, draft)
    except Conflict:
        await rt.kube.post_event(
            scope,
            type_="Normal" if purge.complete else "Warning",
            reason=R.PURGED if purge.complete else R.PURGE_INCOMPLETE,
            message=msg,
        )
    log.info("scope %s/%s: %s", namespace, name, msg)
    if not purge.complete and attempt + 1 < rt.config.operator.scope_purge_attempts:
        raise DisposalPending(msg, rt.config.operator.disposal_retry_seconds)
    return purge
