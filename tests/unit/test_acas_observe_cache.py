"""The acas driver's read cache: one label-filtered list per interval answers every observe,
ensure/dispose write through, changes are notified, a failing list keeps the last good state."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from sandbox_operator import labels as lbl
from sandbox_operator.acas.errors import AcasError
from sandbox_operator.backends.acas.driver import (
    NAMESPACE_LABEL,
    REMOTE_KIND,
    SANDBOX_NAME_LABEL,
    STALE_AFTER_INTERVALS,
    AcasDriver,
    remote_labels,
)
from sandbox_operator.backends.base import ObservedPhase, SandboxRef, ServedBy
from sandbox_operator.contract import SandboxKey
from tests.acas_standin import StandinServer
from tests.fixtures.acas import new_driver, request

LIST = "AzureSandboxes_List"
GET = "AzureSandboxes_Get"
INTERVAL = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def standin() -> AsyncIterator[StandinServer]:
    async with StandinServer() as server:
        yield server


@pytest.fixture
async def creator(standin: StandinServer) -> AsyncIterator[AcasDriver]:
    """Another replica: makes remote sandboxes the driver under test did not see being made."""
    d = new_driver(standin)
    yield d
    await d.close()


@pytest.fixture
async def driver(standin: StandinServer) -> AsyncIterator[AcasDriver]:
    d = new_driver(standin, observeIntervalSeconds=INTERVAL)
    yield d
    await d.close()


@pytest.fixture
def clock(driver: AcasDriver) -> Clock:
    c = Clock()
    driver._clock = c
    return c


def ref(name: str, uid: str = "", served: str = "") -> SandboxRef:
    served_by = ServedBy(REMOTE_KIND, served) if served else None
    return SandboxRef("ns1", name, uid or f"u-{name}", served_by)


def calls(standin: StandinServer) -> dict[str, int]:
    return {op: standin.state.calls[op] for op in (LIST, GET)}


async def make(creator: AcasDriver, *names: str) -> dict[str, str]:
    """Sandboxes made through another driver: name -> remote id."""
    out = {}
    for name in names:
        served = await creator.ensure(request(name, f"u-{name}"))
        out[name] = served.name
    return out


class Notes:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, namespace: str, name: str) -> None:
        self.seen.append((namespace, name))


async def wait_until(predicate: Callable[[], Any]) -> None:
    async with asyncio.timeout(5):
        while not predicate():  # noqa: ASYNC110 (state of the stand-in and the driver)
            await asyncio.sleep(0.01)


# -- cost ------------------------------------------------------------------------------------


async def test_n_sandboxes_observed_cost_one_list_per_interval(
    driver: AcasDriver, creator: AcasDriver, standin: StandinServer, clock: Clock
) -> None:
    names = [f"sbx-{i}" for i in range(8)]
    ids = await make(creator, *names)
    before = calls(standin)
    for _ in range(3):  # three reconcile passes over every sandbox, concurrently
        observed = await asyncio.gather(*(driver.observe(ref(n)) for n in names))
        assert [o.phase for o in observed] == [ObservedPhase.READY] * len(names)
        assert [o.served_by.name for o in observed if o.served_by] == [ids[n] for n in names]
    key = SandboxKey(scope="tenant", thread_id="t1", agent_dir="agents/a")
    assert len(await driver.list_by_key("ns1", key)) == len(names)
    assert calls(standin) == {LIST: before[LIST] + 1, GET: before[GET]}
    # Without the periodic task, the first call after an interval lists again, once for all.
    clock.now += INTERVAL
    await asyncio.gather(*(driver.observe(ref(n)) for n in names))
    assert calls(standin) == {LIST: before[LIST] + 2, GET: before[GET]}
    # The one list is filtered by the service to this operator and this backend.
    query = [r["query"] for r in standin.state.requests if r["operation"] == LIST][-1]
    assert lbl.MANAGED_BY_LABEL in query["labels"] and lbl.BACKEND_LABEL in query["labels"]


async def test_concurrent_first_callers_share_one_list(
    driver: AcasDriver, creator: AcasDriver, standin: StandinServer
) -> None:
    names = [f"sbx-{i}" for i in range(5)]
    await make(creator, *names)
    before = standin.state.calls[LIST]
    standin.state.add_fault(operation=LIST, delay=0.2)  # the first list is slow
    observed = await asyncio.gather(*(driver.observe(ref(n)) for n in names * 4))
    assert {o.phase for o in observed} == {ObservedPhase.READY}
    assert standin.state.calls[LIST] == before + 1


# -- write-through ---------------------------------------------------------------------------


async def test_ensure_and_dispose_write_through(
    driver: AcasDriver, standin: StandinServer, clock: Clock
) -> None:
    assert (await driver.observe(ref("sbx-1"))).phase is ObservedPhase.ABSENT  # fills the cache
    served = await driver.ensure(request("sbx-1", "u-sbx-1"))
    before = calls(standin)
    obs = await driver.observe(ref("sbx-1"))
    assert obs.phase is ObservedPhase.READY and obs.served_by is not None
    assert obs.served_by.name == served.name
    assert calls(standin) == before  # answered from the cache
    await driver.dispose(ref("sbx-1", served=served.name))
    before = calls(standin)
    assert (await driver.observe(ref("sbx-1"))).phase is ObservedPhase.ABSENT
    assert calls(standin) == before


async def test_a_list_under_way_does_not_undo_a_write(
    driver: AcasDriver, standin: StandinServer, clock: Clock
) -> None:
    await driver.refresh()
    # A list that reads the group before the create but answers after it.
    standin.state.add_fault(operation=LIST, status=200, body=[], delay=0.3)
    listing = asyncio.create_task(driver.refresh())
    await wait_until(lambda: standin.state.faults[0].hits == 1)
    served = await driver.ensure(request("sbx-1", "u-sbx-1"))
    assert await listing
    obs = await driver.observe(ref("sbx-1"))
    assert obs.phase is ObservedPhase.READY and obs.served_by is not None
    assert obs.served_by.name == served.name
    # And the other way round: a list that still shows a sandbox disposed meanwhile.
    wire = standin.state.sandboxes[served.name].to_wire()
    standin.state.clear_faults()
    standin.state.add_fault(operation=LIST, status=200, body=[wire], delay=0.3)
    listing = asyncio.create_task(driver.refresh())
    await wait_until(lambda: standin.state.faults[0].hits == 1)
    await driver.dispose(ref("sbx-1", served=served.name))
    assert await listing
    assert (await driver.observe(ref("sbx-1"))).phase is ObservedPhase.ABSENT


async def test_a_recorded_remote_missing_from_the_cache_is_checked_by_id(
    driver: AcasDriver, creator: AcasDriver, standin: StandinServer, clock: Clock
) -> None:
    await driver.refresh()  # the cache holds nothing yet
    served = await creator.ensure(request("sbx-1", "u-sbx-1"))  # made by another replica
    before = calls(standin)
    obs = await driver.observe(ref("sbx-1", served=served.name))
    assert obs.phase is ObservedPhase.READY  # not "gone", which would fail a Ready sandbox
    assert calls(standin) == {LIST: before[LIST], GET: before[GET] + 1}
    assert (await driver.observe(ref("sbx-1", served=served.name))).phase is ObservedPhase.READY
    assert calls(standin)[GET] == before[GET] + 1  # now it is in the cache


# -- change notification ---------------------------------------------------------------------


async def test_notify_reports_changed_sandboxes_and_not_unchanged_ones(
    driver: AcasDriver, creator: AcasDriver, standin: StandinServer
) -> None:
    ids = await make(creator, "sbx-a", "sbx-b", "sbx-c")
    notes = Notes()
    await driver.start(notes)
    await wait_until(lambda: driver.cache_status().filled)
    assert driver.cache_status().running
    assert notes.seen == []  # the first list has nothing to compare with
    assert await driver.refresh()
    assert notes.seen == []  # nothing changed
    standin.state.sandboxes[ids["sbx-a"]].state = "Failed"
    standin.state.remove(ids["sbx-b"])  # vanished
    await make(creator, "sbx-d")  # appeared (another replica made it)
    assert await driver.refresh()
    assert sorted(notes.seen) == [("ns1", "sbx-a"), ("ns1", "sbx-b"), ("ns1", "sbx-d")]
    assert (await driver.observe(ref("sbx-a"))).phase is ObservedPhase.FAILED
    notes.seen.clear()
    # The driver's own ensure/dispose are in the cache already: no echo of them.
    await driver.ensure(request("sbx-e", "u-sbx-e"))
    await driver.dispose(ref("sbx-c", served=ids["sbx-c"]))
    assert await driver.refresh()
    assert notes.seen == []


async def test_the_periodic_task_lists_and_notifies_until_closed(
    standin: StandinServer, creator: AcasDriver
) -> None:
    ids = await make(creator, "sbx-a")
    driver = new_driver(standin, observeIntervalSeconds=0.05)
    notes = Notes()
    try:
        await driver.start(notes)
        await driver.start(notes)  # idempotent: one task
        await wait_until(lambda: driver.cache_status().lists >= 3)
        standin.state.sandboxes[ids["sbx-a"]].state = "Stopped"
        await wait_until(lambda: notes.seen == [("ns1", "sbx-a")])
    finally:
        await driver.close()
    lists = standin.state.calls[LIST]
    assert not driver.cache_status().running
    await asyncio.sleep(0.2)
    assert standin.state.calls[LIST] == lists  # stopped


async def test_notify_names_the_sandbox_for_dotted_and_older_sandboxes(
    driver: AcasDriver, creator: AcasDriver, standin: StandinServer
) -> None:
    dotted = await creator.ensure(request("my.sandbox", "u-dotted"))
    assert standin.state.sandboxes[dotted.name].labels[SANDBOX_NAME_LABEL] == "my.sandbox"
    # A remote sandbox from before the name label: its sandbox label is the name.
    legacy = request("sbx-legacy", "u-legacy")
    labels = remote_labels(legacy, "acas-test")
    del labels[SANDBOX_NAME_LABEL]
    standin.state.seed_sandbox("legacy-id", labels=labels)
    notes = Notes()
    await driver.start(notes)
    await wait_until(lambda: driver.cache_status().filled)
    standin.state.sandboxes[dotted.name].state = "Failed"
    standin.state.sandboxes["legacy-id"].state = "Failed"
    assert await driver.refresh()
    assert sorted(notes.seen) == [("ns1", "my.sandbox"), ("ns1", "sbx-legacy")]


async def test_a_failing_notify_does_not_stop_the_others(
    driver: AcasDriver, creator: AcasDriver, standin: StandinServer
) -> None:
    ids = await make(creator, "sbx-a", "sbx-b")
    seen: list[str] = []

    def notify(namespace: str, name: str) -> None:
        seen.append(name)
        raise RuntimeError("boom")

    await driver.start(notify)
    await wait_until(lambda: driver.cache_status().filled)
    for remote_id in ids.values():
        standin.state.sandboxes[remote_id].state = "Failed"
    assert await driver.refresh()
    assert sorted(seen) == ["sbx-a", "sbx-b"]


# -- failures --------------------------------------------------------------------------------


async def test_a_failing_list_keeps_the_last_good_state(
    driver: AcasDriver, creator: AcasDriver, standin: StandinServer, clock: Clock
) -> None:
    ids = await make(creator, "sbx-1")
    notes = Notes()
    driver._notify = notes  # as start() would, without the task (the test drives the clock)
    assert (await driver.observe(ref("sbx-1"))).phase is ObservedPhase.READY
    standin.state.add_fault(operation=LIST, status=500, code="InternalServerError", times=-1)
    standin.state.remove(ids["sbx-1"])  # the list cannot tell
    assert not await driver.refresh()
    status = driver.cache_status()
    assert status.filled and not status.stale and status.consecutive_failures == 1
    assert "InternalServerError" in status.last_error and str(standin.port) not in status.last_error
    clock.now += INTERVAL  # due again; the failed attempt counts: one more list, still failing
    assert (await driver.observe(ref("sbx-1"))).phase is ObservedPhase.READY
    assert driver.cache_status().consecutive_failures == 2
    assert notes.seen == []  # a failed list reports nothing
    # Too old to answer: observe asks the service for this sandbox alone, by its recorded id.
    clock.now += INTERVAL * STALE_AFTER_INTERVALS
    assert driver.cache_status().stale
    before = calls(standin)
    obs = await driver.observe(ref("sbx-1", served=ids["sbx-1"]))
    assert obs.phase is ObservedPhase.ABSENT  # the GET says 404: really gone
    assert calls(standin)[GET] == before[GET] + 1
    # Without a recorded id it lists by its labels, which fails: an error, never "Failed".
    with pytest.raises(AcasError):
        await driver.observe(ref("sbx-2"))
    standin.state.clear_faults()
    assert await driver.refresh()
    status = driver.cache_status()
    assert not status.stale and status.consecutive_failures == 0 and status.last_error == ""


async def test_before_any_good_list_observe_asks_the_service(
    driver: AcasDriver, creator: AcasDriver, standin: StandinServer, clock: Clock
) -> None:
    ids = await make(creator, "sbx-1")
    standin.state.add_fault(operation=LIST, status=503, code="ServiceUnavailable", times=-1)
    with pytest.raises(AcasError):
        await driver.observe(ref("sbx-1"))
    lists = standin.state.calls[LIST]
    obs = await driver.observe(ref("sbx-1", served=ids["sbx-1"]))
    assert obs.phase is ObservedPhase.READY  # by id; the failed list is not retried at once
    assert standin.state.calls[LIST] == lists
    assert not driver.cache_status().filled


# -- labels ----------------------------------------------------------------------------------


def test_remote_labels_record_the_sandbox_name_when_it_fits() -> None:
    labels = remote_labels(request("my.sandbox", "u"), "acas-test")
    assert labels[SANDBOX_NAME_LABEL] == "my.sandbox"
    assert labels[lbl.SANDBOX_LABEL] == lbl.sandbox_label_value("my.sandbox") != "my.sandbox"
    assert labels[NAMESPACE_LABEL] == "ns1"
    long_name = "a." * 40 + "b"
    assert SANDBOX_NAME_LABEL not in remote_labels(request(long_name, "u"), "acas-test")
