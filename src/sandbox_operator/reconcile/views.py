"""In-memory views of the objects the operator reconciles, fed by watches.

Why: a reconcile that reads the API server costs requests proportional to the objects it holds
(every pass re-reading a Sandbox, its scope and its pod), which is what made an idle fleet of
thousands of sandboxes cost thousands of requests per second. Here every read comes from memory;
the API server is called only to write, and only when the wanted state differs from the seen one.

The views are filled by kopf's *indexing* handlers (see ``handlers.py``): kopf runs no other
handler until every indexed resource has been listed once, so by the time the first reconcile
runs, a view that says "no pod" means the API server had none when it was listed, not "not
loaded yet". Deletions arrive through the ``DELETED`` watch event. Writes the operator makes are
put into the views at once from the API server's answer (``upsert`` keeps the newer
``resourceVersion``), so the next pass never acts on its own stale copy.

Only what reconciling needs is kept of each object (a slim projection: ``reconcile/slim.py``), as
compact JSON decoded on each read and handed out as a typed view (``SandboxView``, ``PodView``:
no further copy), so memory stays near a few hundred bytes per object rather than the kilobytes
of its full JSON or of nested Python dicts.
"""

from __future__ import annotations

import json
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sandbox_operator import kubeobj
from sandbox_operator import labels as lbl
from sandbox_operator.contract import SANDBOX_KIND, ConditionType
from sandbox_operator.reconcile.slim import (
    INDEXED_LABELS,
    Slim,
    SlimPod,
    intern,
    slim_network_policy,
    slim_plain,
    slim_pod,
    slim_pool,
    slim_sandbox,
    slim_scope,
)
from sandbox_operator.views import ObjectView, PodView
from sandbox_operator.views.objects import Raw
from sandbox_operator.views.resources import SandboxScopeView, SandboxView, SandboxWarmPoolView

#: The view a Store hands its objects out as.
V = TypeVar("V", bound=ObjectView)
ObjKey = tuple[str, str]  # (namespace, name)


def _rv(obj: ObjectView) -> int:
    try:
        return int(obj.metadata.resource_version or 0)
    except ValueError:
        return 0


@dataclass(frozen=True, slots=True)
class _Entry:
    """One object held: its identity, its indexed labels, and the slim copy as compact JSON.

    Why bytes: a slim object as nested dicts costs about 3 KiB of Python objects; its JSON, a
    few hundred bytes. Reads are rare (a pass reads a handful of objects), so each is decoded on
    demand, and every reader gets a fresh copy it may change freely."""

    uid: str
    rv: int
    indexed: tuple[str | None, ...]  # the values of INDEXED_LABELS, in order (None: absent)
    data: bytes
    summary: Any = None


def _encode(obj: Slim | SlimPod) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


#: How many removed uids a Store remembers (a delete's answer comes within seconds of its event).
GONE_UIDS_KEPT = 4096


