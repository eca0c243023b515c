"""The operator's driver for `acas` backends: one remote microVM sandbox per Sandbox resource.

The remote sandbox carries the hashed key labels, the Sandbox's namespace, name, uid and kind,
so ensure, dispose and the scope purge find it by a label listing on the service (never from
memory), from any replica. The remote id goes into the Sandbox's status as `servedBy` (kind
`AcasSandbox`).

Reading state costs one call per interval, not one per sandbox: the driver keeps a read cache of
the group's remote sandboxes, refilled by ONE label-filtered list (this operator, this backend)
every `observeIntervalSeconds`. `observe` and `list_by_key` answer from it; `ensure` and
`dispose` write what they learn through to it at once. Correctness never rests on the cache:
whatever creates or deletes asks the service, an absence the cache cannot vouch for (a recorded
remote id it does not hold) is checked by id, and a cache that could not be refilled for
`STALE_AFTER_INTERVALS` intervals no longer answers (the service is asked per sandbox, as it was
before the cache). With `start(notify)` a background task does the listing and reports every
Sandbox whose remote state changed between two lists.

Every sandbox is created with its confinement in the same request: an inline egress policy
(default Deny plus one Allow host rule per `egressAllow` entry) and a lifecycle policy that
auto-deletes it after a bounded lifetime even if no operator is left to do so.

Suspend and resume (`Suspendable`) are the service's stop and resume (reference section 3.8):
the remote sandbox stays, `Stopped`, its state saved as a snapshot; observe reports any stopped
state (the service's own idle stop too) as `SUSPENDED`, with the service's `stoppedReason`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_operator import labels as lbl
from sandbox_operator.backends.base import (
    Availability,
    BackendObject,
    DisposalError,
    EnsureRequest,
    Observation,
    ObservedPhase,
    SandboxRef,
    ServedBy,
    StartupError,
    TransientError,
)
from sandbox_operator.contract import (
    ConditionReason,
    DisposalFailure,
    Egress,
    SandboxKey,
    SandboxSpec,
)

from .api import AcasClient
from .auth import CredentialUnavailable, TokenProvider, token_provider_for
from .config import AcasBackendConfig, SecretCredentialSource
from .errors import (
    AcasBadRequest,
    AcasConflict,
    AcasError,
    AcasNotFound,
    AcasNotListed,
    AcasPayloadTooLarge,
    AcasThrottled,
    AcasTimeout,
    disposal_failure,
)
from .models import RemoteSandbox, SandboxState

#: Create failures no retry can cure: the request's content (400, 413) or the group/path (404).
_PERMANENT = (AcasBadRequest, AcasNotFound, AcasPayloadTooLarge)

#: Remote states of a sandbox whose compute is stopped and whose state is kept (reference
#: sections 3.6 and 3.8): `Stopped` (any `stoppedReason`: `UserStopped`, `Idle`, `Disabled`),
#: `Idle` (the service's idle auto-suspend) and `Suspended` (outside the enum; the SDK's
#: `begin_stop` ends on it too).
STOPPED_STATES = frozenset({SandboxState.STOPPED, SandboxState.IDLE, SandboxState.SUSPENDED})
#: What `cpu`/`memory` default to when a create must send `resources` (for `disk`) and the spec
#: leaves them out: both are required members of `resources` (section 3.2); these are the
#: service SDK's own defaults (section 3.3).
DEFAULT_CPU = "1000m"
DEFAULT_MEMORY = "2048Mi"

log = logging.getLogger(__name__)

REMOTE_KIND = "AcasSandbox"
NAMESPACE_LABEL = f"{lbl.GROUP}/namespace"
OWNER_UID_LABEL = f"{lbl.GROUP}/owner-uid"
KIND_LABEL = f"{lbl.GROUP}/kind"
#: The Sandbox's own name (the sandbox label holds `object_name(name)`, which differs for dotted
#: or long names). Set when the name is at most 63 characters; older sandboxes lack it.
SANDBOX_NAME_LABEL = f"{lbl.GROUP}/sandbox-name"
_NAME_LABEL_MAX = 63

#: A cache whose last good list started more than this many intervals ago no longer answers.
STALE_AFTER_INTERVALS = 3

#: What `start` is given: called with (namespace, Sandbox name) for each changed Sandbox.
Notify = Callable[[str, str], None]

_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def label_safe(value: str) -> str:
    """A label value the service's `k=v,k=v` filter can carry (no ',' or '='), <= 63 chars."""
    cleaned = _LABEL_UNSAFE.sub("-", value)[:63].strip("-.")
    return cleaned or "none"


def remote_labels(request: EnsureRequest, backend: str) -> dict[str, str]:
    """The labels a remote sandbox carries: the operator's object labels (hashed key parts,
    sandbox label, backend) plus the Sandbox's namespace, name, uid and kind."""
    out = dict(request.labels)
    out.setdefault(lbl.BACKEND_LABEL, backend)
    out[NAMESPACE_LABEL] = request.sandbox.namespace
    name = request.sandbox.name
    if name and len(name) <= _NAME_LABEL_MAX:
        out[SANDBOX_NAME_LABEL] = name
    if request.sandbox.uid:
        out[OWNER_UID_LABEL] = request.sandbox.uid
    out[KIND_LABEL] = label_safe(request.spec.kind)
    return out


