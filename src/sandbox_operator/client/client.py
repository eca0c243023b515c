"""``SandboxClient``: acquire sandboxes as ``Sandbox`` custom resources and wait for them.

The client never decides a conversation's scope or thread: it takes ``scope_ref``, the name of a
``SandboxScope`` the *host* created in the namespace, and reads scope and thread from it. The
model, which only ever talks to tools, cannot name another conversation's sandbox.

``acquire`` is get-or-create: the Sandbox's name is derived from the key and the spec's kind
(:func:`sandbox_operator.naming.sandbox_name`; two kinds under one key are two sandboxes) and the
object is written with server-side apply, so two callers racing on one key and kind converge on
one object (and one pod). Then the client *watches*
the Sandbox (it never polls) until ``Ready=True`` or a terminal reason, raising that reason's
exception the moment the operator reports it; it also watches the SandboxScope, so a scope
deleted while a caller waits raises promptly.

This module is the facade: construction, what the parts share, and thin methods. The client is
composed, not stacked: it holds one object per job and delegates to them --
:class:`~sandbox_operator.client.kube.SandboxObjects` (the namespace's API calls, its typed
refusals), :class:`~sandbox_operator.client.watching.Watches` (every wait),
:class:`~sandbox_operator.client.suspension.Suspensions` (suspend, resume, activity),
:class:`~sandbox_operator.client.scopes.Scopes` (create a SandboxScope and wait for it),
:class:`~sandbox_operator.client.egress.EgressFeed` (egress delivery),
:class:`~sandbox_operator.client.planes.DataPlanes` (the data plane into what serves a Sandbox,
``reach``), :class:`~sandbox_operator.client.acquire.Acquisitions` (acquire and the handle),
:class:`~sandbox_operator.client.disposal.Disposals` (dispose) and
:class:`~sandbox_operator.client.purges.ScopePurges` (``dispose_scope``, ``delete_scope``). None
of them imports the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.stream import WsApiClient

from sandbox_operator import naming
from sandbox_operator.client.acquire import Acquisitions, CarriesHostTools
from sandbox_operator.client.dataplane import DataPlane, DataPlaneFactory
from sandbox_operator.client.disposal import Disposals
from sandbox_operator.client.egress import EgressFeed
from sandbox_operator.client.egressedits import EgressEdits
from sandbox_operator.client.kube import SandboxObjects
from sandbox_operator.client.observer import SandboxObserver, ToolCallContext, tool_call
from sandbox_operator.client.planes import DataPlanes
from sandbox_operator.client.purges import ScopePurges
from sandbox_operator.client.resets import Resets
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.client.scopes import Scopes
from sandbox_operator.client.suspension import Suspensions
from sandbox_operator.client.watching import Watches
from sandbox_operator.contract import (
    SANDBOX_PLURAL,
    IsolationScope,
    SandboxKey,
    SandboxSpec,
    ScopePurge,
)
from sandbox_operator.contract.egressrules import EgressRule, EgressRuleFields
from sandbox_operator.kubeapi import in_cluster_api_client, new_api_client
from sandbox_operator.views import SandboxScopeView, SandboxView

_SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class SandboxClient:
    """Async client for one namespace. Build it with :meth:`from_kubeconfig` or
    :meth:`in_cluster`, or hand it a configured ``kubernetes_asyncio`` ``ApiClient``.

    ``field_manager`` names this client in server-side apply (one per client by default).
    ``observer`` receives the client's events (see :mod:`sandbox_operator.client.observer`);
    without one, no event is built. ``dataplanes`` maps a ``status.servedBy.kind`` to the factory
    of the data plane that reaches such a sandbox
    (:data:`~sandbox_operator.client.planes.DEFAULT_DATAPLANES`, the pod one, is built in), e.g.
    ``dataplanes=acas_dataplanes(...)`` from :mod:`sandbox_operator.client.dataplane.acas`.
    """

    def __init__(
        self,
        api_client: k8s.ApiClient,
        namespace: str,
        *,
        field_manager: str | None = None,
        default_timeout: float = 300.0,
        observer: SandboxObserver | None = None,
        dataplanes: Mapping[str, DataPlaneFactory] | None = None,
    ) -> None:
        self.api = api_client
        self.default_timeout = default_timeout
        self.ws_api = WsApiClient(configuration=api_client.configuration)
        #: the namespace's API calls: what every other part below goes through
        self.objects = SandboxObjects(
            k8s.CustomObjectsApi(api_client),
            namespace,
            field_manager or f"sandbox-client-{secrets.token_hex(4)}",
        )
        #: every wait on one object
        self.watches = Watches(self.objects)
        #: suspend, resume and the last-activity stamps
        self.suspensions = Suspensions(self.objects, self.watches)
        #: reset: a Sandbox's pod replaced by a never-used one
        self.resets = Resets(self.objects, self.watches)
        #: egress edits: a running Sandbox's allowlist and rules narrowed or widened
        self.egress_edits = EgressEdits(self.objects, self.watches)
        #: create a SandboxScope and wait until it is Ready
        self.scopes = Scopes(self.objects, self.watches)
        #: egress delivery per Sandbox (name, uid), and the one watch that pushes it
        self.egress_feed = EgressFeed(self.objects, observer)
        #: the data plane into what serves a Sandbox, per ``servedBy.kind`` (called with this
        #: client, the ``dataplanes=`` contract)
        self.planes = DataPlanes(self.objects, dataplanes or {}, handed=self)
        #: dispose of one Sandbox (now, or in the background for an unclean handle)
        self.disposals = Disposals(self.objects, self.watches, self.suspensions, self.egress_feed)
        #: acquire: apply, wait until Ready, build the handle (whose lifecycle is this client),
        #: after any background disposal of the same name has ended
        self.acquisitions = Acquisitions(
            self.objects,
            self.watches,
            self.suspensions,
            self.egress_feed,
            self.planes,
            self,
            settled=self.disposals.settled,
        )
        #: dispose of a conversation's Sandboxes, delete its SandboxScope
        self.scope_purges = ScopePurges(self.objects, self.watches, self.egress_feed)

    # -- what the parts share, kept where they hold it ----------------------------------------

    @property
    def namespace(self) -> str:
        return self.objects.namespace

    @namespace.setter
    def namespace(self, namespace: str) -> None:
        self.objects.namespace = namespace

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        """The API every call goes through (setting it swaps it for all of the client's parts)."""
        return self.objects.custom

    @custom.setter
    def custom(self, custom: k8s.CustomObjectsApi) -> None:
        self.objects.custom = custom

    @property
    def field_manager(self) -> str:
        """This client's name in server-side apply."""
        return self.objects.field_manager

    @field_manager.setter
    def field_manager(self, field_manager: str) -> None:
        self.objects.field_manager = field_manager

    @property
    def dataplanes(self) -> dict[str, DataPlaneFactory]:
        """How this client reaches a Ready sandbox, per ``servedBy.kind`` (kept in its
        :class:`DataPlanes`; adding to it reaches every later connect)."""
        return self.planes.factories

    @property
    def observer(self) -> SandboxObserver | None:
        """Who receives this client's events; kept in its egress feed, which delivers to it too,
        so that setting it reaches both."""
        return self.egress_feed.observer

    @observer.setter
    def observer(self, observer: SandboxObserver | None) -> None:
        self.egress_feed.observer = observer

    # -- construction ---------------------------------------------------------------------

    @classmethod
    async def from_kubeconfig(
        cls,
        namespace: str,
        *,
        kubeconfig: str | os.PathLike[str] | None = None,
        context: str | None = None,
        **kwargs: Any,
    ) -> SandboxClient:
        """From a kubeconfig (``kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``;
        ``context``: one of its contexts), via :func:`sandbox_operator.kubeapi.new_api_client`."""
        api = await new_api_client(kubeconfig=kubeconfig or None, context=context)
        return cls(api, namespace, **kwargs)

    @classmethod
    def in_cluster(cls, namespace: str | None = None, **kwargs: Any) -> SandboxClient:
        """From the pod's service account (namespace: the pod's own unless given)."""
        api = in_cluster_api_client()
        if namespace is None:
            with open(_SA_NAMESPACE) as fh:
                namespace = fh.read().strip()
        return cls(api, namespace, **kwargs)

    async def close(self) -> None:
        await self.egress_feed.close()
        await self.ws_api.close()
        await self.api.close()

    async def __aenter__(self) -> SandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- observation ------------------------------------------------------------------------

    def tool_call(self, call_id: str) -> ToolCallContext:
        """The context of one tool call: ``async with client.tool_call(call_id): ...``. Every
        event emitted inside carries ``call=call_id``, and on exit this client's observer gets a
        ``ToolCallEnded`` with every key the call touched."""
        return tool_call(call_id, self.observer)

    async def report_egress(self, sandbox: Sandbox | str) -> int:
        """Read the Sandbox and deliver one ``EgressObserved`` per egress decision the proxy has
        written to ``status.egress`` and this client has not delivered yet; returns how many.
        Without an observer it reads nothing and returns 0. A Sandbox this client acquired is
        followed by its watch anyway (decisions arrive without this call); this call shares its
        watermark, so nothing is delivered twice. Decisions the proxy has not written yet (it
        writes at an interval) are not seen; ``missed_before`` counts those it no longer shows."""
        if self.observer is None:
            return 0
        name = sandbox if isinstance(sandbox, str) else sandbox.name
        try:
            obj = await self.objects.get(SANDBOX_PLURAL, name, SandboxView)
        except ApiException as exc:
            if exc.status == 404:
                return 0
            raise
        key = sandbox.key if isinstance(sandbox, Sandbox) else None
        return self.egress_feed.deliver(obj, key)

    # -- scopes, suspension and activity: delegated to the parts that hold them --------------

    async def create_scope(
        self,
        *,
        scope: str,
        thread_id: str,
        name: str | None = None,
        min_isolation: str | None = None,
        min_isolation_scope: str | None = None,
        agent_service_accounts: Sequence[str] = (),
        timeout: float = 60.0,  # noqa: ASYNC109
    ) -> str:
        """Create (or converge) the SandboxScope of a conversation; returns its name. For the
        *host*: an agent's service account should not be able to do this.

        ``agent_service_accounts`` binds those ServiceAccounts of the namespace to this
        conversation (docs/concepts.md, "The conversation boundary"); the call then waits (up to
        ``timeout`` seconds) until the operator reports the scope Ready, which it does once their
        Role is written, so an agent handed the scope can use it at once; else
        :class:`SandboxScopeNotReady`."""
        return await self.scopes.create(
            scope=scope,
            thread_id=thread_id,
            name=name,
            min_isolation=min_isolation,
            min_isolation_scope=min_isolation_scope,
            agent_service_accounts=agent_service_accounts,
            timeout=timeout,
        )

    def key_for(self, scope_obj: SandboxScopeView, agent_dir: str, call_id: str) -> SandboxKey:
        """The sandbox key of ``(agent_dir, call_id)`` in the conversation ``scope_obj`` names
        (a SandboxScope's view; a plain dict is wrapped)."""
        return Scopes.key_for(SandboxScopeView.of(scope_obj), agent_dir, call_id)

    async def suspend(
        self,
        sandbox: Sandbox | str,
        *,
        wait: bool = True,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        """Suspend a Sandbox (by handle or name): ``spec.suspended: true``; the operator deletes
        its pod and keeps its work volume, NetworkPolicy and identity. Processes and memory are
        not kept; files in the work dir are.

        Raises :class:`SandboxNotSuspendable` when the Sandbox declares no ``spec.storage`` (read
        first; the API server refuses it too). With ``wait``, returns once the operator reports
        ``Ready=False`` reason ``Suspended`` for this spec, raises the typed error of a terminal
        reason (e.g. :class:`SandboxGone`), or :class:`SandboxNotSuspendedInTime` after
        ``timeout`` (default: the client's ``default_timeout``). A handle's next use resumes."""
        deadline = timeout if timeout is not None else self.default_timeout
        await self.suspensions.suspend(sandbox, wait=wait, timeout=deadline)

    async def resume(
        self,
        sandbox: Sandbox | str,
        *,
        wait: bool = True,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        """Resume a Sandbox (by handle or name), whatever suspended it: ``spec.suspended`` back
        to false when it is true, and the last-activity annotation stamped when the idle timeout
        suspended it (``status.suspendedBy: idle``). The operator starts a new pod on the same
        work volume after judging the spec again. A Sandbox that is not suspended is left as is.

        With ``wait``, returns once it is Ready (a handle then talks to the new pod); raises the
        refusal's typed error when the operator refuses the resume (e.g.
        :class:`SandboxIsolationBelowFloor`: the floor was raised meanwhile; it stays
        suspended), :class:`SandboxSuspended` when it is suspended again meanwhile, or
        :class:`SandboxNotReadyInTime` (after ``timeout``, default: the client's
        ``default_timeout``). Without ``wait``, a handle's next use waits."""
        deadline = timeout if timeout is not None else self.default_timeout
        await self.suspensions.resume(sandbox, wait=wait, timeout=deadline)

    async def reset(
        self,
        sandbox: Sandbox | str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        """Reset a Sandbox (by handle or name): ``spec.resets`` raised by one; the operator
        deletes its pod with no grace period (every process and file of it goes) and puts a
        never-used pod in its place, a matching warm pool's when one has an idle pod. The
        Sandbox, its key, conversation and NetworkPolicy stay; a handle then talks to the new
        pod. Returns once the operator reports it Ready.

        Raises :class:`SandboxNotResettable` when the Sandbox declares ``spec.storage`` or its
        backend cannot reset (it serves on as it was), the typed error of a terminal reason when
        the new pod cannot start (e.g. :class:`SandboxStartupFailed`), or
        :class:`SandboxNotReadyInTime` after ``timeout`` (default: the client's
        ``default_timeout``). docs/reset.md."""
        deadline = timeout if timeout is not None else self.default_timeout
        await self.resets.reset(sandbox, timeout=deadline)

    async def edit_egress(
        self,
        sandbox: Sandbox | str,
        *,
        allow: Sequence[str] | None = None,
        rules: Sequence[EgressRule | EgressRuleFields] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        """Narrow or widen a running Sandbox's egress (by handle or name): ``allow`` replaces
        ``spec.egressAllow``, ``rules`` replaces ``spec.egressRules`` (None: left as it is; an
        empty list: none). The egress mode stays. Returns once the operator admitted the edit
        and the egress proxy enforces it: the next connection is judged by it, and connections
        it no longer allows are closed.

        Raises :class:`SandboxEgressEditRefused` when the API server refuses the lists
        (``reason`` ``Invalid``, the message naming the field) or the operator does (its
        ``reason``, e.g. ``EgressNotEnforced``); the egress in force stays so. Raises
        :class:`SandboxNotReadyInTime` after ``timeout`` (default: the client's
        ``default_timeout``). docs/egress.md, "Editing egress on a live Sandbox"."""
        deadline = timeout if timeout is not None else self.default_timeout
        await self.egress_edits.edit(sandbox, allow=allow, rules=rules, timeout=deadline)

    async def touch(self, name: str) -> None:
        """Stamp the Sandbox's last-activity annotation (the operator's idle timeout counts from
        it). The handle does this by itself, at most every 30 seconds, while it is used."""
        await self.suspensions.touch(name)

    # -- agent side: acquire, reach and dispose, delegated ---------------------------------

    async def acquire(
        self,
        scope_ref: str,
        agent_dir: str,
        spec: SandboxSpec,
        call_id: str = "",
        *,
        timeout: float | None = None,  # noqa: ASYNC109
        host_tools: CarriesHostTools | None = None,
    ) -> Sandbox:
        """Get or create the sandbox for ``(scope_ref, agent_dir, call_id)`` and wait until it
        is Ready. Raises the typed exception of the reason the operator reports (refusals
        without waiting for the deadline) or :class:`SandboxNotReadyInTime`.

        ``host_tools``: the host-tool registry the sandbox will carry; it is sealed here and its
        names go into the handle's :attr:`Sandbox.effective_state`. With an observer, every
        outcome from the moment the key is known (served, refused, timed out, cancelled) is
        delivered as a ``SandboxAcquired``; a SandboxScope that cannot be read leaves no key to
        report, so that refusal reaches the caller only."""
        deadline = timeout if timeout is not None else self.default_timeout
        return await self.acquisitions.acquire(
            scope_ref, agent_dir, spec, call_id, deadline=deadline, host_tools=host_tools
        )

    async def reach(self, name: str) -> tuple[SandboxView, DataPlane]:
        """The named Sandbox of this namespace and the data plane into what serves it now, for
        a tool that reaches a Sandbox it did not acquire (``sandbox-operator shell``): no
        handle, no capability gate, no resume. What it may do is the caller's own RBAC:
        ``get`` on sandboxes here, ``create`` on ``pods/exec`` for the plane's commands. A
        missing Sandbox raises :class:`SandboxGone`, a suspended one :class:`SandboxSuspended`,
        one not Ready :class:`DataPlaneError` naming its reason."""
        return await self.planes.reach(name)

    def dispose_soon(self, name: str, *, uid: str | None = None) -> asyncio.Future[None]:
        """Dispose of Sandbox ``name`` in the background (an unclean handle does: its caller's
        own error goes on at once); an acquire of the name through this client waits for it."""
        return self.disposals.dispose_soon(name, uid)

    async def dispose(
        self, sandbox: Sandbox | str, *, wait: bool = False, uid: str | None = None
    ) -> None:
        """Delete a Sandbox (by handle or name). Missing is success. ``uid`` deletes only that
        very object (a delete precondition): a Sandbox recreated under the name since it was
        read is never taken for it.

        With an observer, the Sandbox is read first: egress decisions not yet reported are
        delivered (``EgressObserved``), and a dispose by name learns the key from the object;
        then the delete is reported as ``SandboxDisposed``. A Sandbox already gone when disposed
        by name has no key to report and yields no event. With ``wait``, once it is gone, the
        records its last state adds are delivered and its egress stream ends
        (``EgressStreamEnded``); without, a Sandbox this client acquired ends through its
        watch."""
        await self.disposals.dispose(sandbox, wait=wait, uid=uid)

    async def dispose_scope(
        self,
        scope_ref: str,
        *,
        timeout: float = 120.0,  # noqa: ASYNC109
    ) -> ScopePurge:
        """Delete every Sandbox of one SandboxScope in the namespace and wait (up to ``timeout``
        seconds) until each is gone; returns the outcome: ``disposed`` counts the Sandboxes the
        API server no longer has (not the deletes issued), ``undisposed`` each one still there,
        with its ``DisposalCode`` (its ``Disposed`` condition's, else ``timeout``). The
        SandboxScope itself is the host's to delete.

        With an observer, the listed Sandboxes' unreported egress decisions are delivered first,
        each one gone ends its egress stream with its last state seen (``EgressStreamEnded``),
        and the disposal is reported as one ``ScopeDisposed`` naming the conversation by
        ``(scope, thread_id)``."""
        return await self.scope_purges.dispose_scope(scope_ref, timeout=timeout)

    async def delete_scope(
        self,
        name: str,
        *,
        wait: bool = False,
        timeout: float = 120.0,  # noqa: ASYNC109
    ) -> ScopePurge | None:
        """Delete a SandboxScope: the operator disposes every Sandbox of the conversation,
        records the outcome in the scope's ``status.lastPurge`` and lets the scope go. Missing is
        success.

        With ``wait``, returns once the scope is gone, with that outcome as its last state
        recorded it (``ScopePurge``: how many Sandboxes were disposed, and each that was not with
        its ``DisposalCode``), and reports it to the observer as one ``ScopeDisposed``. None when
        no purge was recorded (the scope was gone already, or no operator held it), and always
        without ``wait``."""
        return await self.scope_purges.delete_scope(name, wait=wait, timeout=timeout)

    @contextlib.asynccontextmanager
    async def sandbox_for_call(
        self,
        scope_ref: str,
        agent_dir: str,
        spec: SandboxSpec,
        call_id: str | None = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> AsyncIterator[Sandbox]:
        """A sandbox created for one call (``isolationScope: call``) and deleted when the block
        exits, however it exits."""
        if spec.isolation_scope is not IsolationScope.CALL:
            spec = spec.model_copy(update={"isolation_scope": IsolationScope.CALL})
        call_id = call_id or secrets.token_hex(8)
        name: str | None = None
        try:
            sandbox = await self.acquire(scope_ref, agent_dir, spec, call_id, timeout=timeout)
            name = sandbox.name
            yield sandbox
        finally:
            if name is None:
                with contextlib.suppress(Exception):
                    scope_obj = await self.objects.read_scope(scope_ref)
                    key = self.key_for(scope_obj, agent_dir, call_id)
                    name = naming.sandbox_name(key, spec.kind)
            if name is not None:
                await asyncio.shield(self.dispose(name))
