"""What the acas driver sends and reads about one remote sandbox: its labels, its create body
(with the egress and lifecycle policies it is confined by), and what its state means in the
phases every driver reports. Pure functions: no I/O.
"""

from __future__ import annotations

import re

from sandbox_operator import labels as lbl
from sandbox_operator.acas.bodies import CreateSandboxContent, EgressPolicy, LifecyclePolicy
from sandbox_operator.acas.config import AcasBackendConfig
from sandbox_operator.acas.errors import AcasBadRequest, AcasNotFound, AcasPayloadTooLarge
from sandbox_operator.acas.models import REMOTE_KIND, RemoteSandbox, SandboxState
from sandbox_operator.backends.base import (
    BackendObject,
    EnsureRequest,
    Observation,
    ObservedPhase,
    SandboxRef,
    ServedBy,
)
from sandbox_operator.contract import Egress, SandboxSpec

#: Create failures no retry can cure: the request's content (400, 413) or the group/path (404).
PERMANENT = (AcasBadRequest, AcasNotFound, AcasPayloadTooLarge)

#: Remote states of a sandbox whose compute is stopped and whose state is kept (reference
#: sections 3.6 and 3.8): `Stopped` (any `stoppedReason`: `UserStopped`, `Idle`, `Disabled`),
#: `Idle` (the service's idle auto-suspend) and `Suspended` (outside the enum; the SDK's
#: `begin_stop` ends on it too).
STOPPED_STATES = frozenset({SandboxState.STOPPED, SandboxState.IDLE, SandboxState.SUSPENDED})
#: What `cpu`/`memory` default to when a create must send `resources` (for `disk`) and the spec
#: leaves them out: both are required members of `resources` (section 3.2); these are the
#: service SDK's own defaults (section 3.3).
DEFAULT_CPU = "1000m"
DEFAULT_MEMORY = "2048Mi"

NAMESPACE_LABEL = f"{lbl.GROUP}/namespace"
OWNER_UID_LABEL = f"{lbl.GROUP}/owner-uid"
KIND_LABEL = lbl.KIND_LABEL
#: The Sandbox's own name (the sandbox label holds `object_name(name)`, which differs for dotted
#: or long names). Set when the name is at most 63 characters; older sandboxes lack it.
SANDBOX_NAME_LABEL = f"{lbl.GROUP}/sandbox-name"
_NAME_LABEL_MAX = 63

_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def served_by(remote_id: str) -> ServedBy:
    """The `servedBy` of a Sandbox the remote sandbox `remote_id` serves."""
    return ServedBy(REMOTE_KIND, remote_id)


def label_safe(value: str) -> str:
    """A label value the service's `k=v,k=v` filter can carry (no ',' or '='), <= 63 chars."""
    cleaned = _LABEL_UNSAFE.sub("-", value)[:63].strip("-.")
    return cleaned or "none"


def remote_labels(request: EnsureRequest, backend: str) -> dict[str, str]:
    """The labels a remote sandbox carries: the operator's object labels (hashed key parts,
    sandbox label, backend) plus the Sandbox's namespace, name, uid and kind."""
    out = dict(request.labels)
    out.setdefault(lbl.BACKEND_LABEL, backend)
    out[NAMESPACE_LABEL] = request.sandbox.namespace
    name = request.sandbox.name
    if name and len(name) <= _NAME_LABEL_MAX:
        out[SANDBOX_NAME_LABEL] = name
    if request.sandbox.uid:
        out[OWNER_UID_LABEL] = request.sandbox.uid
    out[KIND_LABEL] = label_safe(request.spec.kind)
    return out


def egress_policy(spec: SandboxSpec) -> EgressPolicy:
    """The inline egress policy for a spec: closed -> Deny everything (HTTP and L3/L4);
    allowlist -> Deny by default, Allow each named host; unrestricted -> Allow."""
    if spec.egress is Egress.UNRESTRICTED:
        return {"http": {"defaultAction": "Allow"}}
    policy: EgressPolicy = {
        "http": {
            "defaultAction": "Deny",
            "hostRules": [{"pattern": host, "action": "Allow"} for host in spec.egress_allow],
        }
    }
    if spec.egress is Egress.CLOSED:
        policy["transportRules"] = {"defaultAction": "Deny", "rules": []}
    return policy


def lifecycle_policy(spec: SandboxSpec, config: AcasBackendConfig) -> LifecyclePolicy:
    """Auto-delete after the Sandbox's ttl plus grace (at most `maxLifetimeSeconds`), counted
    from creation; auto-suspend after the idle timeout (at most `idleSuspendSeconds`)."""
    limits = config.lifetime
    lifetime = limits.max_lifetime_seconds
    ttl = spec.lifetime.ttl_seconds
    if ttl:
        lifetime = min(lifetime, ttl + limits.grace_seconds)
    idle = limits.idle_suspend_seconds
    if spec.lifetime.idle_timeout_seconds:
        idle = min(idle, max(30, spec.lifetime.idle_timeout_seconds))
    return {
        "autoSuspendPolicy": {"enabled": True, "interval": idle, "mode": "Memory"},
        "autoDeletePolicy": {
            "enabled": True,
            "deleteIntervalInSeconds": lifetime,
            "trigger": "AfterCreation",
        },
    }


