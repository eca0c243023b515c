"""What the operator sends the ACA sandboxes service to create a sandbox, as TypedDicts: the
``CreateSandboxContent`` body with its egress policy, lifecycle policy and resources.

Why TypedDicts: the body is JSON the client sends as it is; naming its keys makes a misspelt one
a type error instead of a field the service ignores. Only the keys the operator writes are
declared (the service's reference has many more); the answers are read by ``models`` and
``sandbox_operator.views.acas``, never through these.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict


class HostRule(TypedDict):
    pattern: str
    action: Literal["Allow"]


class HttpEgressPolicy(TypedDict):
    defaultAction: Literal["Allow", "Deny"]
    hostRules: NotRequired[list[HostRule]]


class TransportRule(TypedDict):
    action: Literal["Allow", "Deny"]
    protocol: str
    destination: str
    port: int


class TransportEgressPolicy(TypedDict):
    """L3/L4 egress: the operator sends it only to deny everything (no rule)."""

    defaultAction: Literal["Deny"]
    rules: list[TransportRule]


class EgressPolicy(TypedDict):
    http: HttpEgressPolicy
    transportRules: NotRequired[TransportEgressPolicy]


class AutoSuspendPolicy(TypedDict):
    enabled: bool
    interval: int
    mode: Literal["Memory"]


class AutoDeletePolicy(TypedDict):
    enabled: bool
    deleteIntervalInSeconds: int
    trigger: Literal["AfterCreation"]


class LifecyclePolicy(TypedDict):
    autoSuspendPolicy: AutoSuspendPolicy
    autoDeletePolicy: AutoDeletePolicy


class DiskImageRef(TypedDict):
    name: str
    isPublic: bool


class SourcesRef(TypedDict):
    diskImage: DiskImageRef


class SandboxResources(TypedDict):
    cpu: str
    memory: str
    disk: NotRequired[str]


class CreateSandboxContent(TypedDict):
    labels: dict[str, str]
    sourcesRef: SourcesRef
    egressPolicy: EgressPolicy
    lifecycle: LifecyclePolicy
    resources: NotRequired[SandboxResources]