def egress_policy(spec: SandboxSpec) -> dict[str, Any]:
    """The inline egress policy for a spec: closed -> Deny everything (HTTP and L3/L4);
    allowlist -> Deny by default, Allow each named host; unrestricted -> Allow."""
    if spec.egress is Egress.UNRESTRICTED:
        return {"http": {"defaultAction": "Allow"}}
    policy: dict[str, Any] = {
        "http": {
            "defaultAction": "Deny",
            "hostRules": [{"pattern": host, "action": "Allow"} for host in spec.egress_allow],
        }
    }
    if spec.egress is Egress.CLOSED:
        policy["transportRules"] = {"defaultAction": "Deny", "rules": []}
    return policy


def lifecycle_policy(spec: SandboxSpec, config: AcasBackendConfig) -> dict[str, Any]:
    """Auto-delete after the Sandbox's ttl plus grace (at most `maxLifetimeSeconds`), counted
    from creation; auto-suspend after the idle timeout (at most `idleSuspendSeconds`)."""
    limits = config.lifetime
    lifetime = limits.max_lifetime_seconds
    ttl = spec.lifetime.ttl_seconds
    if ttl:
        lifetime = min(lifetime, ttl + limits.grace_seconds)
    idle = limits.idle_suspend_seconds
    if spec.lifetime.idle_timeout_seconds:
        idle = min(idle, max(30, spec.lifetime.idle_timeout_seconds))
    return {
        "autoSuspendPolicy": {"enabled": True, "interval": idle, "mode": "Memory"},
        "autoDeletePolicy": {
            "enabled": True,
            "deleteIntervalInSeconds": lifetime,
            "trigger": "AfterCreation",
        },
    }


def create_content(request: EnsureRequest, config: AcasBackendConfig) -> dict[str, Any]:
    """The `CreateSandboxContent` body for a request."""
    spec = request.spec
    content: dict[str, Any] = {
        "labels": remote_labels(request, config.name),
        "sourcesRef": {"diskImage": {"name": config.image_for(spec.image), "isPublic": True}},
        "egressPolicy": egress_policy(spec),
        "lifecycle": lifecycle_policy(spec, config),
    }
    limits = spec.resources.limits
    requests = spec.resources.requests
    cpu = limits.cpu or requests.cpu
    memory = limits.memory or requests.memory
    if cpu and memory:
        content["resources"] = {"cpu": str(cpu), "memory": str(memory)}
    if spec.storage is not None:
        # The sandbox's own disk is what stop saves and resume restores (section 3.8): its size
        # is the one storage field the service takes. storageClassName and accessMode have no
        # counterpart (the disk is the service's, used by this sandbox alone).
        content["resources"] = {
            "cpu": str(cpu or DEFAULT_CPU),
            "memory": str(memory or DEFAULT_MEMORY),
            "disk": str(spec.storage.size),
        }
    return content


def classify(remote: RemoteSandbox | None) -> Observation:
    """What a remote sandbox's state says, in the phases every driver reports."""
    if remote is None:
        return Observation(ObservedPhase.ABSENT)
    served = ServedBy(REMOTE_KIND, remote.id, "", remote.id)
    state = remote.state or ""
    reason = (remote.state_details.stopped_reason if remote.state_details else None) or ""
    created = remote.created_at

    def obs(phase: ObservedPhase, message: str) -> Observation:
        return Observation(phase, served, state or "Unknown", message, created)

    if state == SandboxState.RUNNING:
        return obs(ObservedPhase.READY, "remote sandbox is running")
    if state in STOPPED_STATES:
        # Stopped by the operator (UserStopped), by the service's idle auto-suspend (Idle) or
        # by a person at the service (Disabled): the compute is off, the state is kept. The
        # detail is the service's reason, so the operator can tell its own suspend from the
        # service's.
        why = reason or state
        return Observation(
            ObservedPhase.SUSPENDED,
            served,
            why,
            f"remote sandbox is {state.lower()} ({why}); its state is kept",
            created,
        )
    if state == SandboxState.STOPPING:
        # On its way to Stopped (a stop saving its state, or the service's idle suspend):
        # already not usable, nothing lost. Suspended, still settling.
        return Observation(
            ObservedPhase.SUSPENDED,
            served,
            SandboxState.STOPPING,
            "remote sandbox is stopping (saving its state)",
            created,
        )
    if state == SandboxState.CREATING:
        return obs(ObservedPhase.STARTING, "remote sandbox is being created")
    if state == SandboxState.DELETING:
        return obs(ObservedPhase.DISPOSING, "remote sandbox is being deleted")
    if state in (SandboxState.FAILED, SandboxState.STOP_FAILED):
        return obs(ObservedPhase.FAILED, f"remote sandbox state {state}")
    return obs(ObservedPhase.STARTING, f"remote sandbox state {state or 'unknown'}")


