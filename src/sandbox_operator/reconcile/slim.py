"""What the operator's watched views keep of each object: a slim projection, copied out of the
watch's body.

Why its own module: which fields reconciling reads (and so which must be kept) is one topic, apart
from how the views store, index and hand objects out (``reconcile/views.py``). Only what a pass,
a driver or the census reads is kept, so memory stays near a few hundred bytes per object (a
field not kept here reads as absent from the views).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal, Required, TypedDict

from sandbox_operator import labels as lbl
from sandbox_operator.backends.confinement import confinement_digest
from sandbox_operator.contract import GROUP, SANDBOX_KIND, ConditionStatus
from sandbox_operator.views import (
    ConditionView,
    MetaView,
    ObjectView,
    PodView,
    SandboxScopeView,
    SandboxView,
    SandboxWarmPoolView,
)

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
#: (``MetaView.annotations_size``'s key.)
ANNOTATIONS_SIZE: Final = "annotationsSize"
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


def intern(value: Any) -> str:
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
_KEPT_META: Final[tuple[Literal["generation", "creationTimestamp", "deletionTimestamp"], ...]] = (
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
)
UID = "uid"


# ---- the slim copies' shapes: what is stored (encoded to JSON) and read back through views ----


class SlimOwner(TypedDict):
    kind: str
    name: str
    uid: str | None


class SlimMeta(TypedDict, total=False):
    """What ``_slim_meta`` keeps of an object's metadata."""

    name: str
    namespace: str
    uid: str
    resourceVersion: str
    ownerReferences: list[SlimOwner]
    finalizers: list[str]
    #: ``_KEPT_META``, when the wire has them.
    generation: int
    creationTimestamp: str
    deletionTimestamp: str
    #: A child's: only the labels selection and the drivers read (``_CHILD_LABELS``).
    labels: dict[str, str]
    #: Only ``_KEPT_ANNOTATIONS``; the size of all of them when large (``ANNOTATIONS_SIZE``).
    annotations: dict[str, str]
    annotationsSize: int


class SlimPodCondition(TypedDict, total=False):
    type: str
    status: str
    lastTransitionTime: str | None
    reason: str
    message: str


class SlimContainerStatus(TypedDict):
    name: str
    ready: bool
    image: str
    state: dict[str, Any]  # the wire's, copied (its one key: waiting, running or terminated)


class SlimPodStatus(TypedDict, total=False):
    phase: str
    reason: str
    message: str
    podIP: str
    conditions: list[SlimPodCondition]
    containerStatuses: list[SlimContainerStatus]


class SlimPodSpec(TypedDict, total=False):
    nodeName: str
    #: ``backends.confinement.CONFINEMENT`` (the key ``PodView.confinement`` reads).
    confinement: str


class SlimPod(TypedDict):
    """A pod as the views keep it: what selecting, classifying and claiming it read."""

    metadata: SlimMeta
    spec: SlimPodSpec
    status: SlimPodStatus


class Slim(TypedDict, total=False):
    """Any other object as the views keep it: its metadata; of this package's kinds (and of a
    namespace's egress NetworkPolicy) the wire's spec copied whole (read through the views, or
    validated into its model) and the status fields kept (``_SANDBOX_STATUS`` ...), copied as
    the wire has them."""

    apiVersion: str
    kind: str
    metadata: Required[SlimMeta]
    spec: dict[str, Any]
    status: dict[str, Any]


def _slim_meta(
    meta: MetaView, *, annotations: bool = True, labels: frozenset[str] | None = None
) -> SlimMeta:
    """The part of an object's metadata the views keep (a copy: the views never hold a
    watch's body)."""
    out: SlimMeta = {
        "name": intern(meta.name),
        "namespace": intern(meta.namespace),
        "uid": meta.uid,
        "resourceVersion": meta.resource_version,
    }
    for k in _KEPT_META:
        if meta.get(k) is not None:
            out[k] = meta[k]
    have = meta.labels
    if have:
        out["labels"] = {
            intern(k): intern(v) for k, v in have.items() if labels is None or k in labels
        }
    if annotations:
        have_annotations = meta.annotations
        kept = {intern(k): str(v) for k, v in have_annotations.items() if k in _KEPT_ANNOTATIONS}
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
        out["finalizers"] = [intern(f) for f in meta.finalizers]
    owners = meta.owner_references
    if owners:
        out["ownerReferences"] = [
            {"kind": intern(o.kind), "name": o.name, "uid": o.raw.get(UID)} for o in owners
        ]
    return out


