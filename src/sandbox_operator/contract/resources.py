"""Models of the two custom resources, Sandbox and SandboxScope. The CRDs are generated from these
(see ``sandbox_operator.crdgen``), so the API server and the operator validate the same shape."""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import Field, field_validator, model_validator

from .base import (
    EGRESS_ALLOW_MAX_ITEMS,
    KEY_MAX_LENGTH,
    NO_CONTROL_PATTERN,
    NON_EMPTY_NO_CONTROL_PATTERN,
    CapabilitySet,
    ContractModel,
    IsolationValue,
)
from .conditions import ConditionStatus
from .egresshosts import EgressHost
from .egresspolicy import EgressEditRefusal, EgressPolicyStatus
from .egressrules import EGRESS_RULES_MAX_ITEMS, EgressRule
from .enums import Egress, IsolationScope, OsFamily
from .hostpolicy import ScopePurge
from .key import SandboxKey, check_key_part
from .models import SandboxSpec
from .ports import PORTS_MAX_ITEMS, PortStatus
from .quantities import ResourceRequirements

GROUP: Final = "sandbox-operator.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
SANDBOX_KIND: Final = "Sandbox"
SANDBOX_PLURAL: Final = "sandboxes"
SANDBOX_SHORT_NAME: Final = "sbx"
SANDBOX_SCOPE_KIND: Final = "SandboxScope"
SANDBOX_SCOPE_PLURAL: Final = "sandboxscopes"
SANDBOX_SCOPE_SHORT_NAME: Final = "sbxs"
SANDBOX_WARM_POOL_KIND: Final = "SandboxWarmPool"
SANDBOX_WARM_POOL_PLURAL: Final = "sandboxwarmpools"
SANDBOX_WARM_POOL_SHORT_NAME: Final = "sbxwp"
#: ``status.servedFrom`` of a Sandbox whose pod was created for it (no warm pool served it).
SERVED_FROM_COLD: Final = "cold"
#: Most idle pods one SandboxWarmPool may keep.
WARM_POOL_MAX_REPLICAS: Final = 1000
#: Most resets one Sandbox may be asked for (``spec.resets``: a counter, never decreased).
RESETS_MAX: Final = 1_000_000_000
#: Sandbox spec fields set by an edit (a merge patch of their own), never by the acquirer's apply:
#: suspend / resume, and reset.
SPEC_EDIT_FIELDS: Final = ("suspended", "resets")
#: Most conditions a status holds.
CONDITIONS_MAX_ITEMS: Final = 16

#: Most decisions ``status.egress.recent`` holds.
EGRESS_RECENT_MAX_ITEMS: Final = 10

#: Most ServiceAccounts one SandboxScope binds to its conversation.
AGENT_SERVICE_ACCOUNTS_MAX_ITEMS: Final = 16
DNS_SUBDOMAIN_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class Condition(ContractModel):
    """A status condition in the shape of metav1.Condition."""

    type: str = Field(
        max_length=316,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
        description="Condition type: Admitted, Ready or Disposed.",
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="metadata.generation the condition was set from.",
    )
    last_transition_time: datetime = Field(
        description="When the condition last changed status.",
    )
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        description="Machine-readable CamelCase reason (see ConditionReason).",
    )
    message: str = Field(
        default="",
        max_length=32768,
        description="Human-readable detail; never carries secrets or endpoints.",
    )


class ServedBy(ContractModel):
    """The Kubernetes object or remote resource that serves a sandbox (never an endpoint).

    One type on both sides: a driver returns it, the reconciler writes it into
    ``status.servedBy``, the client reads it back. Drivers build it positionally
    (``ServedBy("Pod", name, namespace)``); an empty namespace (a remote resource) is none, so
    it is left out of the wire form.
    """

    kind: str = Field(max_length=63, description="Kind of the serving object, e.g. Pod.")
    name: str = Field(max_length=KEY_MAX_LENGTH, description="Name or id of the serving object.")
    namespace: str | None = Field(
        default=None,
        max_length=63,
        description="Namespace of the serving object, when it is a namespaced Kubernetes object.",
    )

    def __init__(self, kind: str, name: str, namespace: str | None = None, **data: Any) -> None:
        data.update(kind=kind, name=name, namespace=namespace or None)
        super().__init__(**data)


