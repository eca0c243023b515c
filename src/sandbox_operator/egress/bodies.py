"""The objects the egress proxy writes to the API server: a Sandbox's ``status.egress`` summary
(merge-patched) and the Events of its decisions.

Why its own module: the summary's keys are the CRD's (the contract's ``EgressSummary`` and
``EgressDecisionRecord``) and an Event's are core/v1's; naming them once as ``TypedDict``s makes
a typo in a key the type checker's error, while ``summaries.py`` and ``events.py`` keep their
rules (the counting window, the fold and the budget). They are plain dicts at run time: the
bytes sent are what the dict literals always built.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict


class EgressRecordBody(TypedDict):
    """One entry of ``status.egress.recent``: a decision without its address or client."""

    time: str
    verdict: str
    reason: str
    method: str
    host: str
    port: int
    seq: int


class EgressSummaryBody(TypedDict):
    """``status.egress``: this process's counts, its window and the recent decisions."""

    allowed: int
    denied: int
    unreachable: int
    since: str
    updated: str
    recent: list[EgressRecordBody]
    admitted: NotRequired[str]
    policyGeneration: NotRequired[int]
    final: NotRequired[bool]


class EgressStatusBody(TypedDict):
    """A Sandbox's ``status`` as the proxy merges it: only ``egress`` (None: nothing to say)."""

    egress: EgressSummaryBody | None


class EgressStatusPatch(TypedDict):
    """The merge patch of a Sandbox's status subresource."""

    status: EgressStatusBody


class EventMetadataBody(TypedDict):
    name: str


class InvolvedObjectBody(TypedDict):
    """The Sandbox an Event is about (by uid too, so a recreated one is not confused with it)."""

    apiVersion: str
    kind: str
    name: str
    namespace: str
    uid: str


class EventSourceBody(TypedDict):
    component: str


class DecisionEventBody(TypedDict):
    """A core/v1 Event of one folded decision (``count`` repeats since ``firstTimestamp``)."""

    apiVersion: str
    kind: str
    metadata: EventMetadataBody
    involvedObject: InvolvedObjectBody
    reason: str
    message: str
    type: str
    count: int
    firstTimestamp: str
    lastTimestamp: str
    source: EventSourceBody
    reportingComponent: str
