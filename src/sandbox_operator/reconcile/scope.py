"""Reconcile a SandboxScope: count its sandboxes; on delete, purge what it owns.

One conversation (scope + threadId) has one SandboxScope per namespace: the oldest SandboxScope
naming it holds it, a later one is refused (``Ready=False, ScopeConflict``, naming the holder) and
so are the Sandboxes naming that one, until the holder is gone (``Views.conversation_holder``).

A scope owns the Sandboxes whose ``spec.scopeRef`` names it, found in the views (never by an
in-memory registry of what this process created, so a replica that never saw those sandboxes
created purges them just as well), and nothing else: a Sandbox of another SandboxScope with the
same scope and threadId carries the same conversation labels, so the labels alone never decide.

A purge costs a bounded number of calls per sandbox. When this scope is the only one naming its
conversation (the usual case) everything with the conversation's labels is its own: the
Sandboxes go with one ``deletecollection`` by the conversation's label selector, and so do the
pods, NetworkPolicies and work volumes (PersistentVolumeClaims) of every watched backend (three
calls per backend, orphans included).
When another SandboxScope names the same conversation, each member is deleted by name and its
own finalizer disposes what carries its sandbox label. Each Sandbox's own finalizer confirms,
from the watch, that its objects are gone and lets it go (one patch, plus a status write only
when it has to wait). The scope waits, woken by each member's deletion event, until every member
is gone or the disposal timeout passes, records the purge and lets go.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from pydantic import ValidationError

from sandbox_operator import labels as lbl
from sandbox_operator.backends.base import DisposalError, WatchedDisposal
from sandbox_operator.contract import (
    SANDBOX_SCOPE_PLURAL,
    ConditionReason,
    DisposalCode,
    DisposalFailure,
    SandboxScopeResourceSpec,
    ScopePurge,
)
from sandbox_operator.reconcile import access
from sandbox_operator.reconcile import conditions as cnd
from sandbox_operator.reconcile.kube import Conflict, api_error_text
from sandbox_operator.reconcile.runtime import FINALIZER, Runtime
from sandbox_operator.reconcile.status import (
    CONFLICT_RETRY_SECONDS,
    DISPOSED,
    READY,
    Draft,
    write_status,
)
from sandbox_operator.views import ConditionView, SandboxScopeView, SandboxView

log = logging.getLogger(__name__)
R = ConditionReason

#: Sandbox events wake their scope this much later, so a burst of creates costs one count write.
COUNT_DEBOUNCE_SECONDS = 1.0


def _spec(scope: SandboxScopeView) -> SandboxScopeResourceSpec | None:
    try:
        return SandboxScopeResourceSpec.model_validate(scope.spec)
    except ValidationError:
        return None


def scope_members(rt: Runtime, namespace: str, name: str) -> list[SandboxView]:
    """The Sandboxes a scope owns: those whose ``spec.scopeRef`` names it."""
    return rt.views.naming_scope(namespace, name)


def scope_member_names(rt: Runtime, namespace: str, name: str) -> set[str]:
    """The names of a scope's Sandboxes (as ``scope_members``), decoding none of them."""
    return set(rt.views.naming_scope_names(namespace, name))


def owns_conversation(rt: Runtime, namespace: str, name: str) -> bool:
    """Whether the scope is the only SandboxScope naming its conversation, so that everything
    carrying the conversation's labels is its own (and may go by collection)."""
    return rt.views.conversation_scopes(namespace, name) == [name]


def conflict_message(spec: SandboxScopeResourceSpec, holder: str) -> str:
    return (
        f"SandboxScope {holder!r} already holds scope {spec.scope!r} threadId "
        f"{spec.thread_id!r} in this namespace (one conversation, one SandboxScope): this one "
        f"is refused, and so are its Sandboxes, while {holder!r} exists; delete this one and "
        f"use {holder!r}, or give this one another threadId"
    )


