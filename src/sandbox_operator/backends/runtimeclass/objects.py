"""The API calls on the objects a runtime-class sandbox is made of (the NetworkPolicy of its
backend and egress mode, its work volume claim and pod, and the pod's events): creating the
first two, reading, listing by label, and deleting, with the operator's watched views in front
where it has them. A base class of :class:`~.driver.RuntimeClassDriver`, which decides what to
create and what a pod's state means.

The API objects (``_core``, ``_net``) are bound here (:meth:`RuntimeClassObjects._bind_api`), so
the calls made on them read together with where they come from (tests/unit/test_chart_rbac.py
derives the chart's RBAC from them, module by module)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, TypedDict

from sandbox_operator import labels as lbl
from sandbox_operator import naming
from sandbox_operator.backends.base import (
    BackendObject,
    DisposalError,
    EnsureRequest,
    SandboxRef,
    StartupError,
    TransientError,
    WatchedObjects,
)
from sandbox_operator.backends.manifests import NetworkPolicy
from sandbox_operator.backends.runtimeclass.config import RuntimeClassBackendConfig
from sandbox_operator.backends.runtimeclass.observe import backend_object, foreign_claim
from sandbox_operator.backends.runtimeclass.pods import (
    CLAIM,
    NETWORK_POLICY,
    POD,
    build_egress_policy,
    build_work_volume_claim,
    egress_policy_key,
    policy_spec_differs,
)
from sandbox_operator.contract import (
    ConditionReason,
    DisposalCode,
    DisposalFailure,
    Egress,
    SandboxKey,
)
from sandbox_operator.egress.config import ManagedEgressProxySettings
from sandbox_operator.kubeapi import api_message
from sandbox_operator.kubecalls import call_json, read_or_none
from sandbox_operator.views import DeleteAnswerView, EventView, ListView, ObjectView, PodView
from sandbox_operator.views.fields import mapping

#: The package's logger (the name it had when the package was one module).
log = logging.getLogger(__package__)


class DeleteOptions(TypedDict, total=False):
    """The keyword arguments of a kubernetes_asyncio delete call the backend sets."""

    grace_period_seconds: int


def _delete_options(kind: str, grace: int | None) -> DeleteOptions:
    """The query of a delete of ``kind``: a pod's with ``grace`` seconds (the backend's
    ``pod.disposalGracePeriodSeconds`` for a disposal); none (the pod's own grace, and every
    other kind's delete) when ``grace`` is None."""
    if kind != POD or grace is None:
        return {}
    return {"grace_period_seconds": grace}


def deletion_landed(kind: str, answer: DeleteAnswerView) -> bool:
    """Whether a delete's answer says the object is gone from the API server: a Status, or the
    object as it was last with no finalizer left and no grace period (what a pod deleted with no
    grace period answers: its final state, deletionTimestamp set, already removed)."""
    if answer.is_status:
        return True
    meta = answer.metadata
    if answer.kind != kind or meta.finalizers:
        return False
    return not meta.deleting or meta.deletion_grace_period_seconds == 0


class RuntimeClassObjects:
    """Creating, reading, listing and deleting a sandbox's objects on one RuntimeClass backend.

    ``_core``/``_net`` are kubernetes_asyncio's CoreV1Api and NetworkingV1Api; the views
    (``_pods``, ``_network_policies``, ``_claims``) are the operator's, None for one-off callers.
    """

    _config: RuntimeClassBackendConfig
    _api: Any
    _core: Any
    _net: Any
    _dispose_timeout: float
    _poll: float
    _pods: WatchedObjects[PodView] | None = None
    _network_policies: WatchedObjects[ObjectView] | None = None
    _claims: WatchedObjects[ObjectView] | None = None
    _proxy_settings: ManagedEgressProxySettings | None = None

    def _bind_api(self, api: Any) -> None:
        """Talk to the API server through ``api`` (a :class:`kubernetes_asyncio.client.ApiClient`).
        Typed as Any: bodies are plain manifests (dicts), which the client serializes as is."""
        from kubernetes_asyncio import client

        self._api = api
        self._core = client.CoreV1Api(api)
        self._net = client.NetworkingV1Api(api)

    @property
    def name(self) -> str:
        return self._config.name

    def _sanitize(self, obj: Any) -> Any:
        return self._api.sanitize_for_serialization(obj)

    # ---- creating and reading -------------------------------------------------------------

    async def _read_pod(self, namespace: str, name: str) -> PodView | None:
        if self._pods is not None:
            return self._pods.get(namespace, name)
        found = await read_or_none(self._api, self._core.read_namespaced_pod, name, namespace)
        return None if found is None else PodView(found)

    async def ensure_network_policy(self, request: EnsureRequest) -> None:
        """The NetworkPolicy that confines the request's pod (the namespace's policy of this
        backend and the spec's egress mode), in force before the pod exists or is claimed.

        Raises :class:`StartupError` when the API server refuses it."""
        await self.ensure_egress_policy(request.sandbox.namespace, request.spec.egress)

    def egress_policy_current(self, policy: ObjectView) -> bool:
        """Whether a namespace's egress policy of this backend (as the views or a watch event
        hold it) is the one :func:`build_egress_policy` makes now."""
        key = egress_policy_key(policy)
        if key is None or key[0] != self.name:
            return True  # not ours to judge
        meta = policy.metadata
        want = build_egress_policy(meta.namespace, key[1], self._config, self._proxy_settings)
        return meta.name == want["metadata"]["name"] and not policy_spec_differs(
            policy.spec, want["spec"]
        )

    async def ensure_egress_policy(self, namespace: str, egress: Egress) -> None:
        """Make the namespace's NetworkPolicy of this backend and ``egress`` what
        :func:`build_egress_policy` makes: no call when the views hold it so (every Sandbox but
        the first of its kind in a namespace); created when missing, replaced when it differs (a
        changed proxy, an edit). Concurrent callers for one policy share one call, so a burst of
        Sandboxes in a new namespace creates it once.

        Raises :class:`StartupError` when the API server refuses it."""
        want = build_egress_policy(namespace, egress, self._config, self._proxy_settings)
        name = str(want["metadata"]["name"])
        if self._network_policies is not None:
            have = self._network_policies.get(namespace, name)
            if have is not None and self.egress_policy_current(have):
                return
        calls = self.__dict__.setdefault("_egress_policy_calls", {})
        key = (namespace, name)
        call = calls.get(key)
        if call is None:
            call = asyncio.ensure_future(self._put_egress_policy(want))
            calls[key] = call

            def done(finished: asyncio.Future[None]) -> None:
                if calls.get(key) is finished:
                    del calls[key]

            call.add_done_callback(done)
        await asyncio.shield(call)

    async def _put_egress_policy(self, want: NetworkPolicy) -> None:
        """Create ``want``, or replace the policy under its name when that differs."""
        from kubernetes_asyncio.client.exceptions import ApiException

        meta = want["metadata"]
        ns, name = meta["namespace"], meta["name"]
        try:
            have: ObjectView | None
            if self._network_policies is not None:
                have = self._network_policies.get(ns, name)
            else:
                found = await read_or_none(
                    self._api, self._net.read_namespaced_network_policy, name, ns
                )
                have = None if found is None else ObjectView(found)
            if have is None:
                answer = await call_json(self._net.create_namespaced_network_policy, ns, want)
            elif self.egress_policy_current(have):
                return
            else:
                body: NetworkPolicy = {
                    **want,
                    "metadata": {**meta, "resourceVersion": have.metadata.resource_version},
                }
                answer = await call_json(
                    self._net.replace_namespaced_network_policy, name, ns, body
                )
                log.info("NetworkPolicy %s/%s differed from its backend's: replaced", ns, name)
        except ApiException as exc:
            if exc.status == 409:  # made or changed meanwhile: the watch brings it, judged again
                return
            raise StartupError(
                ConditionReason.STARTUP_FAILED,
                f"NetworkPolicy {name} was refused by the API server (HTTP {exc.status}): "
                f"{api_message(exc)[:500]}",
            ) from None
        if self._network_policies is not None:
            self._network_policies.upsert(answer)

    async def ensure_work_volume(self, request: EnsureRequest) -> None:
        """Create the sandbox's work volume (``spec.storage``) unless it is there: found in the
        views (or created, or already there: 409) and owned by this Sandbox. A claim under its
        name that another Sandbox owns (an earlier one of the same key, not disposed yet) or that
        is being deleted raises :class:`StartupError` ``KeyUnclean``: starting on it would hand
        the sandbox someone else's files, or a volume about to go."""
        from kubernetes_asyncio.client.exceptions import ApiException

        ns = request.sandbox.namespace
        claim = build_work_volume_claim(request)
        name = claim["metadata"]["name"]
        existing = self._claims.get(ns, name) if self._claims is not None else None
        if existing is None:
            try:
                created = await call_json(
                    self._core.create_namespaced_persistent_volume_claim, ns, claim
                )
                if self._claims is not None:
                    self._claims.upsert(created)
                return
            except ApiException as exc:
                if exc.status != 409:  # 409: already there (made by another pass or replica)
                    raise StartupError(
                        ConditionReason.STARTUP_FAILED,
                        f"PersistentVolumeClaim {name} was refused by the API server "
                        f"(HTTP {exc.status}): {api_message(exc)[:500]}",
                    ) from None
            try:
                existing = ObjectView(
                    await call_json(self._core.read_namespaced_persistent_volume_claim, name, ns)
                )
            except ApiException as exc:
                if exc.status == 404:  # deleted between our create and read: the next pass
                    raise TransientError(f"PersistentVolumeClaim {name} went away") from None
                raise TransientError(
                    f"reading PersistentVolumeClaim {name}: HTTP {exc.status}"
                ) from None
            if self._claims is not None:
                self._claims.upsert(existing)
        problem = foreign_claim(existing, request.sandbox.uid)
        if problem:
            raise StartupError(ConditionReason.KEY_UNCLEAN, problem)

    async def _work_volume_exists(self, request: EnsureRequest) -> bool:
        """Whether the sandbox's work volume exists: in the views, else asked once (a view not
        synced yet must not read as "gone")."""
        from kubernetes_asyncio.client.exceptions import ApiException

        ns, name = request.sandbox.namespace, naming.work_volume_name(request.sandbox.name)
        if self._claims is not None and self._claims.get(ns, name) is not None:
            return True
        try:
            await call_json(self._core.read_namespaced_persistent_volume_claim, name, ns)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise TransientError(
                f"reading PersistentVolumeClaim {name}: HTTP {exc.status}"
            ) from None
        return True

    async def _sandbox_events(self, pod: ObjectView) -> list[EventView] | None:
        """The kubelet's ``FailedCreatePodSandBox`` events of ``pod``; None when unreadable."""
        from kubernetes_asyncio.client.exceptions import ApiException

        meta = pod.metadata
        try:
            listed = await self._core.list_namespaced_event(
                meta.namespace,
                field_selector=f"involvedObject.uid={meta.uid},reason=FailedCreatePodSandBox",
            )
        except ApiException as exc:
            log.warning("cannot read the events of pod %s (HTTP %s)", meta.name, exc.status)
            return None
        return [EventView(mapping(e)) for e in ListView(self._sanitize(listed)).objects]

    # ---- deleting and listing -------------------------------------------------------------

    def _call(self, verb: str, kind: str) -> Any:
        """The API call that does ``verb`` (``delete``/``read``) to one object of ``kind`` by
        (name, namespace)."""
        calls: dict[tuple[str, str], Any] = {
            ("delete", POD): self._core.delete_namespaced_pod,
            ("read", POD): self._core.read_namespaced_pod,
            ("delete", CLAIM): self._core.delete_namespaced_persistent_volume_claim,
            ("read", CLAIM): self._core.read_namespaced_persistent_volume_claim,
            ("delete", NETWORK_POLICY): self._net.delete_namespaced_network_policy,
            ("read", NETWORK_POLICY): self._net.read_namespaced_network_policy,
        }
        return calls[verb, kind if kind in (POD, CLAIM) else NETWORK_POLICY]

    async def _delete_and_wait(
        self, kind: str, namespace: str, name: str, *, graceful: bool = False
    ) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        async def delete() -> None:
            options = _delete_options(kind, None if graceful else self._disposal_grace)
            await self._call("delete", kind)(name, namespace, **options)

        async def exists() -> bool:
            try:
                await self._call("read", kind)(name, namespace)
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
            return True

        try:
            try:
                await delete()
            except ApiException as exc:
                if exc.status != 404:
                    raise
                return
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self._dispose_timeout
            while await exists():
                if loop.time() >= deadline:
                    raise DisposalError(
                        DisposalFailure(
                            code=DisposalCode.TIMEOUT,
                            detail=f"{kind} {name} still present after {self._dispose_timeout:g}s",
                            backend=self.name,
                        )
                    )
                await asyncio.sleep(self._poll)
        except ApiException as exc:
            raise _disposal_error(self.name, f"deleting {kind} {name}", exc) from None
        except (TimeoutError, OSError) as exc:
            raise _unreachable(self.name, f"deleting {kind} {name}", exc) from None

    async def dispose(self, sandbox: SandboxRef) -> None:
        name = naming.pod_name(sandbox.name)
        errors: list[DisposalError] = []
        # The pod first: its work volume (if any) is released only once no pod uses it.
        own = ((POD, name), (CLAIM, naming.work_volume_name(sandbox.name)))
        for kind, obj_name in own:
            try:
                await self._delete_and_wait(kind, sandbox.namespace, obj_name)
            except DisposalError as exc:
                errors.append(exc)
        # Anything else carrying this sandbox's label (e.g. left by an older naming scheme, or
        # the per-Sandbox NetworkPolicy of versions before one policy per egress mode).
        for obj in await self._list(sandbox.namespace, lbl.sandbox_selector(sandbox.name)):
            if (obj.kind, obj.name) in own:
                continue
            try:
                await self.dispose_object(obj)
            except DisposalError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    # ---- disposal without waiting: the operator's watches say when it landed ----------------

    def _seen(self, namespace: str, label: str, value: str) -> list[BackendObject]:
        """The objects of every kind in the views whose ``label`` is ``value``."""
        assert self._pods is not None and self._network_policies is not None
        views = ((POD, self._pods), (NETWORK_POLICY, self._network_policies), (CLAIM, self._claims))
        return [
            backend_object(kind, obj)
            for kind, view in views
            if view is not None
            for obj in view.select(namespace, label, value)
        ]

    def _this_backend(self, found: list[BackendObject]) -> list[BackendObject]:
        """Drop what another backend labelled as its own (unlabelled objects count as ours)."""
        backend = self.name
        return [o for o in found if o.labels.get(lbl.BACKEND_LABEL, backend) == backend]

    def _seen_children(self, sandbox: SandboxRef) -> list[BackendObject]:
        assert self._pods is not None
        value = lbl.sandbox_label_value(sandbox.name)
        found = self._seen(sandbox.namespace, lbl.SANDBOX_LABEL, value)
        recorded = sandbox.served_by
        if (
            recorded is not None
            and recorded.kind == POD
            and not any(o.kind == POD and o.name == recorded.name for o in found)
        ):
            pod = self._pods.get(recorded.namespace or sandbox.namespace, recorded.name)
            if pod is not None:
                found.append(backend_object(POD, pod))
        return self._this_backend(found)

    @property
    def watches_disposal(self) -> bool:
        """True when disposal is asked for here and its landing is seen through the watches
        (``request_disposal``); False: ``dispose`` deletes and waits by polling."""
        return self._pods is not None

    async def request_disposal(
        self, sandbox: SandboxRef, *, requested: bool = False
    ) -> list[BackendObject]:
        """Delete what serves the sandbox and is not being deleted yet; return what is still
        there (its deletion requested; on a backend whose disposals go at once, not answered as
        done: a pod deleted with no grace period is gone with the answer). No wait, no read: the
        views say what exists, and the watch event of each deletion brings the operator back.
        ``requested``: a collection delete already asked for these (a scope purge), whose effect
        the views may not show yet; nothing is deleted again, only what remains is returned.

        Raises :class:`DisposalError` when the API server refuses a deletion.
        """
        remaining = self._seen_children(sandbox)
        if requested:
            return remaining
        left: list[BackendObject] = []
        for obj in remaining:
            if obj.deleting or await self._delete(obj.kind, obj.namespace, obj.name):
                left.append(obj)
        return left

    async def request_conversation_disposal(
        self, namespace: str, scope: str, thread_id: str
    ) -> None:
        """Delete every pod and PersistentVolumeClaim (and NetworkPolicy left by an older version)
        of one conversation on this backend: a ``deletecollection`` by label selector per kind,
        whatever the number of sandboxes."""
        from kubernetes_asyncio.client.exceptions import ApiException

        selector = lbl.format_selector(
            {
                lbl.MANAGED_BY_LABEL: lbl.MANAGED_BY_VALUE,
                lbl.CONVERSATION_LABEL: lbl.conversation_value(scope, thread_id),
                lbl.BACKEND_LABEL: self.name,
            }
        )
        try:
            await call_json(
                self._core.delete_collection_namespaced_pod,
                namespace,
                label_selector=selector,
                **_delete_options(POD, self._disposal_grace),
            )
            conversation = lbl.conversation_value(scope, thread_id)
            if self._network_policies is None or self._network_policies.select_names(
                namespace, lbl.CONVERSATION_LABEL, conversation
            ):  # per-Sandbox policies of older versions; today's are per egress mode
                await call_json(
                    self._net.delete_collection_namespaced_network_policy,
                    namespace,
                    label_selector=selector,
                )
            await call_json(
                self._core.delete_collection_namespaced_persistent_volume_claim,
                namespace,
                label_selector=selector,
            )
        except ApiException as exc:
            raise _disposal_error(self.name, "deleting the conversation's objects", exc) from None

    @property
    def _disposal_grace(self) -> int | None:
        """The grace a disposal's pod delete gives (``pod.disposalGracePeriodSeconds``); None:
        the pod's own ``terminationGracePeriodSeconds``, sent as no option at all."""
        return self._config.pod.disposal_grace_period_seconds

    @property
    def _gone_with_answer(self) -> bool:
        """Whether this backend's disposals read a delete's answer as final (its pods deleted
        with no grace period, the opt-in of docs/disposal.md); otherwise what is deleted is
        waited for until its watch event, as it always was."""
        return self._disposal_grace == 0

    async def _delete(
        self, kind: str, namespace: str, name: str, *, graceful: bool = False
    ) -> bool:
        """Delete one object (a disposal's pod with the backend's disposal grace; ``graceful``,
        a suspension's: with its own); whether it may still be there (always, unless the
        backend's disposals go at once and the answer says it is gone)."""
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            options = _delete_options(kind, None if graceful else self._disposal_grace)
            answer = DeleteAnswerView(
                await call_json(self._call("delete", kind), name, namespace, **options)
            )
        except ApiException as exc:
            if exc.status == 404:
                return not self._gone_with_answer
            raise _disposal_error(self.name, f"deleting {kind} {name}", exc) from None
        except (TimeoutError, OSError) as exc:
            raise _unreachable(self.name, f"deleting {kind} {name}", exc) from None
        landed = self._deleted(kind, namespace, name, answer)
        return not (self._gone_with_answer and landed)

    def _deleted(self, kind: str, namespace: str, name: str, answer: DeleteAnswerView) -> bool:
        """Put a delete's answer into the views at once, as a create's is: the object being
        deleted (a pod in its grace period, held by a finalizer, a claim still in use), or gone
        (a Status; on a backend whose disposals go at once, also a pod deleted with no grace
        period). Until its watch event came, a pass that ran meanwhile (woken by the Sandbox's
        own status write) deleted it again. Returns whether the answer was read as gone."""
        meta = answer.metadata
        if self._gone_with_answer:
            landed = deletion_landed(kind, answer)
        else:
            landed = not (answer.kind == kind and meta.deleting)
        views = {POD: self._pods, NETWORK_POLICY: self._network_policies, CLAIM: self._claims}
        view = views.get(kind)
        if view is None:
            return landed
        if not landed:
            if answer.kind == kind and meta.deleting:
                view.upsert(answer.raw)
            return landed
        uid = answer.details.uid or meta.uid
        if answer.kind in ("Status", kind) and uid:
            view.remove(namespace, name, uid)
        return landed

    async def _list(self, namespace: str, selector: str) -> list[BackendObject]:
        pods = await self._core.list_namespaced_pod(namespace, label_selector=selector)
        nps = await self._net.list_namespaced_network_policy(namespace, label_selector=selector)
        claims = await self._core.list_namespaced_persistent_volume_claim(
            namespace, label_selector=selector
        )
        out = [backend_object(POD, ObjectView(self._sanitize(p))) for p in pods.items]
        out += [backend_object(NETWORK_POLICY, ObjectView(self._sanitize(n))) for n in nps.items]
        out += [backend_object(CLAIM, ObjectView(self._sanitize(c))) for c in claims.items]
        return self._this_backend(out)

    async def list_by_scope(
        self, namespace: str, scope: str, thread_id: str
    ) -> list[BackendObject]:
        return await self._list(namespace, lbl.scope_selector(scope, thread_id))

    async def list_by_key(self, namespace: str, key: SandboxKey) -> list[BackendObject]:
        if self._pods is not None and self._network_policies is not None:
            return self._this_backend(self._seen(namespace, lbl.KEY_LABEL, lbl.key_value(key)))
        return await self._list(namespace, lbl.key_selector(key))

    async def dispose_object(self, obj: BackendObject) -> None:
        await self._delete_and_wait(obj.kind, obj.namespace, obj.name)


def _unreachable(backend: str, what: str, exc: BaseException) -> DisposalError:
    return DisposalError(
        DisposalFailure(
            code=DisposalCode.UNREACHABLE,
            detail=f"{what}: {type(exc).__name__}",
            backend=backend,
        )
    )


def _disposal_error(backend: str, what: str, exc: Any) -> DisposalError:
    status = getattr(exc, "status", None)
    code = DisposalCode.REFUSED if status in (401, 403) else DisposalCode.UNKNOWN
    return DisposalError(
        DisposalFailure(code=code, detail=f"{what}: HTTP {status}", backend=backend)
    )