@dataclass
class Store(Generic[V]):
    """One resource's objects by (namespace, name), with label indexes, handed out as views
    (``view``, e.g. ``SandboxView``) over a fresh decoded copy.

    ``summarize`` keeps a small value per object beside it (e.g. a Sandbox's Ready reason and
    backend, for the metrics census) that can be read without decoding the object."""

    #: The slim copy of an object (given as a view over the wire's), e.g. ``slim_sandbox``.
    slim: Callable[[V], Slim | SlimPod]
    view: type[V]
    #: Given the view over the slim copy held.
    summarize: Callable[[V], Any] | None = None
    #: The (label, value) pairs to index an object under (given the view over the slim copy);
    #: default: its labels. (A SandboxScope is indexed under the conversation its spec names,
    #: which no label of its own carries.)
    index_of: Callable[[V], Mapping[str, str]] | None = None
    items: dict[ObjKey, _Entry] = field(default_factory=dict)
    # (namespace, label, value) -> the name holding it, or the set of names when several do
    # (most key and sandbox label values are held by one object: no set for those).
    _by_label: dict[tuple[str, str, str], str | set[str]] = field(default_factory=dict)
    # The uids of objects removed as gone, newest last (bounded): a uid never comes back, so an
    # answer that arrives after the object's DELETED event (a delete's response, slower than the
    # watch) cannot put it back as a ghost that no event would ever remove.
    _gone: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[V]:
        return (self.view(json.loads(e.data)) for e in list(self.items.values()))

    def summaries(self) -> Iterator[Any]:
        return (e.summary for e in list(self.items.values()))

    def get(self, namespace: str, name: str) -> V | None:
        entry = self.items.get((namespace, name))
        return None if entry is None else self.view(json.loads(entry.data))

    def uid_of(self, namespace: str, name: str) -> str | None:
        entry = self.items.get((namespace, name))
        return None if entry is None else entry.uid

    def upsert(self, obj: Mapping[str, Any]) -> V:
        """Keep ``obj`` (a watch's body or an answer: the wire, or a view over it) unless the
        view holds this version of it or a newer one (such as the watch event of the operator's
        own write, whose answer put it here: then nothing is copied); return what the view
        holds now."""
        given = self.view(obj.raw if isinstance(obj, Raw) else obj)
        meta = given.metadata
        k, uid, rv = (meta.namespace, meta.name), meta.uid, _rv(given)
        old = self.items.get(k)
        if old is not None and old.uid == uid and old.rv >= rv:
            return self.view(json.loads(old.data))
        slim = self.slim(given)
        held = self.view(slim)
        if uid and uid in self._gone:
            return held  # removed already: this is an older word about it
        if old is not None:
            self._unindex(k, old)
        k = (slim["metadata"]["namespace"], slim["metadata"]["name"])  # interned (_slim_meta)
        labels = self.index_of(held) if self.index_of is not None else held.metadata.labels
        entry = _Entry(
            uid=uid,
            rv=rv,
            indexed=tuple(labels.get(label) for label in INDEXED_LABELS),
            data=_encode(slim),
            summary=self.summarize(held) if self.summarize is not None else None,
        )
        self.items[k] = entry
        self._index(k, entry)
        return held

    def remove(self, namespace: str, name: str, uid: str | None = None) -> None:
        """Forget an object that is gone (its DELETED event, a 404, a delete answered with a
        Status). With its ``uid``, the object is never taken back under that uid."""
        k = (namespace, name)
        old = self.items.get(k)
        if old is not None and (uid is None or old.uid == uid):
            self._unindex(k, old)
            del self.items[k]
        if uid:
            self._gone[uid] = None
            self._gone.move_to_end(uid)
            if len(self._gone) > GONE_UIDS_KEPT:
                self._gone.popitem(last=False)

    def select(self, namespace: str, label: str, value: str) -> list[V]:
        out = (self.items.get((namespace, n)) for n in self.select_names(namespace, label, value))
        return [self.view(json.loads(e.data)) for e in out if e is not None]

    def select_names(self, namespace: str, label: str, value: str) -> list[str]:
        """The names holding a label value, decoding nothing (counting, enqueueing)."""
        held = self._by_label.get((namespace, label, value))
        return [] if held is None else [held] if isinstance(held, str) else sorted(held)

    def summary_of(self, namespace: str, name: str) -> Any:
        entry = self.items.get((namespace, name))
        return None if entry is None else entry.summary

    def names(self) -> Iterable[ObjKey]:
        return list(self.items)

    @staticmethod
    def _index_keys(k: ObjKey, entry: _Entry) -> Iterator[tuple[str, str, str]]:
        for label, value in zip(INDEXED_LABELS, entry.indexed, strict=True):
            if value is not None:
                yield (k[0], label, value)

    def _index(self, k: ObjKey, entry: _Entry) -> None:
        for ix in self._index_keys(k, entry):
            held = self._by_label.get(ix)
            if held is None:
                self._by_label[ix] = k[1]
            elif isinstance(held, str):
                if held != k[1]:
                    self._by_label[ix] = {held, k[1]}
            else:
                held.add(k[1])

    def _unindex(self, k: ObjKey, entry: _Entry) -> None:
        for ix in self._index_keys(k, entry):
            held = self._by_label.get(ix)
            if held is None:
                continue
            if isinstance(held, str):
                if held == k[1]:
                    del self._by_label[ix]
                continue
            held.discard(k[1])
            if len(held) == 1:
                self._by_label[ix] = next(iter(held))
            elif not held:
                del self._by_label[ix]