class EgressDecisionRecord(ContractModel):
    """One decision of the egress proxy about this sandbox, as far as status may show it.

    Deliberately without the request path, query, headers, credentials and the address the proxy
    resolved or connected to: anyone who can read the Sandbox can read this.
    """

    time: datetime = Field(description="When the proxy decided.")
    verdict: Literal["ALLOW", "DENY", "UNREACHABLE"] = Field(
        description="ALLOW, DENY or UNREACHABLE."
    )
    reason: str = Field(
        max_length=63,
        pattern=r"^[A-Za-z][A-Za-z0-9]*$",
        description="Machine-readable reason, e.g. Allowed, HostNotAllowed, ConnectFailed.",
    )
    method: str = Field(
        default="",
        max_length=16,
        description="Request method (CONNECT, GET, ...); empty when none was read.",
    )
    host: str = Field(
        default="",
        max_length=255,
        description="Host the sandbox asked for; empty when the request named none.",
    )
    port: int = Field(default=0, ge=0, le=65535, description="Port the sandbox asked for.")
    seq: int | None = Field(
        default=None,
        ge=1,
        description=(
            "The decision's number among this sandbox's decisions since `since`, from 1: the "
            "running total (allowed + denied + unreachable) at that decision. A reader that last "
            "saw number n and now sees m > n + 1 first knows m - n - 1 decisions were never "
            "shown. Absent from records written by proxies older than this field."
        ),
    )


class EgressSummary(ContractModel):
    """What the namespace's egress proxy decided for this sandbox, written by the proxy."""

    allowed: int = Field(default=0, ge=0, description="Connections allowed since `since`.")
    denied: int = Field(default=0, ge=0, description="Connections refused since `since`.")
    unreachable: int = Field(
        default=0,
        ge=0,
        description="Allowed hosts that could not be resolved or connected to since `since`.",
    )
    since: datetime = Field(description="When the proxy started counting for this sandbox.")
    updated: datetime = Field(description="When the proxy last wrote this summary.")
    recent: tuple[EgressDecisionRecord, ...] = Field(
        default=(),
        max_length=EGRESS_RECENT_MAX_ITEMS,
        description="The newest decisions, oldest first (at most 10).",
    )
    admitted: datetime | None = Field(
        default=None,
        description=(
            "When the running proxy admitted this sandbox to its table (its pod IP and "
            "allowlist); from then on it is served. The operator reports the sandbox Ready only "
            "once this is set."
        ),
    )
    final: bool = Field(
        default=False,
        description=(
            "Set by the proxy once the Sandbox is being deleted: it no longer serves the sandbox "
            "(later connections are not attributed to it), and this is its last write, so the "
            "totals and `recent` hold every decision it made for the sandbox since `since`."
        ),
    )
    policy_generation: int | None = Field(
        default=None,
        ge=0,
        description=(
            "status.egressPolicy.generation of the allowlist the proxy enforces since `admitted` "
            "(an egress edit is in force once this reaches its generation)."
        ),
    )


