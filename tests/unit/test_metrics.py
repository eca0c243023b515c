"""sandbox_operator.metrics: request labelling, the API client and kopf session hooks, the census
collector, reconcile timing, the /metrics endpoint and the CLI flags. No cluster: a local aiohttp
server stands in for the API server where real HTTP is wanted."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import REGISTRY, generate_latest

from sandbox_operator import apirequest, cli, metrics
from sandbox_operator.apirequest import parse_api_request
from sandbox_operator.metrics import (
    API_REQUESTS,
    API_RESPONSE_BYTES,
    SANDBOXES,
    kopf_session,
    register_sandbox_census,
    track_reconcile,
)
from sandbox_operator.metrics import requests as request_metrics
from sandbox_operator.metrics import server as metrics_server
from sandbox_operator.metrics.census import SandboxCensus
from sandbox_operator.metrics.requests import instrument_api_client

GROUP = "sandbox-operator.dev"


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def requests(verb: str, resource: str, code: str, client: str = "operator") -> float:
    return value(
        "sandbox_operator_api_requests_total",
        verb=verb,
        resource=resource,
        code=code,
        client=client,
    )


def response_bytes(verb: str, resource: str, client: str = "operator") -> float:
    return value(
        "sandbox_operator_api_response_bytes_total", verb=verb, resource=resource, client=client
    )


def watch_restarts(resource: str) -> float:
    return value("sandbox_operator_watch_restarts_total", resource=resource)


class Delta:
    """Counter values before and after a block (the metrics are process-wide)."""

    def __init__(self, fn: Any, *args: str) -> None:
        self.fn, self.args = fn, args
        self.before = fn(*args)

    @property
    def change(self) -> float:
        return float(self.fn(*self.args)) - float(self.before)


# ---- path -> (verb, resource) -------------------------------------------------------------------

NS_PODS = "/api/v1/namespaces/ns/pods"
SBX = f"/apis/{GROUP}/v1/namespaces/ns/sandboxes"


@pytest.mark.parametrize(
    ("method", "url", "query", "want"),
    [
        # core group, namespaced
        ("GET", f"{NS_PODS}/p1", None, ("get", "pods")),
        ("HEAD", f"{NS_PODS}/p1", None, ("get", "pods")),
        ("GET", NS_PODS, None, ("list", "pods")),
        ("GET", f"{NS_PODS}?labelSelector=a%3Db&watch=false", None, ("list", "pods")),
        ("GET", f"{NS_PODS}?watch=true&resourceVersion=5", None, ("watch", "pods")),
        ("GET", f"{NS_PODS}?watch=1", None, ("watch", "pods")),
        ("GET", NS_PODS, [("watch", True), ("timeoutSeconds", 60)], ("watch", "pods")),
        ("GET", NS_PODS, {"watch": "true"}, ("watch", "pods")),
        ("GET", NS_PODS, [("watch", False)], ("list", "pods")),
        ("POST", NS_PODS, None, ("create", "pods")),
        ("PUT", f"{NS_PODS}/p1", None, ("update", "pods")),
        ("PATCH", f"{NS_PODS}/p1", None, ("patch", "pods")),
        ("DELETE", f"{NS_PODS}/p1", None, ("delete", "pods")),
        ("DELETE", NS_PODS, [("labelSelector", "a=b")], ("deletecollection", "pods")),
        ("GET", f"{NS_PODS}/p1/log", None, ("get", "pods/log")),
        ("POST", f"{NS_PODS}/p1/exec", None, ("create", "pods/exec")),
        ("PATCH", f"{NS_PODS}/p1/status", None, ("patch", "pods/status")),
        ("POST", "/api/v1/namespaces/ns/events", None, ("create", "events")),
        ("GET", "/api/v1/namespaces/ns/events?fieldSelector=x", None, ("list", "events")),
        ("GET", "/api/v1/namespaces/ns/services/svc", None, ("get", "services")),
        (
            "GET",
            "/api/v1/namespaces/ns/services/svc:80/proxy/metrics",
            None,
            ("get", "services/proxy"),
        ),
        # objects whose names look like path words
        ("GET", f"{NS_PODS}/api", None, ("get", "pods")),
        ("GET", f"{NS_PODS}/namespaces", None, ("get", "pods")),
        ("GET", "/api/v1/namespaces/status/pods", None, ("list", "pods")),  # namespace "status"?
        # custom resources, namespaced, with the status subresource
        ("GET", f"{SBX}/s1", None, ("get", "sandboxes")),
        ("PATCH", f"{SBX}/s1", None, ("patch", "sandboxes")),
        ("PATCH", f"{SBX}/s1/status", None, ("patch", "sandboxes/status")),
        ("PUT", f"{SBX}/s1/status", None, ("update", "sandboxes/status")),
        ("GET", f"{SBX}/s1/status", None, ("get", "sandboxes/status")),
        ("GET", f"{SBX}?watch=true&allowWatchBookmarks=true", None, ("watch", "sandboxes")),
        ("DELETE", f"{SBX}/s1", None, ("delete", "sandboxes")),
        ("DELETE", SBX, None, ("deletecollection", "sandboxes")),
        (
            "PATCH",
            "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies/np",
            None,
            ("patch", "networkpolicies"),
        ),
        # all namespaces and cluster-scoped resources
        ("GET", f"/apis/{GROUP}/v1/sandboxes", None, ("list", "sandboxes")),
        ("GET", f"/apis/{GROUP}/v1/sandboxscopes?watch=true", None, ("watch", "sandboxscopes")),
        ("GET", "/api/v1/pods?watch=true", None, ("watch", "pods")),
        ("GET", "/apis/node.k8s.io/v1/runtimeclasses/gvisor", None, ("get", "runtimeclasses")),
        ("GET", "/apis/node.k8s.io/v1/runtimeclasses", None, ("list", "runtimeclasses")),
        (
            "PATCH",
            "/apis/kopf.dev/v1/clusterkopfpeerings/so",
            None,
            ("patch", "clusterkopfpeerings"),
        ),
        (
            "GET",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions?watch=true",
            None,
            ("watch", "customresourcedefinitions"),
        ),
        # namespaces themselves: their name, and their own subresources
        ("GET", "/api/v1/namespaces", None, ("list", "namespaces")),
        ("GET", "/api/v1/namespaces?watch=true", None, ("watch", "namespaces")),
        ("GET", "/api/v1/namespaces/ns", None, ("get", "namespaces")),
        ("DELETE", "/api/v1/namespaces/ns", None, ("delete", "namespaces")),
        ("GET", "/api/v1/namespaces/ns/status", None, ("get", "namespaces/status")),
        ("PUT", "/api/v1/namespaces/ns/finalize", None, ("update", "namespaces/finalize")),
        # the legacy /watch/ and /proxy/ prefixes
        ("GET", "/api/v1/watch/namespaces/ns/pods", None, ("watch", "pods")),
        ("GET", "/api/v1/watch/namespaces/ns/pods/p1", None, ("watch", "pods")),
        ("GET", f"/apis/{GROUP}/v1/watch/sandboxes", None, ("watch", "sandboxes")),
        ("GET", "/api/v1/proxy/namespaces/ns/pods/p1/x/y", None, ("proxy", "pods")),
        # discovery and other non-resource paths
        ("GET", "/api", None, ("get", "discovery")),
        ("GET", "/api/v1", None, ("get", "discovery")),
        ("GET", "/apis", None, ("get", "discovery")),
        ("GET", f"/apis/{GROUP}", None, ("get", "discovery")),
        ("GET", f"/apis/{GROUP}/v1", None, ("get", "discovery")),
        ("GET", "/version", None, ("get", "nonresource")),
        ("GET", "/openapi/v2", None, ("get", "nonresource")),
        ("GET", "/", None, ("get", "nonresource")),
        # full URLs
        ("GET", f"https://10.0.0.1:6443{NS_PODS}/p1", None, ("get", "pods")),
        ("get", f"https://kubernetes.default.svc{SBX}?watch=true", None, ("watch", "sandboxes")),
        ("OPTIONS", NS_PODS, None, ("options", "pods")),
    ],
)
def test_request_labels(method: str, url: str, query: Any, want: tuple[str, str]) -> None:
    assert parse_api_request(method, url, query) == want


def test_server_path_prefix_is_dropped_first() -> None:
    url = "https://rancher.example/k8s/clusters/c-1/api/v1/namespaces/ns/pods/p1"
    assert parse_api_request("GET", url, prefix="/k8s/clusters/c-1") == ("get", "pods")
    assert parse_api_request("GET", url, prefix="/k8s/clusters/c-1/") == ("get", "pods")
    # A prefix that itself holds an "api" segment is only understood when given.
    url = "https://proxy.example/api/cluster/api/v1/namespaces/ns/pods"
    assert parse_api_request("GET", url, prefix="/api/cluster") == ("list", "pods")


# ---- instrument_api_client against a fake rest client -------------------------------------------


class FakeRest:
    """Shaped like kubernetes_asyncio's RESTClientObject: GET/... go through self.request."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.next: Any = None  # a response, an exception, or an awaitable to wait on

    async def request(
        self,
        method: str,
        url: str,
        query_params: Any = None,
        headers: Any = None,
        body: Any = None,
        post_params: Any = None,
        _preload_content: bool = True,
        _request_timeout: Any = None,
    ) -> Any:
        self.calls.append((method, url, query_params))
        nxt = self.next
        if isinstance(nxt, BaseException):
            raise nxt
        if isinstance(nxt, asyncio.Event):
            await nxt.wait()
        return nxt

    async def GET(self, url: str, headers: Any = None, query_params: Any = None, **kw: Any) -> Any:
        return await self.request("GET", url, headers=headers, query_params=query_params, **kw)


