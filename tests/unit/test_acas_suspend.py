"""Suspend and resume on an `acas` backend: the driver's `Suspendable` side against the stand-in.

The stop / stop-async / resume requests are checked at the stand-in against the reference's
operation table (method and path per operationId, `api-version` the only query, no body:
section 3.8 "None of these operations takes a request body"), the same anchor
`test_acas_examples.py` replays the published examples against.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from sandbox_operator.acas.config import AcasBackendConfig, default_declarations
from sandbox_operator.acas.errors import AcasConflict
from sandbox_operator.acas.models import RemoteSandbox
from sandbox_operator.backends.acas.driver import (
    REMOTE_KIND,
    AcasDriver,
    create_content,
)
from sandbox_operator.backends.base import (
    EnsureRequest,
    ObservedPhase,
    SandboxRef,
    ServedBy,
    StartupError,
    Suspendable,
    TransientError,
    suspends,
)
from sandbox_operator.contract import ConditionReason
from tests.acas_standin import DEFAULT_TOKEN, StandinServer
from tests.fixtures.acas import DOCUMENTED, P, make_config, new_driver, request

STOP = "SandboxLifecycleOperations_PostSandboxStop"
STOP_ASYNC = "SandboxLifecycleOperations_PostSandboxStopAsync"
RESUME = "SandboxLifecycleOperations_PostSandboxResume"
CREATE = "AzureSandboxes_Create"
STORAGE = {"size": "2Gi"}
FILE = "/workspace/notes/kept.txt"
CONTENT = bytes(range(256)) * 3


@pytest.fixture
async def standin() -> AsyncIterator[StandinServer]:
    async with StandinServer() as server:
        yield server


@pytest.fixture
async def driver(standin: StandinServer) -> AsyncIterator[AcasDriver]:
    d = new_driver(standin)
    yield d
    await d.close()


def ref(remote_id: str | None = None, uid: str = "uid-1") -> SandboxRef:
    """The ref the operator passes: the Sandbox, plus the status's servedBy once recorded."""
    served = ServedBy(REMOTE_KIND, remote_id) if remote_id else None
    return SandboxRef("ns1", "sbx-1", uid, served)


def req(served: str | None = None, uid: str = "uid-1", **spec_kw: Any) -> EnsureRequest:
    """An EnsureRequest (as for ensure) whose ref carries the recorded remote id, if any."""
    return dataclasses.replace(request(uid=uid, **spec_kw), sandbox=ref(served, uid))


def sent(standin: StandinServer, operation: str) -> list[dict[str, Any]]:
    return [r for r in standin.state.requests if r["operation"] == operation]


def assert_as_documented(standin: StandinServer, operation: str, remote_id: str) -> None:
    """Every request of `operation` the stand-in saw is the reference's: method, path (section
    2), `api-version` as the only query parameter, no body (section 3.8)."""
    method, template = DOCUMENTED[operation]
    path = (P + template).format(
        subscriptionId="00000000-0000-0000-0000-000000000000",
        resourceGroupName="rg-test",
        sandboxGroupName="group-test",
        id=remote_id,
    )
    requests = sent(standin, operation)
    assert requests, f"no {operation} was sent"
    for r in requests:
        assert (r["method"], r["path"]) == (method, path)
        assert r["query"] == {"api-version": "2026-09-01-preview"}
        assert r["hasBody"] is False and r["contentType"] is None


async def test_declares_persistent_storage_and_suspends(driver: AcasDriver) -> None:
    assert default_declarations().persistent_storage is True
    assert driver.config.declarations.persistent_storage is True
    assert isinstance(driver, Suspendable) and suspends(driver)
    assert driver.config.stop_method == "blocking"
    assert (driver.config.timeouts.stop, driver.config.timeouts.resume) == (180.0, 300.0)


def test_storage_size_is_the_disk_asked_of_the_service() -> None:
    config = make_config("http://127.0.0.1:1")
    with_storage = create_content(
        request(storage={"size": "2Gi", "storageClassName": "fast"}), config
    )
    # cpu and memory are required members of resources: the service's defaults fill them.
    assert with_storage["resources"] == {"cpu": "1000m", "memory": "2048Mi", "disk": "2Gi"}
    sized = create_content(
        request(storage=STORAGE, resources={"limits": {"cpu": "2", "memory": "1Gi"}}), config
    )
    assert sized["resources"] == {"cpu": "2", "memory": "1Gi", "disk": "2Gi"}
    assert "resources" not in create_content(request(), config)


