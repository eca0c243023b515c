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

The client is composed, not stacked: it holds one object per job and delegates to them --
:class:`~sandbox_operator.client.kube.SandboxObjects` (the namespace's API calls, its typed
refusals), :class:`~sandbox_operator.client.watching.Watches` (every wait),
:class:`~sandbox_operator.client.suspension.Suspensions` (suspend, resume, activity),
:class:`~sandbox_operator.client.scopes.Scopes` (create a SandboxScope and wait for it) and
:class:`~sandbox_operator.client.egress.EgressFeed` (egress delivery). None of them knows the
client; what the client does itself is what reports to its observer (acquire, dispose, the
scope purges) and the handles it builds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.stream import WsApiClient

from sandbox_operator import kubeobj, naming
from sandbox_operator import labels as lbl
from sandbox_operator.client.dataplane import (
    DataPlane,
    DataPlaneFactory,
    pod_factory,
)
from sandbox_operator.client.egress import EgressFeed
from sandbox_operator.client.errors import (
    DataPlaneError,
    SandboxGone,
    SandboxNotReadyInTime,
    SandboxSuspended,
)
from sandbox_operator.client.kube import SandboxObjects
from sandbox_operator.client.observer import (
    EffectiveState,
    SandboxAcquired,
    SandboxDisposed,
    SandboxObserver,
    ScopeDisposed,
    ToolCallContext,
    failure_name,
    notify,
    record_key,
    tool_call,
)
from sandbox_operator.client.purges import purge_of_scope, undisposed
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.client.scopes import Scopes
from sandbox_operator.client.served import ServedPlane
from sandbox_operator.client.status import (
    Goal,
    effective_state,
    evaluate,
    is_suspended,
    key_from_object,
    served_by,
)
from sandbox_operator.client.suspension import Suspensions
from sandbox_operator.client.watching import Watches
from sandbox_operator.contract import (
    API_VERSION,
    SANDBOX_KIND,
    SANDBOX_PLURAL,
    SANDBOX_SCOPE_PLURAL,
    DisposalFailure,
    IsolationScope,
    SandboxKey,
    SandboxResourceSpec,
    SandboxSpec,
    ScopePurge,
)
from sandbox_operator.kubeapi import in_cluster_api_client, new_api_client

_observe_log = logging.getLogger("sandbox_operator.client.observer")

_SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

#: The data planes every client has, keyed by ``status.servedBy.kind``: the pod exec one.
#: ``SandboxClient(dataplanes=...)`` adds to (or overrides) these.
DEFAULT_DATAPLANES: Mapping[str, DataPlaneFactory] = {kubeobj.POD_KIND: pod_factory}


class CarriesHostTools(Protocol):
    """What :meth:`SandboxClient.acquire` reads from a host-tool registry: sealing it (a served
    sandbox's record must not change under it) and the names it carries."""

    def aggregate(self) -> object: ...

    @property
    def names(self) -> tuple[str, ...]: ...


