"""The ports router's limits (issue #39, "Bad input and limits"), in process over fake reviews and
an in-process upstream: 1,000 requests parked on one suspended Sandbox ask for exactly one
resume, hold the router's memory to a bounded few KiB each (tracemalloc, the callers' own
sockets included), are every one answered once the Sandbox is Ready, and leave nothing behind;
past the wake bound they are answered 503, not hung."""

from __future__ import annotations

import _weakrefset
import asyncio
import gc
import resource
import selectors
import tracemalloc
import weakref

import pytest

from sandbox_operator.router import metrics
from tests.fixtures.router_fakes import NAME, NS, Kit, router_kit, sandbox_obj

PARKED = 1000
#: Most bytes a parked request may hold, the caller's end of its connection included (measured
#: about 15 KiB on Python 3.11; the bound leaves room without letting a per-request buffer of the
#: head limit's size, 32 KiB, or a leak through).
PER_REQUEST_MAX = 24 * 1024
#: Most bytes the 1,000 requests may leave behind once answered and closed (measured: ~35 KiB).
LEFT_BEHIND_MAX = 64 * 1024


@pytest.fixture(autouse=True)
def _descriptors() -> None:
    """Each parked request holds two sockets here (the caller's and the router's), and two more
    once forwarded."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * PARKED + 256
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"needs {wanted} open files, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def _suspend(kit: Kit) -> None:
    kit.view.apply_sandbox(
        "MODIFIED",
        sandbox_obj(
            kit.upstream.port,
            ready=False,
            suspendedBy="idle",
            suspendedAt="2026-01-01T00:00:00Z",
        ),
    )


async def _until_parked(count: int) -> None:
    for _ in range(2400):  # 120 s: a bound on a hang, not a timing (tracemalloc is slow)
        if metrics.PARKED._value.get() >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"only {metrics.PARKED._value.get()} of {count} requests parked")


#: The event loop's own tables (its selector's map of sockets, its weak set of tasks) keep the
#: capacity a flood grew them to: once per process, not per request, so not what is left behind.
_LOOP_TABLES = (
    tracemalloc.Filter(False, selectors.__file__),
    tracemalloc.Filter(False, weakref.__file__),
    tracemalloc.Filter(False, _weakrefset.__file__),
)


def _traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def _left() -> int:
    gc.collect()
    stats = tracemalloc.take_snapshot().filter_traces(_LOOP_TABLES).statistics("filename")
    return sum(stat.size for stat in stats)


async def test_a_thousand_parked_requests_resume_once_in_bounded_memory_and_are_answered() -> None:
    async with router_kit(wake_timeout=60, response_timeout=30) as kit:
        assert (await kit.get(f"/{NS}/{NAME}/web/"))[0] == 200  # warm: reviews cached
        kit.upstream.heads.clear()
        _suspend(kit)
        parked_before = metrics.PARKED._value.get()
        tracemalloc.start()
        try:
            baseline, baseline_left = _traced(), _left()
            flood = [asyncio.ensure_future(kit.get(f"/{NS}/{NAME}/web/")) for _ in range(PARKED)]
            await _until_parked(parked_before + PARKED)
            per_request = (_traced() - baseline) / PARKED
            await asyncio.sleep(0.2)  # the one resume's task runs after the requests that asked
            assert kit.resumes.asked == [(NS, NAME)]
            # The operator brings it back: every parked request goes on to the pod.
            kit.view.apply_sandbox("MODIFIED", sandbox_obj(kit.upstream.port))
            answers = await asyncio.wait_for(asyncio.gather(*flood), 180)
            statuses = [status for status, _ in answers]
            del flood, answers
            kit.upstream.heads.clear()  # the test's own records
            await asyncio.sleep(0.1)
            left_behind = _left() - baseline_left
        finally:
            tracemalloc.stop()
    assert statuses == [200] * PARKED
    assert kit.resumes.asked == [(NS, NAME)]
    assert metrics.PARKED._value.get() == parked_before
    assert per_request < PER_REQUEST_MAX, f"{per_request:.0f} bytes per parked request"
    assert left_behind < LEFT_BEHIND_MAX, f"{left_behind} bytes left behind"


async def test_parked_requests_past_the_wake_bound_are_answered_503_not_hung() -> None:
    async with router_kit(wake_timeout=1.0) as kit:
        _suspend(kit)
        answers = await asyncio.wait_for(
            asyncio.gather(*(kit.get(f"/{NS}/{NAME}/web/") for _ in range(200))), 20
        )
    assert {(status, body["reason"]) for status, body in answers} == {(503, "NotReadyInTime")}
    assert kit.resumes.asked == [(NS, NAME)]
    assert kit.upstream.heads == []
