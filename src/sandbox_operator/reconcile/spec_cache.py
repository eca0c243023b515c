"""The validated spec of each Sandbox, kept per (uid, generation).

Its own module because it is a cache with its own bound and eviction, not a step of the pass: a
spec only changes with its generation, and validating it on every pass of thousands of Sandboxes
was the bulk of a pass's CPU.
"""

from __future__ import annotations

from sandbox_operator.contract import SandboxResourceSpec
from sandbox_operator.reconcile import compute
from sandbox_operator.reconcile.runtime import Runtime
from sandbox_operator.views import SandboxView

#: Validated specs kept (least recently used first out): enough for the Sandboxes of a burst,
#: bounded so that memory does not grow with every idle Sandbox held.
SPEC_CACHE_SIZE = 2048


def parsed_spec(rt: Runtime, obj: SandboxView) -> SandboxResourceSpec | str:
    """The validated spec, kept per (uid, generation): a spec only changes with its generation,
    and validating it on every pass of thousands of Sandboxes is the bulk of a pass's CPU."""
    meta = obj.metadata
    k = (meta.namespace, meta.name)
    stamp = (meta.uid, meta.generation)
    cached = rt.spec_cache.get(k)
    if cached is not None and cached[0] == stamp:
        rt.spec_cache.move_to_end(k)
        hit: SandboxResourceSpec | str = cached[1]
        return hit
    parsed = compute.parse_spec(obj)
    rt.spec_cache[k] = (stamp, parsed)
    if len(rt.spec_cache) > SPEC_CACHE_SIZE:
        rt.spec_cache.popitem(last=False)  # the least recently used
    return parsed
