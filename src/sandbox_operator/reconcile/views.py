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

Only what reconciling needs is kept of each object (a slim projection), as compact JSON decoded
on each read, so memory stays near a few hundred bytes per object rather than the kilobytes of
its full JSON or of nested Python dicts.
"""

from __future__ import annotations

import json
import sys
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from sandbox_operator import kubeobj
from sandbox_operator import labels as lbl
from sandbox_operator.backends.confinement import CONFINEMENT, confinement_digest
from sandbox_operator.contract import GROUP, SANDBOX_KIND, ConditionStatus, ConditionType
from sandbox_operator.views import (
    ConditionView,
    MetaView,
    ObjectView,
    PodView,
    SandboxScopeView,
    SandboxView,
    SandboxWarmPoolView,
)

Obj = dict[str, Any]
ObjKey = tuple[str, str]  # (namespace, name)

#: Annotations of our own that reconciling reads; every other annotation (kopf's bookkeeping,
#: ``kubectl.kubernetes.io/last-applied-configuration``, users' own) is left out of the views.
_KEPT_ANNOTATIONS = frozenset(
    {
        lbl.SCOPE_ANNOTATION,
        lbl.THREAD_ANNOTATION,
        lbl.AGENT_DIR_ANNOTATION,
        lbl.CALL_ANNOTATION,
        lbl.LAST_ACTIVITY_ANNOTATION,
        lbl.POOL_NAME_ANNOTATION,
        f"{GROUP}/egress-proxy",
    }
)

#: In a view's metadata: the size of the object's annotations (``labels.annotations_size``), kept
#: only from ANNOTATIONS_SIZE_KEPT_FROM bytes on (below, any patch of ours fits).
ANNOTATIONS_SIZE = "annotationsSize"
ANNOTATIONS_SIZE_KEPT_FROM = 64 * 1024


#: Labels indexed for selection (key uniqueness, conversations, sandbox membership).
INDEXED_LABELS = (
    lbl.KEY_LABEL,
    lbl.CONVERSATION_LABEL,
    lbl.SANDBOX_LABEL,
    lbl.POOL_LABEL,
    lbl.POOL_SHAPE_LABEL,
    lbl.EGRESS_LABEL,
)

#: Status fields of a Sandbox or SandboxScope that the operator writes or reads.
_SANDBOX_STATUS = (
    "conditions",
    "observedGeneration",
    "backend",
    "isolation",
    "effectiveFloor",
    "isolationScope",
    "servedBy",
    "servedFrom",
    "sealedUntilClaim",  # judged at the claim, kept (reconcile/seal.py)
    # Suspend and resume (spec.storage): why and since when it is suspended, and the counts.
    "suspendedBy",
    "suspendedAt",
    "resumedAt",
    "suspendCount",
    "resumeCount",
    # Reset (spec.resets): the count the serving pod answers, when, and a refusal.
    "resets",
    "resetAt",
    "resetRefused",
    # Declared ports and their URLs through the router (compute.port_fields).
    "ports",
    # Egress edits (allowlist sandboxes only): what the proxy enforces, compared with the spec
    # on each pass, and which generation it is (reconcile/egress_edit.py).
    "admittedEgressAllow",
    "admittedEgressRules",
    "egressPolicy",
    "egressEditRefused",
)
_SCOPE_STATUS = ("conditions", "observedGeneration", "sandboxCount", "lastPurge", "lastPurgeTime")
_POOL_STATUS = (
    "conditions",
    "observedGeneration",
    "backend",
    "replicas",
    "readyReplicas",
    "claimed",
    "selector",
    "shape",
)


def _s(value: Any) -> str:
    """Intern short repeated strings (label values, namespaces, reasons): thousands of objects
    share them."""
    return sys.intern(str(value)) if len(str(value)) <= 64 else str(value)


def _plain(value: Any) -> Any:
    """A deep plain-dict copy of a kopf body part (kopf hands out live mapping views)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


#: The labels a child object (pod, NetworkPolicy, PersistentVolumeClaim) keeps in the views:
#: what selection and the drivers read (the kind: KeyUnclean tells a sandbox's identity, its key
#: and kind, by it). A Sandbox keeps all of its labels (their values are compared with the key's).
_CHILD_LABELS = frozenset(
    (*INDEXED_LABELS, lbl.BACKEND_LABEL, lbl.MANAGED_BY_LABEL, lbl.KIND_LABEL)
)
#: Kubernetes's PodReady condition type (the pod's, not the Sandbox's ``ConditionType.READY``).
POD_READY = "Ready"
#: The pod conditions classify_pod reads.
_POD_CONDITIONS = frozenset({POD_READY, "PodScheduled"})
_TRANSITION = "lastTransitionTime"


