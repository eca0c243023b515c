"""Writing a status: the draft a pass computes, the one merge patch it becomes, and the Events.

A pass starts a :class:`Draft` from the object as the views hold it, sets conditions (the
contract's :class:`Condition` models, types and reasons the contract's enums) and fields on it,
and :func:`send_status_patch` patches only what changed. The patch is validated against the kind's
status model (``SandboxResourceStatus``, ``SandboxScopeResourceStatus``,
``SandboxWarmPoolResourceStatus``) and serialised from it once, by alias and without unset
fields; a field set to None is removed (a merge patch's null).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Unpack

from sandbox_operator.backends.base import SandboxRef, ServedBy
from sandbox_operator.contract import (
    SANDBOX_PLURAL,
    SANDBOX_SCOPE_PLURAL,
    SANDBOX_WARM_POOL_PLURAL,
    Condition,
    ConditionReason,
    ConditionStatus,
    ConditionType,
    ContractModel,
    SandboxResourceStatus,
    SandboxScopeResourceStatus,
    SandboxWarmPoolResourceStatus,
)
from sandbox_operator.reconcile import conditions as cnd
from sandbox_operator.reconcile.runtime import Runtime
from sandbox_operator.reconcile.statusfields import StatusFields, StatusWrite
from sandbox_operator.views import ObjectView, SandboxStatusView, SandboxView, StatusView

ADMITTED = ConditionType.ADMITTED
READY = ConditionType.READY
DISPOSED = ConditionType.DISPOSED
R = ConditionReason

#: The status model of each kind the operator writes, by plural.
STATUS_MODELS: Final[Mapping[str, type[ContractModel]]] = {
    SANDBOX_PLURAL: SandboxResourceStatus,
    SANDBOX_SCOPE_PLURAL: SandboxScopeResourceStatus,
    SANDBOX_WARM_POOL_PLURAL: SandboxWarmPoolResourceStatus,
}

#: Reasons reported as Normal events; every other reason is a Warning.
NORMAL_REASONS = frozenset(
    {R.ADMITTED, R.CREATING, R.READY, R.SUSPENDED, R.DISPOSING, R.DISPOSED, R.PURGED}
)

#: Normal transitions every Sandbox makes on its way in and out (admitted, created, Ready,
#: disposed): recorded in its conditions only, never as an Event. An Event is a write to the API
#: server for each Sandbox, and nothing reads these that does not read the conditions (the client
#: and ``kubectl get sandboxes`` read the conditions). Warnings are always recorded, and so are
#: the Normal events someone waits for: ``Suspended`` (``kubectl describe`` on a sandbox that
#: stopped by itself) and a scope's ``Purged``.
SILENT_REASONS = frozenset({R.ADMITTED, R.CREATING, R.READY, R.DISPOSING, R.DISPOSED})

#: After a write lost a race (409), look again this soon even if no watch event comes.
CONFLICT_RETRY_SECONDS = 1.0


@dataclass
class Draft:
    """The status being computed for one object, compared with the old one at write time.

    ``conditions`` are models; ``fields`` are the other status fields in their wire spelling
    (camelCase keys, JSON values; None: remove), as ``compute``'s plans give them."""

    obj: ObjectView
    conditions: list[Condition] = field(init=False)
    fields: StatusFields = field(init=False)
    #: The status as held (a view over the object's own ``status``: no copy).
    old: StatusView = field(init=False)

    def __post_init__(self) -> None:
        self.old = StatusView(self.view.raw_status)
        self.conditions = cnd.parse_conditions(self.old.conditions)
        self.fields = {"observedGeneration": self.generation}

    @property
    def view(self) -> ObjectView:
        return self.obj

    @property
    def generation(self) -> int | None:
        """``metadata.generation``; None when the object has none (the API server's start at 1)."""
        return self.view.metadata.generation or None

    @property
    def values(self) -> StatusWrite:
        """The status as it would be written (for the keys this pass sets)."""
        return {"conditions": [c.to_wire() for c in self.conditions], **self.fields}

    def cond(
        self,
        ctype: ConditionType,
        status: bool | ConditionStatus,
        reason: ConditionReason,
        message: str,
    ) -> None:
        self.conditions = cnd.with_condition(
            self.conditions, ctype, status, reason, message, self.generation
        )

    def set(self, **fields: Unpack[StatusFields]) -> None:
        self.fields.update(fields)

    def condition(self, ctype: ConditionType) -> Condition | None:
        return cnd.condition(self.conditions, ctype)

    def reason(self, ctype: ConditionType) -> str | None:
        c = self.condition(ctype)
        return None if c is None else c.reason

    def is_true(self, ctype: ConditionType) -> bool:
        c = self.condition(ctype)
        return c is not None and c.status is ConditionStatus.TRUE


