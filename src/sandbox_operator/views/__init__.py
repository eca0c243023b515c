"""Typed views over the wire dicts: one accessor per field the code reads, over the same dict.

Why: the objects the API server sends (a watch event's body, a list item, an answer, a view's
decoded copy) are plain dicts, and every reader dug into them with ``.get("…")`` chains, where a
typo in a key is found by a test at best. A view wraps the dict it is given (no copy, no parse
on construction) and names each field once, typed; the type checker then sees every read. Like
kopf's body views, a view is itself a read-only ``Mapping`` over the object, so a function that
still takes a mapping takes a view too, and conversion can go one reader at a time.

Timestamps are parsed once per object version: a view caches what it parsed, and the parse of a
given string is memoised, so a walk of a Sandbox that asks for its creation time nine times
parses it once.

This package imports only the standard library, the contract and ``kubeobj``/``kubeapi`` (the
shared ``meta`` and timestamp reading), so the reconciler, the backends, the client, the maf
backend and the egress proxy can all take views.
"""

from __future__ import annotations

from sandbox_operator.views.acas import (
    AcasCountView,
    AcasEgressDecisionsView,
    AcasEgressPolicyView,
    AcasErrorBodyView,
    AcasErrorView,
    AcasHttpDecisionsView,
    AcasHttpPolicyView,
    AcasPageView,
    AcasSnapshotView,
)
from sandbox_operator.views.admission import (
    AdmissionPolicyView,
    PolicyBindingView,
    SelfSubjectReviewView,
)
from sandbox_operator.views.client import (
    HostToolRequestView,
    KubeconfigContextDetailsView,
    KubeconfigContextView,
    SandboxSpecView,
)
from sandbox_operator.views.conditions import Conditions, ConditionView
from sandbox_operator.views.core import (
    ApiStatusView,
    ConfigMapView,
    DeleteAnswerView,
    EventView,
    NamespaceView,
    ObjectRefView,
    ServiceView,
    StatusCauseView,
    StatusDetailsView,
)
from sandbox_operator.views.objects import (
    ListView,
    ManagedFieldsEntry,
    MetaView,
    ObjectView,
    OwnerRef,
    WatchEvent,
    on_the_wire,
)
from sandbox_operator.views.pod import (
    ContainerStatusView,
    PodStatusView,
    PodView,
    TerminatedStateView,
    WaitingStateView,
)
from sandbox_operator.views.resources import (
    EgressEditRefusalView,
    EgressStatusView,
    SandboxScopeView,
    SandboxStatusView,
    SandboxView,
    SandboxWarmPoolView,
    ScopeStatusView,
    ServedRef,
    StatusView,
    WarmPoolStatusView,
)

__all__ = [
    "AcasCountView",
    "AcasEgressDecisionsView",
    "AcasEgressPolicyView",
    "AcasErrorBodyView",
    "AcasErrorView",
    "AcasHttpDecisionsView",
    "AcasHttpPolicyView",
    "AcasPageView",
    "AcasSnapshotView",
    "AdmissionPolicyView",
    "ApiStatusView",
    "ConditionView",
    "Conditions",
    "ConfigMapView",
    "ContainerStatusView",
    "DeleteAnswerView",
    "EgressEditRefusalView",
    "EgressStatusView",
    "EventView",
    "HostToolRequestView",
    "KubeconfigContextDetailsView",
    "KubeconfigContextView",
    "ListView",
    "ManagedFieldsEntry",
    "MetaView",
    "NamespaceView",
    "ObjectRefView",
    "ObjectView",
    "OwnerRef",
    "PodStatusView",
    "PodView",
    "PolicyBindingView",
    "SandboxScopeView",
    "SandboxSpecView",
    "SandboxStatusView",
    "SandboxView",
    "SandboxWarmPoolView",
    "ScopeStatusView",
    "SelfSubjectReviewView",
    "ServedRef",
    "ServiceView",
    "StatusCauseView",
    "StatusDetailsView",
    "StatusView",
    "TerminatedStateView",
    "WaitingStateView",
    "WarmPoolStatusView",
    "WatchEvent",
    "on_the_wire",
]