class SandboxResourceSpec(SandboxSpec):
    """spec of a Sandbox: the key parts it owns plus the workload's SandboxSpec."""

    scope_ref: str = Field(
        min_length=1,
        max_length=KEY_MAX_LENGTH,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description=(
            "Name of the SandboxScope in this namespace that supplies scope, threadId and the "
            "conversation's floors. Immutable."
        ),
    )
    agent_dir: str = Field(
        min_length=1,
        max_length=KEY_MAX_LENGTH,
        pattern=NON_EMPTY_NO_CONTROL_PATTERN,
        description="Agent the sandbox belongs to (part of the sandbox key). Immutable.",
    )
    call_id: str = Field(
        default="",
        max_length=KEY_MAX_LENGTH,
        pattern=NO_CONTROL_PATTERN,
        description="Call the sandbox serves; required iff isolationScope is call. Immutable.",
    )
    suspended: bool = Field(
        default=False,
        description=(
            "true: stop the sandbox's compute and keep its work volume, NetworkPolicy and "
            "identity (needs storage); false again, or the client's next use, resumes it. "
            "One of the spec fields (with lifetime, resets, egressAllow and egressRules) that may "
            "change after creation."
        ),
    )
    resets: int = Field(
        default=0,
        ge=0,
        le=RESETS_MAX,
        description=(
            "Raise by one to reset the sandbox: its pod is replaced by a never-used one (a warm "
            "pool's when one matches, else a new one) with an empty work directory, and every "
            "process and file of the previous one goes; key, name and conversation stay. May "
            "only increase; not with storage (docs/reset.md). status.resets says which request "
            "the serving pod answers."
        ),
    )

    # Before the pattern (which the CRD carries), so a person gets the specific reason.
    @field_validator("agent_dir", mode="before")
    @classmethod
    def _agent_dir_clean(cls, value: object) -> object:
        return check_key_part(value, "agentDir") if isinstance(value, str) else value

    @field_validator("call_id", mode="before")
    @classmethod
    def _call_id_clean(cls, value: object) -> object:
        if isinstance(value, str):
            return check_key_part(value, "callId", allow_empty=True)
        return value

    @model_validator(mode="after")
    def _call_id_iff_call_scope(self) -> SandboxResourceSpec:
        per_call = self.isolation_scope is IsolationScope.CALL
        if per_call and not self.call_id:
            raise ValueError("callId is required when isolationScope is call")
        if not per_call and self.call_id:
            raise ValueError(
                f"callId must be empty unless isolationScope is call "
                f"(isolationScope is {self.isolation_scope.value})"
            )
        if self.resets and self.storage is not None:
            raise ValueError(
                "resets needs a sandbox without storage: a reset gives the sandbox an empty work "
                "directory, and a persistent work volume is kept, never emptied"
            )
        if self.suspended and self.storage is None:
            raise ValueError(
                "suspended needs storage: without a work volume, suspending would lose the "
                "sandbox's files (delete the Sandbox instead)"
            )
        return self

    def sandbox_spec(self) -> SandboxSpec:
        """The workload's SandboxSpec, without the key parts."""
        return SandboxSpec.model_validate(
            {
                name: getattr(self, name)
                for name in SandboxSpec.model_fields
                if name in self.model_fields_set
            }
        )

    def key(self, scope: str, thread_id: str) -> SandboxKey:
        """The sandbox key, given the scope and thread of the referenced SandboxScope."""
        return SandboxKey(
            scope=scope, thread_id=thread_id, agent_dir=self.agent_dir, call_id=self.call_id
        )


