"""The shared kube-client factory and the API answer readers (sandbox_operator.kubeapi)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from sandbox_operator import kubeapi


def _kubeconfig(path: Path, server: str = "https://example.invalid:6443") -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t0ken"}}],
                "contexts": [
                    {"name": "one", "context": {"cluster": "c", "user": "u"}},
                    {"name": "two", "context": {"cluster": "c", "user": "u", "namespace": "x"}},
                ],
                "current-context": "one",
            }
        )
    )
    return path


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2024-05-01T10:00:00Z", datetime(2024, 5, 1, 10, tzinfo=UTC)),
        (
            "2024-05-01T10:00:00+02:00",
            datetime(2024, 5, 1, 10, tzinfo=timezone(timedelta(hours=2))),
        ),
        ("2024-05-01T10:00:00", datetime(2024, 5, 1, 10, tzinfo=UTC)),
        (datetime(2024, 5, 1, 10), datetime(2024, 5, 1, 10, tzinfo=UTC)),
        (None, None),
        ("", None),
        ("yesterday", None),
        (12345, None),
    ],
)
def test_parse_time(value: object, expected: datetime | None) -> None:
    parsed = kubeapi.parse_time(value)
    assert parsed == expected
    if parsed is not None:
        assert parsed.tzinfo is not None


def _api_exc(body: Any, reason: str = "Forbidden") -> ApiException:
    exc = ApiException(status=403, reason=reason)
    exc.body = body
    return exc


def test_api_message_prefers_the_status_message() -> None:
    exc = _api_exc(json.dumps({"kind": "Status", "message": "pods is forbidden: no"}))
    assert kubeapi.api_message(exc) == "pods is forbidden: no"


@pytest.mark.parametrize("body", [None, "", "not json", json.dumps({"kind": "Status"}), "[1]"])
def test_api_message_falls_back_to_the_reason(body: Any) -> None:
    assert kubeapi.api_message(_api_exc(body)) == "Forbidden"


def test_api_message_empty_without_anything() -> None:
    assert kubeapi.api_message(ApiException(status=500)) == ""


async def test_new_api_client_reads_the_given_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")  # an explicit file wins
    path = _kubeconfig(tmp_path / "kubeconfig", server="https://one.invalid:6443")
    api = await kubeapi.new_api_client(kubeconfig=str(path))
    try:
        assert api.configuration.host == "https://one.invalid:6443"
    finally:
        await api.close()


async def test_new_api_client_uses_kubeconfig_env_and_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _kubeconfig(tmp_path / "kubeconfig", server="https://env.invalid:6443")
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    api = await kubeapi.new_api_client(context="two")
    try:
        assert api.configuration.host == "https://env.invalid:6443"
    finally:
        await api.close()


async def test_new_api_client_loads_into_the_given_configuration(tmp_path: Path) -> None:
    from kubernetes_asyncio import client

    cfg = client.Configuration()
    path = _kubeconfig(tmp_path / "kubeconfig")
    api = await kubeapi.new_api_client(kubeconfig=path.as_posix(), configuration=cfg)
    try:
        assert api.configuration is cfg
        assert cfg.host == "https://example.invalid:6443"
        assert client.Configuration.get_default_copy().host != cfg.host  # global untouched
    finally:
        await api.close()


async def test_new_api_client_in_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []

    def fake_incluster(client_configuration: Any = None) -> None:
        calls.append(client_configuration)
        client_configuration.host = "https://in-cluster.invalid"

    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    from kubernetes_asyncio import config

    monkeypatch.setattr(config, "load_incluster_config", fake_incluster)
    api = await kubeapi.new_api_client()
    try:
        assert calls == [api.configuration]
        assert api.configuration.host == "https://in-cluster.invalid"
    finally:
        await api.close()