def observation_for(sandbox: SandboxRef, found: list[RemoteSandbox]) -> Observation:
    """What observe reports for `sandbox` given the remote sandboxes carrying its labels: one
    that another Sandbox (an earlier one of the same name) owns is not this one's."""
    if sandbox.uid:
        mine = [r for r in found if r.labels.get(OWNER_UID_LABEL, sandbox.uid) == sandbox.uid]
        if found and not mine:
            return Observation(
                ObservedPhase.ABSENT,
                None,
                "Foreign",
                "remote sandbox belongs to another Sandbox",
            )
        found = mine
    return classify(found[0] if found else None)


def _owned_by(remote: RemoteSandbox, sandbox: SandboxRef) -> bool:
    """Whether `remote` serves this Sandbox (not an earlier one of the same name)."""
    return not sandbox.uid or remote.labels.get(OWNER_UID_LABEL, sandbox.uid) == sandbox.uid


def _lost(remote_id: str) -> str:
    return (
        f"remote sandbox {remote_id}, which held the suspended sandbox's state, is gone at the "
        "service (deleted, e.g. by its auto-delete lifetime): nothing to resume, nothing was "
        "created in its place"
    )


def _sandbox_key(remote: RemoteSandbox) -> tuple[str, str]:
    """(namespace, sandbox label value) of a remote sandbox: which Sandbox it serves."""
    return remote.labels.get(NAMESPACE_LABEL, ""), remote.labels.get(lbl.SANDBOX_LABEL, "")


def _ref_key(sandbox: SandboxRef) -> tuple[str, str]:
    return sandbox.namespace, lbl.sandbox_label_value(sandbox.name)


def _recorded_id(sandbox: SandboxRef) -> str:
    """The remote id the Sandbox's status recorded (`servedBy`), if it names one of ours."""
    served = sandbox.served_by
    return served.name if served is not None and served.kind == REMOTE_KIND else ""


def _fingerprint(remote: RemoteSandbox) -> tuple[str, ...]:
    """What observe would tell of one remote sandbox (owner, phase, state, its reason)."""
    obs = classify(remote)
    return (
        remote.id,
        remote.labels.get(OWNER_UID_LABEL, ""),
        obs.phase.value,
        obs.detail_reason,
        obs.message,
    )


class _Snapshot:
    """The cached remote sandboxes, by id and by the Sandbox they serve."""

    def __init__(self, remotes: Iterable[RemoteSandbox] = ()) -> None:
        self.by_id: dict[str, RemoteSandbox] = {}
        self.by_sandbox: dict[tuple[str, str], dict[str, RemoteSandbox]] = {}
        for remote in remotes:
            self.put(remote)

    def put(self, remote: RemoteSandbox) -> None:
        self.drop(remote.id)
        self.by_id[remote.id] = remote
        self.by_sandbox.setdefault(_sandbox_key(remote), {})[remote.id] = remote

    def drop(self, remote_id: str) -> None:
        remote = self.by_id.pop(remote_id, None)
        if remote is None:
            return
        key = _sandbox_key(remote)
        group = self.by_sandbox.get(key, {})
        group.pop(remote_id, None)
        if not group:
            self.by_sandbox.pop(key, None)

    def of(self, key: tuple[str, str]) -> list[RemoteSandbox]:
        return list(self.by_sandbox.get(key, {}).values())

    def states(self) -> dict[tuple[str, str], tuple[tuple[str, ...], ...]]:
        return {
            key: tuple(sorted(_fingerprint(r) for r in group.values()))
            for key, group in self.by_sandbox.items()
            if key[0] and key[1]
        }


@dataclass(frozen=True)
class CacheStatus:
    """How the driver's read cache stands (for logs, metrics and tests)."""

    filled: bool  # a list has succeeded at least once
    age_seconds: float | None  # since the last good list started (None: never)
    stale: bool  # too old to answer: observe asks the service per sandbox
    consecutive_failures: int  # lists failed since the last good one
    last_error: str  # what the last failed list said ("" after a good one)
    lists: int  # lists sent so far, good or not
    running: bool  # the periodic task of `start` is running


def backend_object(remote: RemoteSandbox) -> BackendObject:
    labels = remote.labels
    return BackendObject(
        kind=REMOTE_KIND,
        name=remote.id,
        namespace=labels.get(NAMESPACE_LABEL, ""),
        sandbox_name=labels.get(lbl.SANDBOX_LABEL, ""),
        owner_uid=labels.get(OWNER_UID_LABEL, ""),
        deleting=remote.state == SandboxState.DELETING,
        labels=dict(labels),
    )