def fake_api_client(host: str = "https://api.example:6443") -> Any:
    return SimpleNamespace(rest_client=FakeRest(), configuration=SimpleNamespace(host=host))


async def test_hook_counts_requests_codes_and_bytes() -> None:
    api = fake_api_client()
    instrument_api_client(api)
    rest = api.rest_client
    host = "https://api.example:6443"

    rest.next = SimpleNamespace(status=200, data=b"x" * 123)
    got = Delta(requests, "get", "pods", "200")
    got_bytes = Delta(response_bytes, "get", "pods")
    resp = await rest.GET(f"{host}{NS_PODS}/p1")
    assert resp is rest.next  # the response passes through untouched
    assert (got.change, got_bytes.change) == (1, 123)

    rest.next = SimpleNamespace(status=201, data=b"{}")
    got = Delta(requests, "patch", "sandboxes/status", "201")
    await rest.request("PATCH", f"{host}{SBX}/s1/status", body={"status": {}})
    assert got.change == 1

    rest.next = SimpleNamespace(status=200, data=b"")
    got = Delta(requests, "deletecollection", "pods", "200")
    await rest.request("DELETE", f"{host}{NS_PODS}", [("labelSelector", "a=b")])
    assert got.change == 1


async def test_hook_counts_api_exceptions_transport_errors_and_cancellation() -> None:
    from kubernetes_asyncio.client.exceptions import ApiException

    api = fake_api_client()
    instrument_api_client(api)
    rest = api.rest_client

    conflict = ApiException(status=409, reason="Conflict")
    conflict.body = b'{"kind":"Status","code":409}'
    rest.next = conflict
    got = Delta(requests, "patch", "sandboxes", "409")
    got_bytes = Delta(response_bytes, "patch", "sandboxes")
    with pytest.raises(ApiException) as err:
        await rest.request("PATCH", f"{SBX}/s1")
    assert err.value is conflict  # re-raised as is
    assert (got.change, got_bytes.change) == (1, len(conflict.body))

    rest.next = ApiException(status=0, reason="Cannot prepare a request message")
    got = Delta(requests, "create", "pods", "error")
    with pytest.raises(ApiException):
        await rest.request("POST", NS_PODS)
    assert got.change == 1

    rest.next = ConnectionResetError("reset by peer")
    got = Delta(requests, "get", "pods", "error")
    with pytest.raises(ConnectionResetError):
        await rest.request("GET", f"{NS_PODS}/p1")
    assert got.change == 1

    rest.next = asyncio.Event()
    got = Delta(requests, "list", "events", "cancelled")
    task = asyncio.create_task(rest.request("GET", "/api/v1/namespaces/ns/events"))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert got.change == 1


