"""The ports router's metrics (docs/metrics.md, "The ports router") over the in-process router:
each request counted once by outcome and code (the pod's status when forwarded, 101 for an
upgrade; the router's own with its reason otherwise), its time to the first answer byte, a
wake-up asked once for a flood and the requests parked meanwhile, a failed ask; and GET /metrics
on the router's own port serving them (and not the operator's)."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator

import pytest_asyncio

from sandbox_operator.router import metrics
from tests.fixtures.router_fakes import GOOD, NAME, NS, OTHER, Kit, router_kit, sandbox_obj


@pytest_asyncio.fixture
async def kit() -> AsyncIterator[Kit]:
    async with router_kit() as running:
        yield running


def _value(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def _requests(outcome: str, code: str) -> float:
    return _value("sandbox_operator_router_requests_total", outcome=outcome, code=code)


def _refusals(reason: str) -> float:
    return _value("sandbox_operator_router_refusals_total", reason=reason)


def _latencies(outcome: str) -> float:
    return _value("sandbox_operator_router_request_seconds_count", outcome=outcome)


async def test_each_request_is_counted_once_by_outcome_code_and_reason(kit: Kit) -> None:
    before = {
        "ok": _requests("forwarded", "200"),
        "up": _requests("forwarded", "101"),
        "401": _requests("refused", "401"),
        "403": _requests("refused", "403"),
        "504": _requests("failed", "504"),
        "forbidden": _refusals("Forbidden"),
        "unauth": _refusals("Unauthenticated"),
        "timeout": _refusals("ResponseTimeout"),
        "forwarded_seconds": _latencies("forwarded"),
        "refused_seconds": _latencies("refused"),
    }
    assert (await kit.get(f"/{NS}/{NAME}/web/"))[0] == 200
    assert (await kit.get(f"/{NS}/{NAME}/web/", token=None))[0] == 401
    assert (await kit.get(f"/{NS}/{NAME}/web/", token=OTHER))[0] == 403
    assert (await kit.get("/healthz"))[0] == 200  # not counted
    reader, writer = await asyncio.open_connection("127.0.0.1", kit.port)
    writer.write(
        f"GET /{NS}/{NAME}/web/ws HTTP/1.1\r\nHost: r\r\nAuthorization: Bearer {GOOD}\r\n"
        "Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n".encode()
    )
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 101")
    writer.close()
    kit.upstream.silent = True
    assert (await kit.get(f"/{NS}/{NAME}/web/"))[0] == 504
    assert _requests("forwarded", "200") - before["ok"] == 1
    assert _requests("forwarded", "101") - before["up"] == 1
    assert _requests("refused", "401") - before["401"] == 1
    assert _requests("refused", "403") - before["403"] == 1
    assert _requests("failed", "504") - before["504"] == 1
    assert _refusals("Unauthenticated") - before["unauth"] == 1
    assert _refusals("Forbidden") - before["forbidden"] == 1
    assert _refusals("ResponseTimeout") - before["timeout"] == 1
    assert _latencies("forwarded") - before["forwarded_seconds"] == 2
    assert _latencies("refused") - before["refused_seconds"] == 2


async def test_a_flood_to_a_suspended_sandbox_is_one_wake_up_and_parks_its_requests(
    kit: Kit,
) -> None:
    asked = _value("sandbox_operator_router_wakeups_total", result="asked")
    waited = _value("sandbox_operator_router_wait_seconds_count")
    parked = _value("sandbox_operator_router_parked_requests")
    port = kit.upstream.port
    kit.view.apply_sandbox(
        "MODIFIED",
        sandbox_obj(port, ready=False, suspendedBy="idle", suspendedAt="2026-01-01T00:00:00Z"),
    )
    flood = [asyncio.ensure_future(kit.get(f"/{NS}/{NAME}/web/")) for _ in range(5)]
    await asyncio.sleep(0.3)
    assert _value("sandbox_operator_router_parked_requests") - parked == 5
    kit.view.apply_sandbox("MODIFIED", sandbox_obj(port))
    assert [status for status, _ in await asyncio.gather(*flood)] == [200] * 5
    assert _value("sandbox_operator_router_wakeups_total", result="asked") - asked == 1
    assert _value("sandbox_operator_router_wait_seconds_count") - waited == 5
    assert _value("sandbox_operator_router_parked_requests") == parked


async def test_a_resume_that_cannot_be_asked_counts_as_a_failed_wake_up(kit: Kit) -> None:
    failed = _value("sandbox_operator_router_wakeups_total", result="failed")
    kit.view.apply_sandbox(
        "MODIFIED", sandbox_obj(kit.upstream.port, ready=False, suspendedBy="idle")
    )
    kit.resumes.fail = True
    status, body = await kit.get(f"/{NS}/{NAME}/web/")
    assert (status, body["reason"]) == (503, "ResumeFailed")
    assert _value("sandbox_operator_router_wakeups_total", result="failed") - failed == 1
    assert _value("sandbox_operator_router_refusals_total", reason="ResumeFailed") >= 1


def test_the_metrics_port_serves_the_routers_registry_only() -> None:
    port = metrics.serve_metrics("127.0.0.1", 0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    assert "sandbox_operator_router_requests_total" in text
    assert "sandbox_operator_router_parked_requests" in text
    assert "process_resident_memory_bytes" in text
    assert "sandbox_operator_reconcile_duration_seconds" not in text  # the operator's


def test_the_wake_event_names_the_sandbox_it_woke() -> None:
    from sandbox_operator.router.kube import WOKEN_REASON, wake_event

    event = wake_event(NS, NAME, "uid-9")
    assert event["reason"] == WOKEN_REASON == "WokenByTraffic"
    assert event["involvedObject"]["uid"] == "uid-9"
    assert event["metadata"]["namespace"] == NS
    assert event["metadata"]["name"].startswith(f"{NAME}.woken.")
