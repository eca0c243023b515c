"""What every layer reads the same way off a Kubernetes object as the API sends it: its
``metadata`` and the built-in kinds it names.

A watch event, a list item and a client read all hand over the wire dict, where ``metadata`` may
be absent or null. Six modules each defined their own ``_meta`` for that, and the literal kind
names (``"Pod"`` nineteen times) were spelled out wherever an object was built, classified or
compared. Both live here once. This module imports only the standard library, so the contract,
the backends, the reconciler, the client and the egress proxy can all use it without an import
reaching upwards (``tests/unit/test_kubeobj.py`` holds that no other module defines a ``meta``
helper or spells the kind literals).

The kinds of this package's own resources (``Sandbox``, ``SandboxScope``, ``SandboxWarmPool``)
are the contract's: ``sandbox_operator.contract.resources``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

__all__ = [
    "NETWORK_POLICY_KIND",
    "PERSISTENT_VOLUME_CLAIM_KIND",
    "POD_KIND",
    "ROLE_BINDING_KIND",
    "ROLE_KIND",
    "SERVICE_ACCOUNT_KIND",
    "meta",
]

POD_KIND: Final = "Pod"
NETWORK_POLICY_KIND: Final = "NetworkPolicy"
PERSISTENT_VOLUME_CLAIM_KIND: Final = "PersistentVolumeClaim"
SERVICE_ACCOUNT_KIND: Final = "ServiceAccount"
ROLE_KIND: Final = "Role"
ROLE_BINDING_KIND: Final = "RoleBinding"

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The object's ``metadata``; an empty mapping when the object, or its metadata, is absent
    or null (a deleted object's last state, a partial patch answer, a test's bare dict).

    Read-only: the answer is the object's own dict (no copy), or a shared empty one."""
    if obj is None:
        return _EMPTY
    found: Mapping[str, Any] | None = obj.get("metadata")
    return found if found is not None else _EMPTY