async def reconcile_scope(rt: Runtime, namespace: str, name: str) -> float | None:
    scope = rt.views.scopes.get(namespace, name)
    if scope is None:
        rt.purges.pop((namespace, name), None)
        rt.access_written.pop((namespace, name), None)
        return None
    if scope.metadata.deleting:
        return await purge_scope(rt, scope)
    await _ensure_finalizer(rt, scope)
    scope = rt.views.scopes.get(namespace, name) or scope
    members = scope_member_names(rt, namespace, name)
    spec = _spec(scope)
    refused = await grant_access(rt, scope, spec, members) if spec is not None else None
    draft = Draft(scope)
    draft.set(sandboxCount=len(members))
    holder = rt.views.conversation_holder(namespace, name)
    if spec is not None and holder is not None:
        draft.cond(READY, False, R.SCOPE_CONFLICT, conflict_message(spec, holder))
    elif refused:
        # Ready means the bound agents can use the conversation: not while their Role is not.
        draft.cond(READY, False, R.ACCESS_NOT_GRANTED, refused)
    elif spec is not None:
        draft.cond(READY, True, R.READY, f"{len(members)} sandbox(es) in this conversation")
    else:
        try:
            SandboxScopeResourceSpec.model_validate(scope.spec)
        except ValidationError as exc:
            msg = f"spec is invalid: {exc.errors()[0]['msg']}"
            draft.cond(READY, False, R.PENDING, msg)
    await write_status(rt, SANDBOX_SCOPE_PLURAL, draft)
    return rt.config.operator.disposal_retry_seconds if refused else None


def access_pending(rt: Runtime, namespace: str, scope_ref: str, sandbox: str) -> bool:
    """Whether a Sandbox of a scope that binds agents is not in the scope's Role yet: its
    agents cannot read it until the scope's pass writes it, so that pass should run now."""
    scope = rt.views.scopes.get(namespace, scope_ref)
    if scope is None or not scope.agent_service_accounts:
        return False
    written = rt.access_written.get((namespace, scope_ref))
    return written is None or sandbox not in written.sandboxes


async def grant_access(
    rt: Runtime, scope: SandboxScopeView, spec: SandboxScopeResourceSpec, members: set[str]
) -> str | None:
    """Keep the scope's Role and RoleBinding (``reconcile/access.py``) granting its agents
    their conversation; writes only when they would say more than what was last written.
    When the write fails: why (also a Warning Event on the scope; the pass is retried)."""
    key = scope.key
    if not spec.agent_service_accounts and key not in rt.access_written:
        return None  # nothing bound, nothing written by this process
    wanted = access.wanted_access(spec.agent_service_accounts, members)
    written = rt.access_written.get(key)
    if written is not None and written.covers(wanted):
        return None
    try:
        await rt.kube.apply_rbac(access.role_manifest(scope, wanted), access.FIELD_MANAGER)
        await rt.kube.apply_rbac(access.binding_manifest(scope, wanted), access.FIELD_MANAGER)
    except Exception as exc:
        rt.access_written.pop(key, None)
        message = (
            f"the Role and RoleBinding {access.access_name(key[1])!r} for the bound agents "
            f"could not be written ({api_error_text(exc)}): they cannot reach this "
            "conversation until it is"
        )
        log.warning("scope %s/%s: %s", key[0], key[1], message)
        await rt.kube.post_event(
            scope, type_="Warning", reason=R.ACCESS_NOT_GRANTED, message=message
        )
        return message
    rt.access_written[key] = wanted
    return None


async def _ensure_finalizer(rt: Runtime, scope: SandboxScopeView) -> None:
    meta = scope.metadata
    finalizers = list(meta.finalizers)
    if FINALIZER in finalizers:
        return
    patched = await rt.kube.patch_metadata(
        SANDBOX_SCOPE_PLURAL,
        meta.namespace,
        meta.name,
        finalizers=[*finalizers, FINALIZER],
        resource_version=meta.resource_version or None,
    )
    if patched is not None:
        rt.views.scopes.upsert(patched)