class SandboxResourceStatus(ContractModel):
    """status of a Sandbox, written by the operator (``egress``: by the egress proxy)."""

    conditions: tuple[Condition, ...] = Field(
        default=(),
        max_length=CONDITIONS_MAX_ITEMS,
        description="Admitted, Ready and Disposed conditions.",
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the status was computed from."
    )
    backend: str | None = Field(
        default=None, max_length=63, description="Backend that serves the sandbox."
    )
    isolation: IsolationValue | None = Field(
        default=None, description="Isolation the serving backend declares."
    )
    effective_floor: IsolationValue | None = Field(
        default=None,
        description="Strictest of the host's, the scope's and the spec's isolation floors.",
    )
    isolation_scope: IsolationScope | None = Field(
        default=None, description="Effective isolation scope (strictest of host, scope and spec)."
    )
    served_by: ServedBy | None = Field(
        default=None, description="The Kubernetes object or remote resource serving it."
    )
    served_from: str | None = Field(
        default=None,
        max_length=KEY_MAX_LENGTH + 16,
        description=(
            "Where the serving pod came from: 'cold' (created for this sandbox) or "
            "'SandboxWarmPool/<name>' (a pre-started, never-used pod of that pool, claimed at "
            "admission)."
        ),
    )
    sealed_until_claim: bool | None = Field(
        default=None,
        description=(
            "Served from a warm pool: whether its pod was sealed from its creation to the claim "
            "(the idle-pool-pod policies the operator checks, --pool-seal, in force all along), "
            "so no identity but the operator's could reach it first. Judged at the claim."
        ),
    )
    admitted_egress_allow: tuple[EgressHost, ...] | None = Field(
        default=None,
        max_length=EGRESS_ALLOW_MAX_ITEMS,
        description=(
            "The egressAllow hosts judged at admission, or at the last egress edit accepted "
            "(allowlist sandboxes only): what the egress proxy enforces (status.egressPolicy)."
        ),
    )
    admitted_egress_rules: tuple[EgressRule, ...] | None = Field(
        default=None,
        max_length=EGRESS_RULES_MAX_ITEMS,
        description=(
            "The egressRules judged at admission, or at the last egress edit accepted "
            "(allowlist sandboxes that have rules only): what the egress proxy enforces."
        ),
    )
    egress_policy: EgressPolicyStatus | None = Field(
        default=None, description="Which generation's egress is admitted, and when."
    )
    egress_edit_refused: EgressEditRefusal | None = Field(
        default=None, description="Why the latest egress edit was refused; unset otherwise."
    )
    egress: EgressSummary | None = Field(
        default=None,
        description=(
            "Summary of the egress proxy's decisions for an allowlist sandbox; written by the "
            "proxy, never by the operator."
        ),
    )
    suspended_by: Literal["spec", "idle"] | None = Field(
        default=None,
        description=(
            "Why the sandbox is suspended now: spec (spec.suspended) or idle (lifetime.idleAction "
            "suspend); unset while it is not suspended."
        ),
    )
    suspended_at: datetime | None = Field(
        default=None, description="When the sandbox was last suspended."
    )
    resumed_at: datetime | None = Field(
        default=None, description="When the sandbox was last resumed."
    )
    suspend_count: int = Field(default=0, ge=0, description="Times the sandbox was suspended.")
    resume_count: int = Field(default=0, ge=0, description="Times the sandbox was resumed.")
    resets: int = Field(
        default=0,
        ge=0,
        description=(
            "The spec.resets the serving pod answers: raised once the previous pod was deleted "
            "and a never-used one put in its place (its Ready condition says how it is doing)."
        ),
    )
    reset_at: datetime | None = Field(default=None, description="When the sandbox was last reset.")
    ports: tuple[PortStatus, ...] | None = Field(
        default=None,
        max_length=PORTS_MAX_ITEMS,
        description=(
            "spec.ports with each http port's URL through the router (docs/ports.md); unset "
            "when the spec declares none."
        ),
    )
    reset_refused: str | None = Field(
        default=None,
        max_length=1024,
        description=(
            "Why the spec.resets above status.resets is not served (its backend cannot replace "
            "the sandbox's compute); unset otherwise."
        ),
    )


class SandboxScopeResourceSpec(ContractModel):
    """spec of a SandboxScope: one conversation, and the floors it sets for its sandboxes."""

    scope: str = Field(
        min_length=1,
        max_length=KEY_MAX_LENGTH,
        pattern=NON_EMPTY_NO_CONTROL_PATTERN,
        description="Tenant or scope of the conversation (part of the sandbox key). Immutable.",
    )
    thread_id: str = Field(
        min_length=1,
        max_length=KEY_MAX_LENGTH,
        pattern=NON_EMPTY_NO_CONTROL_PATTERN,
        description="Conversation thread (part of the sandbox key). Immutable.",
    )
    min_isolation: IsolationValue | None = Field(
        default=None,
        description="Isolation floor for this conversation; raises the host's, never lowers it.",
    )
    min_isolation_scope: IsolationScope | None = Field(
        default=None,
        description="Least separation for this conversation; raises the host's, never lowers it.",
    )
    agent_service_accounts: tuple[
        Annotated[
            str,
            Field(
                min_length=1,
                max_length=253,
                pattern=DNS_SUBDOMAIN_PATTERN,
                description="The name of a ServiceAccount in this namespace.",
            ),
        ],
        ...,
    ] = Field(
        default=(),
        max_length=AGENT_SERVICE_ACCOUNTS_MAX_ITEMS,
        description=(
            "ServiceAccounts of this namespace bound to this conversation: the operator grants "
            "them a Role to read this SandboxScope and its Sandboxes (by name) and to use the "
            "conversation, which the chart's conversation-boundary admission policies require "
            "to create, change, delete or exec into its sandboxes (docs/concepts.md)."
        ),
    )

    # Before the pattern (which the CRD carries), so a person gets the specific reason.
    @field_validator("scope", "thread_id", mode="before")
    @classmethod
    def _clean(cls, value: object, info: Any) -> object:
        if not isinstance(value, str):
            return value
        return check_key_part(value, "scope" if info.field_name == "scope" else "threadId")