async def test_hook_counts_watches_as_watch_restarts() -> None:
    api = fake_api_client()
    instrument_api_client(api)
    api.rest_client.next = SimpleNamespace(status=200, data=b"")
    restarts = Delta(watch_restarts, "sandboxes")
    got = Delta(requests, "watch", "sandboxes", "200")
    await api.rest_client.GET(SBX, query_params=[("watch", True)])
    await api.rest_client.GET(SBX, query_params=[("watch", True), ("resourceVersion", "7")])
    await api.rest_client.GET(SBX)  # a list is no watch
    assert (restarts.change, got.change) == (2, 2)


async def test_hook_is_idempotent_and_uses_the_hosts_path_prefix() -> None:
    api = fake_api_client("https://rancher.example/k8s/clusters/c-1")
    instrument_api_client(api)
    wrapped = api.rest_client.request
    instrument_api_client(api)
    assert api.rest_client.request is wrapped
    api.rest_client.next = SimpleNamespace(status=200, data=b"")
    got = Delta(requests, "get", "pods", "200")
    await api.rest_client.GET(f"https://rancher.example/k8s/clusters/c-1{NS_PODS}/p1")
    assert got.change == 1  # once, not twice


async def test_a_broken_label_never_breaks_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    api = fake_api_client()
    instrument_api_client(api)

    def boom(*_: Any, **__: Any) -> tuple[str, str]:
        raise ValueError("bug")

    monkeypatch.setattr(apirequest, "parse_api_request", boom)
    api.rest_client.next = SimpleNamespace(status=200, data=b"ok")
    assert (await api.rest_client.GET(NS_PODS)).data == b"ok"