#: Metadata fields kept as the wire has them, when present.
_KEPT_META = ("generation", "creationTimestamp", "deletionTimestamp")
_UID = "uid"


def _slim_meta(
    obj: Mapping[str, Any], *, annotations: bool = True, labels: frozenset[str] | None = None
) -> Obj:
    """The part of an object's metadata the views keep (a copy: the views never hold a
    watch's body)."""
    meta = MetaView(kubeobj.meta(obj))
    out: Obj = {
        "name": _s(meta.name),
        "namespace": _s(meta.namespace),
        "uid": meta.uid,
        "resourceVersion": meta.resource_version,
    }
    for k in _KEPT_META:
        if meta.get(k) is not None:
            out[k] = meta[k]
    have = meta.labels
    if have:
        out["labels"] = {_s(k): _s(v) for k, v in have.items() if labels is None or k in labels}
    if annotations:
        have_annotations = meta.annotations
        kept = {_s(k): str(v) for k, v in have_annotations.items() if k in _KEPT_ANNOTATIONS}
        if kept:
            out["annotations"] = kept
        # How much of the API server's annotation limit is used, when it is a fair share: a
        # metadata patch that would take the object over the limit is refused (422) as a whole.
        rough = sum(len(k) + len(v) for k, v in have_annotations.items())  # chars <= bytes
        if rough * 4 > ANNOTATIONS_SIZE_KEPT_FROM:
            size = lbl.annotations_size(have_annotations)
            if size > ANNOTATIONS_SIZE_KEPT_FROM:
                out[ANNOTATIONS_SIZE] = size
    if meta.finalizers:
        out["finalizers"] = [_s(f) for f in meta.finalizers]
    owners = meta.owner_references
    if owners:
        out["ownerReferences"] = [
            {"kind": _s(o.kind), "name": o.name, "uid": o.raw.get(_UID)} for o in owners
        ]
    return out


def _slim_resource(
    view: ObjectView, default_kind: str, status: Obj, *, annotations: bool = True
) -> Obj:
    """The slim copy of one of this package's kinds: identity, spec whole, the kept status."""
    return {
        "apiVersion": view.api_version,
        "kind": view.kind or default_kind,
        "metadata": _slim_meta(view.raw, annotations=annotations),
        "spec": _plain(view.spec),
        "status": status,
    }


def _kept(status: Mapping[str, Any], keys: Iterable[str]) -> Obj:
    return {k: _plain(status[k]) for k in keys if k in status}


def slim_sandbox(obj: Mapping[str, Any]) -> Obj:
    view = SandboxView(obj)
    slim_status = _kept(view.raw_status, _SANDBOX_STATUS)
    egress = view.status.egress
    if egress.admitted:
        slim_status["egress"] = {"admitted": egress["admitted"]}
        if egress.final:  # the disposal waits for it (egress_final_wait)
            slim_status["egress"]["final"] = True
    return _slim_resource(view, SANDBOX_KIND, slim_status)


def slim_scope(obj: Mapping[str, Any]) -> Obj:
    view = SandboxScopeView(obj)
    return _slim_resource(view, "SandboxScope", _kept(view.raw_status, _SCOPE_STATUS))


def slim_pool(obj: Mapping[str, Any]) -> Obj:
    view = SandboxWarmPoolView(obj)
    status = _kept(view.raw_status, _POOL_STATUS)
    return _slim_resource(view, "SandboxWarmPool", status, annotations=False)


def _slim_pod_condition(c: ConditionView) -> Obj:
    cond: Obj = {
        "type": _s(c.type),
        "status": _s(c.status),
        "lastTransitionTime": c.raw.get(_TRANSITION),
    }
    if c.reason:
        cond["reason"] = _s(c.reason)
    if c.message and c.status != ConditionStatus.TRUE:
        cond["message"] = c.message[:300]
    return cond


