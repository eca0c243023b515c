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

Suspend and resume (`Suspendable`) are the service's stop and resume: see `suspend.py`. The read
cache lives in `cache.py`, what a remote sandbox carries and what its state means in `remote.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from sandbox_operator import labels as lbl
from sandbox_operator.acas.api import AcasClient
from sandbox_operator.acas.auth import (
    CredentialUnavailable,
    SecretTokens,
    TokenProvider,
    token_provider_for,
)
from sandbox_operator.acas.config import AcasBackendConfig, SecretCredentialSource
from sandbox_operator.acas.errors import AcasError, AcasNotListed, AcasThrottled, disposal_failure
from sandbox_operator.acas.models import REMOTE_KIND
from sandbox_operator.backends.base import (
    Availability,
    BackendObject,
    DisposalError,
    EnsureRequest,
    Observation,
    SandboxRef,
    ServedBy,
    StartupError,
    TransientError,
)
from sandbox_operator.contract import ConditionReason, DisposalFailure, SandboxKey

from .cache import STALE_AFTER_INTERVALS, CacheStatus, Notify
from .remote import (
    KIND_LABEL,
    NAMESPACE_LABEL,
    OWNER_UID_LABEL,
    PERMANENT,
    SANDBOX_NAME_LABEL,
    backend_object,
    classify,
    create_content,
    egress_policy,
    observation_for,
    recorded_id,
    ref_key,
    remote_labels,
    sandbox_key,
    served_by,
)
from .suspend import SuspendResume

__all__ = [
    "KIND_LABEL",
    "NAMESPACE_LABEL",
    "OWNER_UID_LABEL",
    "REMOTE_KIND",
    "SANDBOX_NAME_LABEL",
    "STALE_AFTER_INTERVALS",
    "AcasDriver",
    "CacheStatus",
    "Notify",
    "build_driver",
    "classify",
    "create_content",
    "egress_policy",
    "remote_labels",
]

log = logging.getLogger(__name__)


class AcasDriver(SuspendResume):
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
        self._init_cache()

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

    async def check_available(self) -> Availability:
        try:
            await self._client.list_sandboxes(self._selector(), page_size=1, max_pages=1)
        except CredentialUnavailable as exc:
            return Availability(False, f"credential unavailable: {exc.missing}")
        except AcasError as exc:
            return Availability(False, f"sandbox group not usable: {exc.detail}")
        return Availability(True)

    async def ensure(self, request: EnsureRequest) -> ServedBy:
        """Find or create the remote sandbox. A 400/404/413 is permanent (`StartupError`); any
        other service error (5xx, 429, unreachable, timeout, 401/403) is a `TransientError` the
        operator retries until the startup deadline."""
        try:
            return await self._ensure(request)
        except PERMANENT as exc:
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
            return served_by(remote.id)
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
        return served_by(created.id)

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
        obs = observation_for(sandbox, snapshot.of(ref_key(sandbox)))
        recorded = recorded_id(sandbox)
        if obs.served_by is None and recorded and recorded not in snapshot.by_id:
            remote = await self._get_own(sandbox, recorded)
            if remote is not None:
                return observation_for(sandbox, [remote])
        return obs

    async def _observe_remote(self, sandbox: SandboxRef) -> Observation:
        recorded = recorded_id(sandbox)
        if recorded:
            remote = await self._client.find_sandbox(recorded)
            if remote is None:  # what served the sandbox is gone (404)
                self._forget(recorded)
                return classify(None)
            if sandbox_key(remote) == ref_key(sandbox):
                self._remember(remote)
                return observation_for(sandbox, [remote])
        found = await self._find(sandbox)
        self._write_through(sandbox, found)
        return observation_for(sandbox, found)

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
        steps = [(r.id, self._dispose_remote) for r in found]
        recorded = recorded_id(sandbox)
        if recorded and recorded not in {r.id for r in found}:
            steps.append((recorded, self._dispose_unlisted))
        first: DisposalError | None = None
        for remote_id, step in steps:
            try:
                await step(remote_id)
            except DisposalError as exc:
                first = first or exc
            else:
                self._forget(remote_id)
        if first is not None:
            raise first
        self._names.pop(ref_key(sandbox), None)

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
    dispose_timeout: float | None = None,
    operator_namespace: str | None = None,
    tokens: TokenProvider | None = None,
    transport: Any = None,
) -> AcasDriver:
    """Entry point `sandbox_operator.backends.build_driver` calls for `type: acas`.

    `api` is the operator's kubernetes_asyncio ApiClient (used to read a credential Secret);
    `dispose_timeout` is the operator's `disposeTimeoutSeconds` (a disposal waits at most the
    shorter of it and `timeouts.delete`), passed as the number it is, as the runtime-class
    driver gets it, rather than the whole settings object read by attribute name;
    `operator_namespace` is where a credential Secret named without a namespace is read
    (`sandbox_operator.config.operator_namespace()`; `default` when None);
    `tokens`/`transport` let tests inject a token provider and an httpx transport.
    """
    if tokens is None:
        if isinstance(config.credential, SecretCredentialSource):
            tokens = SecretTokens(api, config.credential, config.token_scope, operator_namespace)
        else:
            tokens = token_provider_for(config.credential, config.token_scope)
    return AcasDriver(
        config, AcasClient(config, tokens, transport=transport), dispose_timeout=dispose_timeout
    )