# ---- a local stand-in for the API server --------------------------------------------------------

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1", "namespace": "ns"}}
NOT_FOUND = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404}
EVENTS = [
    {"type": "ADDED", "object": {**POD, "metadata": {"name": "p1", "resourceVersion": "1"}}},
    {"type": "MODIFIED", "object": {**POD, "metadata": {"name": "p1", "resourceVersion": "2"}}},
]


class FakeApiServer:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None]] = []  # method, path?query, Authorization
        self.port = 0
        self.sent: dict[str, int] = {}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.method, request.path_qs, request.headers.get("Authorization")))
        path = request.path.removeprefix("/prefix")
        if request.query.get("watch", "").lower() == "true":
            resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            body = b"".join(json.dumps(e).encode() + b"\n" for e in EVENTS)
            self.sent["watch"] = len(body)
            for line in body.splitlines(keepends=True):
                await resp.write(line)
            await resp.write_eof()
            return resp
        if path.endswith("/pods/missing"):
            return web.json_response(NOT_FOUND, status=404)
        if request.method == "GET" and path.endswith("/pods/p1"):
            body = json.dumps(POD).encode()
            self.sent["pod"] = len(body)
            return web.Response(body=body, content_type="application/json")
        return web.json_response({"kind": "Status", "code": 200})


@pytest.fixture
async def api_server() -> AsyncIterator[FakeApiServer]:
    server = FakeApiServer()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.port = runner.addresses[0][1]
    try:
        yield server
    finally:
        await runner.cleanup()


def kube_client(host: str) -> Any:
    from kubernetes_asyncio import client

    cfg = client.Configuration(host=host)
    api = client.ApiClient(configuration=cfg)
    instrument_api_client(api)
    return api


