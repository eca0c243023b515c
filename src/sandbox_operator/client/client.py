"""``SandboxClient``: acquire sandboxes as ``Sandbox`` custom resources and wait for them.

The client never decides a conversation's scope or thread: it takes ``scope_ref``, the name of a
``SandboxScope`` the *host* created in the namespace, and reads scope and thread from it. The
model, which only ever talks to tools, cannot name another conversation's sandbox.

``acquire`` is get-or-create: the Sandbox's name is derived from the key
(:func:`sandbox_operator.naming.sandbox_name`) and the object is written with server-side apply,
so two callers racing on one key converge on one object (and one pod). Then the client *watches*
the Sandbox (it never polls) until ``Ready=True`` or a terminal reason, raising that reason's
exception the moment the operator reports it; it also watches the SandboxScope, so a scope
deleted while a caller waits raises promptly.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio import watch as k8s_watch
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.stream import WsApiClient

from sandbox_operator import labels as lbl
from sandbox_operator import naming
from sandbox_operator.client.dataplane import (
    DataPlane,
    DirEntry,
    ExecResult,
    FileStat,
    pod_dataplane,
)
from sandbox_operator.client.errors import (
    DataPlaneError,
    SandboxAcquireError,
    SandboxForbidden,
    SandboxGone,
    SandboxNotReadyInTime,
    SandboxNotSuspendable,
    SandboxNotSuspendedInTime,
    SandboxScopeNotFound,
    SandboxSpecConflict,
    SandboxSpecRejected,
    SandboxSuspended,
    acquire_error_for,
    scrub,
)
from sandbox_operator.client.observer import (
    EffectiveState,
    EgressObserved,
    EgressWatermark,
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
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.contract import (
    API_VERSION,
    GROUP,
    SANDBOX_KIND,
    SANDBOX_PLURAL,
    SANDBOX_SCOPE_KIND,
    SANDBOX_SCOPE_PLURAL,
    VERSION,
    Capability,
    ConditionReason,
    IsolationScope,
    SandboxKey,
    SandboxResourceSpec,
    SandboxSpec,
)
from sandbox_operator.contract.resources import EgressSummary

_observe_log = logging.getLogger("sandbox_operator.client.observer")

_SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

#: Builds a data plane for a Ready Sandbox, keyed by ``status.servedBy.kind``.
DataPlaneFactory = Callable[["SandboxClient", Mapping[str, Any]], DataPlane]
_DATAPLANES: dict[str, DataPlaneFactory] = {}


def register_dataplane(served_by_kind: str, factory: DataPlaneFactory) -> None:
    """Teach every client how to reach sandboxes served by a ``servedBy.kind`` (e.g. an ACA
    session). ``Pod`` is built in."""
    _DATAPLANES[served_by_kind] = factory


def _pod_factory(client: SandboxClient, obj: Mapping[str, Any]) -> DataPlane:
    served = (obj.get("status") or {}).get("servedBy") or {}
    namespace = served.get("namespace") or obj["metadata"]["namespace"]
    if namespace != client.namespace:
        raise DataPlaneError("the sandbox is served from another namespace")
    return pod_dataplane(client.ws_api, namespace, served["name"])


register_dataplane("Pod", _pod_factory)


class CarriesHostTools(Protocol):
    """What :meth:`SandboxClient.acquire` reads from a host-tool registry: sealing it (a served
    sandbox's record must not change under it) and the names it carries."""

    def aggregate(self) -> object: ...

    @property
    def names(self) -> tuple[str, ...]: ...


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def effective_state(
    obj: Mapping[str, Any],
    spec: SandboxSpec,
    *,
    host_tools: Sequence[str] = (),
    call: str | None = None,
) -> EffectiveState:
    """The :class:`EffectiveState` of a served Sandbox, from the status the operator wrote."""
    status = obj.get("status") or {}
    served = status.get("servedBy") or {}
    admitted_allow = status.get("admittedEgressAllow")
    allow = admitted_allow if admitted_allow is not None else list(spec.egress_allow)
    required = tuple(c.value for c in Capability if c in spec.requires)
    return EffectiveState(
        backend=_text(status.get("backend")),
        isolation=_text(status.get("isolation")),
        isolation_floor=_text(status.get("effectiveFloor")),
        isolation_scope=_text(status.get("isolationScope")),
        served_by_kind=_text(served.get("kind")),
        served_from=_text(status.get("servedFrom")),
        egress=spec.egress.value,
        egress_allow=tuple(str(h) for h in allow),
        capabilities_required=required,
        capabilities_matched=required,
        capabilities_offered=None,
        host_tools=tuple(host_tools),
        call=call,
    )


def key_from_object(obj: Mapping[str, Any]) -> SandboxKey | None:
    """The sandbox key a Sandbox object carries in its annotations (None if it carries none)."""
    ann = (obj.get("metadata") or {}).get("annotations") or {}
    try:
        return SandboxKey(
            scope=ann[lbl.SCOPE_ANNOTATION],
            thread_id=ann[lbl.THREAD_ANNOTATION],
            agent_dir=ann[lbl.AGENT_DIR_ANNOTATION],
            call_id=ann.get(lbl.CALL_ANNOTATION, ""),
        )
    except (KeyError, ValueError):
        return None


def _conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {c.get("type", ""): c for c in (obj.get("status") or {}).get("conditions") or []}


def _evaluate(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    """("ready" | "pending" | "terminal", reason, message) for a Sandbox object."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    observed = status.get("observedGeneration")
    conds = _conditions(obj)
    disposed = conds.get("Disposed")
    if disposed is not None and disposed.get("status") == "True":
        return "terminal", disposed.get("reason") or "Disposed", disposed.get("message", "")
    admitted = conds.get("Admitted")
    stale = observed is not None and meta.get("generation") and observed < meta["generation"]
    if admitted is not None and admitted.get("status") == "False" and not stale:
        reason = admitted.get("reason", "")
        if acquire_error_for(reason) is not None:
            return "terminal", reason, admitted.get("message", "")
    ready = conds.get("Ready")
    if ready is not None and not stale:
        reason = ready.get("reason", "")
        if ready.get("status") == "True":
            return "ready", reason, ""
        if acquire_error_for(reason) is not None:
            return "terminal", reason, ready.get("message", "")
        return "pending", reason, ready.get("message", "")
    return "pending", (admitted or {}).get("reason", "") or "Pending", ""


#: The Ready reason of a suspended Sandbox.
_SUSPENDED = ConditionReason.SUSPENDED.value

#: What a wait is for: ``ready`` (acquire: Suspended is terminal), ``resumed`` (a wait that
#: resumed the sandbox: Suspended is on its way back unless the spec says suspended again),
#: ``suspended`` (a suspend: done once the operator reports Suspended for the current spec).
_Goal = Literal["ready", "resumed", "suspended"]


def _stale(obj: Mapping[str, Any]) -> bool:
    meta = obj.get("metadata") or {}
    observed = (obj.get("status") or {}).get("observedGeneration")
    return bool(observed is not None and meta.get("generation") and observed < meta["generation"])


def _suspended_now(obj: Mapping[str, Any]) -> bool:
    """The operator reports the Sandbox suspended for its current spec (Ready=False Suspended)."""
    ready = _conditions(obj).get("Ready")
    return (
        ready is not None
        and not _stale(obj)
        and ready.get("status") == "False"
        and ready.get("reason") == _SUSPENDED
    )


def is_suspended(obj: Mapping[str, Any]) -> bool:
    """Whether a Sandbox object is suspended or on its way there, whatever suspended it: its spec
    says ``suspended``, or its status says it is (``suspendedBy``, Ready reason ``Suspended``)."""
    if (obj.get("spec") or {}).get("suspended"):
        return True
    if (obj.get("status") or {}).get("suspendedBy"):
        return True
    ready = _conditions(obj).get("Ready")
    return ready is not None and ready.get("reason") == _SUSPENDED


def _evaluate_for(obj: Mapping[str, Any], goal: _Goal) -> tuple[str, str, str]:
    """:func:`_evaluate` for a wait with a goal; "ready" means the goal is reached."""
    if goal == "suspended":
        if _suspended_now(obj):
            return "ready", _SUSPENDED, ""
        state, reason, message = _evaluate(obj)
        # Ready (still, or for an older spec) is on its way to Suspended.
        return ("pending", reason, message) if state == "ready" else (state, reason, message)
    state, reason, message = _evaluate(obj)
    if goal == "resumed" and state == "terminal" and reason == _SUSPENDED:
        if (obj.get("spec") or {}).get("suspended"):
            # Suspended again (spec.suspended true) while the resume was waited on.
            return "terminal", reason, message or "spec.suspended was set again"
        return "pending", reason, message
    return state, reason, message


def _plane_of(sandbox: Sandbox | str) -> _ServedPlane | None:
    if isinstance(sandbox, Sandbox) and isinstance(sandbox.dataplane, _ServedPlane):
        return sandbox.dataplane
    return None


def _served_by(obj: Mapping[str, Any]) -> object:
    return (obj.get("status") or {}).get("servedBy")


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


class _ServedPlane:
    """The data plane of a handle acquired through the client: it talks to whatever serves the
    Sandbox now. A suspend closes the served plane; the next use resumes the Sandbox and talks to
    the new pod. A data-plane failure on a Sandbox found suspended behind the handle's back (the
    idle timeout, ``kubectl patch``) raises :class:`SandboxSuspended`; the next use resumes it."""

    def __init__(self, client: SandboxClient, inner: DataPlane, served_by: object) -> None:
        self.client = client
        self.inner: DataPlane | None = inner
        self.served_by = served_by
        self.handle: Sandbox | None = None
        self._lock = asyncio.Lock()

    @property
    def suspended(self) -> bool:
        return self.inner is None

    async def drop(self) -> None:
        """The pod is going away: close the served plane; the next use resumes."""
        inner, self.inner = self.inner, None
        if inner is not None:
            with contextlib.suppress(Exception):
                await inner.close()

    async def serve(self, inner: DataPlane, served_by: object) -> None:
        old, self.inner, self.served_by = self.inner, inner, served_by
        if old is not None and old is not inner:
            with contextlib.suppress(Exception):
                await old.close()

    async def _live(self) -> DataPlane:
        async with self._lock:
            if self.inner is None and self.handle is not None:
                await self.client.resume(self.handle)
        if self.inner is None:
            raise DataPlaneError("the sandbox is suspended")
        return self.inner

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        plane = await self._live()
        try:
            return await getattr(plane, method)(*args, **kwargs)
        except DataPlaneError as exc:
            handle = self.handle
            if handle is None or not await self.client._found_suspended(handle.name):
                raise
            await self.drop()
            raise SandboxSuspended(
                sandbox=handle.name,
                namespace=handle.namespace,
                message="the sandbox was suspended; the next use of the handle resumes it",
            ) from exc

    async def exec(self, *args: Any, **kwargs: Any) -> ExecResult:
        result: ExecResult = await self._call("exec", *args, **kwargs)
        return result

    async def write_file(self, *args: Any, **kwargs: Any) -> None:
        await self._call("write_file", *args, **kwargs)

    async def read_file(self, *args: Any, **kwargs: Any) -> bytes:
        data: bytes = await self._call("read_file", *args, **kwargs)
        return data

    async def stat(self, *args: Any, **kwargs: Any) -> FileStat:
        st: FileStat = await self._call("stat", *args, **kwargs)
        return st

    async def list_dir(self, *args: Any, **kwargs: Any) -> list[DirEntry]:
        entries: list[DirEntry] = await self._call("list_dir", *args, **kwargs)
        return entries

    async def remove(self, *args: Any, **kwargs: Any) -> bool:
        removed: bool = await self._call("remove", *args, **kwargs)
        return removed

    async def close(self) -> None:
        await self.drop()


class SandboxClient:
    """Async client for one namespace. Build it with :meth:`from_kubeconfig` or
    :meth:`in_cluster`, or hand it a configured ``kubernetes_asyncio`` ``ApiClient``.

    ``field_manager`` names this client in server-side apply (one per client by default).
    ``observer`` receives the client's events (see :mod:`sandbox_operator.client.observer`);
    without one, no event is built.
    """

    def __init__(
        self,
        api_client: k8s.ApiClient,
        namespace: str,
        *,
        field_manager: str | None = None,
        default_timeout: float = 300.0,
        observer: SandboxObserver | None = None,
    ) -> None:
        self.observer = observer
        #: egress reporting progress per Sandbox (name, uid)
        self._egress_marks: dict[tuple[str, str], EgressWatermark] = {}
        #: the newest last-activity stamp written per Sandbox: stamps never go back
        self._activity_stamps: dict[str, datetime] = {}
        self.api = api_client
        self.namespace = namespace
        self.field_manager = field_manager or f"sandbox-client-{secrets.token_hex(4)}"
        self.default_timeout = default_timeout
        self.custom = k8s.CustomObjectsApi(api_client)
        self.ws_api = WsApiClient(configuration=api_client.configuration)

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
        cfg = k8s.Configuration()
        await k8s_config.load_kube_config(
            config_file=str(kubeconfig) if kubeconfig else None,
            context=context,
            client_configuration=cfg,
        )
        return cls(k8s.ApiClient(configuration=cfg), namespace, **kwargs)

    @classmethod
    def in_cluster(cls, namespace: str | None = None, **kwargs: Any) -> SandboxClient:
        """From the pod's service account (namespace: the pod's own unless given)."""
        cfg = k8s.Configuration()
        k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        if namespace is None:
            with open(_SA_NAMESPACE) as fh:
                namespace = fh.read().strip()
        return cls(k8s.ApiClient(configuration=cfg), namespace, **kwargs)

    async def close(self) -> None:
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
        written to ``status.egress`` since the last report; returns how many. Without an
        observer it reads nothing and returns 0. Decisions the proxy has not written yet (it
        writes at an interval) are not seen; ``missed_before`` counts those it no longer shows."""
        if self.observer is None:
            return 0
        name = sandbox if isinstance(sandbox, str) else sandbox.name
        try:
            obj: Mapping[str, Any] = await self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, SANDBOX_PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return 0
            raise
        key = sandbox.key if isinstance(sandbox, Sandbox) else None
        return self._report_egress_obj(obj, key)

    def _report_egress_obj(self, obj: Mapping[str, Any], key: SandboxKey | None) -> int:
        observer = self.observer
        raw = (obj.get("status") or {}).get("egress")
        if observer is None or not raw:
            return 0
        key = key or key_from_object(obj)
        if key is None:
            return 0
        summary = EgressSummary.model_validate(raw)
        meta = obj.get("metadata") or {}
        name = meta.get("name", "")
        mark = self._egress_marks.setdefault((name, meta.get("uid", "")), EgressWatermark())
        total = summary.allowed + summary.denied + summary.unreachable
        fresh = mark.advance(summary.since, total, summary.recent)
        for missed, record in fresh:
            notify(
                observer,
                "egress_observed",
                functools.partial(
                    EgressObserved,
                    key=key,
                    call=None,
                    sandbox=name,
                    time=record.time,
                    verdict=record.verdict,
                    reason=record.reason,
                    method=record.method,
                    host=record.host,
                    port=record.port,
                    missed_before=missed,
                ),
            )
        return len(fresh)

    # -- host side: scopes ----------------------------------------------------------------

    async def create_scope(
        self,
        *,
        scope: str,
        thread_id: str,
        name: str | None = None,
        min_isolation: str | None = None,
        min_isolation_scope: str | None = None,
    ) -> str:
        """Create (or converge) the SandboxScope of a conversation; returns its name. For the
        *host*: an agent's service account should not be able to do this."""
        name = name or naming.scope_name(scope, thread_id)
        spec: dict[str, Any] = {"scope": scope, "threadId": thread_id}
        if min_isolation:
            spec["minIsolation"] = min_isolation
        if min_isolation_scope:
            spec["minIsolationScope"] = min_isolation_scope
        body = {
            "apiVersion": API_VERSION,
            "kind": SANDBOX_SCOPE_KIND,
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": spec,
        }
        await self._apply(SANDBOX_SCOPE_PLURAL, name, body)
        return name

    async def delete_scope(
        self,
        name: str,
        *,
        wait: bool = False,
        timeout: float = 120.0,  # noqa: ASYNC109
    ) -> None:
        """Delete a SandboxScope (the operator disposes its sandboxes). Missing is success."""
        await self._delete(SANDBOX_SCOPE_PLURAL, name)
        if wait:
            await self._wait_gone(SANDBOX_SCOPE_PLURAL, name, timeout)

    # -- agent side -------------------------------------------------------------------------

    async def _read_scope(self, scope_ref: str) -> Mapping[str, Any]:
        try:
            obj: Mapping[str, Any] = await self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, SANDBOX_SCOPE_PLURAL, scope_ref
            )
        except ApiException as exc:
            if exc.status == 403:
                raise SandboxForbidden(
                    namespace=self.namespace, action="get sandboxscopes"
                ) from None
            if exc.status == 404:
                raise SandboxScopeNotFound(
                    sandbox="", namespace=self.namespace, message=f"no SandboxScope {scope_ref!r}"
                ) from None
            raise
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            raise SandboxGone(
                sandbox="",
                namespace=self.namespace,
                reason="ScopeDeleted",
                message=f"SandboxScope {scope_ref!r} is being deleted",
            )
        return obj

    def key_for(self, scope_obj: Mapping[str, Any], agent_dir: str, call_id: str) -> SandboxKey:
        spec = scope_obj.get("spec") or {}
        return SandboxKey(
            scope=spec["scope"], thread_id=spec["threadId"], agent_dir=agent_dir, call_id=call_id
        )

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
        scope_obj = await self._read_scope(scope_ref)
        key = self.key_for(scope_obj, agent_dir, call_id)
        name = naming.sandbox_name(key)
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
                lambda: self._acquired(key, call, name, started, refusal=refusal),
            )
            raise
        notify(
            self.observer,
            "sandbox_acquired",
            lambda: self._acquired(key, call, name, started, state=sandbox.effective_state),
        )
        return sandbox

    def _acquired(
        self,
        key: SandboxKey,
        call: str | None,
        name: str,
        started: float,
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
                "labels": lbl.key_labels(key),
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
        dataplane = _ServedPlane(self, self._dataplane(obj), _served_by(obj))

        async def touch() -> None:
            await self.touch(name)

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
        )
        dataplane.handle = sandbox
        return sandbox

    async def touch(self, name: str) -> None:
        """Stamp the Sandbox's last-activity annotation (the operator's idle timeout counts from
        it). The handle does this by itself, at most every 30 seconds, while it is used."""
        await self._stamp_activity(name, datetime.now(UTC))

    async def _stamp_activity(self, name: str, when: datetime) -> None:
        # A stamp written late (the handle's background touch) must not undo a newer one (a
        # resume's, which may be ahead of this clock).
        when = max(when, self._activity_stamps.get(name, when))
        self._activity_stamps[name] = when
        stamp = when.strftime("%Y-%m-%dT%H:%M:%SZ")
        await self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            SANDBOX_PLURAL,
            name,
            {"metadata": {"annotations": {lbl.LAST_ACTIVITY_ANNOTATION: stamp}}},
            field_manager=f"{self.field_manager}-activity",
            _content_type="application/merge-patch+json",  # type: ignore[call-arg]
        )

    def _dataplane(self, obj: Mapping[str, Any]) -> DataPlane:
        served = (obj.get("status") or {}).get("servedBy") or {}
        factory = _DATAPLANES.get(served.get("kind", ""))
        if factory is None:
            raise DataPlaneError(f"no data plane for servedBy kind {served.get('kind')!r}")
        return factory(self, obj)

    async def _wait_ready(
        self, name: str, scope_ref: str, body: dict[str, Any], last: dict[str, str]
    ) -> Mapping[str, Any]:
        obj = await self._apply(SANDBOX_PLURAL, name, body)
        while (obj.get("metadata") or {}).get("deletionTimestamp"):
            # A previous sandbox under this key is still going away: wait, then recreate.
            await self._wait_gone(SANDBOX_PLURAL, name, None)
            obj = await self._apply(SANDBOX_PLURAL, name, body)
        goal: _Goal = "ready"
        if is_suspended(obj):
            # Suspended (by spec, kubectl or the idle timeout): acquiring it resumes it.
            obj = await self._start_resume(name, obj)
            goal = "resumed"
        sandbox_watch = asyncio.ensure_future(self._watch_sandbox(name, obj, last, goal=goal))
        scope_watch = asyncio.ensure_future(self._watch_scope_deleted(scope_ref))
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

    def _raise_terminal(self, name: str, reason: str, message: str) -> None:
        cls = acquire_error_for(reason) or SandboxAcquireError
        raise cls(sandbox=name, namespace=self.namespace, reason=reason, message=message)

    async def _watch_sandbox(
        self, name: str, obj: Mapping[str, Any], last: dict[str, str], *, goal: _Goal = "ready"
    ) -> Mapping[str, Any]:
        """Return the object once Ready (or, for ``goal="suspended"``, Suspended); raise on a
        terminal reason or deletion."""
        while True:
            state, reason, message = _evaluate_for(obj, goal)
            last["reason"] = reason
            if state == "ready":
                return obj
            if state == "terminal":
                self._raise_terminal(name, reason, message)
            if (obj.get("metadata") or {}).get("deletionTimestamp"):
                raise SandboxGone(
                    sandbox=name,
                    namespace=self.namespace,
                    reason="Deleted",
                    message="the Sandbox is being deleted",
                )
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            event = await self._next_event(SANDBOX_PLURAL, name, rv)
            if event is None:  # relist
                try:
                    obj = await self.custom.get_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, SANDBOX_PLURAL, name
                    )
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                    raise SandboxGone(
                        sandbox=name,
                        namespace=self.namespace,
                        reason="Deleted",
                        message="the Sandbox was deleted while waiting",
                    ) from None
                continue
            kind, new = event
            if kind == "DELETED":
                raise SandboxGone(
                    sandbox=name,
                    namespace=self.namespace,
                    reason="Deleted",
                    message="the Sandbox was deleted while waiting",
                )
            obj = new

    async def _next_event(
        self, plural: str, name: str, resource_version: str | None
    ) -> tuple[str, Mapping[str, Any]] | None:
        """The next event on one object after ``resource_version`` (None: relist needed)."""
        w = k8s_watch.Watch()
        try:
            stream = w.stream(
                self.custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                plural,
                field_selector=f"metadata.name={name}",
                resource_version=resource_version,
                timeout_seconds=60,
                allow_watch_bookmarks=False,
            )
            async for event in stream:
                kind = event.get("type", "")
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    return kind, event["object"]
        except ApiException as exc:
            if exc.status == 410:
                return None
            raise
        finally:
            w.stop()
            await w.close()
        return None

    async def _watch_scope_deleted(self, scope_ref: str) -> None:
        """Return when the SandboxScope is deleted or marked for deletion."""
        while True:
            try:
                obj = await self._read_scope(scope_ref)
            except (SandboxScopeNotFound, SandboxGone):
                return
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            while True:
                event = await self._next_event(SANDBOX_SCOPE_PLURAL, scope_ref, rv)
                if event is None:
                    break
                kind, new = event
                if kind == "DELETED" or (new.get("metadata") or {}).get("deletionTimestamp"):
                    return
                rv = (new.get("metadata") or {}).get("resourceVersion")

    # -- suspend and resume -------------------------------------------------------------------

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
        name = sandbox if isinstance(sandbox, str) else sandbox.name
        obj = await self._get_sandbox(name)
        spec = obj.get("spec") or {}
        if not spec.get("storage"):
            raise SandboxNotSuspendable(sandbox=name, namespace=self.namespace)
        if not spec.get("suspended"):
            obj = await self._patch_suspended(name, True)
        plane = _plane_of(sandbox)
        if plane is not None:
            await plane.drop()
        if not wait:
            return
        deadline = timeout if timeout is not None else self.default_timeout
        last = {"reason": ""}
        try:
            async with asyncio.timeout(deadline):
                await self._watch_sandbox(name, obj, last, goal="suspended")
        except TimeoutError:
            raise SandboxNotSuspendedInTime(
                sandbox=name, namespace=self.namespace, timeout=deadline, last_reason=last["reason"]
            ) from None

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
        :class:`SandboxNotReadyInTime`. Without ``wait``, a handle's next use waits."""
        name = sandbox if isinstance(sandbox, str) else sandbox.name
        obj = await self._get_sandbox(name)
        was_suspended = is_suspended(obj)
        if was_suspended:
            obj = await self._start_resume(name, obj)
        plane = _plane_of(sandbox)
        if not wait:
            if plane is not None and was_suspended:
                await plane.drop()
            return
        deadline = timeout if timeout is not None else self.default_timeout
        last = {"reason": ""}
        try:
            async with asyncio.timeout(deadline):
                obj = await self._watch_sandbox(name, obj, last, goal="resumed")
        except TimeoutError:
            raise SandboxNotReadyInTime(
                sandbox=name, namespace=self.namespace, timeout=deadline, last_reason=last["reason"]
            ) from None
        if plane is not None and isinstance(sandbox, Sandbox):
            await self._serve_again(sandbox, plane, obj)

    async def _serve_again(
        self, sandbox: Sandbox, plane: _ServedPlane, obj: Mapping[str, Any]
    ) -> None:
        """Point a handle at what serves its Sandbox now (a new pod after a resume)."""
        served = _served_by(obj)
        if not plane.suspended and served == plane.served_by:
            return
        await plane.serve(self._dataplane(obj), served)
        old = sandbox.effective_state
        if old is not None:
            fresh = effective_state(obj, sandbox.spec, host_tools=old.host_tools, call=old.call)
            sandbox._effective_state = fresh

    async def _start_resume(self, name: str, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        """Ask for a suspended Sandbox to be resumed; returns the object to watch from."""
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        if spec.get("suspended"):
            obj = await self._patch_suspended(name, False)
        elif status.get("suspendedBy") != "spec":
            # Suspended by the idle timeout (spec.suspended is false): activity newer than the
            # suspension resumes it. (By spec with spec.suspended already false: on its way.)
            await self._touch_after(name, _parse_time(status.get("suspendedAt")))
        return obj

    async def _touch_after(self, name: str, after: datetime | None) -> None:
        """Stamp activity strictly newer than ``after`` (the operator's suspension time): now,
        or the second after ``after`` when this clock is not past it (the stamp has whole
        seconds, and the operator's clock may be ahead of this one)."""
        when = datetime.now(UTC).replace(microsecond=0)
        if after is not None:
            when = max(when, after.replace(microsecond=0) + timedelta(seconds=1))
        await self._stamp_activity(name, when)

    async def _get_sandbox(self, name: str) -> Mapping[str, Any]:
        try:
            obj: Mapping[str, Any] = await self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, SANDBOX_PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 403:
                raise SandboxForbidden(namespace=self.namespace, action="get sandboxes") from None
            if exc.status == 404:
                raise SandboxGone(
                    sandbox=name, namespace=self.namespace, message="no such Sandbox"
                ) from None
            raise
        return obj

    async def _patch_suspended(self, name: str, value: bool) -> Mapping[str, Any]:
        try:
            obj: Mapping[str, Any] = await self.custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                SANDBOX_PLURAL,
                name,
                {"spec": {"suspended": value}},
                field_manager=f"{self.field_manager}-suspend",
                _content_type="application/merge-patch+json",  # type: ignore[call-arg]
            )
        except ApiException as exc:
            message = scrub(_api_message(exc))
            if exc.status == 403:
                raise SandboxForbidden(namespace=self.namespace, action="patch sandboxes") from None
            if exc.status == 404:
                raise SandboxGone(
                    sandbox=name, namespace=self.namespace, message="no such Sandbox"
                ) from None
            if exc.status in (400, 422):
                if value and "storage" in message:
                    raise SandboxNotSuspendable(
                        sandbox=name, namespace=self.namespace, message=message
                    ) from None
                raise SandboxSpecRejected(
                    sandbox=name, namespace=self.namespace, message=message
                ) from None
            raise
        if not isinstance(obj, Mapping):
            obj = await self._get_sandbox(name)
        return obj

    async def _found_suspended(self, name: str) -> bool:
        """Whether the Sandbox is suspended now (False when it cannot be read)."""
        try:
            return is_suspended(await self._get_sandbox(name))
        except Exception:
            return False

    async def dispose(self, sandbox: Sandbox | str, *, wait: bool = False) -> None:
        """Delete a Sandbox (by handle or name). Missing is success.

        With an observer, the Sandbox is read first: egress decisions not yet reported are
        delivered (``EgressObserved``), and a dispose by name learns the key from the object;
        then the delete is reported as ``SandboxDisposed``. A Sandbox already gone when disposed
        by name has no key to report and yields no event."""
        name = sandbox if isinstance(sandbox, str) else sandbox.name
        key = None if isinstance(sandbox, str) else sandbox.key
        if not isinstance(sandbox, str):
            with contextlib.suppress(Exception):
                await sandbox.close()
        uid = ""
        if self.observer is not None:
            try:
                obj = await self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, SANDBOX_PLURAL, name
                )
            except Exception:  # reporting must not stop the delete
                obj = None
            if isinstance(obj, Mapping):
                key = key or key_from_object(obj)
                uid = (obj.get("metadata") or {}).get("uid", "")
                try:
                    self._report_egress_obj(obj, key)
                except Exception as exc:
                    _log_report_failure(exc)
        call = record_key(key)
        try:
            await self._delete(SANDBOX_PLURAL, name)
        except BaseException as exc:
            self._disposed(key, call, name, exc)
            raise
        self._disposed(key, call, name, None)
        self._egress_marks.pop((name, uid), None)
        self._activity_stamps.pop(name, None)
        if wait:
            await self._wait_gone(SANDBOX_PLURAL, name, 120.0)

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

    async def dispose_scope(self, scope_ref: str) -> int:
        """Delete every Sandbox of one SandboxScope in the namespace; returns how many deletes
        were issued. The SandboxScope itself is the host's to delete.

        With an observer, the listed Sandboxes' unreported egress decisions are delivered first,
        and the disposal is reported as one ``ScopeDisposed`` (count, or the failure's class
        name) naming the conversation by ``(scope, thread_id)``."""
        call = record_key(None)
        count = 0
        items: list[Mapping[str, Any]] = []
        try:
            listing = await self.custom.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, SANDBOX_PLURAL
            )
            items = [
                item
                for item in listing.get("items", [])
                if (item.get("spec") or {}).get("scopeRef") == scope_ref
            ]
            if self.observer is not None:
                for item in items:
                    try:
                        self._report_egress_obj(item, None)
                    except Exception as exc:
                        _log_report_failure(exc)
            for item in items:
                await self._delete(SANDBOX_PLURAL, item["metadata"]["name"])
                count += 1
        except BaseException as exc:
            await self._scope_disposed(scope_ref, items, call, count, exc)
            raise
        await self._scope_disposed(scope_ref, items, call, count, None)
        return count

    async def _scope_disposed(
        self,
        scope_ref: str,
        items: Sequence[Mapping[str, Any]],
        call: str | None,
        count: int,
        exc: BaseException | None,
    ) -> None:
        if self.observer is None:
            return
        scope: str | None = None
        thread_id: str | None = None
        try:
            obj = await self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, SANDBOX_SCOPE_PLURAL, scope_ref
            )
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
                count=count,
                failure=failure_name(exc),
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
                    scope_obj = await self._read_scope(scope_ref)
                    name = naming.sandbox_name(self.key_for(scope_obj, agent_dir, call_id))
            if name is not None:
                await asyncio.shield(self.dispose(name))

    # -- plumbing ---------------------------------------------------------------------------

    async def _apply(self, plural: str, name: str, body: dict[str, Any]) -> Mapping[str, Any]:
        try:
            obj: Mapping[str, Any] = await self.custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                plural,
                name,
                body,
                field_manager=self.field_manager,
                _content_type="application/apply-patch+yaml",  # type: ignore[call-arg]
            )
        except ApiException as exc:
            message = scrub(_api_message(exc))
            if exc.status == 403:
                raise SandboxForbidden(namespace=self.namespace, action=f"apply {plural}") from None
            if exc.status == 409:
                raise SandboxSpecConflict(
                    sandbox=name, namespace=self.namespace, message=message
                ) from None
            if exc.status in (400, 422):
                raise SandboxSpecRejected(
                    sandbox=name, namespace=self.namespace, message=message
                ) from None
            raise
        if not isinstance(obj, Mapping):
            # Some responses (e.g. a no-op apply) come back without a decoded body.
            obj = await self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, plural, name
            )
        return obj

    async def _delete(self, plural: str, name: str) -> None:
        try:
            await self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, plural, name
            )
        except ApiException as exc:
            if exc.status == 403:
                raise SandboxForbidden(
                    namespace=self.namespace, action=f"delete {plural}"
                ) from None
            if exc.status != 404:
                raise

    async def _wait_gone(self, plural: str, name: str, timeout: float | None) -> None:  # noqa: ASYNC109
        async with asyncio.timeout(timeout):
            while True:
                try:
                    obj = await self.custom.get_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, plural, name
                    )
                except ApiException as exc:
                    if exc.status == 404:
                        return
                    raise
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                while True:
                    event = await self._next_event(plural, name, rv)
                    if event is None:
                        break
                    if event[0] == "DELETED":
                        return
                    rv = (event[1].get("metadata") or {}).get("resourceVersion")


def _log_report_failure(exc: Exception) -> None:
    _observe_log.warning("sandbox observer: reporting egress failed (%s)", type(exc).__name__)


def _api_message(exc: ApiException) -> str:
    import json

    try:
        doc = json.loads(exc.body or "{}")
    except (ValueError, TypeError):
        return exc.reason or ""
    return str(doc.get("message") or exc.reason or "")
