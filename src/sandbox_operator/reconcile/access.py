"""A conversation's access for the agents bound to it: one Role and one RoleBinding per scope.

A SandboxScope that lists ``spec.agentServiceAccounts`` binds those ServiceAccounts to its
conversation. What the cluster enforces for them (docs/concepts.md, "The conversation boundary"):

* **Reads** are RBAC's: the Role made here grants ``get``/``list``/``watch`` on this
  SandboxScope and on its Sandboxes, *by name* (RBAC's resourceNames; a list or watch of one
  object by ``metadata.name`` is authorized with that name). No admission controller sees reads,
  and RBAC has no label selectors, so the names are the only way: the Role is rewritten when a
  Sandbox that it does not name yet appears in the scope.
* **Writes and exec** are the admission policies' (the chart's ``conversationBoundary``): creating,
  changing or deleting a Sandbox, and exec or attach into a sandbox pod, need the verb ``use`` on
  the SandboxScope the object names (the Sandbox's ``spec.scopeRef``, the pod's
  ``sandbox-operator.dev/scope-ref`` annotation). The Role made here grants ``use`` on this scope
  alone. ``use`` is no built-in verb: it means nothing to the API server but what the policies
  ask of it.
* **Ports** are the router's (docs/ports.md): it asks a SubjectAccessReview for ``connect`` on
  ``sandboxes/ports`` of the Sandbox a request names. The Role made here grants it on this
  scope's Sandboxes, by name, as the reads.

The Role and the RoleBinding are owned by the SandboxScope (garbage-collected with it) and written
with server-side apply only when what they should say differs from what this process last wrote:
a Sandbox that left the scope keeps its name in the Role until the next write (a Sandbox name is
a digest of its key, which includes the conversation, so a name never passes to another
conversation), so a cleanup costs no write. The names are bounded by the scope's Sandboxes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from sandbox_operator import kubeobj
from sandbox_operator.backends.manifests import OwnerReference, PolicyRule, Role, RoleBinding
from sandbox_operator.contract import API_VERSION, GROUP, SANDBOX_PLURAL, SANDBOX_SCOPE_PLURAL
from sandbox_operator.views import SandboxScopeView

#: The router's question on a Sandbox (sandbox_operator.router.reviews asks it; the router's
#: package sits beside the operator's, so the words are repeated, and a unit test holds them
#: equal).
PORTS_RESOURCE: Final = f"{SANDBOX_PLURAL}/ports"
PORTS_VERB: Final = "connect"

#: The verb the conversation-boundary policies ask for on ``sandboxscopes/<scopeRef>``.
USE_VERB: Final = "use"
#: The prefix of the Role and RoleBinding of one scope: ``sandbox-conversation-<scope>``.
ACCESS_NAME_PREFIX: Final = "sandbox-conversation-"
_NAME_MAX: Final = 253
FIELD_MANAGER: Final = "sandbox-operator-access"


def access_name(scope: str) -> str:
    """The name of a scope's Role and RoleBinding (a scope name is a DNS subdomain of up to 253
    characters; a longer result is cut and told apart by a digest)."""
    name = ACCESS_NAME_PREFIX + scope
    if len(name) <= _NAME_MAX:
        return name
    digest = hashlib.sha256(scope.encode()).hexdigest()[:10]
    return f"{name[: _NAME_MAX - 11].rstrip('.-')}-{digest}"


@dataclass(frozen=True, slots=True)
class ConversationAccess:
    """What one scope's Role and RoleBinding say: the bound ServiceAccounts, the Sandbox names."""

    agents: tuple[str, ...]
    sandboxes: frozenset[str]

    def covers(self, wanted: ConversationAccess) -> bool:
        """Whether this (written) access already grants everything ``wanted`` asks for."""
        return self.agents == wanted.agents and wanted.sandboxes <= self.sandboxes


def wanted_access(agents: Iterable[str], sandboxes: Iterable[str]) -> ConversationAccess:
    return ConversationAccess(tuple(sorted(set(agents))), frozenset(sandboxes))


def _owner(scope: SandboxScopeView) -> OwnerReference:
    meta = scope.metadata
    return {
        "apiVersion": API_VERSION,
        "kind": "SandboxScope",
        "name": meta.name,
        "uid": meta.uid,
    }


def role_manifest(scope: SandboxScopeView, access: ConversationAccess) -> Role:
    """The scope's Role: get and use on the scope, reads of its Sandboxes and connect on their
    ports, by name."""
    meta = scope.metadata
    name = meta.name
    rules: list[PolicyRule] = [
        {
            "apiGroups": [GROUP],
            "resources": [SANDBOX_SCOPE_PLURAL],
            "resourceNames": [name],
            "verbs": ["get", "list", "watch", USE_VERB],
        }
    ]
    if access.sandboxes:
        rules.append(
            {
                "apiGroups": [GROUP],
                "resources": [SANDBOX_PLURAL],
                "resourceNames": sorted(access.sandboxes),
                "verbs": ["get", "list", "watch"],
            }
        )
        rules.append(
            {
                "apiGroups": [GROUP],
                "resources": [PORTS_RESOURCE],
                "resourceNames": sorted(access.sandboxes),
                "verbs": [PORTS_VERB],
            }
        )
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kubeobj.ROLE_KIND,
        "metadata": {
            "name": access_name(name),
            "namespace": meta.namespace,
            "ownerReferences": [_owner(scope)],
        },
        "rules": rules,
    }


def binding_manifest(scope: SandboxScopeView, access: ConversationAccess) -> RoleBinding:
    """The scope's RoleBinding: its Role, to the ServiceAccounts the scope lists."""
    meta = scope.metadata
    name = access_name(meta.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kubeobj.ROLE_BINDING_KIND,
        "metadata": {
            "name": name,
            "namespace": meta.namespace,
            "ownerReferences": [_owner(scope)],
        },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": kubeobj.ROLE_KIND,
            "name": name,
        },
        "subjects": [
            {"kind": kubeobj.SERVICE_ACCOUNT_KIND, "name": agent, "namespace": meta.namespace}
            for agent in access.agents
        ],
    }