async def test_a_real_api_client_is_counted_preloaded_and_streamed(
    api_server: FakeApiServer,
) -> None:
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

    async with kube_client(f"http://127.0.0.1:{api_server.port}/prefix") as api:
        core = client.CoreV1Api(api)

        got = Delta(requests, "get", "pods", "200")
        got_bytes = Delta(response_bytes, "get", "pods")
        pod = await core.read_namespaced_pod("p1", "ns")
        assert pod.metadata.name == "p1"
        assert (got.change, got_bytes.change) == (1, api_server.sent["pod"])

        got = Delta(requests, "get", "pods", "404")
        with pytest.raises(ApiException) as err:
            await core.read_namespaced_pod("missing", "ns")
        assert err.value.status == 404 and got.change == 1

        # _preload_content=False: the raw aiohttp response; bytes counted at the end of its body.
        got = Delta(requests, "watch", "pods", "200")
        got_bytes = Delta(response_bytes, "watch", "pods")
        restarts = Delta(watch_restarts, "pods")
        resp = await core.list_namespaced_pod("ns", watch=True, _preload_content=False)
        assert got.change == 1 and restarts.change == 1
        lines = [line async for line in resp.content]
        resp.release()
        assert [json.loads(line)["type"] for line in lines] == ["ADDED", "MODIFIED"]
        assert got_bytes.change == api_server.sent["watch"]

        got = Delta(requests, "patch", "sandboxes/status", "200")
        await client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
            GROUP, "v1", "ns", "sandboxes", "s1", {"status": {}}
        )
        assert got.change == 1
    assert ("GET", "/prefix/api/v1/namespaces/ns/pods/p1", None) in api_server.seen


async def test_a_refused_connection_is_counted_as_error() -> None:
    from kubernetes_asyncio import client

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with kube_client(f"http://127.0.0.1:{port}") as api:
        got = Delta(requests, "list", "pods", "error")
        with pytest.raises(Exception) as err:
            await client.CoreV1Api(api).list_namespaced_pod("ns")
        assert "ApiException" not in type(err.value).__name__
        assert got.change == 1


# ---- kopf's own session -------------------------------------------------------------------------


async def test_kopf_session_counts_watches_lists_and_patches(api_server: FakeApiServer) -> None:
    import kopf

    info = kopf.ConnectionInfo(server=f"http://127.0.0.1:{api_server.port}", token="tkn")
    session = kopf_session.instrumented_session(info)
    base = info.server
    try:
        restarts = Delta(watch_restarts, "sandboxes")
        got = Delta(requests, "watch", "sandboxes", "200", "kopf")
        got_bytes = Delta(response_bytes, "watch", "sandboxes", "kopf")
        url = f"{base}{SBX}?watch=true&allowWatchBookmarks=true"
        async with session.get(url) as resp:
            async for _line in resp.content:
                pass
        assert (restarts.change, got.change) == (1, 1)
        assert got_bytes.change == api_server.sent["watch"]

        got = Delta(requests, "list", "sandboxes", "200", "kopf")
        async with session.get(f"{base}{SBX}") as resp:
            await resp.json()
        assert got.change == 1

        got = Delta(requests, "get", "pods", "404", "kopf")
        async with session.get(f"{base}{NS_PODS}/missing") as resp:
            assert resp.status == 404
        assert got.change == 1

        got = Delta(requests, "patch", "clusterkopfpeerings", "200", "kopf")
        async with session.patch(f"{base}/apis/kopf.dev/v1/clusterkopfpeerings/so", json={}):
            pass
        assert got.change == 1
    finally:
        await session.close()
    # The credentials reach the server as kopf would send them.
    assert {auth for _m, _p, auth in api_server.seen} == {"Bearer tkn"}

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    session = kopf_session.instrumented_session(
        kopf.ConnectionInfo(server=f"http://127.0.0.1:{port}")
    )
    try:
        got = Delta(requests, "list", "sandboxes", "error", "kopf")
        with pytest.raises(OSError):
            await session.get(f"http://127.0.0.1:{port}{SBX}")
        assert got.change == 1
    finally:
        await session.close()


async def test_kopf_and_operator_requests_are_told_apart(api_server: FakeApiServer) -> None:
    import kopf

    base = f"http://127.0.0.1:{api_server.port}"
    ours = Delta(requests, "get", "pods", "200", "operator")
    kopfs = Delta(requests, "get", "pods", "200", "kopf")
    session = kopf_session.instrumented_session(kopf.ConnectionInfo(server=base))
    try:
        async with session.get(f"{base}{NS_PODS}/p1") as resp:
            await resp.read()
    finally:
        await session.close()
    assert (ours.change, kopfs.change) == (0, 1)
    from kubernetes_asyncio import client

    async with kube_client(base) as api:
        await client.CoreV1Api(api).read_namespaced_pod("p1", "ns")
    assert (ours.change, kopfs.change) == (1, 1)