class SandboxScopeResourceStatus(ContractModel):
    """status of a SandboxScope, written by the operator."""

    conditions: tuple[Condition, ...] = Field(
        default=(),
        max_length=CONDITIONS_MAX_ITEMS,
        description="Ready and Disposed conditions of the scope.",
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the status was computed from."
    )
    sandbox_count: int = Field(default=0, ge=0, description="Sandboxes that reference the scope.")
    last_purge: ScopePurge | None = Field(
        default=None, description="Outcome of the last purge: disposed count and what was left."
    )
    last_purge_time: datetime | None = Field(
        default=None, description="When the last purge finished."
    )


# ---- SandboxWarmPool --------------------------------------------------------------------------

#: The fields of a Sandbox spec that decide its admission and shape its pod: what a warm pool's
#: template holds. Everything else of a Sandbox (lifetime, transfer limits, declared outputs, the
#: key) is the claiming Sandbox's own and does not touch the pod.
WARM_POOL_TEMPLATE_FIELDS: Final = (
    "kind",
    "image",
    "work_dir",
    "requires",
    "min_isolation",
    "requires_os_family",
    "egress",
    "egress_allow",
    "resources",
)


def _template_field(name: str) -> Any:
    """The Sandbox spec's own field definition (type, constraints, description), reused."""
    return copy.deepcopy(SandboxSpec.model_fields[name])


class WarmPoolTemplate(ContractModel):
    """What the pool's pods are made for: the admission- and pod-shaping fields of a Sandbox spec,
    with the same meaning, constraints and defaults."""

    kind: str = _template_field("kind")
    image: str = _template_field("image")
    work_dir: str = _template_field("work_dir")
    requires: CapabilitySet = _template_field("requires")
    min_isolation: IsolationValue | None = _template_field("min_isolation")
    requires_os_family: OsFamily | None = _template_field("requires_os_family")
    egress: Egress = _template_field("egress")
    egress_allow: tuple[EgressHost, ...] = _template_field("egress_allow")
    resources: ResourceRequirements = _template_field("resources")

    def sandbox_spec(self) -> SandboxSpec:
        """The Sandbox spec this template stands for (everything else at its default), validated
        exactly as a Sandbox's spec is."""
        data = {name: getattr(self, name) for name in self.model_fields_set}
        return SandboxSpec(**data)


class SandboxWarmPoolResourceSpec(ContractModel):
    """spec of a SandboxWarmPool: the template its pods are made for and how many to keep."""

    template: WarmPoolTemplate = Field(
        description=(
            "The Sandbox spec fields the pool's pods are made for. A Sandbox is served from the "
            "pool when it is admitted onto the pool's backend and these fields of its spec, with "
            "the host's resource defaults filled in, equal the template's."
        ),
    )
    replicas: int = Field(
        default=0,
        ge=0,
        le=WARM_POOL_MAX_REPLICAS,
        description=(
            "Idle, never-used pods to keep started (the scale subresource: kubectl scale and a "
            "HorizontalPodAutoscaler set it)."
        ),
    )
    max_creating: int = Field(
        default=5,
        ge=1,
        le=100,
        description="Most pod creations in flight at once while the pool fills or refills.",
    )


class SandboxWarmPoolResourceStatus(ContractModel):
    """status of a SandboxWarmPool, written by the operator."""

    conditions: tuple[Condition, ...] = Field(
        default=(),
        max_length=CONDITIONS_MAX_ITEMS,
        description="Ready: every wanted idle pod is started (or why the pool serves nothing).",
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the status was computed from."
    )
    backend: str | None = Field(
        default=None,
        max_length=63,
        description="Backend the policy chose for the template (none when it is refused).",
    )
    replicas: int = Field(default=0, ge=0, description="Idle pods of the pool (started or not).")
    ready_replicas: int = Field(default=0, ge=0, description="Idle pods that are Ready to claim.")
    claimed: int = Field(
        default=0, ge=0, description="Pods claimed from the pool whose Sandboxes still hold them."
    )
    selector: str | None = Field(
        default=None,
        max_length=1024,
        description="Label selector of the pool's idle pods (the scale subresource's selector).",
    )
    shape: str | None = Field(
        default=None,
        max_length=64,
        description=(
            "Digest of the backend and the template as resolved under the host policy; a pod of "
            "the pool serves a Sandbox whose resolved spec has the same digest."
        ),
    )
