"""The bodies the reconciler sends to the API server, as typed dicts naming the keys it writes.

Why its own module: the reconciler builds Events and the merge patches of its objects' status
(``reconcile/kube.py``), which no backend sends. The shapes it shares with the backends (metadata
and its patch, a Role and its binding, a ConfigMap) are ``backends/manifests.py``'s. Typed here, a
misspelt key in any of them is a mypy error where it is built; at the call the typed dict is
the body kubernetes_asyncio serialises as it is (the wire bytes are the dict's). Only the keys
the operator writes are named: ``total=False`` where a body leaves some out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

from sandbox_operator.backends.manifests import ObjectMeta


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


class StatusPatch(TypedDict):
    """A merge patch of an object's status subresource: the status as its kind's model encoded
    it (``reconcile/status.py``), with the version read as a precondition when known."""

    status: Mapping[str, Any]
    metadata: NotRequired[ObjectMeta]
