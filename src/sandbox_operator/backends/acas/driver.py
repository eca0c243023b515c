"""The operator's driver for `acas` backends: one remote microVM sandbox per Sandbox resource.

Stateless like every driver: the remote sandbox carries the hashed key labels, the Sandbox's
namespace, name, uid and kind, so observe, dispose and the scope purge find it by a label
listing on the service (never from memory), from any replica. The remote id goes into the
Sandbox's status as `servedBy` (kind `AcasSandbox`).

Every sandbox is created with its confinement in the same request: an inline egress policy
(default Deny plus one Allow host rule per `egressAllow` entry) and a lifecycle policy that
auto-deletes it after a bounded lifetime even if no operator is left to do so.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
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
    AcasError,
    AcasNotFound,
    AcasNotListed,
    AcasPayloadTooLarge,
    AcasThrottled,
    disposal_failure,
)
from .models import RemoteSandbox, SandboxState

#: Create failures no retry can cure: the request's content (400, 413) or the group/path (404).
_PERMANENT = (AcasBadRequest, AcasNotFound, AcasPayloadTooLarge)

REMOTE_KIND = "AcasSandbox"
NAMESPACE_LABEL = f"{lbl.GROUP}/namespace"
OWNER_UID_LABEL = f"{lbl.GROUP}/owner-uid"
KIND_LABEL = f"{lbl.GROUP}/kind"

_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def label_safe(value: str) -> str:
    """A label value the service's `k=v,k=v` filter can carry (no ',' or '='), <= 63 chars."""
    cleaned = _LABEL_UNSAFE.sub("-", value)[:63].strip("-.")
    return cleaned or "none"


def remote_labels(request: EnsureRequest, backend: str) -> dict[str, str]:
    """The labels a remote sandbox carries: the operator's object labels (hashed key parts,
    sandbox name, backend) plus the Sandbox's namespace, uid and kind."""
    out = dict(request.labels)
    out.setdefault(lbl.BACKEND_LABEL, backend)
    out[NAMESPACE_LABEL] = request.sandbox.namespace
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
    if state in (SandboxState.IDLE, SandboxState.SUSPENDED) or (
        state == SandboxState.STOPPED and reason == "Idle"
    ):
        return obs(ObservedPhase.READY, "remote sandbox is idle-suspended (resumes on use)")
    if state == SandboxState.CREATING:
        return obs(ObservedPhase.STARTING, "remote sandbox is being created")
    if state == SandboxState.DELETING:
        return obs(ObservedPhase.DISPOSING, "remote sandbox is being deleted")
    if state in (SandboxState.FAILED, SandboxState.STOP_FAILED):
        return obs(ObservedPhase.FAILED, f"remote sandbox state {state}")
    if state in (SandboxState.STOPPED, SandboxState.STOPPING):
        why = f" ({reason})" if reason else ""
        return obs(ObservedPhase.FAILED, f"remote sandbox was stopped{why}")
    return obs(ObservedPhase.STARTING, f"remote sandbox state {state or 'unknown'}")


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
        for remote in await self._find(sandbox):
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
        listed = {r.id for r in await self._find(sandbox)}
        if created.id not in listed:
            with contextlib.suppress(AcasError):
                await self._client.delete_and_wait(created.id)
            error = AcasNotListed(
                "AzureSandboxes_List", what="created sandbox missing from its label listing"
            )
            raise StartupError(ConditionReason.STARTUP_FAILED, f"{error} [{error.detail}]")
        return ServedBy(REMOTE_KIND, created.id, "", created.id)

    async def observe(self, sandbox: SandboxRef) -> Observation:
        found = await self._find(sandbox)
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

    async def _dispose_remote(self, remote_id: str) -> None:
        try:
            await self._client.delete_and_wait(remote_id, within=self._dispose_within)
        except AcasError as exc:
            raise DisposalError(disposal_failure(exc, self.name)) from None

    async def dispose(self, sandbox: SandboxRef) -> None:
        try:
            found = await self._find(sandbox)
        except AcasError as exc:
            raise DisposalError(disposal_failure(exc, self.name)) from None
        first: DisposalError | None = None
        for remote in found:
            try:
                await self._dispose_remote(remote.id)
            except DisposalError as exc:
                first = first or exc
        recorded = sandbox.served_by
        listed = {r.id for r in found}
        if recorded is not None and recorded.kind == REMOTE_KIND and recorded.name not in listed:
            try:
                await self._dispose_unlisted(recorded.name)
            except DisposalError as exc:
                first = first or exc
        if first is not None:
            raise first

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
        return await self._list(
            self._selector(**{lbl.KEY_LABEL: lbl.key_value(key), NAMESPACE_LABEL: namespace})
        )

    async def dispose_object(self, obj: BackendObject) -> None:
        await self._dispose_remote(obj.name)

    async def close(self) -> None:
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