class _SecretTokens:
    """Reads the credential Secret on first use (the driver is built synchronously), then
    delegates to the provider it describes."""

    def __init__(self, api: Any, source: SecretCredentialSource, scope: str) -> None:
        self._api = api
        self._source = source
        self._scope = scope
        self._inner: TokenProvider | None = None
        self._retired: list[TokenProvider] = []

    def __repr__(self) -> str:
        return f"_SecretTokens(secret={self._source.secret_name!r})"

    async def _provider(self) -> TokenProvider:
        if self._inner is None:
            import base64

            from kubernetes_asyncio import client

            namespace = self._source.namespace or operator_namespace()
            secret = await client.CoreV1Api(self._api).read_namespaced_secret(
                self._source.secret_name, namespace
            )
            data = {
                k: base64.b64decode(v).decode()
                for k, v in (getattr(secret, "data", None) or {}).items()
            }
            self._inner = token_provider_for(self._source, self._scope, secret_data=data)
        return self._inner

    async def get_token(self) -> str:
        try:
            provider = await self._provider()
        except AcasError:
            raise
        except Exception as exc:  # the Kubernetes client's errors: keep no text
            raise CredentialUnavailable(
                f"Secret {self._source.secret_name} ({type(exc).__name__})"
            ) from None
        return await provider.get_token()

    def invalidate(self) -> None:
        # A rotated Secret is picked up on the next call; the old provider is closed at the end.
        if self._inner is not None:
            self._inner.invalidate()
            self._retired.append(self._inner)
        self._inner = None

    async def aclose(self) -> None:
        for provider in [*self._retired, *([self._inner] if self._inner else [])]:
            await provider.aclose()
        self._retired.clear()
        self._inner = None


def operator_namespace() -> str:
    """The namespace the operator runs in (for Secrets named without one)."""
    env = os.environ.get("POD_NAMESPACE") or os.environ.get("OPERATOR_NAMESPACE")
    if env:
        return env
    try:
        return _SA_NAMESPACE_FILE.read_text().strip() or "default"
    except OSError:
        return "default"


