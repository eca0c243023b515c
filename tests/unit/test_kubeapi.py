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


_OPERATOR_IMPORTS = """
import json, sys
import sandbox_operator.cli, kopf, sandbox_operator.reconcile.handlers
models = [m for m in sys.modules if m.startswith("kubernetes_asyncio.client.models.")]
apis = [m for m in sys.modules if m.startswith("kubernetes_asyncio.client.api.")]
print(json.dumps({"models": len(models), "apis": len(apis)}))
"""


def test_operator_process_loads_only_the_kube_classes_it_uses() -> None:
    """kubernetes_asyncio's package imports every generated class (about 1,600 modules, a third
    of the operator's resident memory); kubeapi makes them lazy, so the operator's imports load
    a handful (kopf's owner-reference helpers import two models)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _OPERATOR_IMPORTS], capture_output=True, text=True, check=True
    )
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded["models"] < 20, loaded
    assert loaded["apis"] < 5, loaded


async def test_lazy_kube_classes_are_the_library_s_own() -> None:
    """A class read from the lazy package is the generated module's class, and the ApiClient
    (de)serializes through it as before."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.api.core_v1_api import CoreV1Api
    from kubernetes_asyncio.client.models.v1_pod import V1Pod

    assert client.V1Pod is V1Pod and client.models.V1Pod is V1Pod
    assert client.CoreV1Api is CoreV1Api and client.api.CoreV1Api is CoreV1Api
    assert "V1Pod" in dir(client.models)
    with pytest.raises(AttributeError):
        _ = client.models.V1NoSuchThing
    api = client.ApiClient()
    try:
        pod = api._ApiClient__deserialize(  # type: ignore[attr-defined]
            {
                "metadata": {
                    "name": "p",
                    "ownerReferences": [
                        {"kind": "Sandbox", "name": "s", "apiVersion": "v1", "uid": "u"}
                    ],
                }
            },
            "V1Pod",
        )
        assert isinstance(pod, V1Pod)
        assert pod.metadata.owner_references[0].name == "s"
        assert api.sanitize_for_serialization(pod)["metadata"]["name"] == "p"
    finally:
        await api.close()


async def test_a_request_consults_no_environment_and_the_env_proxy_is_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kubernetes_asyncio's session trusts the environment, which made aiohttp look up
    ``.netrc`` and the proxy variables in a worker thread on every request; the clients kubeapi
    makes read the proxy for the API server once, at creation, and a request hops to no thread."""
    import asyncio

    from aiohttp import web
    from kubernetes_asyncio import client

    from sandbox_operator.kubecalls import call_json

    async def resources(_req: web.Request) -> web.Response:
        return web.json_response({"kind": "APIResourceList"})

    app = web.Application()
    app.router.add_get("/api/v1/", resources)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    loop = asyncio.get_running_loop()
    hops: list[Any] = []
    real = loop.run_in_executor

    def counted(executor: Any, fn: Any, *args: Any) -> Any:
        hops.append(fn)
        return real(executor, fn, *args)

    monkeypatch.setattr(loop, "run_in_executor", counted)
    for var in ("HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    api = await kubeapi.new_api_client(
        kubeconfig=str(_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{port}"))
    )
    try:
        hops.clear()
        for _ in range(3):
            assert (await call_json(client.CoreV1Api(api).get_api_resources))["kind"]
        assert hops == []
        assert api.rest_client.proxy is None
    finally:
        await api.close()
        await runner.cleanup()
    monkeypatch.setenv("HTTP_PROXY", "http://user:pw@proxy.invalid:3128")
    api = await kubeapi.new_api_client(
        kubeconfig=str(_kubeconfig(tmp_path / "kc2", "http://api.invalid:6443"))
    )
    try:
        assert api.rest_client.proxy == "http://proxy.invalid:3128"
        assert api.rest_client.proxy_headers["Proxy-Authorization"].startswith("Basic ")
    finally:
        await api.close()
    monkeypatch.setenv("NO_PROXY", "api.invalid")
    api = await kubeapi.new_api_client(
        kubeconfig=str(_kubeconfig(tmp_path / "kc3", "http://api.invalid:6443"))
    )
    try:
        assert api.rest_client.proxy is None
    finally:
        await api.close()
