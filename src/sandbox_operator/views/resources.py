"""Views of the operator's own kinds: Sandbox, SandboxScope, SandboxWarmPool.

Why its own module: these are the objects the reconciler, the client and the maf backend read
most. A spec is validated into its contract model where it is judged (the wire boundary); the
view names the few spec fields read without that, and the status fields the operator writes
under the status models' own names (``tests/unit/test_views.py`` holds each status field to a
field of its kind's status model).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandbox_operator.views.conditions import Conditions
from sandbox_operator.views.fields import (
    Field,
    count,
    count_field,
    flag,
    mapping_field,
    optional_int,
    raw_field,
    sequence,
    text_field,
    time_field,
    truthy,
)
from sandbox_operator.views.objects import ObjectView, Raw, nested


class ServedRef(Raw):
    """``status.servedBy``: the object that serves a sandbox (kind, name, namespace)."""

    __slots__ = ()
    kind = text_field()
    name = text_field()
    namespace = text_field()


class EgressStatusView(Raw):
    """``status.egress``: when the egress proxy admitted the sandbox, and its final record."""

    __slots__ = ()
    admitted = text_field()
    admitted_at = time_field("admitted")
    final = Field(flag)
    #: The ``egressPolicy.generation`` the proxy enforces (None: it has not said).
    policy_generation: Field[int | None] = Field(optional_int)


class EgressEditRefusalView(Raw):
    """``status.egressEditRefused``: the egress edit refused, at which generation and why."""

    __slots__ = ()
    generation: Field[int | None] = Field(optional_int)
    reason = text_field()
    message = text_field()


class StatusView(Raw):
    """What every status of this package's kinds carries (any kind's, read generically)."""

    __slots__ = ()
    conditions = Field(Conditions)
    observed_generation = count_field()


class SandboxStatusView(StatusView):
    """A Sandbox's ``status``."""

    __slots__ = ()
    backend = text_field()
    isolation = text_field()
    effective_floor = text_field()
    isolation_scope = text_field()
    served_by: Field[ServedRef] = Field(nested(ServedRef))
    served_from = text_field()
    sealed_until_claim = raw_field()
    suspended_by = text_field()
    suspended_at = time_field()
    resumed_at = text_field()
    suspend_count = count_field()
    resume_count = count_field()
    resets = raw_field()
    reset_refused = raw_field()
    admitted_egress_allow = raw_field()
    admitted_egress_rules = raw_field()
    egress_policy = mapping_field()
    egress: Field[EgressStatusView] = Field(nested(EgressStatusView))
    egress_edit_refused: Field[Mapping[str, Any] | None] = Field(
        lambda v: v if isinstance(v, Mapping) else None
    )

    @property
    def egress_policy_generation(self) -> int | None:
        """``egressPolicy.generation``: the generation whose egress was admitted (None: none)."""
        return optional_int(self.egress_policy.get("generation"))


class SandboxView(ObjectView):
    """A Sandbox."""

    __slots__ = ()
    status: Field[SandboxStatusView] = Field(nested(SandboxStatusView))
    scope_ref = text_field(under="spec")
    #: ``spec.kind``: the kind of sandbox (a name the host agent chose), not the resource's.
    sandbox_kind = text_field("kind", under="spec")
    suspended = Field(truthy, under="spec")
    #: ``spec.egress``: closed, allowlist or open (as written).
    egress_mode = text_field("egress", under="spec")
    #: ``spec.resets`` as written (the client checks its type itself).
    wanted_resets = raw_field("resets", under="spec")
    storage = raw_field(under="spec")
    egress_allow = Field(sequence, under="spec")
    egress_rules = raw_field(under="spec")
    #: ``spec.ports`` as written (each validated into a ``SandboxPort`` where it is routed).
    ports = Field(sequence, under="spec")


class ScopeStatusView(StatusView):
    """A SandboxScope's ``status``."""

    __slots__ = ()
    sandbox_count = count_field()
    last_purge = raw_field()


class SandboxScopeView(ObjectView):
    """A SandboxScope."""

    __slots__ = ()
    status: Field[ScopeStatusView] = Field(nested(ScopeStatusView))
    scope = text_field(under="spec")
    thread_id = text_field(under="spec")
    agent_service_accounts = Field(sequence, under="spec")


class WarmPoolStatusView(StatusView):
    """A SandboxWarmPool's ``status``."""

    __slots__ = ()
    backend = text_field()
    shape = text_field()


class SandboxWarmPoolView(ObjectView):
    """A SandboxWarmPool."""

    __slots__ = ()
    status: Field[WarmPoolStatusView] = Field(nested(WarmPoolStatusView))
    replicas = count_field(under="spec")
    #: ``spec.maxCreating``; 5 when unset (the CRD's default).
    max_creating = Field(lambda v: count(v) or 5, under="spec")
