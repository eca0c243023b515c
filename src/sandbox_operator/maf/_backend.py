"""The operator as a ``maf_sandbox.SandboxBackend``: :class:`OperatorBackend`.

One instance stands for one of the operator's backends (see :func:`~._published.select_backend`),
so its ``isolation`` and ``declarations`` are that backend's, read from what the operator
publishes; an acquire that the operator ends up serving from another backend is disposed and
refused (:class:`~._errors.OperatorBackendMismatch`), so a sandbox the declarations do not
describe is never handed out.

The adapter acts as the host: it creates the conversation's SandboxScope, then acquires the
Sandbox through the client (server-side apply, so concurrent acquires of one key converge on one
object; the client waits on its watch). Disposal finds Sandboxes by the key's and conversation's
labels, so any process can dispose what another created, and counts a Sandbox only once the
API server no longer has it. The SandboxScope's name is derived from the conversation
(:func:`sandbox_operator.naming.scope_name`), never remembered only in this process, so a
conversation purged from another replica loses its SandboxScope too (and with it, under the
conversation boundary, its agents' grant).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Self

import aiohttp
import maf_sandbox as maf
from kubernetes_asyncio.client.exceptions import ApiException
from maf_sandbox.credentials import CredentialGateway, GatewayLease

from sandbox_operator import labels as lbl
from sandbox_operator import naming
from sandbox_operator.client import Sandbox as ClientSandbox
from sandbox_operator.client import SandboxClient
from sandbox_operator.client import errors as client_errors
from sandbox_operator.contract import (
    GROUP,
    SANDBOX_PLURAL,
    SERVED_FROM_COLD,
    VERSION,
    SandboxKey,
    Selection,
)
from sandbox_operator.contract.published import PublishedBackends
from sandbox_operator.maf import _grants as grants
from sandbox_operator.maf._egress import EgressRelay
from sandbox_operator.maf._errors import (
    NEEDS_DISPOSAL,
    OperatorAcquireFailed,
    OperatorBackendMismatch,
    translate,
)
from sandbox_operator.maf._published import read_published, select_backend
from sandbox_operator.maf._sandbox import OperatorSandbox, sandbox_instance_id
from sandbox_operator.maf._translate import BASE_MOUNTED, declarations, operator_spec
from sandbox_operator.views import ListView, SandboxView

#: How long a disposal waits for the API server to no longer have the Sandboxes it deleted.
log = logging.getLogger(__name__)

DEFAULT_DISPOSE_TIMEOUT = 120.0

#: How many reset instances a backend remembers as not handed out yet.
PRISTINE_KEPT = 4096


def _target(item: SandboxView) -> tuple[str, str | None]:
    """A listed Sandbox as a delete target: its name and uid."""
    meta = item.metadata
    return meta.name, meta.uid or None


def _failure_code(exc: BaseException) -> maf.DisposalCode:
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, client_errors.SandboxForbidden) or (
        isinstance(exc, ApiException) and exc.status in (401, 403, 409, 422)
    ):
        return "refused"
    if isinstance(exc, aiohttp.ClientError | ConnectionError) or (
        isinstance(exc, ApiException) and exc.status in (0, 502, 503, 504)
    ):
        return "unreachable"
    return "unknown"


def _failure(exc: BaseException, what: str) -> maf.DisposalFailure:
    """A disposal failure naming what failed by type and status only (no message: it can carry
    an endpoint)."""
    status = f" (HTTP {exc.status})" if isinstance(exc, ApiException) else ""
    return maf.DisposalFailure(_failure_code(exc), f"{what}: {type(exc).__name__}{status}")


def _unlisted(exc: BaseException, what: str) -> maf.DisposalFailure:
    """The query enumerating what to delete failed: nothing is known to be gone."""
    return maf.DisposalFailure("unlisted", _failure(exc, what).detail)


class OperatorBackend:
    """A maf-sandbox backend served by this operator's backend ``backend_name``.

    Build it with :meth:`connect` (reads the published backends) or from a
    :class:`~sandbox_operator.contract.published.PublishedBackends` already read.
    ``default_image`` serves a spec naming no image; ``acquire_timeout`` bounds the wait for
    Ready (default: the client's); ``dispose_timeout`` bounds a disposal's wait for the gone.
    ``agent_service_accounts`` are the ServiceAccounts of the namespace each conversation's
    SandboxScope binds (the conversation boundary, docs/concepts.md): the agents that may then
    use that conversation's sandboxes with their own tokens; the first acquire of a conversation
    waits until the operator has granted it.
    """

    def __init__(
        self,
        client: SandboxClient,
        published: PublishedBackends,
        *,
        backend: str | None = None,
        default_image: str | None = None,
        acquire_timeout: float | None = None,
        dispose_timeout: float = DEFAULT_DISPOSE_TIMEOUT,
        agent_service_accounts: Sequence[str] = (),
        credential_gateway: CredentialGateway | None = None,
    ) -> None:
        self.client = client
        self.published = published
        chosen = select_backend(published, backend)
        self.backend_name = chosen.name
        self._isolation = maf.Isolation(chosen.isolation)
        #: issues the grants an ``EgressRule(authority=)`` attaches (``_grants``); None: none
        self.credential_gateway = credential_gateway
        self._declarations = declarations(
            chosen, grants.attached_identity(credential_gateway, attaches=True)
        )
        #: whether the storage base is a volume mounted when the compute is made (BASE_MOUNTED)
        self._base_mounted = chosen.type in BASE_MOUNTED
        #: under perSpec, a named backend raises every spec's floor to its rung
        self._floor = (
            self._isolation
            if backend is not None and published.host_policy.selection == Selection.PER_SPEC
            else None
        )
        self.default_image = default_image
        self.acquire_timeout = acquire_timeout
        self.dispose_timeout = dispose_timeout
        self.agent_service_accounts = tuple(agent_service_accounts)
        #: the conversations whose SandboxScope this process has converged
        self._scopes: set[tuple[str, str]] = set()
        #: where this backend's egress decisions go (``observe_egress``; None: nowhere)
        self._egress_report: maf.EgressReporter | None = None
        #: instances a reset of this process put in place and no acquire has handed out since
        self._pristine: OrderedDict[str, None] = OrderedDict()

    @classmethod
    async def connect(
        cls,
        client: SandboxClient,
        *,
        backend: str | None = None,
        default_image: str | None = None,
        acquire_timeout: float | None = None,
        dispose_timeout: float = DEFAULT_DISPOSE_TIMEOUT,
        published_namespace: str | None = None,
        agent_service_accounts: Sequence[str] = (),
        credential_gateway: CredentialGateway | None = None,
    ) -> Self:
        """Read what the operator publishes in ``client.namespace`` (every operator publishes it
        in each namespace it serves; ``published_namespace`` reads another's) and stand for
        ``backend`` (see :func:`~._published.select_backend`)."""
        published = await read_published(client, namespace=published_namespace)
        return cls(
            client,
            published,
            backend=backend,
            default_image=default_image,
            acquire_timeout=acquire_timeout,
            dispose_timeout=dispose_timeout,
            agent_service_accounts=agent_service_accounts,
            credential_gateway=credential_gateway,
        )

    @property
    def name(self) -> str:
        return f"sandbox-operator/{self.backend_name}"

    @property
    def isolation(self) -> maf.Isolation:
        return self._isolation

    @property
    def declarations(self) -> maf.BackendDeclarations:
        return self._declarations

    # -- acquire --------------------------------------------------------------------------

    async def _scope(self, key: maf.SandboxKey) -> str:
        """The conversation's SandboxScope, created (converged) once per process, under the name
        every process derives alike."""
        conversation = (key.scope, key.thread_id)
        ref = naming.scope_name(*conversation)
        if conversation not in self._scopes:
            await self.client.create_scope(
                scope=key.scope,
                thread_id=key.thread_id,
                name=ref,
                agent_service_accounts=self.agent_service_accounts,
            )
            self._scopes.add(conversation)
        return ref

    async def acquire(self, key: maf.SandboxKey, spec: maf.SandboxSpec) -> OperatorSandbox:
        """Get or create the sandbox of ``(key, spec.kind)`` and wait until it is Ready."""
        attaching = maf.Capability.ATTACHED_IDENTITY in self._declarations.capabilities
        lease = grants.start(self.credential_gateway if attaching else None, key, spec)
        ours = operator_spec(
            spec,
            floor=self._floor,
            default_image=self.default_image,
            grant_secret=grants.grant_secret_name(key, spec.kind) if lease else None,
        )

        async def once() -> ClientSandbox:
            return await self.client.acquire(
                await self._scope(key),
                key.agent_id,
                ours,
                key.call_id,
                timeout=self.acquire_timeout,
            )

        try:
            try:
                handle = await once()
            except client_errors.SandboxScopeNotFound:
                # Our remembered SandboxScope was purged (by any process): converge it once more.
                self._scopes.discard((key.scope, key.thread_id))
                handle = await once()
        except client_errors.SandboxScopeNotReady as exc:
            # The agents' grant was not written (or another scope holds the conversation): no
            # Sandbox was asked for; maf has no type for it, and it must not fall back.
            raise OperatorAcquireFailed(str(exc), reason=exc.reason or "ScopeNotReady") from exc
        except client_errors.SandboxAcquireError as exc:
            if isinstance(exc, client_errors.SandboxScopeNotFound | client_errors.SandboxGone):
                self._scopes.discard((key.scope, key.thread_id))
            raise await self._refusal(exc) from exc
        view = handle.view
        status = view.status
        if status.backend != self.backend_name:
            await handle.close()
            uid = view.metadata.uid or None
            _, failure = await self._delete_and_wait([(handle.name, uid)])
            raise OperatorBackendMismatch(
                f"sandbox {handle.namespace}/{handle.name} was served by backend "
                f"{status.backend or None!r}, not {self.backend_name!r}; "
                + ("it was disposed" if failure is None else f"its disposal failed: {failure}"),
                reason="BackendMismatch",
            )
        instance_id = sandbox_instance_id(view)
        if lease is not None:
            await self._install_grant(handle, view, lease, key, spec, instance_id)
        # A new instance is a trusted baseline when its pod was made for it, or claimed from a
        # pool whose pods the operator saw sealed from their creation to the claim (no identity
        # but the operator's could reach it first: reconcile/seal.py, docs/warm-pools.md).
        served_from = status.served_from or None
        sealed = status.sealed_until_claim is True
        fresh = handle.created and (served_from == SERVED_FROM_COLD or sealed)
        if handle.created and served_from != SERVED_FROM_COLD and not sealed:
            log.info(
                "sandbox %s/%s: claimed from %s, whose pods the operator does not vouch were "
                "sealed until the claim (status.sealedUntilClaim): not freshly created",
                handle.namespace,
                handle.name,
                served_from,
            )
        sandbox = OperatorSandbox(
            handle,
            spec,
            base=ours.work_dir,
            instance_id=instance_id,
            freshly_created=fresh,
            pod=status.served_by.name,
            reclaims=maf.Capability.RECLAIM in self._declarations.capabilities,
            resets=maf.Capability.SNAPSHOT in self._declarations.capabilities,
            on_reset=self._reset_made,
        )
        self._follow_egress(handle.name)
        pristine = sandbox.instance_id in self._pristine
        self._pristine.pop(sandbox.instance_id, None)
        if not (self._base_mounted and (fresh or pristine)):
            # On a runtime-class backend the storage base is the pod's work directory, a volume
            # mounted there when the pod was made: on an instance nothing has used yet (a fresh
            # one, or one a reset of this process put in place and nothing has been handed since)
            # it is that directory by construction. On a reused one, what ran may have put a
            # link on its way; on another backend (acas) nothing mounts it: checked.
            await sandbox.prepare()
        return sandbox

    async def _install_grant(
        self,
        handle: ClientSandbox,
        obj: SandboxView,
        lease: GatewayLease,
        key: maf.SandboxKey,
        spec: maf.SandboxSpec,
        instance_id: str,
    ) -> None:
        """The gateway's grant for this instance, in the Secret the Sandbox owns; a grant that
        cannot be installed disposes the sandbox and refuses (its requests would be refused)."""
        assert self.credential_gateway is not None
        try:
            await grants.install(
                grants.secret_applier(self.client.api),
                self.credential_gateway,
                lease,
                key,
                spec,
                obj,
                instance_id,
            )
        except (ValueError, ApiException) as exc:
            await handle.close()
            _, failure = await self._delete_and_wait([(handle.name, obj.metadata.uid or None)])
            why = str(exc) if isinstance(exc, ValueError) else f"HTTP {exc.status}"
            raise maf.SandboxAttachedIdentityNotPermitted(
                f"the credential grant for {handle.namespace}/{handle.name} was not installed "
                f"({why}); the sandbox "
                + ("was disposed" if failure is None else f"could not be disposed: {failure}")
            ) from None

    def _reset_made(self, instance_id: str) -> None:
        """A reset through this backend put ``instance_id`` in place: its next acquire here hands
        out a pod nothing has used (bounded: a reset never acquired again is forgotten)."""
        self._pristine[instance_id] = None
        while len(self._pristine) > PRISTINE_KEPT:
            self._pristine.popitem(last=False)

    # -- egress observation (maf's ObservesEgress) -----------------------------------------

    def observe_egress(self, report: maf.EgressReporter | None) -> maf.EgressReporter | None:
        """Report the egress proxy's decisions for the Sandboxes this backend serves through
        ``report`` (None: stop); returns the reporter it replaced. Atomic: the client's relay
        is put in place (it cannot fail) before the reporter is swapped. Only a backend that
        declares ``observes_egress`` (its proxy records decisions: allowlist) reports."""
        if report is not None and self._declarations.observes_egress:
            EgressRelay.on(self.client)
        previous, self._egress_report = self._egress_report, report
        if previous is not None and report is not None and previous is not report:
            log.warning(
                "backend %s: egress reporting moved to another router's observer",
                self.backend_name,
            )
        return previous

    def _follow_egress(self, sandbox: str) -> None:
        """Route a served Sandbox's decisions to this backend's reporter, read at delivery."""
        if not self._declarations.observes_egress:
            return
        relay = getattr(self.client, "observer", None)
        if isinstance(relay, EgressRelay):
            relay.route(sandbox, self.backend_name, lambda: self._egress_report)

    async def _refusal(self, exc: client_errors.SandboxAcquireError) -> Exception:
        """maf's exception for a failed acquire; a fallback-permitting one only once the
        Sandbox is gone."""
        mapped = translate(exc)
        if type(mapped) in NEEDS_DISPOSAL and exc.sandbox:
            _, failure = await self._delete_and_wait([(exc.sandbox, None)])
            if failure is not None:
                return OperatorAcquireFailed(
                    f"{exc}; the Sandbox could not be disposed ({failure})", reason=exc.reason
                )
        return mapped

    # -- dispose --------------------------------------------------------------------------

    async def _list(self, selector: str) -> list[SandboxView]:
        listing = ListView(
            await self.client.custom.list_namespaced_custom_object(
                GROUP, VERSION, self.client.namespace, SANDBOX_PLURAL, label_selector=selector
            )
        )
        return [SandboxView(item) for item in listing.objects]

    async def _delete_and_wait(
        self, targets: Sequence[tuple[str, str | None]]
    ) -> tuple[int, maf.DisposalFailure | None]:
        """Delete each ``(name, uid)`` Sandbox, with a uid that very object (the delete's
        precondition, so one recreated under the name since it was read is never taken for
        it), and wait (bounded) until the API server no longer has it; returns how many are
        gone and the folded failure for the rest."""

        async def one(name: str, uid: str | None) -> maf.DisposalFailure | None:
            try:
                async with asyncio.timeout(self.dispose_timeout):
                    await self.client.dispose(name, wait=True, uid=uid)
            except Exception as exc:
                return _failure(exc, f"sandbox {name}")
            return None

        done = await asyncio.gather(*(one(name, uid) for name, uid in targets))
        failures = [f for f in done if f is not None]
        return len(targets) - len(failures), maf.fold_disposal_failures(failures)

    async def dispose(
        self, key: maf.SandboxKey, *, kind: str | None = None, instance_id: str | None = None
    ) -> maf.DisposalFailure | None:
        """Delete the key's Sandboxes (of ``kind``; only the one whose
        :func:`sandbox_instance_id` is ``instance_id``). Never raises; a stale ``instance_id``
        selects nothing, never a replacement."""
        ours = SandboxKey(
            scope=key.scope, thread_id=key.thread_id, agent_dir=key.agent_id, call_id=key.call_id
        )
        try:
            items = await self._list(lbl.key_selector(ours))
        except Exception as exc:
            return _unlisted(exc, "listing the key's sandboxes")
        chosen = [
            item
            for item in items
            if (kind is None or item.sandbox_kind == kind)
            and (instance_id is None or sandbox_instance_id(item) == instance_id)
        ]
        _, failure = await self._delete_and_wait([_target(item) for item in chosen])
        return failure

    async def dispose_scope(self, scope: str, thread_id: str) -> maf.ScopePurge:
        """Delete every Sandbox of the conversation (found by label, whoever created them),
        then its SandboxScope (by its derived name, whoever created it: a purge served by another
        replica must not leave the conversation, or its agents' grant, behind). ``disposed``
        counts the Sandboxes seen gone. Never raises."""
        try:
            items = await self._list(lbl.scope_selector(scope, thread_id))
        except Exception as exc:
            return maf.ScopePurge(0, _unlisted(exc, "listing the conversation's sandboxes"))
        disposed, failure = await self._delete_and_wait([_target(item) for item in items])
        self._scopes.discard((scope, thread_id))
        if failure is None:
            ref = naming.scope_name(scope, thread_id)
            try:
                await self.client.delete_scope(ref)
            except Exception as exc:
                failure = _failure(exc, f"SandboxScope {ref}")
        return maf.ScopePurge(disposed, failure)