def _slim_resource(
    view: ObjectView, default_kind: str, keys: Iterable[str], *, annotations: bool = True
) -> Slim:
    """The slim copy of one of this package's kinds: identity, spec whole, the status fields
    ``keys`` (those present)."""
    status = view.raw_status
    return {
        "apiVersion": view.api_version,
        "kind": view.kind or default_kind,
        "metadata": _slim_meta(view.metadata, annotations=annotations),
        "spec": _plain(view.spec),
        "status": {k: _plain(status[k]) for k in keys if k in status},
    }


def slim_sandbox(view: SandboxView) -> Slim:
    out = _slim_resource(view, SANDBOX_KIND, _SANDBOX_STATUS)
    egress = view.status.egress
    if egress.admitted:
        kept = {"admitted": egress["admitted"]}
        if egress.final:  # the disposal waits for it (egress_final_wait)
            kept["final"] = True
        out["status"]["egress"] = kept
    return out


def slim_scope(view: SandboxScopeView) -> Slim:
    return _slim_resource(view, "SandboxScope", _SCOPE_STATUS)


def slim_pool(view: SandboxWarmPoolView) -> Slim:
    return _slim_resource(view, "SandboxWarmPool", _POOL_STATUS, annotations=False)


def _slim_pod_condition(c: ConditionView) -> SlimPodCondition:
    cond: SlimPodCondition = {
        "type": intern(c.type),
        "status": intern(c.status),
        "lastTransitionTime": c.raw.get(_TRANSITION),
    }
    if c.reason:
        cond["reason"] = intern(c.reason)
    if c.message and c.status != ConditionStatus.TRUE:
        cond["message"] = c.message[:300]
    return cond


def slim_pod(pod: PodView) -> SlimPod:
    status = pod.status
    out_status: SlimPodStatus = {"phase": intern(status.phase)}
    if status.reason:
        out_status["reason"] = status.reason
    if status.message:
        out_status["message"] = status.message
    if status.pod_ip:
        out_status["podIP"] = status.pod_ip
    conds = [_slim_pod_condition(c) for c in status.conditions if c.type in _POD_CONDITIONS]
    if conds:
        out_status["conditions"] = conds
    statuses: list[SlimContainerStatus] = [
        {
            "name": intern(cs.name),
            "ready": cs.ready,
            "image": intern(cs.image),
            "state": _plain(cs.state),
        }
        for cs in status.container_statuses
    ]
    if statuses:
        out_status["containerStatuses"] = statuses
    out_spec: SlimPodSpec = {}
    if pod.node_name:
        out_spec["nodeName"] = intern(pod.node_name)
    # What confines it, as one digest: a pod is claimed or adopted only when this equals the
    # digest of the pod the backend would make (labels and owners can be copied by anyone who
    # may create pods).
    out_spec["confinement"] = confinement_digest(pod.spec)
    return {
        "metadata": _slim_meta(pod.metadata, labels=_CHILD_LABELS),
        "spec": out_spec,
        "status": out_status,
    }


def slim_plain(view: ObjectView) -> Slim:
    """Metadata only (PersistentVolumeClaims: their existence, labels, owners and deletion are
    what counts)."""
    return {"metadata": _slim_meta(view.metadata, annotations=False, labels=_CHILD_LABELS)}


def slim_network_policy(view: ObjectView) -> Slim:
    """Metadata, and the spec of a namespace's egress policy (one per backend and egress mode:
    few, and compared with what its backend makes, to replace one that differs)."""
    out = slim_plain(view)
    if lbl.EGRESS_LABEL in view.metadata.labels:
        out["spec"] = _plain(view.spec)
    return out
