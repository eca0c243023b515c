"""Labels and annotations that tie every object the operator creates to its sandbox key.

A sandbox key is (scope, threadId, agentDir, callId); a sandbox's identity is the key and its
workload kind (``spec.kind``): two kinds under one key are two sandboxes, each with its own image
and egress. The key's parts are free-form strings chosen by the
host, so they cannot be label values as they are (63 characters, a restricted alphabet). Each part
is hashed into a label value instead, and the original strings are kept in annotations for people.
Hashing is domain-separated per part, so a scope and a thread id with the same text get different
values, and deterministic, so any replica (or the client) computes the same selector from the key
alone: a whole conversation can be found by a label selector, never by an in-memory registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

# The API group is the contract's; re-exported here because every label is named under it.
from sandbox_operator.contract.resources import GROUP as GROUP
from sandbox_operator.keyhash import KeyLike as KeyLike
from sandbox_operator.keyhash import hash_part as hash_part
from sandbox_operator.naming import object_name

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "sandbox-operator"

SCOPE_LABEL = f"{GROUP}/scope"
THREAD_LABEL = f"{GROUP}/thread"
CONVERSATION_LABEL = f"{GROUP}/conversation"
AGENT_DIR_LABEL = f"{GROUP}/agent-dir"
CALL_LABEL = f"{GROUP}/call"
KEY_LABEL = f"{GROUP}/key"
#: The workload kind (``spec.kind``, a label value as it is): with the key label, the identity of a
#: sandbox. The key label alone selects every kind under a key (a disposal of the whole key).
KIND_LABEL = f"{GROUP}/kind"
SANDBOX_LABEL = f"{GROUP}/sandbox"
BACKEND_LABEL = f"{GROUP}/backend"
#: A sandbox pod's egress mode (``closed``, ``allowlist``, ``unrestricted``), from its creation
#: (or its claim, for a warm pool's pod): the namespace's NetworkPolicy of its backend and egress
#: mode selects it by this label and the backend label. Idle pool pods carry none.
EGRESS_LABEL = f"{GROUP}/egress"
#: On a warm pool's pods: the SandboxWarmPool that made the pod (kept after a claim, so the
#: pool's deny-all NetworkPolicy keeps selecting it and the pool can count its claimed pods).
POOL_LABEL = f"{GROUP}/pool"
#: On a warm pool's pods: the digest of the backend and resolved template the pod was made for;
#: a Sandbox whose admitted spec has the same digest may claim the pod.
POOL_SHAPE_LABEL = f"{GROUP}/pool-shape"

SCOPE_ANNOTATION = f"{GROUP}/scope"
THREAD_ANNOTATION = f"{GROUP}/thread-id"
AGENT_DIR_ANNOTATION = f"{GROUP}/agent-dir"
CALL_ANNOTATION = f"{GROUP}/call-id"
#: On the objects that serve a Sandbox (its pod): the SandboxScope the Sandbox names. The
#: conversation-boundary admission policy reads it to ask whether an agent may use that
#: conversation before it lets the agent exec into the pod (docs/concepts.md).
SCOPE_REF_ANNOTATION = f"{GROUP}/scope-ref"

# The client may stamp this annotation (RFC 3339 UTC) on a Sandbox whenever it uses it; the
# operator measures lifetime.idleTimeoutSeconds from the later of it and the time the sandbox
# became ready.
LAST_ACTIVITY_ANNOTATION = f"{GROUP}/last-activity"

#: A last-activity stamp at most this far ahead of the operator's clock is taken as "now" (the
#: client's clock may run a little ahead); one further ahead is ignored, not believed: it would
#: put off the idle timeout (and a year-9999 stamp overflowed the deadline arithmetic).
LAST_ACTIVITY_MAX_SKEW_SECONDS = 60.0

#: The API server's limit on the total size of an object's annotations (keys plus values).
ANNOTATIONS_LIMIT_BYTES = 256 * 1024

#: On a pod claimed from a warm pool: when the claim landed (RFC 3339 UTC).
CLAIMED_AT_ANNOTATION = f"{GROUP}/claimed-at"
#: On a warm pool's pods: the pool's name (the pool label holds it shortened when it is long), so
#: a claimed pod still says where it came from after its owner became the Sandbox.
POOL_NAME_ANNOTATION = f"{GROUP}/pool-name"


def read_last_activity(value: object, now: datetime) -> datetime | None:
    """The last-activity annotation's time, read defensively: anyone who may annotate a Sandbox
    may write it. Garbage, a time that cannot be compared or computed with, or one more than
    LAST_ACTIVITY_MAX_SKEW_SECONDS ahead of ``now`` -> None (no activity recorded); a little
    ahead -> ``now``. Always timezone-aware UTC."""
    if not isinstance(value, str) or not value or len(value) > 64:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        parsed = parsed.astimezone(UTC)
        if parsed > now + timedelta(seconds=LAST_ACTIVITY_MAX_SKEW_SECONDS):
            return None
    except (ValueError, OverflowError, TypeError):
        return None
    return min(parsed, now)


def annotations_size(annotations: Mapping[str, str] | None) -> int:
    """The size the API server counts against ANNOTATIONS_LIMIT_BYTES (keys plus values)."""
    return sum(len(str(k).encode()) + len(str(v).encode()) for k, v in (annotations or {}).items())


def scope_value(scope: str) -> str:
    return hash_part("scope", scope)


def thread_value(thread_id: str) -> str:
    return hash_part("thread", thread_id)


def conversation_value(scope: str, thread_id: str) -> str:
    return hash_part("conversation", scope, thread_id)


def key_value(key: KeyLike) -> str:
    return hash_part("key", key.scope, key.thread_id, key.agent_dir, key.call_id)


def key_labels(key: KeyLike, kind: str) -> dict[str, str]:
    """The hashed key parts and the kind, as labels. Every value is <= 63 characters and
    label-safe (the contract's kind pattern is a label value's)."""
    return {
        MANAGED_BY_LABEL: MANAGED_BY_VALUE,
        SCOPE_LABEL: scope_value(key.scope),
        THREAD_LABEL: thread_value(key.thread_id),
        CONVERSATION_LABEL: conversation_value(key.scope, key.thread_id),
        AGENT_DIR_LABEL: hash_part("agent-dir", key.agent_dir),
        CALL_LABEL: hash_part("call", key.call_id),
        KEY_LABEL: key_value(key),
        KIND_LABEL: kind,
    }


def key_annotations(key: KeyLike) -> dict[str, str]:
    """The original key strings, for people reading the objects."""
    return {
        SCOPE_ANNOTATION: key.scope,
        THREAD_ANNOTATION: key.thread_id,
        AGENT_DIR_ANNOTATION: key.agent_dir,
        CALL_ANNOTATION: key.call_id,
    }


def object_annotations(key: KeyLike, scope_ref: str) -> dict[str, str]:
    """Annotations for an object that serves one sandbox: the key's strings and the scope's
    name (``SCOPE_REF_ANNOTATION``)."""
    return {**key_annotations(key), SCOPE_REF_ANNOTATION: scope_ref}


def sandbox_label_value(sandbox_name: str) -> str:
    """The sandbox label's value for a Sandbox name (the name itself if a DNS-1123 label)."""
    return object_name(sandbox_name)