async def _request_purge(
    rt: Runtime,
    namespace: str,
    spec: SandboxScopeResourceSpec | None,
    members: list[SandboxView],
    *,
    whole_conversation: bool,
) -> list[DisposalFailure]:
    """Ask for everything the scope owns to go: with ``whole_conversation`` (no other scope
    names it) everything of the conversation, in collection calls where possible; else each
    member by name (its finalizer disposes its own objects)."""
    failures: list[DisposalFailure] = []
    views = [m.metadata for m in members]
    for m in views:
        rt.purging.add((namespace, m.name))
    if not whole_conversation:
        for m in views:
            if not m.deleting:
                await rt.kube.delete_sandbox(namespace, m.name)
        return failures
    if spec is not None:
        await rt.kube.delete_sandboxes(namespace, lbl.scope_selector(spec.scope, spec.thread_id))
    conversation = lbl.conversation_value(spec.scope, spec.thread_id) if spec is not None else None
    for m in views:
        if m.deleting or (
            conversation is not None and m.labels.get(lbl.CONVERSATION_LABEL) == conversation
        ):
            continue
        await rt.kube.delete_sandbox(namespace, m.name)
    if spec is None:
        return failures
    member_labels = {lbl.sandbox_label_value(str(m["name"])) for m in views}
    for driver in rt.drivers.values():
        try:
            if isinstance(driver, WatchedDisposal) and driver.watches_disposal:
                await driver.request_conversation_disposal(namespace, spec.scope, spec.thread_id)
                continue
            # Remote backends: each member's own finalizer disposes it; here only what carries
            # the conversation's labels but belongs to no member.
            for o in await driver.list_by_scope(namespace, spec.scope, spec.thread_id):
                if o.sandbox_name in member_labels:
                    continue
                try:
                    await driver.dispose_object(o)
                except DisposalError as exc:
                    failures.append(exc.failure)
        except DisposalError as exc:
            failures.append(exc.failure)
        except Exception as exc:
            failures.append(
                DisposalFailure(
                    code=DisposalCode.UNREACHABLE,
                    detail=f"listing the conversation failed: {type(exc).__name__}",
                    backend=driver.name,
                )
            )
    return failures


def _leftovers(
    rt: Runtime, namespace: str, spec: SandboxScopeResourceSpec | None, whole_conversation: bool
) -> int:
    """Watched objects of the conversation still there (orphans of no member included), when
    the purge asked for the whole conversation (else each member's finalizer waits for its
    own objects, and the others' are not this scope's to wait for)."""
    if spec is None or not whole_conversation:
        return 0
    value = lbl.conversation_value(spec.scope, spec.thread_id)
    return rt.views.count_by_label(namespace, lbl.CONVERSATION_LABEL, value)


async def purge_scope(rt: Runtime, scope: SandboxScopeView) -> float | None:
    """Dispose every sandbox of a deleted scope, record the purge, and let the scope go once
    nothing is left (or the attempts are used up: ``PurgeIncomplete``; undisposed Sandboxes
    keep their own finalizers and keep retrying)."""
    meta = scope.metadata
    namespace, name = meta.namespace, meta.name
    key = (namespace, name)
    if FINALIZER not in meta.finalizers:
        rt.purges.pop(key, None)
        return None
    spec = _spec(scope)
    names = scope_member_names(rt, namespace, name)
    whole = owns_conversation(rt, namespace, name)
    timeout = rt.config.operator.dispose_timeout_seconds
    started, attempt, initial, failures = rt.purges.get(key, (None, 0, len(names), ()))
    if started is None:
        members = scope_members(rt, namespace, name)
        found = await _request_purge(rt, namespace, spec, members, whole_conversation=whole)
        started = time.monotonic()
        failures = tuple(found)
        rt.purges[key] = (started, attempt, max(initial, len(names)), failures)
        initial = max(initial, len(names))
    leftovers = _leftovers(rt, namespace, spec, whole)
    elapsed = time.monotonic() - started
    if (names or leftovers) and elapsed < timeout and not failures:
        # Woken by each member's deletion: nothing to decode or write until the last one.
        return timeout - elapsed + 0.05
    members = scope_members(rt, namespace, name)
    purge = _purge_outcome(members, failures, leftovers, initial)
    draft, msg = _purge_status(scope, purge, len(members))
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
        # Try again from the start after the retry delay (the requests are idempotent).
        rt.purges[key] = (None, attempt + 1, initial, ())
        return rt.config.operator.disposal_retry_seconds
    if not await _release(rt, scope):
        return CONFLICT_RETRY_SECONDS
    rt.purges.pop(key, None)
    return None


