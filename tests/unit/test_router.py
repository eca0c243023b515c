"""The ports router (docs/ports.md) over an in-process upstream and fake review answers: the
order of judgement (400, 401, 403, 404), path and header tricks refused before anything is
looked up, only a declared http port of the Sandbox's own Ready pod dialled, the caller's token
never forwarded, WebSocket upgrades spliced, reviews cached, wake-on-traffic single-flight and
bounded, a refused resume's reason in the 503, activity stamped once per interval."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from sandbox_operator.router.reviews import Identity
from sandbox_operator.router.view import View
from tests.fixtures.router_fakes import (
    GOOD,
    NAME,
    NS,
    OTHER,
    UID,
    Kit,
    pod_obj,
    router_kit,
    sandbox_obj,
)
from tests.fixtures.wire_keys import model_keys, typed_keys


@pytest_asyncio.fixture
async def kit() -> AsyncIterator[Kit]:
    async with router_kit() as running:
        yield running


async def test_an_authorized_request_reaches_the_declared_port_without_the_token(kit: Kit) -> None:
    status, _ = await kit.get(
        f"/{NS}/{NAME}/web/api/x?q=1",
        extra="X-Forwarded-For: 10.0.0.9\r\nX-Other: kept\r\nConnection: keep-alive\r\n",
    )
    assert status == 200
    (head,) = kit.upstream.heads
    lines = head.split("\r\n")
    assert lines[0] == "GET /api/x?q=1 HTTP/1.1"
    assert f"Host: 127.0.0.1:{kit.upstream.port}" in lines
    assert f"X-Forwarded-Prefix: /{NS}/{NAME}/web" in lines
    assert "X-Other: kept" in lines
    # One request per connection: the pod closes after its answer, so a kept-alive caller's next
    # request comes through the router's judgement again.
    assert "Connection: close" in lines and "Connection: keep-alive" not in lines
    assert GOOD not in head and "authorization" not in head.lower()
    assert "10.0.0.9" not in head and "Host: router" not in head
    # By number as well as by name; and traffic stamped once per interval.
    assert (await kit.get(f"/{NS}/{NAME}/{kit.upstream.port}/"))[0] == 200
    assert kit.stamps == [(NS, NAME)]


async def test_callers_are_authenticated_then_authorized_before_anything_is_said(kit: Kit) -> None:
    assert (await kit.get(f"/{NS}/{NAME}/web/", token=None))[0] == 401
    assert (await kit.get(f"/{NS}/{NAME}/web/", token="forged"))[0] == 401
    status, body = await kit.get(f"/{NS}/{NAME}/web/", token=OTHER)
    assert (status, body["reason"]) == (403, "Forbidden")
    # Another namespace's or an absent Sandbox: 403 too, so its existence is not told.
    assert (await kit.get(f"/other/{NAME}/web/"))[0] == 403
    assert (await kit.get(f"/{NS}/nope/web/"))[0] == 403
    assert kit.upstream.heads == []


async def test_only_declared_http_ports_are_forwarded(kit: Kit) -> None:
    assert (await kit.get(f"/{NS}/{NAME}/admin/"))[1]["reason"] == "PortNotDeclared"
    assert (await kit.get(f"/{NS}/{NAME}/9999/"))[0] == 404
    assert (await kit.get(f"/{NS}/{NAME}/db/"))[0] == 501
    kit.reviews.allowed.add(("alice", NS, "ghost"))
    assert (await kit.get(f"/{NS}/ghost/web/"))[1]["reason"] == "SandboxNotFound"
    assert kit.upstream.heads == []


@pytest.mark.parametrize(
    "raw",
    [
        f"GET /{NS}/{NAME}/web/../../other/sbx/web/ HTTP/1.1\r\nHost: r\r\n",
        f"GET /{NS}/{NAME}/web/%2e%2e/x HTTP/1.1\r\nHost: r\r\n",
        f"GET /{NS}%2F{NAME}/x/web/ HTTP/1.1\r\nHost: r\r\n",
        f"GET /{NS}/{NAME}/web/a%5cb HTTP/1.1\r\nHost: r\r\n",
        f"GET /{NS}/{NAME}/web/a\\b HTTP/1.1\r\nHost: r\r\n",
        f"GET /{NS}//{NAME}/web/ HTTP/1.1\r\nHost: r\r\n",
        f"GET /{NS}/{NAME}/web/a//b HTTP/1.1\r\nHost: r\r\n",
        f"GET http://pod-2:80/{NS}/{NAME}/web/ HTTP/1.1\r\nHost: r\r\n",
        f"GET //evil/{NS}/{NAME}/web/ HTTP/1.1\r\nHost: r\r\n",
        "OPTIONS * HTTP/1.1\r\nHost: r\r\n",
        f"GET /{NS}/{NAME}/web/ HTTP/1.1\r\nHost: r\r\nHost: pod-2\r\n",
        f"GET /{NS}/{NAME}/web/ HTTP/1.0\r\nHost: r\r\n",
        f"POST /{NS}/{NAME}/web/ HTTP/1.1\r\nHost: r\r\nContent-Length: 3\r\n"
        "Transfer-Encoding: chunked\r\n",
        f"GET /{NS}/{NAME}/web/ HTTP/1.1\r\nHost: r\r\n X-Folded: yes\r\n",
        f"GET /{NS.upper()}/{NAME}/web/ HTTP/1.1\r\nHost: r\r\n",
    ],
)
async def test_path_and_header_tricks_are_refused_before_any_review(kit: Kit, raw: str) -> None:
    status, _ = await kit.send((raw + f"Authorization: Bearer {GOOD}\r\n\r\n").encode())
    assert status == 400
    assert kit.reviews.authentications == 0 and kit.upstream.heads == []


async def test_reviews_are_cached_per_token_and_sandbox(kit: Kit) -> None:
    for _ in range(3):
        assert (await kit.get(f"/{NS}/{NAME}/web/"))[0] == 200
    assert (kit.reviews.authentications, kit.reviews.authorizations) == (1, 1)


async def test_a_websocket_upgrade_is_spliced_both_ways(kit: Kit) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", kit.port)
    writer.write(
        f"GET /{NS}/{NAME}/web/ws HTTP/1.1\r\nHost: r\r\nAuthorization: Bearer {GOOD}\r\n"
        "Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n".encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 101")
    writer.write(b"hello")
    assert await asyncio.wait_for(reader.readexactly(5), 5) == b"HELLO"
    writer.write(b"again")
    assert await asyncio.wait_for(reader.readexactly(5), 5) == b"AGAIN"
    writer.close()


async def test_a_guest_that_never_answers_gets_the_routes_timeout(kit: Kit) -> None:
    kit.upstream.silent = True
    status, body = await kit.get(f"/{NS}/{NAME}/web/")
    assert (status, body["reason"]) == (504, "ResponseTimeout")


async def test_a_pod_not_owned_by_the_sandbox_is_never_dialled(kit: Kit) -> None:
    kit.view.apply_pod("MODIFIED", pod_obj(owner="someone-else"))
    status, body = await kit.get(f"/{NS}/{NAME}/web/")
    assert (status, body["reason"]) == (503, "NotReadyInTime")
    assert kit.upstream.heads == []


async def test_a_flood_to_a_suspended_sandbox_resumes_it_once_and_is_answered(kit: Kit) -> None:
    port = kit.upstream.port
    kit.view.apply_sandbox(
        "MODIFIED",
        sandbox_obj(
            port,
            ready=False,
            suspendedBy="spec",
            spec_suspended=True,
            suspendedAt="2026-01-01T00:00:00Z",
        ),
    )
    flood = [asyncio.ensure_future(kit.get(f"/{NS}/{NAME}/web/")) for _ in range(20)]
    await asyncio.sleep(0.3)
    assert kit.resumes.asked == [(NS, NAME)]
    # The operator resumes it: status says Creating, then Ready.
    kit.view.apply_sandbox("MODIFIED", sandbox_obj(port, ready=False, reason="Creating"))
    await asyncio.sleep(0.05)
    kit.view.apply_sandbox("MODIFIED", sandbox_obj(port))
    answers = await asyncio.gather(*flood)
    assert [a[0] for a in answers] == [200] * 20
    assert kit.resumes.asked == [(NS, NAME)]


async def test_a_refused_resume_answers_503_with_the_conditions_reason(kit: Kit) -> None:
    refused = sandbox_obj(kit.upstream.port, ready=False, suspendedBy="idle")
    refused["status"]["conditions"][0] = {
        "type": "Admitted",
        "status": "False",
        "reason": "IsolationBelowFloor",
        "message": "resume refused: isolation below the floor",
    }
    kit.view.apply_sandbox("MODIFIED", refused)
    status, body = await kit.get(f"/{NS}/{NAME}/web/")
    assert status == 503
    assert body == {
        "reason": "IsolationBelowFloor",
        "message": refused["status"]["conditions"][0]["message"],
    }


async def test_a_resume_that_cannot_be_asked_answers_at_once_and_a_slow_one_in_time(
    kit: Kit,
) -> None:
    kit.view.apply_sandbox(
        "MODIFIED", sandbox_obj(kit.upstream.port, ready=False, suspendedBy="idle")
    )
    kit.resumes.fail = True
    status, body = await kit.get(f"/{NS}/{NAME}/web/")
    assert (status, body["reason"]) == (503, "ResumeFailed")
    kit.resumes.fail = False
    status, body = await kit.get(f"/{NS}/{NAME}/web/")  # asked again, never Ready: bounded
    assert (status, body["reason"]) == (503, "NotReadyInTime")
    assert len(kit.resumes.asked) == 2


def test_a_conversations_role_grants_its_agents_exactly_the_routers_question() -> None:
    """The conversation boundary (docs/concepts.md): the Role the operator writes for a scope's
    agents allows the router's SubjectAccessReview on the scope's own Sandboxes only."""
    from sandbox_operator.reconcile import access
    from sandbox_operator.router.reviews import access_review_spec
    from sandbox_operator.views import SandboxScopeView

    scope = SandboxScopeView({"metadata": {"name": "conv", "namespace": NS, "uid": "u"}})
    role = access.role_manifest(scope, access.wanted_access(["agent"], [NAME]))
    asked = access_review_spec(Identity("system:serviceaccount:team-a:agent"), NS, NAME)
    attrs = asked["resourceAttributes"]
    resource = f"{attrs['resource']}/{attrs['subresource']}"
    granting = [
        r
        for r in role["rules"]
        if attrs["group"] in r["apiGroups"]
        and resource in r["resources"]
        and attrs["verb"] in r["verbs"]
    ]
    assert [r.get("resourceNames") for r in granting] == [[NAME]]


class _Custom:
    """CustomObjectsApi's patch and CoreV1Api's Event creation, recorded."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, str, dict[str, Any], str]] = []
        self.events: list[tuple[str, dict[str, Any]]] = []

    async def patch_namespaced_custom_object(self, *args: Any, **kw: Any) -> None:
        _group, _version, namespace, _plural, name, body = args
        self.patches.append((namespace, name, body, kw["_content_type"]))

    async def create_namespaced_event(self, namespace: str, body: dict[str, Any]) -> None:
        self.events.append((namespace, body))