async def test_kopf_login_wraps_kopfs_default_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    import kopf

    info = kopf.ConnectionInfo(
        server="https://10.0.0.1:443", token="tkn", default_namespace="ns", priority=7
    )
    monkeypatch.setattr(kopf, "login_via_client", lambda **_: info)
    got = await kopf_session.kopf_login(
        logger=logging.getLogger("t"), settings=kopf.OperatorSettings()
    )
    assert isinstance(got, kopf.AiohttpSession)
    assert (got.server, got.default_namespace, got.priority) == ("https://10.0.0.1:443", "ns", 7)
    try:
        assert got.aiohttp_session.headers["Authorization"] == "Bearer tkn"
        assert got.aiohttp_session.trace_configs
    finally:
        await got.aiohttp_session.close()

    monkeypatch.setattr(kopf, "login_via_client", lambda **_: None)
    assert await kopf_session.kopf_login(logger=logging.getLogger("t"), settings=None) is None

    # A session that cannot be built: kopf still gets the credentials (uncounted).
    def broken(_: Any) -> Any:
        raise RuntimeError("no")

    monkeypatch.setattr(kopf, "login_via_client", lambda **_: info)
    monkeypatch.setattr(kopf_session, "instrumented_session", broken)
    assert await kopf_session.kopf_login(logger=logging.getLogger("t"), settings=None) is info


def test_instrument_kopf_registers_one_login_handler() -> None:
    import kopf
    from kopf._core.intents.causes import Activity  # kopf's internals: a test-only peek
    from kopf._core.intents.registries import SmartOperatorRegistry

    registry = kopf.OperatorRegistry()
    assert kopf_session.instrument_kopf(registry)
    assert kopf_session.instrument_kopf(registry)
    handlers = registry._activities.get_handlers(Activity.AUTHENTICATION)
    # The declared handler is the only one: kopf's fallback logins are not used besides it.
    assert [h.fn for h in handlers] == [kopf_session.kopf_login]
    smart = SmartOperatorRegistry()  # what kopf.run() uses by default
    fallbacks = smart._activities.get_handlers(Activity.AUTHENTICATION)
    assert [h.id for h in fallbacks] == ["login_via_client"]  # what kopf_login reuses
    kopf_session.instrument_kopf(smart)
    handlers = smart._activities.get_handlers(Activity.AUTHENTICATION)
    assert [h.fn for h in handlers] == [kopf_session.kopf_login]


# ---- the census ---------------------------------------------------------------------------------


@pytest.fixture
def census() -> Iterator[None]:
    yield
    SANDBOXES.unregister()


def sandboxes(reason: str, backend: str) -> float | None:
    return REGISTRY.get_sample_value(
        "sandbox_operator_sandboxes", {"reason": reason, "backend": backend}
    )


def test_census_is_collected_at_scrape_time_and_replaced(census: None) -> None:
    rows = [("Ready", "gvisor", 2), ("Ready", "gvisor", 1), ("StartupFailed", "kata", 1)]
    register_sandbox_census(lambda: iter(rows))
    assert sandboxes("Ready", "gvisor") == 3  # rows naming one pair are added up
    assert sandboxes("StartupFailed", "kata") == 1
    rows.append(("IsolationBelowFloor", "", 4))
    assert sandboxes("IsolationBelowFloor", "") == 4  # read again at each scrape
    register_sandbox_census(lambda: [("Ready", "kata", 5)])
    assert sandboxes("Ready", "gvisor") is None
    assert sandboxes("Ready", "kata") == 5
    text = generate_latest(REGISTRY).decode()
    assert "# TYPE sandbox_operator_sandboxes gauge" in text
    assert 'sandbox_operator_sandboxes{backend="kata",reason="Ready"} 5.0' in text