async def test_suspend_then_resume_keeps_the_files_and_the_identity(
    driver: AcasDriver, standin: StandinServer
) -> None:
    served = await driver.ensure(request(storage=STORAGE))
    remote_id = served.name
    assert standin.state.sandboxes[remote_id].body["resources"]["disk"] == "2Gi"
    assert (await driver.observe(ref(remote_id))).phase is ObservedPhase.READY
    await driver.client.write_file(remote_id, FILE, CONTENT)

    assert await driver.suspend(ref(remote_id)) == []
    remote = standin.state.sandboxes[remote_id]
    assert remote.state == "Stopped"
    assert remote.state_details is not None
    assert remote.state_details["stoppedReason"] == "UserStopped"
    assert remote.snapshot_id
    obs = await driver.observe(ref(remote_id))  # written through: no list needed
    assert (obs.phase, obs.detail_reason) == (ObservedPhase.SUSPENDED, "UserStopped")
    assert obs.served_by == served
    with pytest.raises(AcasConflict):  # a stopped sandbox serves no data plane
        await driver.client.read_file(remote_id, FILE)

    assert await driver.resume(req(remote_id, storage=STORAGE)) == served
    assert standin.state.sandboxes[remote_id].state == "Running"
    assert (await driver.observe(ref(remote_id))).phase is ObservedPhase.READY
    assert await driver.client.read_file(remote_id, FILE) == CONTENT
    # Same remote sandbox, same labels and policies: nothing was created in its place.
    assert list(standin.state.sandboxes) == [remote_id]
    assert standin.state.calls[CREATE] == 1
    assert standin.state.calls[STOP] == 1 and standin.state.calls[RESUME] == 1
    assert_as_documented(standin, STOP, remote_id)
    assert_as_documented(standin, RESUME, remote_id)


async def test_suspend_and_resume_are_idempotent(
    driver: AcasDriver, standin: StandinServer
) -> None:
    remote_id = (await driver.ensure(request(storage=STORAGE))).name
    assert await driver.suspend(ref(remote_id)) == []
    assert await driver.suspend(ref(remote_id)) == []
    assert await driver.suspend(ref()) == []  # found by its labels alone
    assert standin.state.calls[STOP] == 1
    served = await driver.resume(req(remote_id, storage=STORAGE))
    assert await driver.resume(req(remote_id, storage=STORAGE)) == served
    assert await driver.resume(req(storage=STORAGE)) == served
    assert standin.state.calls[RESUME] == 1
    assert standin.state.calls[CREATE] == 1


async def test_async_stop_reports_what_is_still_stopping(standin: StandinServer) -> None:
    driver = new_driver(standin, stopMethod="async")
    try:
        standin.state.stopping_gets = 3
        remote_id = (await driver.ensure(request(storage=STORAGE))).name
        still = await driver.suspend(ref(remote_id))
        assert [o.name for o in still] == [remote_id]
        assert standin.state.sandboxes[remote_id].state == "Stopping"
        obs = await driver.observe(ref(remote_id))
        assert (obs.phase, obs.detail_reason) == (ObservedPhase.SUSPENDED, "Stopping")
        with pytest.raises(TransientError) as info:  # not resumable until Stopped
            await driver.resume(req(remote_id, storage=STORAGE))
        assert "still stopping" in info.value.message and info.value.retry_after
        rounds = 0
        while await driver.suspend(ref(remote_id)):
            rounds += 1
            assert rounds < 5
        assert standin.state.sandboxes[remote_id].state == "Stopped"
        assert standin.state.calls[STOP_ASYNC] == 1 and standin.state.calls[STOP] == 0
        assert_as_documented(standin, STOP_ASYNC, remote_id)
        await driver.resume(req(remote_id, storage=STORAGE))
        assert standin.state.sandboxes[remote_id].state == "Running"
    finally:
        await driver.close()


def stale_current(
    driver: AcasDriver, monkeypatch: pytest.MonkeyPatch, change: Any
) -> list[RemoteSandbox]:
    """The driver reads the remote sandbox, then (another replica, the service itself)
    `change(remote_id)` happens before the driver's stop or resume lands."""
    seen: list[RemoteSandbox] = []
    original = driver._current

    async def racing(sandbox: SandboxRef) -> RemoteSandbox | None:
        remote = await original(sandbox)
        if remote is not None:
            seen.append(remote)
            change(remote.id)
        return remote

    monkeypatch.setattr(driver, "_current", racing)
    return seen