def slim_pod(obj: Mapping[str, Any]) -> Obj:
    pod = PodView(obj)
    status = pod.status
    out_status: Obj = {"phase": _s(status.phase)}
    for k in ("reason", "message", "podIP"):
        if status.get(k):
            out_status[k] = str(status[k])
    conds = [_slim_pod_condition(c) for c in status.conditions if c.type in _POD_CONDITIONS]
    if conds:
        out_status["conditions"] = conds
    statuses = [
        {"name": _s(cs.name), "ready": cs.ready, "image": _s(cs.image), "state": _plain(cs.state)}
        for cs in status.container_statuses
    ]
    if statuses:
        out_status["containerStatuses"] = statuses
    out_spec: Obj = {}
    if pod.node_name:
        out_spec["nodeName"] = _s(pod.node_name)
    # What confines it, as one digest: a pod is claimed or adopted only when this equals the
    # digest of the pod the backend would make (labels and owners can be copied by anyone who
    # may create pods).
    out_spec[CONFINEMENT] = confinement_digest(pod.spec)
    return {
        "metadata": _slim_meta(obj, labels=_CHILD_LABELS),
        "spec": out_spec,
        "status": out_status,
    }


def slim_plain(obj: Mapping[str, Any]) -> Obj:
    """Metadata only (PersistentVolumeClaims: their existence, labels, owners and deletion are
    what counts)."""
    return {"metadata": _slim_meta(obj, annotations=False, labels=_CHILD_LABELS)}


def slim_network_policy(obj: Mapping[str, Any]) -> Obj:
    """Metadata, and the spec of a namespace's egress policy (one per backend and egress mode:
    few, and compared with what its backend makes, to replace one that differs)."""
    out = slim_plain(obj)
    view = ObjectView(obj)
    if lbl.EGRESS_LABEL in view.metadata.labels:
        out["spec"] = _plain(view.spec)
    return out


def _rv(obj: Mapping[str, Any]) -> int:
    try:
        return int(ObjectView(obj).metadata.resource_version or 0)
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