def test_a_failing_census_gives_no_samples_and_a_log_line(
    census: None, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> list[tuple[str, str, int]]:
        raise KeyError("views not ready")

    register_sandbox_census(broken)
    with caplog.at_level(logging.WARNING, logger="sandbox_operator.metrics"):
        text = generate_latest(REGISTRY).decode()
    assert "sandbox_operator_sandboxes{" not in text
    assert "sandbox_operator_api_requests_total" in text  # the rest of the scrape is intact
    assert "sandbox census failed" in caplog.text and "views not ready" in caplog.text


async def test_census_registered_on_a_loop_runs_on_that_loop(census: None) -> None:
    ran_on: list[int] = []

    def fn() -> list[tuple[str, str, int]]:
        ran_on.append(threading.get_ident())
        return [("Ready", "gvisor", 1)]

    register_sandbox_census(fn)
    loop_thread = threading.get_ident()
    # A scrape thread: the call is handed to the loop, which is free to run it.
    assert await asyncio.to_thread(sandboxes, "Ready", "gvisor") == 1
    # A scrape on the loop's own thread calls it directly.
    assert sandboxes("Ready", "gvisor") == 1
    assert ran_on == [loop_thread, loop_thread]


async def test_census_gives_up_when_the_loop_is_busy(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []
    collector = SandboxCensus(timeout=0.2)
    collector.register(lambda: calls.append(1) or [], asyncio.get_running_loop())
    loop = asyncio.get_running_loop()
    with caplog.at_level(logging.WARNING, logger="sandbox_operator.metrics"):
        scrape = loop.run_in_executor(None, lambda: list(collector.collect()))
        time.sleep(0.5)  # noqa: ASYNC251  (the loop is deliberately blocked)
        assert await scrape == []
    await asyncio.sleep(0.05)
    assert calls == []  # the abandoned call never runs late
    assert "did not run on the event loop" in caplog.text


# ---- reconciles ---------------------------------------------------------------------------------


def reconciles(kind: str, outcome: str) -> float:
    return value("sandbox_operator_reconcile_duration_seconds_count", kind=kind, outcome=outcome)


def test_track_reconcile_times_each_outcome_and_counts_in_flight() -> None:
    in_flight = Delta(value, "sandbox_operator_reconciles_in_flight")
    ok, requeue, error = (Delta(reconciles, "sandbox", o) for o in ("ok", "requeue", "error"))
    with track_reconcile("sandbox") as r:
        assert value("sandbox_operator_reconciles_in_flight", kind="sandbox") >= 1
        assert r.outcome == "ok"
    with pytest.raises(RuntimeError), track_reconcile("sandbox") as r:
        r.outcome = "requeue"
        raise RuntimeError("retry later")
    with pytest.raises(ValueError), track_reconcile("sandbox"):
        raise ValueError("bug")
    assert (ok.change, requeue.change, error.change) == (1, 1, 1)
    assert value("sandbox_operator_reconciles_in_flight", kind="sandbox") == 0
    assert in_flight.change == 0


def test_every_metric_is_exposed_with_its_labels() -> None:
    from sandbox_operator.metrics import ADMISSIONS, READY_LATENCY

    ADMISSIONS.labels("refused", "IsolationBelowFloor").inc()
    READY_LATENCY.labels("gvisor").observe(1.5)
    API_REQUESTS.labels("get", "pods", "200", "operator")
    API_RESPONSE_BYTES.labels("get", "pods", "operator")
    text = generate_latest(REGISTRY).decode()
    for name in (
        "sandbox_operator_reconcile_duration_seconds",
        "sandbox_operator_admissions_total",
        "sandbox_operator_create_to_ready_seconds",
        "sandbox_operator_api_requests_total",
        "sandbox_operator_api_response_bytes_total",
        "sandbox_operator_reconciles_in_flight",
        "sandbox_operator_watch_restarts_total",
    ):
        assert f"\n# TYPE {name} " in text, name
    assert (
        'sandbox_operator_admissions_total{reason="IsolationBelowFloor",result="refused"}' in text
    )
    # All kinds and outcomes exist from the start (rate() and ratios need no first event).
    for kind in metrics.KINDS:
        for outcome in metrics.OUTCOMES:
            assert (
                f'sandbox_operator_reconcile_duration_seconds_count{{kind="{kind}",'
                f'outcome="{outcome}"}}' in text
            )
    buckets = [
        float(line.split('le="')[1].split('"')[0])
        for line in text.splitlines()
        if line.startswith('sandbox_operator_create_to_ready_seconds_bucket{backend="gvisor"')
    ]
    assert buckets[0] == 0.05 and buckets[-2] == 600 and buckets[-1] == float("inf")


# ---- the endpoint and the CLI flags -------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_metrics_server_serves_the_registry() -> None:
    port = free_port()
    metrics_server.start_metrics_server("127.0.0.1", port)
    try:
        assert metrics_server.metrics_server_port() == port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assert resp.status == 200
        assert "sandbox_operator_api_requests_total" in text
        assert "process_resident_memory_bytes" in text  # prometheus_client's own collectors
    finally:
        metrics_server.stop_metrics_server()
    assert metrics_server.metrics_server_port() is None


def test_metrics_server_on_a_taken_port_raises() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(OSError):
            metrics_server.start_metrics_server("127.0.0.1", s.getsockname()[1])


def test_cli_metrics_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = cli._parser().parse_args(["run", "--config", "c.yaml", "-A"])
    assert (args.metrics_port, args.metrics_host) == (8081, "0.0.0.0")
    args = cli._parser().parse_args(["run", "--config", "c", "-A", "--metrics-port", "0"])
    assert args.metrics_port == 0
    assert cli.main(["run", "--config", "c.yaml", "-A", "--metrics-port", "8080"]) == 2
    assert "must differ" in capsys.readouterr().err
    assert cli.main(["run", "--config", "c.yaml", "-A", "--metrics-port", "70000"]) == 2


def test_cli_runs_on_without_metrics_when_the_port_is_taken(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    instrumented: list[bool] = []
    monkeypatch.setattr(kopf_session, "instrument_kopf", lambda: instrumented.append(True) or True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        cli._start_metrics("127.0.0.1", s.getsockname()[1])
    assert "running without them" in capsys.readouterr().err
    assert instrumented == []  # no endpoint, so kopf keeps its own login

    port = free_port()
    try:
        cli._start_metrics("127.0.0.1", port)
        assert instrumented == [True]
    finally:
        metrics_server.stop_metrics_server()


async def test_a_streamed_body_is_counted_as_it_arrives_not_only_at_its_end(monkeypatch) -> None:
    """A watch stream open for minutes shows its bytes in the interval they flowed in."""
    monkeypatch.setattr(request_metrics, "STREAM_SAMPLE_SECONDS", 0.05)
    eof: list[Any] = []
    content = SimpleNamespace(total_bytes=0, on_eof=eof.append)
    req = request_metrics.LabelledRequest("watch", "sandboxes", "kopf")

    def counted() -> float:
        return value(
            "sandbox_operator_api_response_bytes_total",
            verb="watch",
            resource="sandboxes",
            client="kopf",
        )

    before = counted()
    req.read_at_eof(SimpleNamespace(content=content))
    content.total_bytes = 1000
    await asyncio.sleep(0.2)
    assert counted() - before == 1000  # while the stream is still open
    content.total_bytes = 1500
    eof[0]()  # the end of the body: the rest, once
    await asyncio.sleep(0.1)
    assert counted() - before == 1500


async def test_the_stream_sampler_is_stopped_by_the_operators_cleanup(monkeypatch) -> None:
    """A stream still open at shutdown keeps the sampler alive; kopf would give that task five
    seconds before cancelling it, on every stop. The cleanup stops it at once."""
    monkeypatch.setattr(request_metrics, "STREAM_SAMPLE_SECONDS", 0.05)
    content = SimpleNamespace(total_bytes=0, on_eof=lambda _cb: None)
    req = request_metrics.LabelledRequest("watch", "sandboxes", "kopf")
    req.read_at_eof(SimpleNamespace(content=content))  # never reaches its end
    sampler = request_metrics._sampler
    assert sampler is not None and not sampler.done()
    await asyncio.sleep(0.12)
    assert not sampler.done()  # an open stream keeps it sampling
    await request_metrics.stop_stream_sampler()
    assert sampler.done() and request_metrics._sampler is None
    await request_metrics.stop_stream_sampler()  # idempotent
    request_metrics._LIVE_STREAMS.clear()
