"""The bodies the reconciler sends to the API server, as typed dicts naming the keys it writes.

Why its own module: the reconciler builds a conversation's Role and RoleBinding
(``reconcile/access.py``), the published backends ConfigMap (``reconcile/publish.py``), Events,
and the merge patches of its objects' metadata and status (``reconcile/kube.py``). Typed here, a
misspelt key in any of them is a mypy error where it is built; at the call the typed dict is
the body kubernetes_asyncio serialises as it is (the wire bytes are the dict's). Only the keys
the operator writes are named: ``total=False`` where a body leaves some out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict


class OwnerReference(TypedDict):
    """One entry of ``metadata.ownerReferences``."""

    apiVersion: str
    kind: str
    name: str
    uid: str


class ObjectMeta(TypedDict, total=False):
    """The ``metadata`` the operator writes: of a body it applies or creates, or of a merge
    patch (labels and annotations merged in, finalizers replaced, the version a precondition)."""

    name: str
    generateName: str
    namespace: str
    labels: dict[str, str]
    annotations: dict[str, str]
    finalizers: list[str]
    ownerReferences: list[OwnerReference]
    resourceVersion: str


class PolicyRule(TypedDict):
    """One rule of a Role."""

    apiGroups: list[str]
    resources: list[str]
    resourceNames: list[str]
    verbs: list[str]


class RoleManifest(TypedDict):
    """A namespaced Role, as applied."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
    rules: list[PolicyRule]


class RoleRef(TypedDict):
    apiGroup: str
    kind: str
    name: str


class Subject(TypedDict):
    """Whom a RoleBinding binds (a ServiceAccount)."""

    kind: str
    name: str
    namespace: str


class RoleBindingManifest(TypedDict):
    """A RoleBinding, as applied."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
    roleRef: RoleRef
    subjects: list[Subject]


class ConfigMapManifest(TypedDict):
    """A ConfigMap, as applied."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
    data: dict[str, str]


class InvolvedObject(TypedDict):
    """The object an Event is about."""

    apiVersion: str
    kind: str
    name: str
    namespace: str
    uid: str
    resourceVersion: str


class EventSource(TypedDict):
    component: str


class EventBody(TypedDict):
    """A core/v1 Event, as created."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
    involvedObject: InvolvedObject
    type: str
    reason: str
    message: str
    action: str
    source: EventSource
    reportingComponent: str
    reportingInstance: str
    firstTimestamp: str
    lastTimestamp: str
    count: int


class MetadataPatch(TypedDict):
    """A merge patch of an object's metadata."""

    metadata: ObjectMeta


class StatusPatch(TypedDict):
    """A merge patch of an object's status subresource: the status as its kind's model encoded
    it (``reconcile/status.py``), with the version read as a precondition when known."""

    status: Mapping[str, Any]
    metadata: NotRequired[ObjectMeta]
