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

Only what reconciling needs is kept of each object (a slim projection), so memory stays
proportional to a few hundred bytes per object rather than the object's full JSON.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from sandbox_operator import labels as lbl
from sandbox_operator.contract import GROUP, SANDBOX_KIND

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
        f"{GROUP}/egress-proxy",
    }
)

#: Labels indexed for selection (key uniqueness, conversations, sandbox membership).
INDEXED_LABELS = (lbl.KEY_LABEL, lbl.CONVERSATION_LABEL, lbl.SANDBOX_LABEL)

#: Status fields of a Sandbox or SandboxScope that the operator writes or reads.
_SANDBOX_STATUS = (
    "conditions",
    "observedGeneration",
    "backend",
    "isolation",
    "effectiveFloor",
    "isolationScope",
    "servedBy",
)
_SCOPE_STATUS = ("conditions", "observedGeneration", "sandboxCount", "lastPurge", "lastPurgeTime")


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


#: The labels a child object (pod, NetworkPolicy) keeps in the views: what selection and the
#: drivers read. A Sandbox keeps all of its labels (their values are compared with the key's).
_CHILD_LABELS = frozenset((*INDEXED_LABELS, lbl.BACKEND_LABEL, lbl.MANAGED_BY_LABEL))
#: The pod conditions classify_pod reads.
_POD_CONDITIONS = frozenset({"Ready", "PodScheduled"})


def _meta(
    obj: Mapping[str, Any], *, annotations: bool = True, labels: frozenset[str] | None = None
) -> Obj:
    meta = obj.get("metadata") or {}
    out: Obj = {
        "name": _s(meta.get("name", "")),
        "namespace": _s(meta.get("namespace", "")),
        "uid": str(meta.get("uid", "")),
        "resourceVersion": str(meta.get("resourceVersion", "")),
    }
    for k in ("generation", "creationTimestamp", "deletionTimestamp"):
        if meta.get(k) is not None:
            out[k] = meta[k]
    have = meta.get("labels") or {}
    if have:
        out["labels"] = {_s(k): _s(v) for k, v in have.items() if labels is None or k in labels}
    if annotations:
        kept = {
            _s(k): str(v)
            for k, v in (meta.get("annotations") or {}).items()
            if k in _KEPT_ANNOTATIONS
        }
        if kept:
            out["annotations"] = kept
    if meta.get("finalizers"):
        out["finalizers"] = [_s(f) for f in meta["finalizers"]]
    owners = meta.get("ownerReferences") or []
    if owners:
        out["ownerReferences"] = [
            {"kind": _s(o.get("kind", "")), "name": str(o.get("name", "")), "uid": o.get("uid")}
            for o in owners
        ]
    return out


def slim_sandbox(obj: Mapping[str, Any]) -> Obj:
    status = obj.get("status") or {}
    slim_status: Obj = {k: _plain(status[k]) for k in _SANDBOX_STATUS if k in status}
    egress = status.get("egress")
    if isinstance(egress, Mapping) and egress.get("admitted"):
        slim_status["egress"] = {"admitted": egress["admitted"]}
    return {
        "apiVersion": str(obj.get("apiVersion", "")),
        "kind": str(obj.get("kind", SANDBOX_KIND)),
        "metadata": _meta(obj),
        "spec": _plain(obj.get("spec") or {}),
        "status": slim_status,
    }


def slim_scope(obj: Mapping[str, Any]) -> Obj:
    status = obj.get("status") or {}
    return {
        "apiVersion": str(obj.get("apiVersion", "")),
        "kind": str(obj.get("kind", "SandboxScope")),
        "metadata": _meta(obj),
        "spec": _plain(obj.get("spec") or {}),
        "status": {k: _plain(status[k]) for k in _SCOPE_STATUS if k in status},
    }


def slim_pod(obj: Mapping[str, Any]) -> Obj:
    status = obj.get("status") or {}
    spec = obj.get("spec") or {}
    out_status: Obj = {"phase": _s(status.get("phase", "Pending"))}
    for k in ("reason", "message", "podIP"):
        if status.get(k):
            out_status[k] = str(status[k])
    conds = []
    for c in status.get("conditions") or []:
        if c.get("type") not in _POD_CONDITIONS:
            continue
        cond = {
            "type": _s(c.get("type", "")),
            "status": _s(c.get("status", "")),
            "lastTransitionTime": c.get("lastTransitionTime"),
        }
        if c.get("reason"):
            cond["reason"] = _s(c["reason"])
        if c.get("message") and c.get("status") != "True":
            cond["message"] = str(c["message"])[:300]
        conds.append(cond)
    if conds:
        out_status["conditions"] = conds
    statuses = []
    for cs in status.get("containerStatuses") or []:
        statuses.append(
            {
                "name": _s(cs.get("name", "")),
                "ready": bool(cs.get("ready")),
                "image": _s(cs.get("image", "")),
                "state": _plain(cs.get("state") or {}),
            }
        )
    if statuses:
        out_status["containerStatuses"] = statuses
    out_spec: Obj = {}
    if spec.get("nodeName"):
        out_spec["nodeName"] = _s(spec["nodeName"])
    return {"metadata": _meta(obj, labels=_CHILD_LABELS), "spec": out_spec, "status": out_status}


def slim_plain(obj: Mapping[str, Any]) -> Obj:
    """Metadata only (NetworkPolicies: their existence, labels and owners are what counts)."""
    return {"metadata": _meta(obj, annotations=False, labels=_CHILD_LABELS)}


def _rv(obj: Mapping[str, Any]) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


