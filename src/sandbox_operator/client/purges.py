"""What a conversation's disposal did, read off the objects the operator leaves (pure).

A scope purge is recorded by the operator in the SandboxScope's ``status.lastPurge`` just before it
lets the scope go, so the scope's last state (the object a watch's DELETED event carries) says how
many Sandboxes were disposed and which were not, with their ``DisposalCode``. A Sandbox whose
disposal did not land says why in its ``Disposed`` condition."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from sandbox_operator import kubeobj
from sandbox_operator.contract import DisposalCode, DisposalFailure, ScopePurge

#: The operator's DisposalFailed message (reconcile/disposal.py): "disposal failed (<code>) on
#: backend <backend>: <detail>".
_FAILED = re.compile(r"^disposal failed \((?P<code>[a-z_]+)\) on backend (?P<backend>\S*): ")


def purge_of_scope(scope: Mapping[str, Any] | None) -> ScopePurge | None:
    """The purge a SandboxScope's last state records; None when it records none (the scope was
    never purged by an operator, or its state is unreadable)."""
    raw = ((scope or {}).get("status") or {}).get("lastPurge")
    if not isinstance(raw, Mapping):
        return None
    try:
        return ScopePurge.model_validate(raw)
    except ValidationError:
        return None


def undisposed(sandbox: Mapping[str, Any], waited: float) -> DisposalFailure:
    """Why a Sandbox is still there after a disposal was asked for and ``waited`` seconds
    passed: its ``Disposed`` condition's code when it failed, else ``timeout``."""
    status = sandbox.get("status") or {}
    backend = str(status.get("backend") or "")[:63]
    for cond in status.get("conditions") or []:
        if cond.get("type") != "Disposed" or cond.get("reason") != "DisposalFailed":
            continue
        message = str(cond.get("message") or "")
        found = _FAILED.match(message)
        if found and found["code"] in DisposalCode._value2member_map_:
            return DisposalFailure(
                code=DisposalCode(found["code"]),
                detail=message[found.end() :][:1024],
                backend=found["backend"][:63] or backend,
            )
    name = kubeobj.meta(sandbox).get("name", "")
    return DisposalFailure(
        code=DisposalCode.TIMEOUT,
        detail=f"Sandbox {name} still present {waited:g}s after its deletion was asked for",
        backend=backend,
    )
