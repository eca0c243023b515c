"""AcasBackendConfig validation, the operator config union, and the token providers."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from sandbox_operator.acas.auth import (
    AzureIdentityTokenProvider,
    CredentialUnavailable,
    StaticTokenProvider,
    TokenProvider,
    token_provider_for,
)
from sandbox_operator.acas.config import (
    AcasBackendConfig,
    SecretCredentialSource,
    WorkloadIdentityCredentialSource,
)
from sandbox_operator.acas.operations import API_VERSION, TOKEN_SCOPE
from sandbox_operator.contract import Capability, Egress

BASE: dict[str, Any] = {
    "type": "acas",
    "name": "acas-west",
    "endpoint": "https://management.westus2.azuredevcompute.io/",
    "subscription": "00000000-0000-0000-0000-000000000000",
    "resourceGroup": "rg",
    "sandboxGroup": "group",
    "credential": {"source": "workloadIdentity"},
}


def cfg(**kw: Any) -> AcasBackendConfig:
    return AcasBackendConfig.model_validate({**BASE, **kw})


def test_defaults() -> None:
    c = cfg()
    assert c.endpoint == "https://management.westus2.azuredevcompute.io"
    assert c.api_version == API_VERSION
    assert c.token_scope == TOKEN_SCOPE
    assert c.isolation == "microvm"
    assert c.create_method == "PUT"
    assert Capability.EXEC in c.declarations.capabilities
    assert Capability.SNAPSHOT not in c.declarations.capabilities
    assert c.declarations.egress_modes == {Egress.CLOSED, Egress.ALLOWLIST}
    assert c.declarations.observes_egress is False  # it produces no egress records
    assert isinstance(c.credential, WorkloadIdentityCredentialSource)
    assert c.lifetime.max_lifetime_seconds > 0
    assert c.image_for("python:3.12") == "python:3.12"
    assert cfg(images={"python": "python3.12"}).image_for("python") == "python3.12"
    assert c.observe_interval_seconds == 10.0
    assert cfg(observeIntervalSeconds=2.5).observe_interval_seconds == 2.5


@pytest.mark.parametrize(
    "override",
    [
        {"isolation": "container"},
        {"endpoint": "http://example.com"},
        {"endpoint": "ftp://example.com"},
        {"endpoint": "https://user:pw@example.com"},
        {"endpoint": "https://example.com/?x=1"},
        {"credential": {"source": "apiKey"}},
        {"declarations": {"capabilities": ["exec", "snapshot"]}},
        {"declarations": {"osFamilies": ["windows"]}},
        # #25 item 8: the service keeps no egress record this backend could produce.
        {"declarations": {"observesEgress": True}},
        # #38 item 2: the service's egress policy names hosts, never methods or paths.
        {"declarations": {"egressRules": True}},
        {"unknownField": 1},
        {"name": "Not_DNS"},
        {"timeouts": {"read": 0}},
        {"observeIntervalSeconds": 0},
        {"observeIntervalSeconds": 601},
    ],
)
def test_refused(override: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        cfg(**override)


def test_loopback_http_allowed() -> None:
    assert cfg(endpoint="http://127.0.0.1:8080").endpoint == "http://127.0.0.1:8080"
    assert cfg(endpoint="http://localhost:1").endpoint == "http://localhost:1"


def test_secret_credential() -> None:
    c = cfg(credential={"source": "secret", "secretName": "acas-sp", "namespace": "ops"})
    assert isinstance(c.credential, SecretCredentialSource)
    assert c.credential.client_secret_key == "clientSecret"


def test_operator_config_accepts_acas() -> None:
    from sandbox_operator.config import parse_config

    config, _ = parse_config({"backends": [BASE]})
    assert isinstance(config.backends[0], AcasBackendConfig)


async def test_static_token_provider() -> None:
    provider = token_provider_for(
        SecretCredentialSource(secret_name="s", token_key="token"),
        TOKEN_SCOPE,
        secret_data={"token": "abc"},
    )
    assert isinstance(provider, StaticTokenProvider)
    assert isinstance(provider, TokenProvider)
    assert await provider.get_token() == "abc"
    assert "abc" not in repr(provider)


async def test_service_principal_provider_and_missing_keys() -> None:
    source = SecretCredentialSource(secret_name="acas-sp")
    data = {"tenantId": "t", "clientId": "c", "clientSecret": "very-secret"}
    provider = token_provider_for(source, TOKEN_SCOPE, secret_data=data)
    assert isinstance(provider, AzureIdentityTokenProvider)
    assert "very-secret" not in repr(provider)
    await provider.aclose()
    with pytest.raises(CredentialUnavailable) as info:
        token_provider_for(source, TOKEN_SCOPE, secret_data={"tenantId": "t", "clientId": "c"})
    assert info.value.missing == "key clientSecret in Secret acas-sp"
    with pytest.raises(CredentialUnavailable):
        token_provider_for(source, TOKEN_SCOPE, secret_data=None)


async def test_workload_identity_provider(tmp_path: Any) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("projected")
    provider = token_provider_for(
        WorkloadIdentityCredentialSource(
            tenant_id="t", client_id="c", token_file_path=str(token_file)
        ),
        TOKEN_SCOPE,
    )
    assert isinstance(provider, AzureIdentityTokenProvider)
    assert provider.scope == TOKEN_SCOPE
    await provider.aclose()


class FakeCredential:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.expires_in = 3600

    async def get_token(self, *scopes: str, **_: Any) -> Any:
        import time

        from azure.core.credentials import AccessToken

        self.calls.append(scopes)
        return AccessToken(f"tok-{len(self.calls)}", int(time.time()) + self.expires_in)

    async def close(self) -> None:
        return None


async def test_azure_provider_caches_and_refreshes() -> None:
    cred = FakeCredential()
    provider = AzureIdentityTokenProvider(cred, TOKEN_SCOPE)  # type: ignore[arg-type]
    assert await provider.get_token() == "tok-1"
    assert await provider.get_token() == "tok-1"
    assert cred.calls == [(TOKEN_SCOPE,)]
    provider.invalidate()
    assert await provider.get_token() == "tok-2"
    cred.expires_in = 10  # inside the refresh margin: fetched every time
    provider.invalidate()
    assert await provider.get_token() == "tok-3"
    assert await provider.get_token() == "tok-4"