async def test_stop_answered_409_already_stopped_is_success(
    driver: AcasDriver, standin: StandinServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    remote_id = (await driver.ensure(request(storage=STORAGE))).name
    seen = stale_current(
        driver, monkeypatch, lambda sid: standin.state.sandboxes[sid].stop("UserStopped")
    )
    assert await driver.suspend(ref(remote_id)) == []
    assert seen[0].state == "Running"
    assert [r["operation"] for r in standin.state.requests][-2:] == [STOP, "AzureSandboxes_Get"]
    assert standin.state.calls[STOP] == 1  # answered 409, settled by reading the state
    obs = await driver.observe(ref(remote_id))
    assert obs.phase is ObservedPhase.SUSPENDED


async def test_resume_answered_409_already_running_is_success(
    driver: AcasDriver, standin: StandinServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = await driver.ensure(request(storage=STORAGE))
    await driver.suspend(ref(served.name))

    def resumed_meanwhile(sid: str) -> None:
        standin.state.sandboxes[sid].state = "Running"
        standin.state.sandboxes[sid].state_details = None

    seen = stale_current(driver, monkeypatch, resumed_meanwhile)
    assert await driver.resume(req(served.name, storage=STORAGE)) == served
    assert seen[0].state == "Stopped"
    assert standin.state.calls[RESUME] == 1  # answered 409 (not stopped), then read: Running
    assert (await driver.observe(ref(served.name))).phase is ObservedPhase.READY


async def test_a_bare_503_on_resume_is_transient_and_not_resent(
    driver: AcasDriver, standin: StandinServer
) -> None:
    remote_id = (await driver.ensure(request(storage=STORAGE))).name
    await driver.suspend(ref(remote_id))
    standin.state.add_fault(operation=RESUME, status=503, retry_after="7")
    with pytest.raises(TransientError) as info:
        await driver.resume(req(remote_id, storage=STORAGE))
    assert "HTTP 503" in info.value.message and RESUME in info.value.message
    assert info.value.retry_after == 7.0
    assert str(standin.port) not in info.value.message
    assert standin.state.calls[RESUME] == 1  # a resume is sent once: the operator retries
    assert standin.state.sandboxes[remote_id].state == "Stopped"
    await driver.resume(req(remote_id, storage=STORAGE))  # the later attempt
    assert standin.state.sandboxes[remote_id].state == "Running"


@pytest.mark.parametrize(
    ("operation", "status"), [(STOP, 500), (STOP, 429), ("AzureSandboxes_List", 500)]
)
async def test_service_failures_while_suspending_are_transient(
    driver: AcasDriver, standin: StandinServer, operation: str, status: int
) -> None:
    await driver.ensure(request(storage=STORAGE))
    standin.state.add_fault(operation=operation, status=status, times=-1, retry_after="0")
    with pytest.raises(TransientError) as info:
        await driver.suspend(ref())
    assert f"HTTP {status}" in info.value.message
    if operation == STOP:
        assert standin.state.calls[STOP] == 1  # a stop is sent once


async def test_stop_failed_is_reported(driver: AcasDriver, standin: StandinServer) -> None:
    remote_id = (await driver.ensure(request(storage=STORAGE))).name
    standin.state.stop_outcome = "StopFailed"
    with pytest.raises(TransientError) as info:
        await driver.suspend(ref(remote_id))
    assert "StopFailed" in info.value.message
    assert standin.state.sandboxes[remote_id].state == "StopFailed"
    obs = await driver.observe(ref(remote_id))
    assert (obs.phase, obs.detail_reason) == (ObservedPhase.FAILED, "StopFailed")
    # The next call tries the stop again; the stand-in (like the reference: 409 "not running")
    # refuses to stop a StopFailed sandbox, so it stays reported, never taken for suspended.
    with pytest.raises(TransientError) as again:
        await driver.suspend(ref(remote_id))
    assert "StopFailed" in again.value.message and "409" in again.value.message
    assert standin.state.calls[STOP] == 2


async def test_a_stop_by_the_service_itself_is_observed_suspended_with_its_reason(
    driver: AcasDriver, standin: StandinServer
) -> None:
    served = await driver.ensure(request(storage=STORAGE))
    notified: list[tuple[str, str]] = []
    await driver.start(lambda ns, name: notified.append((ns, name)))
    await driver.refresh()
    standin.state.auto_suspend = True
    standin.state.sandboxes[served.name].lifecycle = {
        "autoSuspendPolicy": {"enabled": True, "interval": 0},
        "autoDeletePolicy": {"enabled": False},
    }
    await driver.refresh()  # the service idle-suspended it on this request
    assert notified == [("ns1", "sbx-1")]
    obs = await driver.observe(ref(served.name))
    assert (obs.phase, obs.detail_reason) == (ObservedPhase.SUSPENDED, "Idle")
    assert "its state is kept" in obs.message
    # The operator may suspend it too (already stopped: no call) or resume it (from Idle).
    assert await driver.suspend(ref(served.name)) == []
    assert standin.state.calls[STOP] == 0
    standin.state.auto_suspend = False
    assert await driver.resume(req(served.name, storage=STORAGE)) == served
    assert standin.state.sandboxes[served.name].state == "Running"


async def test_disabled_at_the_service_is_transient_on_resume(
    driver: AcasDriver, standin: StandinServer
) -> None:
    remote_id = (await driver.ensure(request(storage=STORAGE))).name
    standin.state.sandboxes[remote_id].stop("Disabled")
    obs = await driver.observe(ref(remote_id))
    assert obs.phase is ObservedPhase.SUSPENDED
    with pytest.raises(TransientError) as info:
        await driver.resume(req(remote_id, storage=STORAGE))
    assert "Disabled" in info.value.message


async def test_resume_of_a_remote_that_is_gone_refuses_and_creates_nothing(
    driver: AcasDriver, standin: StandinServer
) -> None:
    remote_id = (await driver.ensure(request(storage=STORAGE))).name
    await driver.suspend(ref(remote_id))
    standin.state.remove(remote_id)  # e.g. its auto-delete lifetime ended
    with pytest.raises(StartupError) as info:
        await driver.resume(req(remote_id, storage=STORAGE))
    assert info.value.reason == ConditionReason.STARTUP_FAILED
    assert remote_id in info.value.message and "gone" in info.value.message
    assert standin.state.sandboxes == {} and standin.state.calls[CREATE] == 1
    assert await driver.suspend(ref(remote_id)) == []  # nothing to stop


async def test_resume_of_a_sandbox_suspended_from_the_start_creates_it(
    driver: AcasDriver, standin: StandinServer
) -> None:
    assert await driver.suspend(ref()) == []  # never created: nothing to stop
    served = await driver.resume(req(storage=STORAGE))
    assert list(standin.state.sandboxes) == [served.name]
    assert standin.state.calls[RESUME] == 0


async def test_resume_next_to_an_earlier_sandboxs_remote_is_key_unclean(
    driver: AcasDriver, standin: StandinServer
) -> None:
    old = await driver.ensure(request(uid="old", storage=STORAGE))
    assert await driver.suspend(ref(uid="new")) == []  # not ours: left alone
    assert standin.state.sandboxes[old.name].state == "Running"
    with pytest.raises(StartupError) as info:
        await driver.resume(req(uid="new", storage=STORAGE))
    assert info.value.reason == ConditionReason.KEY_UNCLEAN


async def test_standin_refuses_a_body_on_stop_and_resume(standin: StandinServer) -> None:
    sandbox = standin.state.seed_sandbox("sbx-body")
    base = f"/subscriptions/s/resourceGroups/r/sandboxGroups/g/sandboxes/{sandbox.id}"
    params = {"api-version": "2026-09-01-preview"}
    headers = {"Authorization": f"Bearer {DEFAULT_TOKEN}"}
    async with httpx.AsyncClient(base_url=standin.base_url) as http:
        for suffix in ("/stop", "/stop/async", "/resume"):
            response = await http.post(base + suffix, params=params, headers=headers, json={})
            assert response.status_code == 400, suffix
            assert response.json()["title"] == "UnexpectedBody"
        assert sandbox.state == "Running"
        stopped = await http.post(base + "/stop", params=params, headers=headers)
        assert stopped.status_code == 200
        snapshot = stopped.json()
        assert snapshot["sandboxId"] == sandbox.id and snapshot["createdAtUtc"]
        assert snapshot["id"] == sandbox.snapshot_id
        again = await http.post(base + "/stop", params=params, headers=headers)
        assert again.status_code == 409  # already stopped
        resumed = await http.post(base + "/resume", params=params, headers=headers)
        assert resumed.status_code == 200 and resumed.json()["state"] == "Running"
        running = await http.post(base + "/resume", params=params, headers=headers)
        assert running.status_code == 409  # already running
        control = await http.post(
            f"/_standin/sandboxes/{sandbox.id}/state",
            json={"state": "Stopped", "stoppedReason": "Idle"},
        )
        assert control.json()["stateDetails"]["stoppedReason"] == "Idle"


def test_config_knobs() -> None:
    config = AcasBackendConfig.model_validate(
        {
            "type": "acas",
            "name": "acas",
            "endpoint": "https://example.invalid",
            "subscription": "s",
            "resourceGroup": "r",
            "sandboxGroup": "g",
            "credential": {"source": "workloadIdentity"},
            "stopMethod": "async",
            "timeouts": {"stop": 30, "resume": 60},
        }
    )
    assert config.stop_method == "async"
    assert (config.timeouts.stop, config.timeouts.resume) == (30.0, 60.0)
    with pytest.raises(ValueError):
        AcasBackendConfig.model_validate({**config.model_dump(by_alias=True), "stopMethod": "x"})