@dataclass
class Store:
    """One resource's objects by (namespace, name), with label indexes."""

    slim: Callable[[Mapping[str, Any]], Obj]
    items: dict[ObjKey, Obj] = field(default_factory=dict)
    _by_label: dict[tuple[str, str, str], set[str]] = field(
        default_factory=lambda: defaultdict(set)
    )

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Obj]:
        return iter(list(self.items.values()))

    def get(self, namespace: str, name: str) -> Obj | None:
        return self.items.get((namespace, name))

    def upsert(self, obj: Mapping[str, Any]) -> Obj:
        """Keep ``obj`` unless the view already holds a newer version of it."""
        slim = self.slim(obj)
        meta = slim["metadata"]
        k = (meta["namespace"], meta["name"])
        old = self.items.get(k)
        if old is not None:
            if old["metadata"].get("uid") == meta.get("uid") and _rv(old) > _rv(slim):
                return old
            self._unindex(k, old)
        self.items[k] = slim
        self._index(k, slim)
        return slim

    def remove(self, namespace: str, name: str, uid: str | None = None) -> None:
        k = (namespace, name)
        old = self.items.get(k)
        if old is not None and (uid is None or old["metadata"].get("uid") == uid):
            self._unindex(k, old)
            del self.items[k]

    def select(self, namespace: str, label: str, value: str) -> list[Obj]:
        names = self._by_label.get((namespace, label, value)) or ()
        return [self.items[(namespace, n)] for n in sorted(names) if (namespace, n) in self.items]

    def names(self) -> Iterable[ObjKey]:
        return list(self.items)

    def _index(self, k: ObjKey, obj: Obj) -> None:
        labels = obj["metadata"].get("labels") or {}
        for label in INDEXED_LABELS:
            if label in labels:
                self._by_label[(k[0], label, labels[label])].add(k[1])

    def _unindex(self, k: ObjKey, obj: Obj) -> None:
        labels = obj["metadata"].get("labels") or {}
        for label in INDEXED_LABELS:
            if label in labels:
                ix = (k[0], label, labels[label])
                names = self._by_label.get(ix)
                if names is not None:
                    names.discard(k[1])
                    if not names:
                        del self._by_label[ix]


def owning_sandbox(obj: Mapping[str, Any]) -> str | None:
    """The name of the Sandbox that owns a pod or NetworkPolicy (its controller reference)."""
    for owner in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("kind") == SANDBOX_KIND:
            return str(owner.get("name", "")) or None
    return None


@dataclass
class Views:
    """Everything the reconcilers read: Sandboxes, SandboxScopes, the operator's pods and
    NetworkPolicies. ``scope_refs`` maps (namespace, scopeRef) to the Sandboxes naming it."""

    sandboxes: Store = field(default_factory=lambda: Store(slim_sandbox))
    scopes: Store = field(default_factory=lambda: Store(slim_scope))
    pods: Store = field(default_factory=lambda: Store(slim_pod))
    network_policies: Store = field(default_factory=lambda: Store(slim_plain))
    _scope_refs: dict[ObjKey, set[str]] = field(default_factory=lambda: defaultdict(set))

    # ---- Sandboxes and their scopeRef index -------------------------------------------------

    def put_sandbox(self, obj: Mapping[str, Any]) -> Obj:
        meta = obj.get("metadata") or {}
        old = self.sandboxes.get(str(meta.get("namespace", "")), str(meta.get("name", "")))
        if old is not None:
            self._unref(old)
        slim = self.sandboxes.upsert(obj)
        self._ref(slim)
        return slim

    def drop_sandbox(self, namespace: str, name: str, uid: str | None = None) -> None:
        old = self.sandboxes.get(namespace, name)
        if old is not None and (uid is None or old["metadata"].get("uid") == uid):
            self._unref(old)
        self.sandboxes.remove(namespace, name, uid)

    def naming_scope(self, namespace: str, scope: str) -> list[Obj]:
        """Sandboxes whose ``spec.scopeRef`` names the scope (admitted or not)."""
        names = self._scope_refs.get((namespace, scope)) or ()
        out = (self.sandboxes.get(namespace, n) for n in sorted(names))
        return [o for o in out if o is not None]

    def _ref(self, obj: Obj) -> None:
        ref = (obj.get("spec") or {}).get("scopeRef")
        if ref:
            meta = obj["metadata"]
            self._scope_refs[(meta["namespace"], str(ref))].add(meta["name"])

    def _unref(self, obj: Obj) -> None:
        ref = (obj.get("spec") or {}).get("scopeRef")
        if ref:
            meta = obj["metadata"]
            names = self._scope_refs.get((meta["namespace"], str(ref)))
            if names is not None:
                names.discard(meta["name"])
                if not names:
                    del self._scope_refs[(meta["namespace"], str(ref))]

    # ---- children -----------------------------------------------------------------------------

    def children(self, namespace: str, sandbox: str) -> list[tuple[str, Obj]]:
        """The pods and NetworkPolicies carrying the sandbox's label, as (kind, object)."""
        value = lbl.sandbox_label_value(sandbox)
        out = [("Pod", p) for p in self.pods.select(namespace, lbl.SANDBOX_LABEL, value)]
        out += [
            ("NetworkPolicy", n)
            for n in self.network_policies.select(namespace, lbl.SANDBOX_LABEL, value)
        ]
        return out

    def by_label(self, namespace: str, label: str, value: str) -> list[tuple[str, Obj]]:
        out = [("Pod", p) for p in self.pods.select(namespace, label, value)]
        out += [("NetworkPolicy", n) for n in self.network_policies.select(namespace, label, value)]
        return out