def patch_body(plural: str, patch: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch as written: what it sets validated as the kind's status model and
    serialised from it (by alias, unset and None fields left out); what it removes, null."""
    model = STATUS_MODELS[plural].model_validate({k: v for k, v in patch.items() if v is not None})
    body = model.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_unset=True)
    return {k: (body[k] if v is not None else None) for k, v in patch.items()}


@dataclass(frozen=True)
class Patched:
    """The answer to a status patch: the object as written, or None when it is gone (404)."""

    obj: ObjectView | None


async def send_status_patch(rt: Runtime, plural: str, draft: Draft) -> Patched | None:
    """Patch the status if it changed (None: it did not, nothing was sent), with the object's
    ``resourceVersion`` as a precondition. Raises :class:`Conflict` when the object changed
    since it was read."""
    meta = draft.view.metadata
    patch = cnd.status_patch(draft.old, draft.values)
    if patch is None:
        return None
    written = await rt.kube.patch_status(
        plural,
        meta.namespace,
        meta.name,
        patch_body(plural, patch),
        meta.resource_version or None,
    )
    return Patched(written)


def sandbox_gone(rt: Runtime, obj: ObjectView) -> None:
    """The API server answered 404 for a Sandbox the views hold: it is gone (a deletion the
    watch has not delivered yet, or missed). Drop it from the views and forget everything kept
    about it, so no resync or event about its scope passes over it again (each such pass would
    cost a read and a write answered 404); its DELETED event, or a newer object of that name,
    brings whatever is due."""
    meta = obj.metadata
    ns, name = meta.namespace, meta.name
    rt.views.drop_sandbox(ns, name, meta.uid or None)
    rt.forget(ns, name)


async def write_status(rt: Runtime, plural: str, draft: Draft) -> bool:
    """Patch a Sandbox's or SandboxScope's status if it changed; post an Event for each
    condition whose reason changed.

    The answer goes into the views at once. Raises :class:`Conflict` when the object changed
    since it was read.
    """
    patched = await send_status_patch(rt, plural, draft)
    if patched is None:
        return False
    meta = draft.view.metadata
    written = patched.obj
    ns, name = meta.namespace, meta.name
    if written is None:
        if plural == SANDBOX_PLURAL:
            sandbox_gone(rt, draft.obj)
        else:
            rt.views.scopes.remove(ns, name, meta.uid or None)
        return False
    if plural == SANDBOX_PLURAL:
        rt.views.put_sandbox(written)
    else:
        rt.views.scopes.upsert(written)
    await _post_events(rt, draft)
    return True


async def _post_events(rt: Runtime, draft: Draft) -> None:
    """An Event for each condition whose reason or status this write changed, but for the
    transitions every Sandbox makes (``SILENT_REASONS``)."""
    old_conds = draft.old.conditions
    for ctype in (ADMITTED, READY, DISPOSED):
        new = draft.condition(ctype)
        old = old_conds.find(ctype)
        if new is None or (
            old is not None and old.reason == new.reason and old.status == new.status
        ):
            continue
        if new.reason in SILENT_REASONS:
            continue
        if ctype == READY and draft.reason(ADMITTED) == new.reason:
            continue  # a refusal is reported once, on Admitted
        type_ = "Normal" if new.reason in NORMAL_REASONS else "Warning"
        await rt.kube.post_event(draft.obj, type_=type_, reason=new.reason, message=new.message)


#: A change of a condition's message alone (same status and reason: "starting: Pending", then
#: "starting: ContainerCreating") is written at most this often per Sandbox; a new reason, status
#: or field is written at once. Such progress is not a transition a watcher acts on: a pod that
#: starts within this long costs two status writes (Admitted, then Ready) and no more, while a slow
#: start (an image pull, a node under load) still shows why it waits, every this many seconds.
MESSAGE_DEBOUNCE_SECONDS = 10.0


def message_only(old: StatusView, draft: Draft) -> bool:
    """Whether the draft differs from the old status only in condition messages."""
    patch = cnd.status_patch(old, draft.values)
    if not patch or set(patch) != {"conditions"}:
        return False
    old_conds = old.conditions
    for new in draft.conditions:
        before = old_conds.find(ConditionType(new.type))
        if before is None:
            return False
        if (before.status, before.reason) != (new.status, new.reason):
            return False
    return True


# ---- what serves the sandbox, as the status records it ---------------------------------------


def recorded_served_by(status: SandboxStatusView) -> ServedBy | None:
    """What ``status.servedBy`` recorded, for dispose (``None`` when nothing was recorded)."""
    served = status.served_by
    if not served.kind or not served.name:
        return None
    return ServedBy(served.kind, served.name, served.namespace)


def egress_admitted(status: SandboxStatusView) -> datetime | None:
    """When the egress proxy says it admitted the sandbox (``status.egress.admitted``), if so."""
    return status.egress.admitted_at


def sandbox_ref(obj: SandboxView, served_by: ServedBy | None = None) -> SandboxRef:
    """The reference drivers get: the Sandbox plus what serves it (observed, else recorded) and
    what its status says of the egress proxy."""
    meta, status = obj.metadata, obj.status
    return SandboxRef(
        meta.namespace,
        meta.name,
        meta.uid,
        served_by or recorded_served_by(status),
        egress_admitted(status),
    )
