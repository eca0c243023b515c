"""AcasDriver (the operator's view of an acas backend) against the loopback stand-in."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sandbox_operator import labels as lbl
from sandbox_operator.acas.auth import StaticTokenProvider
from sandbox_operator.acas.models import RemoteSandbox
from sandbox_operator.backends.acas.driver import (
    KIND_LABEL,
    NAMESPACE_LABEL,
    OWNER_UID_LABEL,
    REMOTE_KIND,
    AcasDriver,
    build_driver,
    classify,
    egress_policy,
)
from sandbox_operator.backends.base import (
    BackendDriver,
    DisposalError,
    ObservedPhase,
    SandboxRef,
    StartupError,
)
from sandbox_operator.contract import (
    ConditionReason,
    DisposalCode,
    SandboxKey,
)
from tests.acas_standin import DEFAULT_TOKEN, StandinServer
from tests.fixtures.acas import make_config, new_driver, request, spec

CREATE = "AzureSandboxes_Create"
LIST = "AzureSandboxes_List"
DELETE = "AzureSandboxes_Delete"


@pytest.fixture
async def standin() -> AsyncIterator[StandinServer]:
    async with StandinServer() as server:
        yield server


@pytest.fixture
async def driver(standin: StandinServer) -> AsyncIterator[AcasDriver]:
    d = new_driver(standin)
    yield d
    await d.close()


async def test_is_a_backend_driver(driver: AcasDriver) -> None:
    assert isinstance(driver, BackendDriver)
    assert (await driver.check_available()).available


async def test_ensure_creates_a_labelled_confined_sandbox(
    driver: AcasDriver, standin: StandinServer
) -> None:
    req = request(
        egress="allowlist",
        egress_allow=("pypi.org", "files.pythonhosted.org"),
        resources={"limits": {"cpu": "1", "memory": "512Mi"}},
    )
    served = await driver.ensure(req)
    assert served.kind == REMOTE_KIND
    remote = standin.state.sandboxes[served.name]
    for k, v in lbl.key_labels(req.key, req.spec.kind).items():
        assert remote.labels[k] == v
    assert remote.labels[lbl.SANDBOX_LABEL] == "sbx-1"
    assert remote.labels[NAMESPACE_LABEL] == "ns1"
    assert remote.labels[OWNER_UID_LABEL] == "uid-1"
    assert remote.labels[KIND_LABEL] == "python"
    assert remote.labels[lbl.BACKEND_LABEL] == "acas-test"
    http = remote.egress_policy["http"]  # type: ignore[index]
    assert http["defaultAction"] == "Deny"
    assert [r["pattern"] for r in http["hostRules"]] == ["pypi.org", "files.pythonhosted.org"]
    delete = remote.lifecycle["autoDeletePolicy"]  # type: ignore[index]
    assert delete["enabled"] and delete["trigger"] == "AfterCreation"
    assert delete["deleteIntervalInSeconds"] == 3600 + 600
    assert remote.body["resources"] == {"cpu": "1", "memory": "512Mi"}
    assert remote.body["sourcesRef"] == {"diskImage": {"name": "python:3.12", "isPublic": True}}
    obs = await driver.observe(req.sandbox)
    assert obs.phase is ObservedPhase.READY
    assert obs.served_by is not None and obs.served_by.name == served.name


async def test_ensure_is_idempotent(driver: AcasDriver, standin: StandinServer) -> None:
    first = await driver.ensure(request())
    second = await driver.ensure(request())
    assert first == second
    assert standin.state.calls[CREATE] == 1


async def test_earlier_sandbox_of_same_name_is_key_unclean(driver: AcasDriver) -> None:
    await driver.ensure(request(uid="old"))
    with pytest.raises(StartupError) as info:
        await driver.ensure(request(uid="new"))
    assert info.value.reason == ConditionReason.KEY_UNCLEAN
    assert (await driver.observe(SandboxRef("ns1", "sbx-1", "new"))).phase is ObservedPhase.ABSENT


async def test_refused_create_is_startup_failed(driver: AcasDriver, standin: StandinServer) -> None:
    standin.state.add_fault(operation=CREATE, status=400, code="InvalidImage")
    with pytest.raises(StartupError) as info:
        await driver.ensure(request())
    assert info.value.reason == ConditionReason.STARTUP_FAILED
    assert "InvalidImage" in info.value.message


async def test_unlisted_sandbox_is_removed_and_refused(
    driver: AcasDriver, standin: StandinServer
) -> None:
    standin.state.add_fault(operation=LIST, status=200, body=[], times=2)
    with pytest.raises(StartupError) as info:
        await driver.ensure(request())
    assert "missing from its label listing" in info.value.message
    assert standin.state.sandboxes == {}


@pytest.mark.parametrize(
    ("startup", "phase"),
    [
        ("Running", ObservedPhase.READY),
        ("Failed", ObservedPhase.FAILED),
        ("Creating", ObservedPhase.STARTING),
    ],
)
async def test_observe_maps_remote_state(
    driver: AcasDriver, standin: StandinServer, startup: str, phase: ObservedPhase
) -> None:
    standin.state.startup_state = startup
    await driver.ensure(request())
    assert (await driver.observe(SandboxRef("ns1", "sbx-1", "uid-1"))).phase is phase


def test_classify() -> None:
    def remote(state: str, reason: str | None = None) -> RemoteSandbox:
        details = {"stoppedReason": reason} if reason else None
        return RemoteSandbox.model_validate({"id": "x", "state": state, "stateDetails": details})

    assert classify(None).phase is ObservedPhase.ABSENT
    # Stopped whatever the reason (the detail says which), or on its way: state kept.
    for state, reason, detail in [
        ("Stopped", "Idle", "Idle"),
        ("Stopped", "UserStopped", "UserStopped"),
        ("Stopped", "Disabled", "Disabled"),
        ("Stopped", None, "Stopped"),
        ("Idle", None, "Idle"),
        ("Suspended", None, "Suspended"),
        ("Stopping", None, "Stopping"),
    ]:
        obs = classify(remote(state, reason))
        assert (obs.phase, obs.detail_reason) == (ObservedPhase.SUSPENDED, detail), state
        assert obs.served_by is not None and obs.served_by.name == "x"
    assert classify(remote("StopFailed")).phase is ObservedPhase.FAILED
    assert classify(remote("Deleting")).phase is ObservedPhase.DISPOSING
    assert classify(remote("Brand-new")).phase is ObservedPhase.STARTING


def test_egress_policies() -> None:
    closed = egress_policy(spec())
    assert closed["http"] == {"defaultAction": "Deny", "hostRules": []}
    assert closed["transportRules"]["defaultAction"] == "Deny"
    assert egress_policy(spec(egress="unrestricted")) == {"http": {"defaultAction": "Allow"}}


async def test_dispose_waits_until_gone(driver: AcasDriver, standin: StandinServer) -> None:
    served = await driver.ensure(request())
    await driver.dispose(SandboxRef("ns1", "sbx-1", "uid-1"))
    assert served.name not in standin.state.sandboxes
    await driver.dispose(SandboxRef("ns1", "sbx-1", "uid-1"))  # idempotent


async def test_scope_purge_from_a_fresh_driver(driver: AcasDriver, standin: StandinServer) -> None:
    key_a = SandboxKey(scope="tenant", thread_id="t1", agent_dir="a")
    key_b = SandboxKey(scope="tenant", thread_id="t1", agent_dir="b")
    key_other = SandboxKey(scope="tenant", thread_id="t2", agent_dir="a")
    await driver.ensure(request("sbx-a", "u-a", key_a))
    await driver.ensure(request("sbx-b", "u-b", key_b))
    other = await driver.ensure(request("sbx-c", "u-c", key_other))
    fresh = new_driver(standin)  # knows nothing but the config
    try:
        objects = await fresh.list_by_scope("ns1", "tenant", "t1")
        assert sorted(o.sandbox_name for o in objects) == ["sbx-a", "sbx-b"]
        assert {o.owner_uid for o in objects} == {"u-a", "u-b"}
        assert await fresh.list_by_scope("ns2", "tenant", "t1") == []
        for obj in objects:
            await fresh.dispose_object(obj)
        assert list(standin.state.sandboxes) == [other.name]
        assert [o.name for o in await fresh.list_by_key("ns1", key_other)] == [other.name]
        sent = [
            r["query"].get("labels", "") for r in standin.state.requests if r["operation"] == LIST
        ]
        assert any(lbl.CONVERSATION_LABEL in s for s in sent)  # filtered by the service
    finally:
        await fresh.close()


async def dispose_times_out(driver: AcasDriver, standin: StandinServer) -> None:
    """A delete that leaves the sandbox listed: dispose gives up with TIMEOUT. Closes `driver`."""
    try:
        await driver.ensure(request())
        standin.state.delete_leaves_listed = True
        with pytest.raises(DisposalError) as info:
            await driver.dispose(SandboxRef("ns1", "sbx-1", "uid-1"))
        assert info.value.code is DisposalCode.TIMEOUT
    finally:
        await driver.close()


async def test_dispose_that_leaves_the_sandbox_listed_times_out(standin: StandinServer) -> None:
    driver = new_driver(standin, timeouts={"delete": 0.2, "pollInterval": 0.05})
    await dispose_times_out(driver, standin)


async def test_dispose_wait_is_bounded_by_the_operators_dispose_timeout(
    standin: StandinServer,
) -> None:
    from sandbox_operator.backends import build_driver as build_any_driver
    from sandbox_operator.config import OperatorSettings

    config = make_config(standin.base_url, timeouts={"delete": 300, "pollInterval": 0.05})
    # The operator's setting reaches the driver the operator builds for the entry.
    built = build_any_driver(
        config, api=None, settings=OperatorSettings(dispose_timeout_seconds=0.3)
    )
    assert isinstance(built, AcasDriver) and built.dispose_within == 0.3
    await built.close()
    driver = build_driver(
        config, api=None, dispose_timeout=0.3, tokens=StaticTokenProvider(DEFAULT_TOKEN)
    )
    assert driver.dispose_within == 0.3
    plain = build_driver(config, api=None, tokens=StaticTokenProvider("x"))
    assert plain.dispose_within == 300
    await plain.close()
    await dispose_times_out(driver, standin)


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        ({"status": 401, "code": "ExpiredAuthenticationToken"}, DisposalCode.REFUSED),
        ({"status": 403, "code": "AuthorizationFailed"}, DisposalCode.REFUSED),
        ({"status": 500, "code": "InternalServerError"}, DisposalCode.UNKNOWN),
    ],
)
async def test_dispose_failures_map_to_codes(
    driver: AcasDriver, standin: StandinServer, fault: dict[str, Any], code: DisposalCode
) -> None:
    await driver.ensure(request())
    standin.state.add_fault(operation=DELETE, times=-1, **fault)
    with pytest.raises(DisposalError) as info:
        await driver.dispose(SandboxRef("ns1", "sbx-1", "uid-1"))
    assert info.value.code is code
    assert fault["code"] in info.value.failure.detail
    assert str(standin.port) not in str(info.value)


async def test_unreachable_backend() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def no_sleep(_: float) -> None:
        return None

    driver = build_driver(
        make_config(f"http://127.0.0.1:{port}"), api=None, tokens=StaticTokenProvider("t")
    )
    driver.client._sleep = no_sleep
    try:
        availability = await driver.check_available()
        assert not availability.available and str(port) not in availability.reason
        with pytest.raises(DisposalError) as info:
            await driver.dispose(SandboxRef("ns1", "sbx-1", "uid-1"))
        assert info.value.code is DisposalCode.UNREACHABLE
    finally:
        await driver.close()


async def test_bad_credential_makes_backend_unavailable(standin: StandinServer) -> None:
    driver = build_driver(
        make_config(standin.base_url), api=None, tokens=StaticTokenProvider("wrong-token")
    )
    try:
        availability = await driver.check_available()
        assert not availability.available
        assert "401" in availability.reason and "wrong-token" not in availability.reason
    finally:
        await driver.close()


async def test_credential_secret_is_read_on_first_use(
    standin: StandinServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import base64
    from types import SimpleNamespace

    from kubernetes_asyncio import client as k8s

    reads: list[tuple[str, str]] = []

    class FakeCore:
        def __init__(self, api: Any) -> None:
            self.api = api

        async def read_namespaced_secret(self, name: str, namespace: str) -> Any:
            reads.append((name, namespace))
            token = base64.b64encode(DEFAULT_TOKEN.encode()).decode()
            return SimpleNamespace(data={"token": token})

    from sandbox_operator.backends import build_driver as build_any_driver
    from sandbox_operator.config import OperatorSettings

    monkeypatch.setattr(k8s, "CoreV1Api", FakeCore)
    # A Secret named without a namespace is read in the operator's (which the runtime passes).
    built = build_any_driver(
        make_config(standin.base_url),
        api=object(),
        settings=OperatorSettings(),
        operator_namespace="operator-ns",
    )
    assert isinstance(built, AcasDriver)
    driver = built
    try:
        assert (await driver.check_available()).available
        assert reads == [("acas", "operator-ns")]
        await driver.ensure(request())
        assert len(reads) == 1  # cached
    finally:
        await driver.close()


async def test_missing_secret_key_is_refused(
    standin: StandinServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from kubernetes_asyncio import client as k8s

    class FakeCore:
        def __init__(self, api: Any) -> None:
            pass

        async def read_namespaced_secret(self, name: str, namespace: str) -> Any:
            return SimpleNamespace(data={})

    monkeypatch.setattr(k8s, "CoreV1Api", FakeCore)
    config = make_config(
        standin.base_url, credential={"source": "secret", "secretName": "acas", "namespace": "x"}
    )
    driver = build_driver(config, api=object())
    try:
        availability = await driver.check_available()
        assert not availability.available and "tenantId" in availability.reason
        with pytest.raises(DisposalError) as info:
            await driver.dispose(SandboxRef("ns1", "sbx-1", "uid-1"))
        assert info.value.code is DisposalCode.REFUSED
    finally:
        await driver.close()


async def test_availability_probe_reads_one_page(
    driver: AcasDriver, standin: StandinServer
) -> None:
    for i in range(3):
        await driver.ensure(request(name=f"sbx-{i}", uid=f"u-{i}"))
    before = standin.state.calls[LIST]
    assert (await driver.check_available()).available
    assert standin.state.calls[LIST] - before == 1


@pytest.mark.parametrize(
    ("fault", "permanent"),
    [
        ({"status": 500, "code": "InternalServerError"}, False),
        ({"status": 503, "code": "ServiceUnavailable"}, False),
        ({"status": 429, "code": "TooManyRequests"}, False),
        ({"status": 404, "code": "SandboxGroupNotFound"}, True),
    ],
)
async def test_create_errors_are_transient_or_permanent(
    driver: AcasDriver, standin: StandinServer, fault: dict[str, Any], permanent: bool
) -> None:
    from sandbox_operator.backends.base import TransientError

    standin.state.add_fault(operation=CREATE, times=-1, **fault)
    expected = StartupError if permanent else TransientError
    with pytest.raises(expected) as info:
        await driver.ensure(request())
    message = str(info.value)
    assert "AzureSandboxes_Create" in message
    assert str(standin.port) not in message and DEFAULT_TOKEN not in message


def recorded(sandbox_id: str) -> SandboxRef:
    """The ref the operator passes to dispose: the Sandbox plus the status's servedBy."""
    from sandbox_operator.backends.base import ServedBy

    return SandboxRef("ns1", "sbx-1", "uid-1", ServedBy(REMOTE_KIND, sandbox_id))


async def test_dispose_removes_a_recorded_sandbox_missing_from_its_listing(
    driver: AcasDriver, standin: StandinServer
) -> None:
    served = await driver.ensure(request())
    standin.state.add_fault(operation=LIST, status=200, body=[], times=-1)
    await driver.dispose(recorded(served.name))  # deleted by its recorded id
    assert served.name not in standin.state.sandboxes
    await driver.dispose(recorded(served.name))  # gone (404) is success


@pytest.mark.parametrize("failing", ["AzureSandboxes_Get", DELETE])
async def test_dispose_of_an_unlisted_sandbox_that_does_not_land_is_unlisted(
    driver: AcasDriver, standin: StandinServer, failing: str
) -> None:
    served = await driver.ensure(request())
    standin.state.add_fault(operation=LIST, status=200, body=[], times=-1)
    standin.state.add_fault(operation=failing, status=500, code="InternalServerError", times=-1)
    with pytest.raises(DisposalError) as info:
        await driver.dispose(recorded(served.name))
    assert info.value.code is DisposalCode.UNLISTED
    detail = info.value.failure.detail
    assert served.name in detail and "InternalServerError" in detail
    assert str(standin.port) not in str(info.value)
    assert served.name in standin.state.sandboxes