def _kube() -> tuple[Any, _Custom]:
    from kubernetes_asyncio import client as k8s

    from sandbox_operator.router.kube import KubeSandboxes

    kube = KubeSandboxes(k8s.ApiClient(), View(), (NS,))
    custom = _Custom()
    kube._custom = kube._core = custom
    return kube, custom


async def test_a_resume_is_asked_as_the_client_asks_it() -> None:
    """Suspended by the spec: spec.suspended false; by idling: a last-activity stamp after the
    suspension (whole seconds), even when this clock is behind the operator's."""
    from sandbox_operator.router.view import sandbox_entry

    kube, custom = _kube()
    by_spec = sandbox_entry(sandbox_obj(1, ready=False, suspendedBy="spec", spec_suspended=True))
    await kube.resume(NS, NAME, by_spec)
    future = "2999-01-01T00:00:00Z"
    by_idle = sandbox_entry(sandbox_obj(1, ready=False, suspendedBy="idle", suspendedAt=future))
    await kube.resume(NS, NAME, by_idle)
    (_, _, spec_body, kind), (_, _, idle_body, _) = custom.patches
    assert spec_body == {"spec": {"suspended": False}}
    assert kind == "application/merge-patch+json"
    stamp = idle_body["metadata"]["annotations"]["sandbox-operator.dev/last-activity"]
    assert stamp == "2999-01-01T00:00:01Z"
    # Each resume leaves an Event on the Sandbox saying traffic woke it.
    assert [ns for ns, _ in custom.events] == [NS, NS]
    event = custom.events[0][1]
    assert event["reason"] == "WokenByTraffic" and event["type"] == "Normal"
    assert event["involvedObject"] == {
        "apiVersion": "sandbox-operator.dev/v1alpha1",
        "kind": "Sandbox",
        "name": NAME,
        "namespace": NS,
        "uid": UID,
    }