def scope_conversation(view: SandboxScopeView) -> dict[str, str]:
    """A SandboxScope's index: the conversation label value of its spec's scope and threadId
    (``view``: a watch event's body, or the slim copy being stored)."""
    scope, thread = view.scope, view.thread_id
    if scope and thread:
        return {lbl.CONVERSATION_LABEL: lbl.conversation_value(scope, thread)}
    return {}


def _age_key(obj: ObjectView) -> tuple[str, str]:
    """Older first: creation time (RFC 3339 UTC, so string order is time order), then name."""
    meta = obj.metadata
    return (meta.creation_timestamp or "9999", meta.name)


def sandbox_summary(obj: SandboxView) -> tuple[str, str, bool]:
    """(Ready reason, backend, admitted) of a Sandbox: the census metric, and which Sandboxes
    wait for something (a scope, a key) without decoding them."""
    reason = "Pending"
    admitted = False
    status = obj.status
    for cond in status.conditions:
        if cond.type == ConditionType.READY:
            reason = intern(cond.reason or "Pending")
        elif cond.type == ConditionType.ADMITTED:
            admitted = cond.is_true
    return reason, intern(status.backend), admitted


def owning_sandbox(obj: ObjectView) -> str | None:
    """The name of the Sandbox that owns a pod, NetworkPolicy or PersistentVolumeClaim (its
    controller reference)."""
    for owner in obj.metadata.owner_references:
        if owner.kind == SANDBOX_KIND:
            return owner.name or None
    return None


