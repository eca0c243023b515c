"""Bearer tokens for the ACA sandboxes API.

Tokens come from `azure-identity` (`azure.identity.aio` credentials: workload identity, or a
service principal whose secret sits in a Kubernetes Secret), for the scope the spec names. A
`StaticTokenProvider` serves tests and the loopback stand-in; `SecretTokens` reads the
operator's credential Secret on first use. No provider ever logs or formats a token; `repr()` of
each hides it.

`azure.identity` and `kubernetes_asyncio` are imported only inside the code that builds a
provider needing them, so importing this module (and the ACA client) needs neither installed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .config import SecretCredentialSource, WorkloadIdentityCredentialSource
from .errors import AcasAuthError, AcasError

if TYPE_CHECKING:
    from azure.core.credentials_async import AsyncTokenCredential

#: Where a Secret named without a namespace is read when the operator's namespace is unknown
#: (a process outside a pod without ``POD_NAMESPACE``).
DEFAULT_SECRET_NAMESPACE = "default"


class CredentialUnavailable(AcasAuthError):
    """The configured credential cannot be built (missing Secret key, unreadable Secret, ...).

    `missing` names what is missing (a key name or a component), never a value. An
    `AcasAuthError`, so it maps to DisposalCode `refused`.
    """

    def __init__(self, missing: str) -> None:
        super().__init__("credential", what=f"missing {missing}")
        self.missing = missing


@runtime_checkable
class TokenProvider(Protocol):
    """Source of bearer tokens for one backend."""

    async def get_token(self) -> str:
        """A currently valid access token (cached until shortly before expiry)."""
        ...

    def invalidate(self) -> None:
        """Forget any cached token (after the service answered 401)."""
        ...

    async def aclose(self) -> None: ...


class StaticTokenProvider:
    """A fixed token: for tests and the loopback stand-in, never for Azure."""

    def __init__(self, token: str) -> None:
        if not token:
            raise CredentialUnavailable("token")
        self._token = token

    def __repr__(self) -> str:
        return "StaticTokenProvider(token=[redacted])"

    async def get_token(self) -> str:
        return self._token

    def invalidate(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


class AzureIdentityTokenProvider:
    """Wraps an `azure.identity.aio` credential; caches its token until `refresh_margin` before
    expiry. One provider per backend; safe for concurrent use."""

    def __init__(
        self, credential: AsyncTokenCredential, scope: str, *, refresh_margin: float = 300.0
    ) -> None:
        self._credential = credential
        self._scope = scope
        self._margin = refresh_margin
        self._token: str | None = None
        self._expires_on = 0.0
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"AzureIdentityTokenProvider(credential={type(self._credential).__name__})"

    @property
    def scope(self) -> str:
        return self._scope

    async def get_token(self) -> str:
        async with self._lock:
            if self._token is None or time.time() >= self._expires_on - self._margin:
                access = await self._credential.get_token(self._scope)
                self._token = access.token
                self._expires_on = float(access.expires_on)
            return self._token

    def invalidate(self) -> None:
        self._token = None
        self._expires_on = 0.0

    async def aclose(self) -> None:
        await self._credential.close()


def token_provider_for(
    source: SecretCredentialSource | WorkloadIdentityCredentialSource,
    scope: str,
    *,
    secret_data: Mapping[str, str] | None = None,
) -> TokenProvider:
    """Build the provider a backend config names.

    `secret_data` is the decoded `data` of the Kubernetes Secret that `source` references; the
    operator reads it (it owns the Kubernetes client) and passes it here. With a `tokenKey`
    present in the Secret, the token is used as-is (stand-in/testing); otherwise the tenant,
    client id and client secret keys build an `azure.identity.aio.ClientSecretCredential`.
    """
    if isinstance(source, WorkloadIdentityCredentialSource):
        from azure.identity.aio import WorkloadIdentityCredential

        return AzureIdentityTokenProvider(
            WorkloadIdentityCredential(
                tenant_id=source.tenant_id,
                client_id=source.client_id,
                token_file_path=source.token_file_path,
            ),
            scope,
        )
    if secret_data is None:
        raise CredentialUnavailable(f"data of Secret {source.secret_name}")
    if source.token_key and source.token_key in secret_data:
        return StaticTokenProvider(secret_data[source.token_key])
    for key in (source.tenant_id_key, source.client_id_key, source.client_secret_key):
        if not secret_data.get(key):
            raise CredentialUnavailable(f"key {key} in Secret {source.secret_name}")
    from azure.identity.aio import ClientSecretCredential

    return AzureIdentityTokenProvider(
        ClientSecretCredential(
            secret_data[source.tenant_id_key],
            secret_data[source.client_id_key],
            secret_data[source.client_secret_key],
        ),
        scope,
    )


class SecretTokens:
    """Reads the credential Secret on first use (the driver is built synchronously), then
    delegates to the provider it describes."""

    def __init__(
        self,
        api: Any,
        source: SecretCredentialSource,
        scope: str,
        operator_namespace: str | None = None,
    ) -> None:
        self._api = api
        self._source = source
        self._scope = scope
        # Where a Secret named without a namespace is read: the operator's own namespace.
        self._namespace = source.namespace or operator_namespace or DEFAULT_SECRET_NAMESPACE
        self._inner: TokenProvider | None = None
        self._retired: list[TokenProvider] = []

    def __repr__(self) -> str:
        return f"SecretTokens(secret={self._source.secret_name!r})"

    async def _provider(self) -> TokenProvider:
        if self._inner is None:
            import base64

            from kubernetes_asyncio import client

            secret = await client.CoreV1Api(self._api).read_namespaced_secret(
                self._source.secret_name, self._namespace
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