async def test_healthz_answers_503_until_the_watches_have_listed() -> None:
    """A router whose view is not listed yet would answer 404 for a Sandbox that exists: its
    readiness probe (/healthz) fails until every watch has listed once."""
    from kubernetes_asyncio import client as k8s

    from sandbox_operator.router.kube import KubeSandboxes

    kube = KubeSandboxes(k8s.ApiClient(), View(), (NS, "other"))
    async with router_kit(synced=lambda: kube.synced) as kit:
        status, body = await kit.get("/healthz")
        assert (status, body["reason"]) == (503, "Syncing")
        kube._listed |= {("sandboxes", NS), ("pods", NS), ("sandboxes", "other")}
        assert (await kit.get("/healthz"))[0] == 503
        kube._listed.add(("pods", "other"))
        assert (await kit.get("/healthz"))[0] == 200


async def test_a_pod_that_listens_late_is_dialled_again_until_the_connect_timeout(
    kit: Kit,
) -> None:
    """A woken Sandbox's pod is Ready before its server listens: a refused connect is tried
    again within the connect timeout (2 s here), then answered 502."""
    with socket.socket() as probe:  # a port nothing listens on yet
        probe.bind(("127.0.0.1", 0))
        late_port = probe.getsockname()[1]
    kit.view.apply_sandbox("MODIFIED", sandbox_obj(late_port))
    answer = asyncio.ensure_future(kit.get(f"/{NS}/{NAME}/web/"))
    await asyncio.sleep(0.6)
    late = await asyncio.start_server(kit.upstream.handle, "127.0.0.1", late_port)
    try:
        assert (await answer)[0] == 200
    finally:
        late.close()
    started = asyncio.get_running_loop().time()
    status, body = await kit.get(f"/{NS}/{NAME}/web/")
    assert (status, body["reason"]) == (502, "ConnectFailed")
    assert asyncio.get_running_loop().time() - started >= 1.0


