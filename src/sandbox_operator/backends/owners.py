"""Owner references to a Sandbox, for the Kubernetes objects the backends create.

Ownership is how the garbage collector cleans up after the operator when the operator itself
cannot (a Sandbox force-deleted, a replica gone): one definition, so the pod of a sandbox and the
egress proxy of its namespace can never disagree on what "owned by this Sandbox" means.
"""

from __future__ import annotations

from sandbox_operator.backends.base import PoolRef, SandboxRef
from sandbox_operator.backends.manifests import OwnerReference
from sandbox_operator.contract import API_VERSION, SANDBOX_KIND, SANDBOX_WARM_POOL_KIND


def owner_reference(sandbox: SandboxRef | PoolRef, *, controller: bool = True) -> OwnerReference:
    """``sandbox`` (or a SandboxWarmPool) as an owner.

    ``controller=True`` (a sandbox's own pod and NetworkPolicy): the Sandbox controls the object
    and its deletion waits for the object (foreground deletion). ``controller=False`` (the
    namespace's egress proxy objects, shared by every allowlist Sandbox there): one owner among
    several, which neither controls nor blocks; the object goes when its last owner is gone.

    A pool controls its idle pods without blocking its own deletion: deleting a pool never waits
    for its pods (the garbage collector deletes them after it).
    """
    pool = isinstance(sandbox, PoolRef)
    return {
        "apiVersion": API_VERSION,
        "kind": SANDBOX_WARM_POOL_KIND if pool else SANDBOX_KIND,
        "name": sandbox.name,
        "uid": sandbox.uid,
        "controller": controller,
        "blockOwnerDeletion": controller and not pool,
    }
