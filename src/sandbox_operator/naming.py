"""Deterministic object names derived from a sandbox's identity, its key and its kind.

The client names a Sandbox from its key and its workload kind (two kinds under one key are two
sandboxes, never one whose spec conflicts), and the operator names the objects that serve it from
the Sandbox's name, so two callers racing on one key and kind meet on one object and a restarted
operator finds what it created before. Every name is a DNS-1123 label (lowercase alphanumerics
and '-', starting and ending with an alphanumeric, at most 63 characters), valid for any resource
kind and as a label value.
"""

from __future__ import annotations

import re

from sandbox_operator.keyhash import KeyLike, hash_part

MAX_NAME = 63
_HASH_LEN = 16  # 64 bits: the readable prefix is decoration, the hash carries identity
_SLUG_LEN = 24
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def slug(text: str, max_len: int = _SLUG_LEN) -> str:
    """A readable, DNS-safe fragment of text (may be empty)."""
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s[:max_len].strip("-")


def is_dns1123_label(name: str) -> bool:
    return len(name) <= MAX_NAME and bool(_DNS1123_LABEL.match(name))


def _compose(prefix: str, readable: str, digest: str) -> str:
    parts = [prefix]
    if readable:
        parts.append(readable)
    parts.append(digest)
    name = "-".join(parts)
    assert is_dns1123_label(name), name
    return name


def sandbox_name(key: KeyLike, kind: str) -> str:
    """The name of the Sandbox resource for a key and a workload kind:
    ``sbx-<agentDir slug>[-<callId slug>]-<kind slug>-<hash of the key and the kind>``, at most
    54 characters (room for ``pod_name``'s and ``work_volume_name``'s suffixes)."""
    digest = hash_part("name", key.scope, key.thread_id, key.agent_dir, key.call_id, kind)
    readable = slug(key.agent_dir)
    if key.call_id:
        readable = "-".join(p for p in (readable[:14], slug(key.call_id, 9)) if p)
    readable = "-".join(p for p in (readable, slug(kind, 8)) if p)
    return _compose("sbx", readable, digest[:_HASH_LEN])


def scope_name(scope: str, thread_id: str) -> str:
    """A suggested name for the SandboxScope of a conversation (hosts may choose their own)."""
    digest = hash_part("scope-name", scope, thread_id)[:_HASH_LEN]
    return _compose("sbxs", slug(thread_id), digest)


def object_name(sandbox: str) -> str:
    """The name of the objects that serve a Sandbox, and the value of its sandbox label.

    A Sandbox named by :func:`sandbox_name` (or any name that is a DNS-1123 label) lends its own
    name; a longer or dotted name is shortened deterministically.
    """
    if is_dns1123_label(sandbox):
        return sandbox
    return _compose("sbx", slug(sandbox, 30), hash_part("object", sandbox)[:_HASH_LEN])


#: Every object serving a Sandbox on a runtime-class backend is named with this prefix, so an
#: admission policy can tell sandbox pods by name (RBAC and CEL on pods/exec cannot see labels).
SANDBOX_OBJECT_PREFIX = "sbx-"


def pod_name(sandbox: str) -> str:
    """The pod serving a Sandbox: always ``sbx-...``, deterministic.

    A Sandbox named ``sbx-...`` (every name :func:`sandbox_name` gives) lends its own name; any
    other name becomes ``sbx-<slug>-<hash of the name>`` (at most 51 characters).
    """
    base = object_name(sandbox)
    if base.startswith(SANDBOX_OBJECT_PREFIX):
        return base
    return _compose("sbx", slug(sandbox, 30), hash_part("pod", sandbox)[:_HASH_LEN])


def egress_policy_name(backend: str, egress: str) -> str:
    """The NetworkPolicy, one per namespace, confining every sandbox pod of one runtime-class
    backend and egress mode: ``sandbox-egress-<backend>-<egress>`` (a backend's name is a DNS
    label, so the name is a valid object name)."""
    return f"sandbox-egress-{backend}-{egress}"


def work_volume_name(sandbox: str) -> str:
    """The PersistentVolumeClaim holding a Sandbox's work directory (``spec.storage``): the pod's
    name plus ``-work``, so the same key always names the same claim (and an earlier sandbox's
    claim not yet gone holds the key back)."""
    return f"{pod_name(sandbox)}-work"