def _encode(obj: Obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


#: How many removed uids a Store remembers (a delete's answer comes within seconds of its event).
GONE_UIDS_KEPT = 4096


@dataclass
class Store:
    """One resource's objects by (namespace, name), with label indexes.

    ``summarize`` keeps a small value per object beside it (e.g. a Sandbox's Ready reason and
    backend, for the metrics census) that can be read without decoding the object."""

    slim: Callable[[Mapping[str, Any]], Obj]
    summarize: Callable[[Obj], Any] | None = None
    #: The (label, value) pairs to index an object under; default: its labels. (A SandboxScope
    #: is indexed under the conversation its spec names, which no label of its own carries.)
    index_of: Callable[[Obj], Mapping[str, str]] | None = None
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

    def __iter__(self) -> Iterator[Obj]:
        return (json.loads(e.data) for e in list(self.items.values()))

    def summaries(self) -> Iterator[Any]:
        return (e.summary for e in list(self.items.values()))

    def get(self, namespace: str, name: str) -> Obj | None:
        entry = self.items.get((namespace, name))
        return None if entry is None else json.loads(entry.data)

    def uid_of(self, namespace: str, name: str) -> str | None:
        entry = self.items.get((namespace, name))
        return None if entry is None else entry.uid

    def upsert(self, obj: Mapping[str, Any]) -> Obj:
        """Keep ``obj`` unless the view holds this version of it or a newer one (such as the
        watch event of the operator's own write, whose answer put it here: then nothing is
        copied); return what the view holds now."""
        meta = MetaView(kubeobj.meta(obj))
        k, uid, rv = (meta.namespace, meta.name), meta.uid, _rv(obj)
        old = self.items.get(k)
        if old is not None and old.uid == uid and old.rv >= rv:
            held: Obj = json.loads(old.data)
            return held
        slim = self.slim(obj)
        if uid and uid in self._gone:
            return slim  # removed already: this is an older word about it
        if old is not None:
            self._unindex(k, old)
        k = (slim["metadata"]["namespace"], slim["metadata"]["name"])  # interned (_slim_meta)
        labels = (
            self.index_of(slim) if self.index_of is not None else MetaView(slim["metadata"]).labels
        )
        entry = _Entry(
            uid=uid,
            rv=rv,
            indexed=tuple(labels.get(label) for label in INDEXED_LABELS),
            data=_encode(slim),
            summary=self.summarize(slim) if self.summarize is not None else None,
        )
        self.items[k] = entry
        self._index(k, entry)
        return slim

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

    def select(self, namespace: str, label: str, value: str) -> list[Obj]:
        out = (self.items.get((namespace, n)) for n in self.select_names(namespace, label, value))
        return [json.loads(e.data) for e in out if e is not None]

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


def scope_conversation(obj: Mapping[str, Any]) -> dict[str, str]:
    """A SandboxScope's index: the conversation label value of its spec's scope and threadId."""
    view = SandboxScopeView(obj)
    scope, thread = view.spec.get("scope"), view.spec.get("threadId")
    if isinstance(scope, str) and isinstance(thread, str) and scope and thread:
        return {lbl.CONVERSATION_LABEL: lbl.conversation_value(scope, thread)}
    return {}


def _age_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    """Older first: creation time (RFC 3339 UTC, so string order is time order), then name."""
    meta = ObjectView(obj).metadata
    return (meta.creation_timestamp or "9999", meta.name)


def sandbox_summary(obj: Obj) -> tuple[str, str, bool]:
    """(Ready reason, backend, admitted) of a Sandbox: the census metric, and which Sandboxes
    wait for something (a scope, a key) without decoding them."""
    reason = "Pending"
    admitted = False
    status = SandboxView(obj).status
    for cond in status.conditions:
        if cond.type == ConditionType.READY:
            reason = _s(cond.reason or "Pending")
        elif cond.type == ConditionType.ADMITTED:
            admitted = cond.is_true
    return reason, _s(status.backend), admitted


def owning_sandbox(obj: Mapping[str, Any]) -> str | None:
    """The name of the Sandbox that owns a pod, NetworkPolicy or PersistentVolumeClaim (its
    controller reference)."""
    for owner in ObjectView(obj).metadata.owner_references:
        if owner.kind == SANDBOX_KIND:
            return owner.name or None
    return None


@dataclass
class Views:
    """Everything the reconcilers read: Sandboxes, SandboxScopes, the operator's pods,
    NetworkPolicies and PersistentVolumeClaims (the work volumes of sandboxes with
    ``spec.storage``). ``scope_refs`` maps (namespace, scopeRef) to the Sandboxes naming it."""

    sandboxes: Store = field(default_factory=lambda: Store(slim_sandbox, sandbox_summary))
    scopes: Store = field(default_factory=lambda: Store(slim_scope, index_of=scope_conversation))
    pools: Store = field(default_factory=lambda: Store(slim_pool))
    pods: Store = field(default_factory=lambda: Store(slim_pod))
    network_policies: Store = field(default_factory=lambda: Store(slim_network_policy))
    persistent_volume_claims: Store = field(default_factory=lambda: Store(slim_plain))
    _scope_refs: dict[ObjKey, set[str]] = field(default_factory=lambda: defaultdict(set))
    _scope_ref_of: dict[ObjKey, str] = field(default_factory=dict)

    # ---- Sandboxes and their scopeRef index -------------------------------------------------

    def put_sandbox(self, obj: Mapping[str, Any]) -> Obj:
        slim = self.sandboxes.upsert(obj)
        meta = slim["metadata"]
        k = (str(meta["namespace"]), str(meta["name"]))
        ref = SandboxView(slim).scope_ref
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

    def naming_scope(self, namespace: str, scope: str) -> list[Obj]:
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

    def conversation_of(self, scope: Mapping[str, Any]) -> list[str]:
        """The held SandboxScopes naming the same conversation as the object ``scope`` (a watch
        event's body), from its own spec: right also when the views dropped it already (a status
        write answered 404 before its DELETED event came)."""
        value = scope_conversation(scope).get(lbl.CONVERSATION_LABEL)
        if value is None:
            return []
        namespace = ObjectView(scope).metadata.namespace
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
        holder = str(oldest["metadata"]["name"])
        return None if holder == scope else holder

    # ---- children -----------------------------------------------------------------------------

    def children(self, namespace: str, sandbox: str) -> list[tuple[str, Obj]]:
        """The pods, NetworkPolicies and PersistentVolumeClaims carrying the sandbox's label,
        as (kind, object)."""
        value = lbl.sandbox_label_value(sandbox)
        out = [(kubeobj.POD_KIND, p) for p in self.pods.select(namespace, lbl.SANDBOX_LABEL, value)]
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