class SandboxClient:
    """Async client for one namespace. Build it with :meth:`from_kubeconfig` or
    :meth:`in_cluster`, or hand it a configured ``kubernetes_asyncio`` ``ApiClient``.

    ``field_manager`` names this client in server-side apply (one per client by default).
    ``observer`` receives the client's events (see :mod:`sandbox_operator.client.observer`);
    without one, no event is built. ``dataplanes`` maps a ``status.servedBy.kind`` to the factory
    of the data plane that reaches such a sandbox (:data:`DEFAULT_DATAPLANES`, the pod one, is
    built in), e.g. ``dataplanes=acas_dataplanes(...)`` from
    :mod:`sandbox_operator.client.dataplane.acas`.
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
        #: how this client reaches a Ready sandbox, per ``servedBy.kind``
        self.dataplanes: dict[str, DataPlaneFactory] = {**DEFAULT_DATAPLANES, **(dataplanes or {})}
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
        #: create a SandboxScope and wait until it is Ready
        self.scopes = Scopes(self.objects, self.watches)
        #: egress delivery per Sandbox (name, uid), and the one watch that pushes it
        self.egress_feed = EgressFeed(self.objects, observer)

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
            obj = await self.objects.get(SANDBOX_PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                return 0
            raise
        key = sandbox.key if isinstance(sandbox, Sandbox) else None
        return self._report_egress_obj(obj, key)

    def _report_egress_obj(self, obj: Mapping[str, Any], key: SandboxKey | None) -> int:
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

    def key_for(self, scope_obj: Mapping[str, Any], agent_dir: str, call_id: str) -> SandboxKey:
        """The sandbox key of ``(agent_dir, call_id)`` in the conversation ``scope_obj`` names."""
        return Scopes.key_for(scope_obj, agent_dir, call_id)

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

    async def touch(self, name: str) -> None:
        """Stamp the Sandbox's last-activity annotation (the operator's idle timeout counts from
        it). The handle does this by itself, at most every 30 seconds, while it is used."""
        await self.suspensions.touch(name)

    # -- agent side -------------------------------------------------------------------------

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
        scope_obj = await self.objects.read_scope(scope_ref)
        key = self.key_for(scope_obj, agent_dir, call_id)
        name = naming.sandbox_name(key, spec.kind)
        call = record_key(key)
        started = time.monotonic()
        try:
            sandbox = await self._acquire(
                key, name, scope_ref, agent_dir, spec, call_id, deadline, host_tools, call
            )
        except BaseException as exc:
            refusal = failure_name(exc)
            notify(
                self.observer,
                "sandbox_acquired",
                lambda: self._acquired(key, call, name, started, spec, refusal=refusal),
            )
            raise
        notify(
            self.observer,
            "sandbox_acquired",
            lambda: self._acquired(key, call, name, started, spec, state=sandbox.effective_state),
        )
        if sandbox.resource is not None:
            self.egress_feed.follow(sandbox.resource, key)  # without an observer: nothing
        return sandbox

    def _acquired(
        self,
        key: SandboxKey,
        call: str | None,
        name: str,
        started: float,
        spec: SandboxSpec,
        *,
        refusal: str | None = None,
        state: EffectiveState | None = None,
    ) -> SandboxAcquired:
        """The event of one acquire's outcome (built only when an observer is registered)."""
        return SandboxAcquired(
            key=key,
            call=call,
            sandbox=name,
            namespace=self.namespace,
            refusal=refusal,
            state=state,
            seconds=time.monotonic() - started,
            labels=MappingProxyType(dict(spec.labels)),
        )

    async def _acquire(
        self,
        key: SandboxKey,
        name: str,
        scope_ref: str,
        agent_dir: str,
        spec: SandboxSpec,
        call_id: str,
        deadline: float,
        host_tools: CarriesHostTools | None,
        call: str | None,
    ) -> Sandbox:
        resource = SandboxResourceSpec.model_validate(
            {
                **spec.model_dump(exclude_unset=True),
                "scope_ref": scope_ref,
                "agent_dir": agent_dir,
                "call_id": call_id,
            }
        )
        body = {
            "apiVersion": API_VERSION,
            "kind": SANDBOX_KIND,
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": lbl.key_labels(key, spec.kind),
                "annotations": lbl.key_annotations(key),
            },
            # ``suspended`` is not the acquirer's to own: suspend/resume (and kubectl) change it,
            # and an apply that owned it would conflict with them.
            "spec": {k: v for k, v in resource.to_wire().items() if k != "suspended"},
        }
        last = {"reason": ""}
        try:
            async with asyncio.timeout(deadline):
                obj = await self._wait_ready(name, scope_ref, body, last)
        except TimeoutError:
            raise SandboxNotReadyInTime(
                sandbox=name, namespace=self.namespace, timeout=deadline, last_reason=last["reason"]
            ) from None
        tools: tuple[str, ...] = ()
        if host_tools is not None:
            host_tools.aggregate()  # seal: what the sandbox carries cannot change under it
            tools = tuple(host_tools.names)

        async def touch() -> None:
            await self.touch(name)

        async def resume() -> None:
            # The plane's resume is the handle's (built below): a resume by handle is what
            # points the plane at the new pod and refreshes the handle's effective state.
            await self.resume(sandbox)

        dataplane = ServedPlane(
            self._dataplane(obj),
            served_by(obj),
            sandbox=name,
            namespace=self.namespace,
            connect=self._dataplane,
            resume=resume,
            is_suspended=self.suspensions.is_suspended,
        )
        sandbox = Sandbox(
            spec,
            dataplane,
            name=name,
            namespace=self.namespace,
            key=key,
            scope_ref=scope_ref,
            on_activity=touch,
            observer=self.observer,
            effective_state=lambda: effective_state(obj, spec, host_tools=tools, call=call),
            lifecycle=self,
            resource=obj,
            created=bool(last.get("created"))
            and last.get("created") == kubeobj.meta(obj).get("uid"),
        )
        return sandbox

    async def reach(self, name: str) -> tuple[Mapping[str, Any], DataPlane]:
        """The named Sandbox of this namespace and the data plane into what serves it now, for
        a tool that reaches a Sandbox it did not acquire (``sandbox-operator shell``): no
        handle, no capability gate, no resume. What it may do is the caller's own RBAC:
        ``get`` on sandboxes here, ``create`` on ``pods/exec`` for the plane's commands. A
        missing Sandbox raises :class:`SandboxGone`, a suspended one :class:`SandboxSuspended`,
        one not Ready :class:`DataPlaneError` naming its reason."""
        obj = await self.objects.get_sandbox(name)
        if is_suspended(obj):
            raise SandboxSuspended(
                sandbox=name, namespace=self.namespace, message="resume it to reach it"
            )
        state, reason, _ = evaluate(obj)
        if state != "ready" or served_by(obj) is None:
            raise DataPlaneError(f"the sandbox is not Ready ({reason or 'no status yet'})")
        return obj, self._dataplane(obj)

    def _dataplane(self, obj: Mapping[str, Any]) -> DataPlane:
        served = (obj.get("status") or {}).get("servedBy") or {}
        factory = self.dataplanes.get(served.get("kind", ""))
        if factory is None:
            raise DataPlaneError(f"no data plane for servedBy kind {served.get('kind')!r}")
        return factory(self, obj)

    async def _wait_ready(
        self, name: str, scope_ref: str, body: dict[str, Any], last: dict[str, str]
    ) -> Mapping[str, Any]:
        obj, created = await self.objects.apply_created(SANDBOX_PLURAL, name, body)
        while kubeobj.meta(obj).get("deletionTimestamp"):
            # A previous sandbox under this key is still going away: wait, then recreate.
            await self.watches.wait_gone(SANDBOX_PLURAL, name, None)
            obj, created = await self.objects.apply_created(SANDBOX_PLURAL, name, body)
        if created:
            last["created"] = kubeobj.meta(obj).get("uid", "")
        goal: Goal = "ready"
        if is_suspended(obj):
            # Suspended (by spec, kubectl or the idle timeout): acquiring it resumes it.
            obj = await self.suspensions.start_resume(name, obj)
            goal = "resumed"
        sandbox_watch = asyncio.ensure_future(self.watches.until_goal(name, obj, last, goal=goal))
        scope_watch = asyncio.ensure_future(self.watches.scope_deleted(scope_ref))
        try:
            done, _ = await asyncio.wait(
                {sandbox_watch, scope_watch}, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in (sandbox_watch, scope_watch):
                task.cancel()
            await asyncio.gather(sandbox_watch, scope_watch, return_exceptions=True)
        if sandbox_watch in done:
            return sandbox_watch.result()
        scope_watch.result()
        raise SandboxGone(
            sandbox=name,
            namespace=self.namespace,
            reason="ScopeDeleted",
            message=f"SandboxScope {scope_ref!r} was deleted while waiting",
        )

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
        name = sandbox if isinstance(sandbox, str) else sandbox.name
        key = None if isinstance(sandbox, str) else sandbox.key
        if not isinstance(sandbox, str):
            with contextlib.suppress(Exception):
                await sandbox.close()
        seen: Mapping[str, Any] | None = None
        if self.observer is not None:
            with contextlib.suppress(Exception):  # reporting must not stop the delete
                seen = await self.objects.get(SANDBOX_PLURAL, name)
            if isinstance(seen, Mapping):
                key = key or key_from_object(seen)
                try:
                    self._report_egress_obj(seen, key)
                except Exception as exc:
                    _log_report_failure(exc)
            else:
                seen = None
        call = record_key(key)
        try:
            await self.objects.delete(SANDBOX_PLURAL, name, uid=uid)
        except BaseException as exc:
            self._disposed(key, call, name, exc)
            raise
        self._disposed(key, call, name, None)
        self.suspensions.activity_stamps.pop(name, None)
        seen_uid = str(kubeobj.meta(seen).get("uid") or "")
        try:
            if wait:
                last = await self.watches.wait_gone(SANDBOX_PLURAL, name, 120.0, uid=uid)
                self._egress_ended(last or seen, key, uid)
        finally:
            self.egress_feed.forget(name, seen_uid)

    def _egress_ended(
        self, last: Mapping[str, Any] | None, key: SandboxKey | None, uid: str | None
    ) -> None:
        """A disposed Sandbox is gone and ``last`` is the last state of it seen: deliver its
        remaining egress records and end its stream (with an observer; never raises)."""
        if self.observer is None or last is None:
            return
        if uid and kubeobj.meta(last).get("uid") != uid:
            return  # a state of another object under the name
        try:
            self.egress_feed.end(last, key)
        except Exception as exc:
            _log_report_failure(exc)

    def _disposed(
        self, key: SandboxKey | None, call: str | None, name: str, exc: BaseException | None
    ) -> None:
        if key is None:
            return
        notify(
            self.observer,
            "sandbox_disposed",
            lambda: SandboxDisposed(
                key=key,
                call=call,
                sandbox=name,
                namespace=self.namespace,
                failure=failure_name(exc),
            ),
        )

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
        call = record_key(None)
        items: list[Mapping[str, Any]] = []
        purge = ScopePurge()
        try:
            items = [
                item
                for item in await self.objects.list_objects(SANDBOX_PLURAL)
                if (item.get("spec") or {}).get("scopeRef") == scope_ref
            ]
            if self.observer is not None:
                for item in items:
                    try:
                        self._report_egress_obj(item, None)
                    except Exception as exc:
                        _log_report_failure(exc)
            targets = [
                (str(item["metadata"]["name"]), str(item["metadata"].get("uid") or "") or None)
                for item in items
            ]
            for name, uid in targets:
                await self.objects.delete(SANDBOX_PLURAL, name, uid=uid)
            purge = await self._disposed_within(targets, timeout)
        except BaseException as exc:
            await self._scope_disposed(scope_ref, items, call, purge, exc)
            raise
        await self._scope_disposed(scope_ref, items, call, purge, None)
        return purge

    async def _disposed_within(
        self,
        targets: Sequence[tuple[str, str | None]],
        timeout: float,  # noqa: ASYNC109
    ) -> ScopePurge:
        """Wait for the deleted Sandboxes to be gone, together, for at most ``timeout``."""

        async def gone(name: str, uid: str | None) -> bool:
            try:
                last = await self.watches.wait_gone(SANDBOX_PLURAL, name, timeout, uid=uid)
            except TimeoutError:
                return False
            self._egress_ended(last, None, uid)
            return True

        outcomes = await asyncio.gather(*(gone(name, uid) for name, uid in targets))
        failures: list[DisposalFailure] = []
        for (name, uid), done in zip(targets, outcomes, strict=True):
            if done:
                continue
            try:
                obj = await self.objects.get(SANDBOX_PLURAL, name)
            except ApiException as exc:
                if exc.status == 404:
                    continue  # went just now
                raise
            if uid and kubeobj.meta(obj).get("uid") != uid:
                continue  # a replacement: the one meant is gone
            failures.append(undisposed(obj, timeout))
        return ScopePurge(disposed=len(targets) - len(failures), undisposed=tuple(failures))

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
        call = record_key(None)
        scope_obj: Mapping[str, Any] | None = None
        try:
            answer = await self.objects.delete(SANDBOX_SCOPE_PLURAL, name)
            if not wait:
                return None
            scope_obj = answer
            uid = str(kubeobj.meta(answer).get("uid") or "") or None
            scope_obj = await self.watches.wait_gone(
                SANDBOX_SCOPE_PLURAL, name, timeout, uid=uid, seen=answer
            )
        except BaseException as exc:
            if wait:
                await self._scope_disposed(name, [], call, None, exc, scope_obj=scope_obj)
            raise
        purge = purge_of_scope(scope_obj)
        if scope_obj is not None:
            await self._scope_disposed(name, [], call, purge, None, scope_obj=scope_obj)
        return purge

    async def _scope_disposed(
        self,
        scope_ref: str,
        items: Sequence[Mapping[str, Any]],
        call: str | None,
        purge: ScopePurge | None,
        exc: BaseException | None,
        *,
        scope_obj: Mapping[str, Any] | None = None,
    ) -> None:
        if self.observer is None:
            return
        scope: str | None = None
        thread_id: str | None = None
        try:
            obj = scope_obj or await self.objects.get(SANDBOX_SCOPE_PLURAL, scope_ref)
            spec = obj.get("spec") or {}
            scope, thread_id = spec.get("scope"), spec.get("threadId")
        except Exception:  # gone already, or not readable: fall back to a Sandbox's key
            for item in items:
                key = key_from_object(item)
                if key is not None:
                    scope, thread_id = key.scope, key.thread_id
                    break
        notify(
            self.observer,
            "scope_disposed",
            lambda: ScopeDisposed(
                scope=scope,
                thread_id=thread_id,
                scope_ref=scope_ref,
                namespace=self.namespace,
                call=call,
                count=purge.disposed if purge is not None else 0,
                failure=failure_name(exc),
                undisposed=purge.undisposed if purge is not None else (),
            ),
        )

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


def _log_report_failure(exc: Exception) -> None:
    _observe_log.warning("sandbox observer: reporting egress failed (%s)", type(exc).__name__)
