"""An in-process backend: a workload's admission, tested without a cluster.

A workload's tests want to know two things before anything runs in a pod: is my spec admitted
under this host's policy, and if not, which refusal do I get? The operator answers with the pure
policy (:mod:`sandbox_operator.policy`) against the backends' declarations, and this module asks
the same functions the same way, in the same order as the reconciler (the call key, then the
host's hard stops and ceilings, then the six checks), with declarations a test states. A refusal
comes back as the client's own typed error (:class:`~sandbox_operator.client.SandboxRefused`
and its subclasses), so the test branches on exactly what the workload will catch in production.

:data:`FAKE_BACKEND_DECLARATIONS` says what :func:`~sandbox_operator.testing.local_sandbox`
serves, so an admitted spec can also be run: :func:`acquire` hands back a local ``Sandbox`` for
the admitted spec (resources resolved as the operator would). It **declares and enforces nothing
else**: egress modes are declared so a workload's egress admission can be tested, and its
processes reach whatever the test machine reaches; its isolation is ``none``, which only a host
policy with the floor lowered to ``none`` (:data:`FAKE_HOST_POLICY`, stated, never implied)
admits. A test of admission and of a workload's logic, never of containment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sandbox_operator.client.errors import SandboxRefused, refusal_error_for
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.contract import (
    BackendDeclarations,
    Capability,
    Egress,
    HostPolicy,
    Isolation,
    IsolationScope,
    OsFamily,
    SandboxRefusal,
    SandboxSpec,
)
from sandbox_operator.policy.admission import (
    Admission,
    BackendProfile,
    admit_request,
)
from sandbox_operator.testing.fakes import local_sandbox

#: What the local sandbox serves: exec, code, host tools and the four file capabilities, on a
#: POSIX guest, one conversation's or one call's sandbox (each acquire is a fresh directory).
#: No snapshot, no attached identity, no work volume kept across a suspend.
FAKE_BACKEND_DECLARATIONS: BackendDeclarations = BackendDeclarations(
    capabilities=frozenset(Capability) - {Capability.SNAPSHOT, Capability.ATTACHED_IDENTITY},
    egress_modes=frozenset({Egress.CLOSED, Egress.ALLOWLIST}),
    os_families=frozenset({OsFamily.POSIX}),
    isolation_scopes=frozenset({IsolationScope.CONVERSATION, IsolationScope.CALL}),
)

#: A host policy whose floor admits the fake's ``none`` rung: lowered here, in the open, as a
#: developer machine lowers it in its configuration. Everything else is the default posture.
FAKE_HOST_POLICY: HostPolicy = HostPolicy(min_isolation=Isolation.NONE)


@dataclass(frozen=True)
class FakeBackend:
    """One registered backend as the policy sees it: a name, a rung, declarations, and whether
    it is up (``available=False`` gives ``BackendUnavailable`` once it is the route)."""

    name: str = "in-process"
    isolation: Isolation = Isolation.NONE
    declarations: BackendDeclarations = FAKE_BACKEND_DECLARATIONS
    available: bool = True
    unavailable_reason: str = "the fake backend is set unavailable"

    @property
    def profile(self) -> BackendProfile:
        return BackendProfile(
            name=self.name,
            isolation=self.isolation.value,
            declarations=self.declarations,
            available=self.available,
            unavailable_reason="" if self.available else self.unavailable_reason,
        )


def admit(
    spec: SandboxSpec,
    *,
    host: HostPolicy = FAKE_HOST_POLICY,
    backends: Sequence[FakeBackend] = (FakeBackend(),),
    call_id: str = "",
    scope_floor: Isolation | None = None,
    scope_min_isolation_scope: IsolationScope | None = None,
) -> Admission:
    """Judge ``spec`` as the operator would: the admission (its ``spec`` with resources
    resolved), or the client's typed refusal (a :class:`SandboxRefused` subclass whose
    ``__cause__`` is the contract's refusal, with its fields). ``scope_*`` stand for a
    SandboxScope's own floor and isolation scope; ``call_id`` for the key's call part."""
    try:
        return admit_request(
            host,
            [b.profile for b in backends],
            spec,
            call_id=call_id,
            scope_floor=scope_floor,
            scope_min_isolation_scope=scope_min_isolation_scope,
        )
    except SandboxRefusal as refusal:
        raise _client_error(spec, refusal) from refusal


def _client_error(spec: SandboxSpec, refusal: SandboxRefusal) -> SandboxRefused:
    """The error the client raises for a Sandbox refused with ``refusal``: the same class and
    the same message the operator's condition would carry."""
    cls = refusal_error_for(refusal.reason)
    return cls(sandbox=f"fake-{spec.kind}", namespace="", message=refusal.message)


def acquire(
    spec: SandboxSpec,
    *,
    host: HostPolicy = FAKE_HOST_POLICY,
    backends: Sequence[FakeBackend] = (FakeBackend(),),
    call_id: str = "",
    root: str | None = None,
) -> Sandbox:
    """:func:`admit`, then a local ``Sandbox`` for the admitted spec (its own temporary
    directory, or ``root``), whose work dir replaces the spec's: the guest's path would not
    exist on the test machine. Gated by the capabilities the spec required, as a real handle."""
    admission = admit(spec, host=host, backends=backends, call_id=call_id)
    admitted = admission.spec or spec
    fields = admitted.model_dump(exclude={"work_dir", "kind", "image"})
    return local_sandbox(root=root, kind=admitted.kind, image=admitted.image, **fields)
