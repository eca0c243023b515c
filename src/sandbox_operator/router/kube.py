"""The router's Kubernetes side: the watches that feed its view, and the two writes it makes on a
Sandbox (a resume, an activity stamp).

Its own module because it is the only one that talks to the API server beside the reviews: a
list, then a watch from its resourceVersion, again from a fresh list when the watch fails or
expires (never a read per request). Needs list and watch on sandboxes and on pods, and patch on
sandboxes (the chart's router Role).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypedDict

from sandbox_operator import labels as lbl
from sandbox_operator.contract import SANDBOX_KIND
from sandbox_operator.contract.resources import GROUP, SANDBOX_PLURAL, VERSION
from sandbox_operator.views import ListView, PodView, SandboxView, WatchEvent

from .bodies import SandboxPatchBody
from .view import SandboxEntry, View

log = logging.getLogger(__name__)

MERGE_PATCH: Final = "application/merge-patch+json"
FIELD_MANAGER: Final = "sandbox-operator-router"
#: The wake Event's source (``source.component``, ``reportingComponent``) and reason.
COMPONENT: Final = "sandbox-operator-router"
WOKEN_REASON: Final = "WokenByTraffic"
#: Seconds a watch is asked to run before the server ends it (then listed again).
WATCH_SECONDS: Final = 300
RETRY_SECONDS: Final = 5.0
_POD_SELECTOR: Final = f"{lbl.MANAGED_BY_LABEL}={lbl.MANAGED_BY_VALUE}"


class _ListOptions(TypedDict, total=False):
    """The keyword arguments of a list (and its watch): pods are selected by label."""

    label_selector: str


class KubeSandboxes:
    """Watches into a :class:`~.view.View` and the router's writes, over one ApiClient."""

    def __init__(self, api: Any, view: View, namespaces: tuple[str, ...]) -> None:
        from kubernetes_asyncio import client as k8s

        self._api = api
        self._custom = k8s.CustomObjectsApi(api)
        self._core = k8s.CoreV1Api(api)
        self._view = view
        self._namespaces = namespaces
        self._listed: set[tuple[str, str | None]] = set()

    @property
    def synced(self) -> bool:
        """Whether every watch has listed once: until then a Sandbox missing from the view may
        exist, so the router is not ready (``/healthz`` answers 503)."""
        scopes = self._namespaces or (None,)
        return len(self._listed) == 2 * len(scopes)

    async def run(self) -> None:
        """Keep every watch going until cancelled."""
        scopes: tuple[str | None, ...] = self._namespaces or (None,)
        watches = [self._keep(kind, ns) for ns in scopes for kind in ("sandboxes", "pods")]
        await asyncio.gather(*watches)

    def _list_call(
        self, kind: str, namespace: str | None
    ) -> tuple[Callable[..., Any], tuple[Any, ...], _ListOptions]:
        if kind == "sandboxes":
            if namespace is None:
                return self._custom.list_cluster_custom_object, (GROUP, VERSION, SANDBOX_PLURAL), {}
            args = (GROUP, VERSION, namespace, SANDBOX_PLURAL)
            return self._custom.list_namespaced_custom_object, args, {}
        options: _ListOptions = {"label_selector": _POD_SELECTOR}
        if namespace is None:
            return self._core.list_pod_for_all_namespaces, (), options
        return self._core.list_namespaced_pod, (namespace,), options

    async def _keep(self, kind: str, namespace: str | None) -> None:
        from kubernetes_asyncio import watch

        call, args, options = self._list_call(kind, namespace)
        sandboxes = kind == "sandboxes"
        while True:
            try:
                listed = ListView(self._plain(await call(*args, **options)))
                items = listed.objects
                if sandboxes:
                    self._view.replace_sandboxes(namespace, map(SandboxView, items))
                else:
                    self._view.replace_pods(namespace, map(PodView, items))
                self._listed.add((kind, namespace))
                version = listed.metadata.resource_version or None
                stream = watch.Watch().stream(
                    call,
                    *args,
                    resource_version=version,
                    timeout_seconds=WATCH_SECONDS,
                    _request_timeout=WATCH_SECONDS + 30,
                    **options,
                )
                async for event in stream:
                    change = WatchEvent(event)
                    if change.type not in ("ADDED", "MODIFIED", "DELETED"):
                        continue
                    obj = self._plain(change.object)
                    if sandboxes:
                        self._view.apply_sandbox(change.type, SandboxView(obj))
                    else:
                        self._view.apply_pod(change.type, PodView(obj))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # listed again after a pause: the view stays as it was
                log.warning("watching %s failed (%s); listing again", kind, type(exc).__name__)
                await asyncio.sleep(RETRY_SECONDS)

    def _plain(self, obj: Any) -> Mapping[str, Any]:
        plain = obj if isinstance(obj, Mapping) else self._api.sanitize_for_serialization(obj)
        return plain if isinstance(plain, Mapping) else {}

    async def _patch(self, namespace: str, name: str, body: SandboxPatchBody) -> None:
        await self._custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            SANDBOX_PLURAL,
            name,
            dict(body),
            field_manager=FIELD_MANAGER,
            _content_type=MERGE_PATCH,  # type: ignore[call-arg]
        )

    async def resume(self, namespace: str, name: str, entry: SandboxEntry) -> None:
        """As the client resumes (docs/suspend.md): spec.suspended back to false when the spec
        suspended it, else activity newer than the suspension. Then an Event on the Sandbox
        says traffic woke it (best effort: a failed Event is logged, the resume stands)."""
        if entry.spec_suspended:
            await self._patch(namespace, name, {"spec": {"suspended": False}})
        else:
            when = datetime.now(UTC).replace(microsecond=0)
            suspended_at = entry.suspended_at
            if suspended_at is not None:
                when = max(when, suspended_at.replace(microsecond=0) + timedelta(seconds=1))
            await self._annotate(namespace, name, when)
        try:
            create: Any = self._core.create_namespaced_event  # takes the plain body too
            await create(namespace, wake_event(namespace, name, entry.uid))
        except Exception as exc:
            log.warning("wake event for %s/%s not posted: %s", namespace, name, type(exc).__name__)

    async def stamp(self, namespace: str, name: str) -> None:
        """The Sandbox's last-activity stamp, now."""
        await self._annotate(namespace, name, datetime.now(UTC))

    async def _annotate(self, namespace: str, name: str, when: datetime) -> None:
        stamp = when.strftime("%Y-%m-%dT%H:%M:%SZ")
        body: SandboxPatchBody = {
            "metadata": {"annotations": {lbl.LAST_ACTIVITY_ANNOTATION: stamp}}
        }
        await self._patch(namespace, name, body)


def wake_event(namespace: str, name: str, uid: str) -> dict[str, object]:
    """The Event on a Sandbox that traffic through the router resumed (reason
    :data:`WOKEN_REASON`)."""
    now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.woken.{secrets.token_hex(6)}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": SANDBOX_KIND,
            "name": name,
            "namespace": namespace,
            "uid": uid,
        },
        "reason": WOKEN_REASON,
        "message": "a request through the ports router found the Sandbox suspended and asked "
        "for its resume",
        "type": "Normal",
        "count": 1,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
    }