@dataclass
class Views:
    """Everything the reconcilers read: Sandboxes, SandboxScopes, the operator's pods,
    NetworkPolicies and PersistentVolumeClaims (the work volumes of sandboxes with
    ``spec.storage``). ``scope_refs`` maps (namespace, scopeRef) to the Sandboxes naming it."""

    sandboxes: Store[SandboxView] = field(
        default_factory=lambda: Store(slim_sandbox, SandboxView, sandbox_summary)
    )
    scopes: Store[SandboxScopeView] = field(
        default_factory=lambda: Store(slim_scope, SandboxScopeView, index_of=scope_conversation)
    )
    pools: Store[SandboxWarmPoolView] = field(
        default_factory=lambda: Store(slim_pool, SandboxWarmPoolView)
    )
    pods: Store[PodView] = field(default_factory=lambda: Store(slim_pod, PodView))
    network_policies: Store[ObjectView] = field(
        default_factory=lambda: Store(slim_network_policy, ObjectView)
    )
    persistent_volume_claims: Store[ObjectView] = field(
        default_factory=lambda: Store(slim_plain, ObjectView)
    )
    _scope_refs: dict[ObjKey, set[str]] = field(default_factory=lambda: defaultdict(set))
    _scope_ref_of: dict[ObjKey, str] = field(default_factory=dict)

    # ---- Sandboxes and their scopeRef index -------------------------------------------------

    def put_sandbox(self, obj: Mapping[str, Any]) -> SandboxView:
        slim = self.sandboxes.upsert(obj)
        k = slim.key
        ref = slim.scope_ref
        if self._scope_ref_of.get(k) != ref:
            self._unref(k)
            if ref:
                self._scope_ref_of[k] = ref
                self._scope_refs[(k[0], ref)].add(k[1])
        return slim

    def drop_sandbox(self, namespace: str, name: str, uid: str | None = None) -> None:
        held = self.sandboxes.uid_of(namespace, name)
        if held is not None and (uid is None or held == uid):
            self._unref((namespace, name))
        self.sandboxes.remove(namespace, name, uid)

    def naming_scope_names(self, namespace: str, scope: str) -> list[str]:
        return sorted(self._scope_refs.get((namespace, scope)) or ())

    def naming_scope(self, namespace: str, scope: str) -> list[SandboxView]:
        """Sandboxes whose ``spec.scopeRef`` names the scope (admitted or not)."""
        names = self._scope_refs.get((namespace, scope)) or ()
        out = (self.sandboxes.get(namespace, n) for n in sorted(names))
        return [o for o in out if o is not None]

    def _unref(self, k: ObjKey) -> None:
        ref = self._scope_ref_of.pop(k, None)
        if ref:
            names = self._scope_refs.get((k[0], ref))
            if names is not None:
                names.discard(k[1])
                if not names:
                    del self._scope_refs[(k[0], ref)]

    # ---- conversations: one SandboxScope each -------------------------------------------------

    def conversation_scopes(self, namespace: str, scope: str) -> list[str]:
        """The SandboxScopes whose spec names the same scope and threadId as ``scope`` does
        (itself included; empty when it is not held or names none)."""
        entry = self.scopes.items.get((namespace, scope))
        if entry is None:
            return []
        value = entry.indexed[INDEXED_LABELS.index(lbl.CONVERSATION_LABEL)]
        if value is None:
            return []
        return self.scopes.select_names(namespace, lbl.CONVERSATION_LABEL, value)

    def conversation_of(self, scope: SandboxScopeView) -> list[str]:
        """The held SandboxScopes naming the same conversation as the object ``scope`` (a watch
        event's body), from its own spec: right also when the views dropped it already (a status
        write answered 404 before its DELETED event came)."""
        value = scope_conversation(scope).get(lbl.CONVERSATION_LABEL)
        if value is None:
            return []
        namespace = scope.metadata.namespace
        return self.scopes.select_names(namespace, lbl.CONVERSATION_LABEL, value)

    def conversation_holder(self, namespace: str, scope: str) -> str | None:
        """The older SandboxScope holding the conversation that ``scope`` names, when that is
        not ``scope`` itself: the oldest of those naming it (by creation, then name) holds it,
        also while it is being deleted (its purge may still dispose the conversation's objects
        by its labels); the others are refused (``ScopeConflict``) until it is gone."""
        names = self.conversation_scopes(namespace, scope)
        if len(names) < 2:
            return None
        held = (self.scopes.get(namespace, n) for n in names)
        oldest = min((o for o in held if o is not None), key=_age_key)
        holder = oldest.metadata.name
        return None if holder == scope else holder

    # ---- children -----------------------------------------------------------------------------

    def children(self, namespace: str, sandbox: str) -> list[tuple[str, ObjectView]]:
        """The pods, NetworkPolicies and PersistentVolumeClaims carrying the sandbox's label,
        as (kind, object)."""
        value = lbl.sandbox_label_value(sandbox)
        out: list[tuple[str, ObjectView]] = [
            (kubeobj.POD_KIND, p) for p in self.pods.select(namespace, lbl.SANDBOX_LABEL, value)
        ]
        out += [
            (kubeobj.NETWORK_POLICY_KIND, n)
            for n in self.network_policies.select(namespace, lbl.SANDBOX_LABEL, value)
        ]
        out += [
            (kubeobj.PERSISTENT_VOLUME_CLAIM_KIND, c)
            for c in self.persistent_volume_claims.select(namespace, lbl.SANDBOX_LABEL, value)
        ]
        return out

    def count_by_label(self, namespace: str, label: str, value: str) -> int:
        return sum(
            len(store.select_names(namespace, label, value))
            for store in (self.pods, self.network_policies, self.persistent_volume_claims)
        )