def create_content(request: EnsureRequest, config: AcasBackendConfig) -> CreateSandboxContent:
    """The `CreateSandboxContent` body for a request."""
    spec = request.spec
    content: CreateSandboxContent = {
        "labels": remote_labels(request, config.name),
        "sourcesRef": {"diskImage": {"name": config.image_for(spec.image), "isPublic": True}},
        "egressPolicy": egress_policy(spec),
        "lifecycle": lifecycle_policy(spec, config),
    }
    limits = spec.resources.limits
    requests = spec.resources.requests
    cpu = limits.cpu or requests.cpu
    memory = limits.memory or requests.memory
    if cpu and memory:
        content["resources"] = {"cpu": str(cpu), "memory": str(memory)}
    if spec.storage is not None:
        # The sandbox's own disk is what stop saves and resume restores (section 3.8): its size
        # is the one storage field the service takes. storageClassName and accessMode have no
        # counterpart (the disk is the service's, used by this sandbox alone).
        content["resources"] = {
            "cpu": str(cpu or DEFAULT_CPU),
            "memory": str(memory or DEFAULT_MEMORY),
            "disk": str(spec.storage.size),
        }
    return content


def classify(remote: RemoteSandbox | None) -> Observation:
    """What a remote sandbox's state says, in the phases every driver reports."""
    if remote is None:
        return Observation(ObservedPhase.ABSENT)
    served = served_by(remote.id)
    state = remote.state or ""
    reason = (remote.state_details.stopped_reason if remote.state_details else None) or ""
    created = remote.created_at

    def obs(phase: ObservedPhase, message: str) -> Observation:
        return Observation(phase, served, state or "Unknown", message, created)

    if state == SandboxState.RUNNING:
        return obs(ObservedPhase.READY, "remote sandbox is running")
    if state in STOPPED_STATES:
        # Stopped by the operator (UserStopped), by the service's idle auto-suspend (Idle) or
        # by a person at the service (Disabled): the compute is off, the state is kept. The
        # detail is the service's reason, so the operator can tell its own suspend from the
        # service's.
        why = reason or state
        return Observation(
            ObservedPhase.SUSPENDED,
            served,
            why,
            f"remote sandbox is {state.lower()} ({why}); its state is kept",
            created,
        )
    if state == SandboxState.STOPPING:
        # On its way to Stopped (a stop saving its state, or the service's idle suspend):
        # already not usable, nothing lost. Suspended, still settling.
        return Observation(
            ObservedPhase.SUSPENDED,
            served,
            SandboxState.STOPPING,
            "remote sandbox is stopping (saving its state)",
            created,
        )
    if state == SandboxState.CREATING:
        return obs(ObservedPhase.STARTING, "remote sandbox is being created")
    if state == SandboxState.DELETING:
        return obs(ObservedPhase.DISPOSING, "remote sandbox is being deleted")
    if state in (SandboxState.FAILED, SandboxState.STOP_FAILED):
        return obs(ObservedPhase.FAILED, f"remote sandbox state {state}")
    return obs(ObservedPhase.STARTING, f"remote sandbox state {state or 'unknown'}")


def observation_for(sandbox: SandboxRef, found: list[RemoteSandbox]) -> Observation:
    """What observe reports for `sandbox` given the remote sandboxes carrying its labels: one
    that another Sandbox (an earlier one of the same name) owns is not this one's."""
    if sandbox.uid:
        mine = [r for r in found if r.labels.get(OWNER_UID_LABEL, sandbox.uid) == sandbox.uid]
        if found and not mine:
            return Observation(
                ObservedPhase.ABSENT,
                None,
                "Foreign",
                "remote sandbox belongs to another Sandbox",
            )
        found = mine
    return classify(found[0] if found else None)


def owned_by(remote: RemoteSandbox, sandbox: SandboxRef) -> bool:
    """Whether `remote` serves this Sandbox (not an earlier one of the same name)."""
    return not sandbox.uid or remote.labels.get(OWNER_UID_LABEL, sandbox.uid) == sandbox.uid


def lost_message(remote_id: str) -> str:
    return (
        f"remote sandbox {remote_id}, which held the suspended sandbox's state, is gone at the "
        "service (deleted, e.g. by its auto-delete lifetime): nothing to resume, nothing was "
        "created in its place"
    )


def sandbox_key(remote: RemoteSandbox) -> tuple[str, str]:
    """(namespace, sandbox label value) of a remote sandbox: which Sandbox it serves."""
    return remote.labels.get(NAMESPACE_LABEL, ""), remote.labels.get(lbl.SANDBOX_LABEL, "")


def ref_key(sandbox: SandboxRef) -> tuple[str, str]:
    return sandbox.namespace, lbl.sandbox_label_value(sandbox.name)


def recorded_id(sandbox: SandboxRef) -> str:
    """The remote id the Sandbox's status recorded (`servedBy`), if it names one of ours."""
    served = sandbox.served_by
    return served.name if served is not None and served.kind == REMOTE_KIND else ""


def backend_object(remote: RemoteSandbox) -> BackendObject:
    labels = remote.labels
    return BackendObject(
        kind=REMOTE_KIND,
        name=remote.id,
        namespace=labels.get(NAMESPACE_LABEL, ""),
        sandbox_name=labels.get(lbl.SANDBOX_LABEL, ""),
        owner_uid=labels.get(OWNER_UID_LABEL, ""),
        deleting=remote.state == SandboxState.DELETING,
        labels=dict(labels),
    )