def object_labels(
    key: KeyLike, sandbox_name: str, backend: str | None = None, *, kind: str
) -> dict[str, str]:
    """Labels for an object that serves one sandbox (pod, NetworkPolicy, remote session)."""
    labels = key_labels(key, kind)
    labels[SANDBOX_LABEL] = sandbox_label_value(sandbox_name)
    if backend is not None:
        labels[BACKEND_LABEL] = backend
    return labels


def egress_policy_labels(backend: str, egress: str) -> dict[str, str]:
    """The labels by which a namespace's NetworkPolicy of one backend and egress mode selects its
    sandbox pods (and which it carries itself)."""
    return {
        MANAGED_BY_LABEL: MANAGED_BY_VALUE,
        BACKEND_LABEL: backend,
        EGRESS_LABEL: egress,
    }


def format_selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def scope_selector(scope: str, thread_id: str) -> str:
    """A label selector for everything of one conversation (scope + thread)."""
    return format_selector(
        {
            MANAGED_BY_LABEL: MANAGED_BY_VALUE,
            CONVERSATION_LABEL: conversation_value(scope, thread_id),
        }
    )


def key_selector(key: KeyLike) -> str:
    """A label selector for everything of one sandbox key, whatever its kinds."""
    return format_selector({MANAGED_BY_LABEL: MANAGED_BY_VALUE, KEY_LABEL: key_value(key)})


def identity_selector(key: KeyLike, kind: str) -> str:
    """A label selector for everything of one sandbox: its key and its kind."""
    return format_selector(
        {MANAGED_BY_LABEL: MANAGED_BY_VALUE, KEY_LABEL: key_value(key), KIND_LABEL: kind}
    )


def sandbox_selector(sandbox_name: str) -> str:
    """A label selector for every object that serves the named Sandbox."""
    return format_selector(
        {MANAGED_BY_LABEL: MANAGED_BY_VALUE, SANDBOX_LABEL: sandbox_label_value(sandbox_name)}
    )


def managed_selector() -> str:
    return format_selector({MANAGED_BY_LABEL: MANAGED_BY_VALUE})