class AcasDriver:
    """`BackendDriver` for one ACA sandbox group."""

    def __init__(
        self,
        config: AcasBackendConfig,
        client: AcasClient,
        *,
        dispose_timeout: float | None = None,
    ) -> None:
        self._config = config
        self._client = client
        # One disposal waits for the service to say "gone" at most this long (the operator's
        # disposeTimeoutSeconds when it is shorter than timeouts.delete), then reports timeout.
        self._dispose_within = config.timeouts.delete
        if dispose_timeout is not None:
            self._dispose_within = min(self._dispose_within, dispose_timeout)
        # The read cache (see the module docstring). Times are `_clock()` readings.
        self._interval = config.observe_interval_seconds
        self._clock: Callable[[], float] = time.monotonic
        self._snapshot: _Snapshot | None = None  # None until a list has succeeded
        self._listed_at = 0.0  # when the list that filled the snapshot started
        self._attempted_at: float | None = None  # when the last list (good or not) started
        self._failures = 0
        self._last_error = ""
        self._lists = 0
        # Write-through since the last good list started: id -> (remote, or None if gone; when).
        # A list that started before a write must not undo it.
        self._writes: dict[str, tuple[RemoteSandbox | None, float]] = {}
        # Sandbox names the sandbox label cannot give back (dotted/long names of sandboxes
        # created without SANDBOX_NAME_LABEL), learned from the refs the operator passes.
        self._names: dict[tuple[str, str], str] = {}
        self._inflight: asyncio.Future[bool] | None = None
        self._task: asyncio.Task[None] | None = None
        self._notify: Notify | None = None

    @property
    def dispose_within(self) -> float:
        return self._dispose_within

    @property
    def name(self) -> str:
        return self._config.name

    @property
    def config(self) -> AcasBackendConfig:
        return self._config

    @property
    def client(self) -> AcasClient:
        return self._client

    @property
    def observe_interval(self) -> float:
        return self._interval

    # -- the read cache ----------------------------------------------------------------------

    def cache_status(self) -> CacheStatus:
        now = self._clock()
        filled = self._snapshot is not None
        age = now - self._listed_at if filled else None
        return CacheStatus(
            filled=filled,
            age_seconds=age,
            stale=age is None or age > self._interval * STALE_AFTER_INTERVALS,
            consecutive_failures=self._failures,
            last_error=self._last_error,
            lists=self._lists,
            running=self._running(),
        )

    def _running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self, notify: Notify) -> None:
        """Start the periodic refresh: one label-filtered list every `observeIntervalSeconds`.

        After each good list, `notify(namespace, sandbox_name)` is called (synchronously, in
        this event loop; it must not block) once for every Sandbox whose remote state as
        observe reports it (remote id, owner, phase, state, reason) differs from what the cache
        held just before, including remote sandboxes that appeared or vanished. Changes the
        operator made itself through `ensure`/`dispose` are already in the cache and are not
        reported again. The first good list reports nothing (there is nothing to compare). A
        failed list reports nothing and keeps the cache. Returns at once; calling it again only
        replaces `notify`. `close()` stops the task.
        """
        self._notify = notify
        if not self._running():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"acas-observe-{self.name}"
            )

    async def _run(self) -> None:
        while True:
            last = self._attempted_at
            if last is None or self._clock() - last >= self._interval:
                try:
                    await self.refresh()
                except Exception:  # refresh records list failures; anything else must not
                    log.exception("acas %s: refreshing the sandbox cache failed", self.name)
            last = self._attempted_at
            since = 0.0 if last is None else self._clock() - last
            await asyncio.sleep(max(self._interval - since, self._interval / 10))

    async def refresh(self) -> bool:
        """List the group's sandboxes now and replace the cache; False if the list failed (the
        last good cache is kept, the failure recorded). Concurrent callers share one list."""
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.ensure_future(self._list_and_apply())
        return await asyncio.shield(self._inflight)

    async def _list_and_apply(self) -> bool:
        started = self._clock()
        self._attempted_at = started
        self._lists += 1
        try:
            try:
                listed = await self._client.list_sandboxes(self._selector())
            except Exception as exc:  # AcasError, or anything else: keep no text of the latter
                self._failures += 1
                self._last_error = str(exc) if isinstance(exc, AcasError) else type(exc).__name__
                age = self._clock() - self._listed_at if self._snapshot is not None else None
                log.log(
                    logging.WARNING if self._failures == 1 else logging.INFO,
                    "acas %s: listing sandboxes failed (%d in a row; cache age %s): %s",
                    self.name,
                    self._failures,
                    "none" if age is None else f"{age:.0f}s",
                    self._last_error,
                )
                return False
        finally:
            self._inflight = None
        fresh = _Snapshot(listed)
        for remote_id, (remote, at) in self._writes.items():
            if at >= started:  # written while the list was under way: newer than the list
                if remote is None:
                    fresh.drop(remote_id)
                else:
                    fresh.put(remote)
        self._writes.clear()
        previous, self._snapshot = self._snapshot, fresh
        self._listed_at = started
        self._failures = 0
        self._last_error = ""
        if previous is not None:
            self._announce(previous, fresh)
        return True

    def _announce(self, before: _Snapshot, after: _Snapshot) -> None:
        notify = self._notify
        if notify is None:
            return
        old, new = before.states(), after.states()
        for key in sorted(old.keys() | new.keys()):
            if old.get(key) == new.get(key):
                continue
            name = self._sandbox_name(key, after.of(key) + before.of(key))
            try:
                notify(key[0], name)
            except Exception:
                log.exception("acas %s: change notification for %s/%s failed", self.name, *key)

    def _sandbox_name(self, key: tuple[str, str], remotes: list[RemoteSandbox]) -> str:
        for remote in remotes:
            name = remote.labels.get(SANDBOX_NAME_LABEL)
            if name:
                return name
        # Sandboxes from before the name label: the sandbox label is the name itself for every
        # DNS-1123 label name (all names the client gives); others were learned from refs.
        return self._names.get(key, key[1])

    def _learn(self, sandbox: SandboxRef) -> None:
        key = _ref_key(sandbox)
        if sandbox.name and key[1] != sandbox.name:
            self._names[key] = sandbox.name

    async def _cache(self) -> _Snapshot | None:
        """The cache when it may answer, else None (the caller asks the service).

        The first call (and, without the periodic task, the first after an interval) lists
        once for everyone; after a failed list the next attempt waits an interval."""
        now = self._clock()
        due = self._snapshot is None or (
            not self._running() and now - self._listed_at >= self._interval
        )
        if due and (
            self._inflight is not None
            or self._attempted_at is None
            or now - self._attempted_at >= self._interval
        ):
            await self.refresh()
        if self._snapshot is None:
            return None
        if self._clock() - self._listed_at > self._interval * STALE_AFTER_INTERVALS:
            return None
        return self._snapshot

    def _remember(self, remote: RemoteSandbox) -> None:
        self._writes[remote.id] = (remote, self._clock())
        if self._snapshot is not None:
            self._snapshot.put(remote)

    def _forget(self, remote_id: str) -> None:
        self._writes[remote_id] = (None, self._clock())
        if self._snapshot is not None:
            self._snapshot.drop(remote_id)

    def _write_through(self, sandbox: SandboxRef, found: list[RemoteSandbox]) -> None:
        """The service just listed exactly `found` for `sandbox`: the cache says so too."""
        keep = {r.id for r in found}
        if self._snapshot is not None:
            for remote in self._snapshot.of(_ref_key(sandbox)):
                if remote.id not in keep:
                    self._forget(remote.id)
        for remote in found:
            self._remember(remote)

    def _selector(self, **extra: str) -> dict[str, str]:
        return {lbl.MANAGED_BY_LABEL: lbl.MANAGED_BY_VALUE, lbl.BACKEND_LABEL: self.name, **extra}

    def _sandbox_selector(self, sandbox: SandboxRef) -> dict[str, str]:
        return self._selector(
            **{
                lbl.SANDBOX_LABEL: lbl.sandbox_label_value(sandbox.name),
                NAMESPACE_LABEL: sandbox.namespace,
            }
        )

    async def check_available(self) -> Availability:
        try:
            await self._client.list_sandboxes(self._selector(), page_size=1, max_pages=1)
        except CredentialUnavailable as exc:
            return Availability(False, f"credential unavailable: {exc.missing}")
        except AcasError as exc:
            return Availability(False, f"sandbox group not usable: {exc.detail}")
        return Availability(True)

    async def _find(self, sandbox: SandboxRef) -> list[RemoteSandbox]:
        return await self._client.list_sandboxes(self._sandbox_selector(sandbox))

    async def ensure(self, request: EnsureRequest) -> ServedBy:
        """Find or create the remote sandbox. A 400/404/413 is permanent (`StartupError`); any
        other service error (5xx, 429, unreachable, timeout, 401/403) is a `TransientError` the
        operator retries until the startup deadline."""
        try:
            return await self._ensure(request)
        except _PERMANENT as exc:
            raise StartupError(
                ConditionReason.STARTUP_FAILED, f"the service refused the sandbox: {exc.detail}"
            ) from None
        except AcasError as exc:
            retry_after = exc.retry_after if isinstance(exc, AcasThrottled) else None
            raise TransientError(str(exc), retry_after=retry_after) from None

    async def _ensure(self, request: EnsureRequest) -> ServedBy:
        sandbox = request.sandbox
        self._learn(sandbox)
        found = await self._find(sandbox)
        self._write_through(sandbox, found)
        for remote in found:
            owner = remote.labels.get(OWNER_UID_LABEL, "")
            if sandbox.uid and owner and owner != sandbox.uid:
                raise StartupError(
                    ConditionReason.KEY_UNCLEAN,
                    f"remote sandbox {remote.id} exists but belongs to another Sandbox (an "
                    "earlier one with this name that was not disposed yet)",
                )
            return ServedBy(REMOTE_KIND, remote.id, "", remote.id)
        content = create_content(request, self._config)
        created = await self._client.create_sandbox(content)
        # It must be findable by its labels, or no replica could ever dispose it.
        listing = await self._find(sandbox)
        self._write_through(sandbox, listing)
        if created.id not in {r.id for r in listing}:
            with contextlib.suppress(AcasError):
                await self._client.delete_and_wait(created.id)
            self._forget(created.id)
            error = AcasNotListed(
                "AzureSandboxes_List", what="created sandbox missing from its label listing"
            )
            raise StartupError(ConditionReason.STARTUP_FAILED, f"{error} [{error.detail}]")
        return ServedBy(REMOTE_KIND, created.id, "", created.id)

    async def observe(self, sandbox: SandboxRef) -> Observation:
        """From the cache (no call), except:

        * a remote id the status recorded that the cache does not hold is asked for by id (it
          may have been created after the list started, e.g. by another replica: "absent" must
          not turn a Ready sandbox Failed);
        * without a usable cache (no list has succeeded, or the last good one is older than
          `STALE_AFTER_INTERVALS` intervals) the service is asked for this sandbox alone: by its
          recorded id (404: absent), else by its labels.

        If that call fails, its error is raised: a failing service never makes a sandbox look
        Failed or gone."""
        self._learn(sandbox)
        snapshot = await self._cache()
        if snapshot is None:
            return await self._observe_remote(sandbox)
        obs = observation_for(sandbox, snapshot.of(_ref_key(sandbox)))
        recorded = _recorded_id(sandbox)
        if obs.served_by is None and recorded and recorded not in snapshot.by_id:
            remote = await self._get_own(sandbox, recorded)
            if remote is not None:
                return observation_for(sandbox, [remote])
        return obs

    async def _observe_remote(self, sandbox: SandboxRef) -> Observation:
        recorded = _recorded_id(sandbox)
        if recorded:
            remote = await self._client.find_sandbox(recorded)
            if remote is None:  # what served the sandbox is gone (404)
                self._forget(recorded)
                return classify(None)
            if _sandbox_key(remote) == _ref_key(sandbox):
                self._remember(remote)
                return observation_for(sandbox, [remote])
        found = await self._find(sandbox)
        self._write_through(sandbox, found)
        return observation_for(sandbox, found)

    async def _get_own(self, sandbox: SandboxRef, remote_id: str) -> RemoteSandbox | None:
        """The remote sandbox by id if it still exists and carries `sandbox`'s labels."""
        remote = await self._client.find_sandbox(remote_id)
        if remote is None:
            self._forget(remote_id)
            return None
        if _sandbox_key(remote) != _ref_key(sandbox):
            return None
        self._remember(remote)
        return remote

    # -- suspend / resume (reference section 3.8) --------------------------------------------

    @property
    def suspends(self) -> bool:
        """Suspend is the service's stop (the state saved as a snapshot), resume its resume."""
        return True

    async def _current(self, sandbox: SandboxRef) -> RemoteSandbox | None:
        """The remote sandbox serving `sandbox` as the service reports it now (never the
        cache, since the answer is acted on): by the recorded id (one GET), else by its
        labels. One that another Sandbox owns (an earlier one of the same name) is not it."""
        recorded = _recorded_id(sandbox)
        if recorded:
            remote = await self._get_own(sandbox, recorded)
            if remote is not None and _owned_by(remote, sandbox):
                return remote
        found = await self._find(sandbox)
        self._write_through(sandbox, found)
        mine = [r for r in found if _owned_by(r, sandbox)]
        return mine[0] if mine else None

    async def suspend(self, sandbox: SandboxRef) -> list[BackendObject]:
        """Stop the remote sandbox: the service saves its state as a snapshot and keeps the
        sandbox (id, labels, egress and lifecycle policies) in place, `Stopped`.

        Returns [] once it is stopped (`Stopped` whatever the reason, `Idle`, `Suspended`) or
        when nothing serves the sandbox; the remote sandbox while it is still stopping (or
        still being created, or deleted: not stoppable now). Idempotent: a stopped sandbox
        costs one read and no stop. The stop is the blocking `POST .../stop` (answered within
        `timeouts.stop` once the snapshot is saved) or, with `stopMethod: async`,
        `POST .../stop/async` (202, `Stopping`; a later call reads the end). A 409 (the
        sandbox is not running) and a stop that did not answer in time are settled by reading
        the state again: already stopped is success. A stop that ends `StopFailed` (the state
        was not saved), any service failure and a sandbox still running after a stop are a
        `TransientError` (the stop is sent again on the next call)."""
        self._learn(sandbox)
        try:
            remote = await self._current(sandbox)
            if remote is None:
                return []
            return await self._suspend(remote)
        except AcasError as exc:
            raise TransientError(str(exc), retry_after=exc.retry_after) from None

    async def _suspend(self, remote: RemoteSandbox) -> list[BackendObject]:
        state = remote.state or ""
        if state in STOPPED_STATES:
            return []
        if state in (SandboxState.STOPPING, SandboxState.CREATING, SandboxState.DELETING):
            return [backend_object(remote)]
        if state == SandboxState.FAILED:
            raise TransientError(f"remote sandbox {remote.id} is Failed: it cannot be stopped")
        # Running, StopFailed (stopped again), or a state this client does not know.
        after: RemoteSandbox | None = None
        refused: AcasError | None = None
        try:
            if self._config.stop_method == "async":
                after = await self._client.stop_sandbox_async(remote.id)
            else:
                await self._client.stop_sandbox(remote.id)
        except (AcasConflict, AcasTimeout) as exc:  # not running / no answer in time: look
            refused = exc
        except AcasNotFound:
            self._forget(remote.id)
            return []
        if after is None:
            after = await self._client.find_sandbox(remote.id)
            if after is None:
                self._forget(remote.id)
                return []
        self._remember(after)
        now = after.state or ""
        if now in STOPPED_STATES:
            return []
        if now in (SandboxState.STOPPING, SandboxState.CREATING, SandboxState.DELETING):
            return [backend_object(after)]
        why = f": {refused}" if refused is not None else ""
        if now == SandboxState.STOP_FAILED:
            raise TransientError(
                f"stopping remote sandbox {remote.id} ended StopFailed: the service did not "
                f"save its state (a later suspend stops it again){why}"
            )
        raise TransientError(
            f"remote sandbox {remote.id} is {now or 'in an unknown state'} after the stop{why}"
        )

    async def resume(self, request: EnsureRequest) -> ServedBy:
        """Start the stopped remote sandbox again from its snapshot (`POST .../resume`, sent
        once, answered within `timeouts.resume`); observe then reports it starting / ready.

        `Running` or `Creating` already: served as it is, no call. A 409 (not stopped) is
        settled by reading the state again: running is success. Still `Stopping`, stopped
        with `stoppedReason: Disabled` (a person disabled it at the service), a bare 503 (the
        documented answer of a resume the service cannot do now), 429, 5xx or no answer:
        `TransientError` (with the service's Retry-After, if any). Nothing serves the sandbox:
        when the status recorded a remote id, what held its state is gone (`StartupError`,
        nothing is created in its place); when it never had one (suspended from the start),
        `ensure` creates it. 400: `StartupError`."""
        try:
            return await self._resume(request)
        except _PERMANENT as exc:
            raise StartupError(
                ConditionReason.STARTUP_FAILED,
                f"the service refused to resume the sandbox: {exc.detail}",
            ) from None
        except AcasError as exc:
            raise TransientError(str(exc), retry_after=exc.retry_after) from None

    async def _resume(self, request: EnsureRequest) -> ServedBy:
        sandbox = request.sandbox
        self._learn(sandbox)
        remote = await self._current(sandbox)
        if remote is None:
            recorded = _recorded_id(sandbox)
            if recorded:
                raise StartupError(ConditionReason.STARTUP_FAILED, _lost(recorded))
            return await self._ensure(request)
        served = ServedBy(REMOTE_KIND, remote.id, "", remote.id)
        if remote.state in (SandboxState.RUNNING, SandboxState.CREATING):
            return served
        if remote.state in (SandboxState.FAILED, SandboxState.DELETING):
            raise StartupError(
                ConditionReason.STARTUP_FAILED,
                f"remote sandbox {remote.id} is {remote.state}: its state cannot be resumed",
            )
        if remote.state == SandboxState.STOPPING:
            raise self._still_stopping(remote)
        try:
            resumed = await self._client.resume_sandbox(remote.id)
        except AcasNotFound:
            self._forget(remote.id)
            raise StartupError(ConditionReason.STARTUP_FAILED, _lost(remote.id)) from None
        except AcasConflict as exc:
            now = await self._client.find_sandbox(remote.id)
            if now is None:
                self._forget(remote.id)
                raise StartupError(ConditionReason.STARTUP_FAILED, _lost(remote.id)) from None
            self._remember(now)
            if now.state in (SandboxState.RUNNING, SandboxState.CREATING):
                return served
            if now.state == SandboxState.STOPPING:
                raise self._still_stopping(now) from None
            reason = now.state_details.stopped_reason if now.state_details else None
            if reason == "Disabled":
                raise TransientError(
                    f"remote sandbox {remote.id} was disabled at the service (stoppedReason "
                    f"Disabled): it resumes once enabled there ({exc})"
                ) from None
            raise TransientError(
                f"resume refused while the sandbox is {now.state}: {exc}"
            ) from None
        self._remember(resumed)
        return served

    def _still_stopping(self, remote: RemoteSandbox) -> TransientError:
        return TransientError(
            f"remote sandbox {remote.id} is still stopping: resumed once it is Stopped",
            retry_after=self._config.timeouts.poll_interval,
        )

    async def _dispose_remote(self, remote_id: str) -> None:
        try:
            await self._client.delete_and_wait(remote_id, within=self._dispose_within)
        except AcasError as exc:
            raise DisposalError(disposal_failure(exc, self.name)) from None

    async def dispose(self, sandbox: SandboxRef) -> None:
        self._learn(sandbox)
        try:
            found = await self._find(sandbox)
        except AcasError as exc:
            raise DisposalError(disposal_failure(exc, self.name)) from None
        self._write_through(sandbox, found)
        first: DisposalError | None = None
        for remote in found:
            try:
                await self._dispose_remote(remote.id)
            except DisposalError as exc:
                first = first or exc
            else:
                self._forget(remote.id)
        recorded = sandbox.served_by
        listed = {r.id for r in found}
        if recorded is not None and recorded.kind == REMOTE_KIND and recorded.name not in listed:
            try:
                await self._dispose_unlisted(recorded.name)
            except DisposalError as exc:
                first = first or exc
            else:
                self._forget(recorded.name)
        if first is not None:
            raise first
        self._names.pop(_ref_key(sandbox), None)

    async def _dispose_unlisted(self, remote_id: str) -> None:
        """The status recorded `remote_id` but its label listing does not hold it. Gone (404)
        is success; otherwise delete it by id, and if that does not land the code is `unlisted`
        (with what failed in the detail), since nothing that lists by label would find it."""
        try:
            if await self._client.find_sandbox(remote_id) is None:
                return
            await self._client.delete_and_wait(remote_id, within=self._dispose_within)
        except AcasError as exc:
            missing = AcasNotListed(
                "AzureSandboxes_List", what="recorded sandbox missing from its label listing"
            )
            raise DisposalError(
                DisposalFailure(
                    code=missing.disposal_code,
                    detail=f"{missing.detail} id={remote_id}; {exc.detail}",
                    backend=self.name,
                )
            ) from None

    async def _list(self, labels: Mapping[str, str]) -> list[BackendObject]:
        return [backend_object(r) for r in await self._client.list_sandboxes(labels)]

    async def list_by_scope(
        self, namespace: str, scope: str, thread_id: str
    ) -> list[BackendObject]:
        return await self._list(
            self._selector(
                **{
                    lbl.CONVERSATION_LABEL: lbl.conversation_value(scope, thread_id),
                    NAMESPACE_LABEL: namespace,
                }
            )
        )

    async def list_by_key(self, namespace: str, key: SandboxKey) -> list[BackendObject]:
        """From the cache when it is usable (see `observe`), else by a filtered list."""
        value = lbl.key_value(key)
        snapshot = await self._cache()
        if snapshot is None:
            return await self._list(
                self._selector(**{lbl.KEY_LABEL: value, NAMESPACE_LABEL: namespace})
            )
        return [
            backend_object(r)
            for r in snapshot.by_id.values()
            if r.labels.get(lbl.KEY_LABEL) == value and r.labels.get(NAMESPACE_LABEL) == namespace
        ]

    async def dispose_object(self, obj: BackendObject) -> None:
        await self._dispose_remote(obj.name)
        self._forget(obj.name)

    async def close(self) -> None:
        """Stop the periodic refresh (and a list under way), then close the HTTP client."""
        for job in (self._task, self._inflight):
            if job is not None and not job.done():
                job.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await job
        self._task = None
        self._inflight = None
        self._notify = None
        await self._client.aclose()


def build_driver(
    config: AcasBackendConfig,
    *,
    api: Any,
    settings: Any = None,
    tokens: TokenProvider | None = None,
    transport: Any = None,
) -> AcasDriver:
    """Entry point `sandbox_operator.backends.build_driver` calls for `type: acas`.

    `api` is the operator's kubernetes_asyncio ApiClient (used to read a credential Secret);
    `tokens`/`transport` let tests inject a token provider and an httpx transport.
    """
    if tokens is None:
        if isinstance(config.credential, SecretCredentialSource):
            tokens = _SecretTokens(api, config.credential, config.token_scope)
        else:
            tokens = token_provider_for(config.credential, config.token_scope)
    dispose_timeout = getattr(settings, "dispose_timeout_seconds", None)
    return AcasDriver(
        config,
        AcasClient(config, tokens, transport=transport),
        dispose_timeout=float(dispose_timeout) if dispose_timeout is not None else None,
    )