def test_the_routers_bodies_name_only_keys_of_the_apis_objects() -> None:
    """router/bodies.py's TypedDicts (what mypy holds the reviews and patches to) name only
    keys of the Kubernetes objects they are sent as: a misspelt key would be dropped by the API
    server, and the review would ask something else than meant."""
    from kubernetes_asyncio.client import (
        V1ResourceAttributes,
        V1SubjectAccessReview,
        V1SubjectAccessReviewSpec,
        V1TokenReview,
        V1TokenReviewSpec,
    )

    from sandbox_operator.contract.resources import SandboxResourceSpec
    from sandbox_operator.router import bodies

    assert typed_keys(bodies.TokenReviewBody) <= model_keys(V1TokenReview)
    assert typed_keys(bodies.TokenReviewSpecBody) <= model_keys(V1TokenReviewSpec)
    assert typed_keys(bodies.AccessReviewBody) <= model_keys(V1SubjectAccessReview)
    assert typed_keys(bodies.AccessReviewSpecBody) <= model_keys(V1SubjectAccessReviewSpec)
    assert typed_keys(bodies.ResourceAttributesBody) <= model_keys(V1ResourceAttributes)
    assert typed_keys(bodies.SuspendedSpecBody) <= model_keys(SandboxResourceSpec)