def _purge_outcome(
    members: Sequence[SandboxView],
    failures: Sequence[DisposalFailure],
    leftovers: int,
    initial: int,
) -> ScopePurge:
    """What a purge achieved: the members still there (each with why, from its Disposed
    condition) and the conversation's objects no member accounts for are undisposed."""
    undisposed: list[DisposalFailure] = list(failures)
    for view in members:
        failed = view.status.conditions.find(DISPOSED) or ConditionView(None)
        undisposed.append(
            DisposalFailure(
                code=DisposalCode.TIMEOUT
                if failed.reason != R.DISPOSAL_FAILED
                else DisposalCode.UNKNOWN,
                detail=failed.message or f"Sandbox {view.metadata['name']} still present",
                backend=view.status.backend,
            )
        )
    if leftovers and not members:
        undisposed.append(
            DisposalFailure(
                code=DisposalCode.TIMEOUT,
                detail=f"{leftovers} object(s) of the conversation still present",
                backend="",
            )
        )
    disposed = max(initial - len(members), 0)
    return ScopePurge(disposed=disposed, undisposed=tuple(undisposed[:256]))


def _purge_status(scope: SandboxScopeView, purge: ScopePurge, remaining: int) -> tuple[Draft, str]:
    """The scope's status after a purge (lastPurge, its time, the count left, Disposed) and the
    one line that says it."""
    draft = Draft(scope)
    draft.set(
        lastPurge=purge.model_dump(mode="json", by_alias=True),
        lastPurgeTime=cnd.now_rfc3339(datetime.now(UTC)),
        sandboxCount=remaining,
    )
    if purge.complete:
        msg = f"purged: {purge.disposed} sandbox(es) disposed"
        draft.cond(DISPOSED, True, R.PURGED, msg)
    else:
        undisposed = purge.undisposed
        each = "; ".join(f"{f.backend}: {f.code.value}: {f.detail}" for f in undisposed[:10])
        msg = f"purge incomplete: {purge.disposed} disposed, {len(undisposed)} undisposed ({each})"
        draft.cond(DISPOSED, False, R.PURGE_INCOMPLETE, msg)
    return draft, msg


async def _release(rt: Runtime, scope: SandboxScopeView) -> bool:
    """Remove the operator's finalizer from the scope (as the views hold it now); False when
    that lost a race (look again)."""
    meta = scope.metadata
    namespace, name = meta.namespace, meta.name
    current = rt.views.scopes.get(namespace, name) or scope
    cmeta = current.metadata
    left = [f for f in cmeta.finalizers if f != FINALIZER]
    try:
        await rt.kube.patch_metadata(
            SANDBOX_SCOPE_PLURAL,
            namespace,
            name,
            finalizers=left,
            resource_version=cmeta.resource_version or None,
        )
    except Conflict:
        return False
    if not left:
        # Deleted now: a pass woken before its DELETED event comes (a member's) finds nothing
        # to purge again, rather than writing a status answered 404.
        rt.views.scopes.remove(namespace, name, cmeta.uid or None)
    return True
