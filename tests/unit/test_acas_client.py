"""AcasClient against the loopback stand-in: retries, faults, typed errors, DisposalCodes, labels,
files, executions, and that neither token nor endpoint leaks into messages or logs."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator

import httpx
import pytest

from sandbox_operator.acas.api import AcasClient, parse_retry_after
from sandbox_operator.acas.auth import StaticTokenProvider
from sandbox_operator.acas.errors import (
    AcasAuthError,
    AcasConflict,
    AcasError,
    AcasNotFound,
    AcasNotListed,
    AcasPayloadTooLarge,
    AcasProtocolError,
    AcasServerError,
    AcasStillPresent,
    AcasThrottled,
    AcasTimeout,
    AcasUnreachable,
    disposal_code,
    disposal_failure,
    error_for_status,
)
from sandbox_operator.acas.operations import LabelSelectorError, label_selector
from sandbox_operator.contract import DisposalCode, SandboxKey
from sandbox_operator.labels import object_labels, scope_selector
from tests.acas_standin import DEFAULT_TOKEN, StandinServer
from tests.fixtures.acas import make_config

SECRET_TOKEN = "sekret-token-0123456789"

EXEC = "SandboxLifecycleOperations_PostSandboxExecuteCommand"
SHELL = "SandboxLifecycleOperations_PostSandboxExecuteShellCommand"
GET = "AzureSandboxes_Get"
LIST = "AzureSandboxes_List"
DELETE = "AzureSandboxes_Delete"
CREATE = "AzureSandboxes_Create"
MKDIR = "SandboxFilesOperations_PostSandboxFileMkdir"
DELETE_FILE = "SandboxFilesOperations_DeleteSandboxFile"


class SleepRecorder:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


@pytest.fixture
async def standin() -> AsyncIterator[StandinServer]:
    async with StandinServer(tokens=(DEFAULT_TOKEN, SECRET_TOKEN)) as server:
        yield server


@pytest.fixture
def sleeps() -> SleepRecorder:
    return SleepRecorder()


@pytest.fixture
async def client(standin: StandinServer, sleeps: SleepRecorder) -> AsyncIterator[AcasClient]:
    async with AcasClient(
        make_config(standin.base_url), StaticTokenProvider(SECRET_TOKEN), sleep=sleeps
    ) as c:
        yield c


async def running(client: AcasClient, labels: dict[str, str] | None = None) -> str:
    created = await client.create_sandbox({"labels": labels or {}})
    assert created.state == "Creating"
    got = await client.get_sandbox(created.id)
    assert got.state == "Running"
    return created.id


def assert_clean(error: BaseException, standin: StandinServer) -> None:
    """No token, no endpoint in anything a caller would log."""
    host_port = f"127.0.0.1:{standin.port}"
    texts = [str(error), repr(error)]
    if isinstance(error, AcasError):
        texts += [error.detail, error.service_message, str(error.code)]
    for text in texts:
        assert SECRET_TOKEN not in text
        assert host_port not in text
        assert standin.base_url not in text
        assert str(standin.port) not in text


# -- basic operations ----------


async def test_create_get_delete_roundtrip(client: AcasClient, standin: StandinServer) -> None:
    sid = await running(client, {"a": "1"})
    assert (await client.get_sandbox(sid)).labels == {"a": "1"}
    await client.delete_and_wait(sid)
    assert await client.find_sandbox(sid) is None
    assert await client.delete_sandbox(sid) in (True, False)
    assert standin.state.calls[CREATE] == 1


async def test_list_filters_on_the_service(client: AcasClient, standin: StandinServer) -> None:
    a = await running(client, {"team": "x", "env": "prod"})
    b = await running(client, {"team": "x", "env": "dev"})
    await running(client, {"team": "y", "env": "prod"})
    found = await client.list_sandboxes({"team": "x"})
    assert {s.id for s in found} == {a, b}
    found = await client.list_sandboxes({"team": "x", "env": "prod"})
    assert [s.id for s in found] == [a]
    sent = [r for r in standin.state.requests if r["operation"] == LIST]
    assert sent[-1]["query"]["labels"] == "env=prod,team=x"


async def test_list_walks_pages(client: AcasClient) -> None:
    ids = {await running(client, {"k": "v"}) for _ in range(5)}
    found = await client.list_sandboxes({"k": "v"}, page_size=2)
    assert {s.id for s in found} == ids


async def test_key_labels_find_a_conversation(client: AcasClient) -> None:
    key = SandboxKey(scope="tenant a", thread_id="thread/1", agent_dir="agents/x")
    other = SandboxKey(scope="tenant a", thread_id="thread/2", agent_dir="agents/x")
    mine = await running(client, object_labels(key, "sbx-1", "acas-test", kind="python"))
    await running(client, object_labels(other, "sbx-2", "acas-test", kind="python"))
    selector = dict(
        pair.split("=", 1) for pair in scope_selector("tenant a", "thread/1").split(",")
    )
    found = await client.list_sandboxes(selector)
    assert [s.id for s in found] == [mine]


def test_label_selector_refuses_ambiguous_text() -> None:
    assert label_selector({"b": "2", "a": "1"}) == "a=1,b=2"
    for bad in ({"a,b": "1"}, {"a": "1,2"}, {"a": "x=y"}, {"": "1"}):
        with pytest.raises(LabelSelectorError):
            label_selector(bad)


async def test_count_accepts_both_shapes(client: AcasClient) -> None:
    await running(client)
    assert await client.count_sandboxes() == 1


# -- executions and files ----------


async def test_execute_command_really_runs(client: AcasClient, standin: StandinServer) -> None:
    sid = await running(client)
    await client.mkdir(sid, "/work")
    result = await client.execute_command(
        sid,
        ["sh", "-c", 'echo "$GREETING"; pwd; echo oops >&2; exit 3'],
        environment={"GREETING": "hello"},
        working_directory="/work",
    )
    assert result.exit_code == 3
    assert result.stdout.splitlines()[0] == "hello"
    assert result.stdout.splitlines()[1].endswith("/root/work")
    assert result.stderr == "oops\n"
    shell = await client.execute_shell_command(sid, "echo hi > out.txt", working_directory="/work")
    assert shell.exit_code == 0
    assert await client.read_file(sid, "/work/out.txt") == b"hi\n"
    assert len(standin.state.executions) == 2


async def test_files_roundtrip(client: AcasClient) -> None:
    sid = await running(client)
    assert await client.write_file(sid, "/data/in/a.txt", b"alpha") == 5
    assert await client.read_file(sid, "/data/in/a.txt") == b"alpha"
    info = await client.stat_file(sid, "/data/in/a.txt")
    assert (info.size, info.is_dir, info.path) == (5, False, "/data/in/a.txt")
    await client.mkdir(sid, "/data/out/deep", create_parents=True)
    names = sorted(e.name for e in await client.list_files(sid, "/data"))
    assert names == ["in", "out"]
    with pytest.raises(AcasConflict):
        await client.delete_file(sid, "/data/in")
    await client.delete_file(sid, "/data/in", recursive=True)
    with pytest.raises(AcasNotFound):
        await client.stat_file(sid, "/data/in/a.txt")
    with pytest.raises(AcasPayloadTooLarge):
        await client.read_file(sid, "/data", max_bytes=1) if False else await _too_large(
            client, sid
        )


async def test_file_op_reporting_failure_is_a_protocol_error(
    client: AcasClient, standin: StandinServer
) -> None:
    sid = await running(client)
    failed = {"success": False, "error": "EIO"}
    standin.state.add_fault(operation=MKDIR, status=200, body=failed, times=1)
    with pytest.raises(AcasProtocolError, match="reported mkdir failure") as info:
        await client.mkdir(sid, "/d")
    assert info.value.operation == MKDIR
    standin.state.add_fault(operation=DELETE_FILE, status=200, body=failed, times=1)
    with pytest.raises(AcasProtocolError, match="reported delete failure") as info:
        await client.delete_file(sid, "/d")
    assert info.value.operation == DELETE_FILE


async def _too_large(client: AcasClient, sid: str) -> None:
    await client.write_file(sid, "/big", b"x" * 10)
    await client.read_file(sid, "/big", max_bytes=5)


async def test_service_413_is_typed(client: AcasClient, standin: StandinServer) -> None:
    sid = await running(client)
    standin.state.max_file_bytes = 4
    with pytest.raises(AcasPayloadTooLarge) as info:
        await client.write_file(sid, "/f", b"12345")
    assert info.value.status == 413


async def test_stopped_sandbox_conflicts(client: AcasClient) -> None:
    sid = await running(client)
    await client.stop_sandbox(sid)
    with pytest.raises(AcasConflict) as info:
        await client.execute_command(sid, ["true"])
    assert info.value.code == "SandboxNotRunning"
    assert (await client.resume_sandbox(sid)).state == "Running"


async def test_egress_policy_and_lifecycle(client: AcasClient, standin: StandinServer) -> None:
    sid = await running(client)
    policy = {
        "http": {"defaultAction": "Deny", "hostRules": [{"pattern": "pypi.org", "action": "Allow"}]}
    }
    assert await client.set_egress_policy(sid, policy) == policy
    assert (await client.get_sandbox(sid)).egress_policy == policy
    lifecycle = {
        "autoSuspendPolicy": {"enabled": True, "interval": 60, "mode": "Memory"},
        "autoDeletePolicy": {
            "enabled": True,
            "deleteIntervalInSeconds": 0,
            "trigger": "AfterCreation",
        },
    }
    await client.set_lifecycle(sid, lifecycle)
    assert await client.find_sandbox(sid) is None  # expired: the service deleted the orphan
    decisions = await client.get_egress_decisions(await running(client))
    assert decisions["http"] == {"allowed": [], "denied": []}


# -- retries ----------


@pytest.mark.parametrize("operation", [GET, LIST, DELETE])
@pytest.mark.parametrize("status", [429, 503])
async def test_idempotent_calls_honour_retry_after(
    client: AcasClient, standin: StandinServer, sleeps: SleepRecorder, operation: str, status: int
) -> None:
    sid = await running(client)
    before = standin.state.calls[operation]
    standin.state.add_fault(operation=operation, status=status, retry_after="1.5", times=2)
    if operation == GET:
        await client.get_sandbox(sid)
    elif operation == LIST:
        await client.list_sandboxes({})
    else:
        await client.delete_sandbox(sid)
    assert sleeps.delays == [1.5, 1.5]
    assert standin.state.calls[operation] - before == 3


async def test_retry_without_retry_after_backs_off(
    client: AcasClient, standin: StandinServer, sleeps: SleepRecorder
) -> None:
    sid = await running(client)
    standin.state.add_fault(operation=GET, status=503, times=3)
    await client.get_sandbox(sid)
    assert len(sleeps.delays) == 3 and all(0 < d <= 0.05 for d in sleeps.delays)


async def test_retries_are_bounded(
    client: AcasClient, standin: StandinServer, sleeps: SleepRecorder
) -> None:
    sid = await running(client)
    standin.state.add_fault(operation=GET, status=429, retry_after="0", times=-1)
    with pytest.raises(AcasThrottled) as info:
        await client.get_sandbox(sid)
    assert info.value.attempts == 4
    assert standin.state.calls[GET] == 1 + 4
    assert info.value.retry_after == 0
    assert disposal_code(info.value) is DisposalCode.UNKNOWN


async def test_retry_after_beyond_cap_is_not_waited(
    client: AcasClient, standin: StandinServer, sleeps: SleepRecorder
) -> None:
    sid = await running(client)
    standin.state.add_fault(operation=GET, status=429, retry_after="3600")
    with pytest.raises(AcasThrottled):
        await client.get_sandbox(sid)
    assert sleeps.delays == []


@pytest.mark.parametrize("status", [429, 503, 500])
@pytest.mark.parametrize("operation", [EXEC, SHELL])
async def test_execution_is_never_sent_twice(
    client: AcasClient, standin: StandinServer, sleeps: SleepRecorder, status: int, operation: str
) -> None:
    sid = await running(client)
    standin.state.add_fault(operation=operation, status=status, retry_after="0", times=-1)
    with pytest.raises(AcasError) as info:
        if operation == EXEC:
            await client.execute_command(sid, ["echo", "once"])
        else:
            await client.execute_shell_command(sid, "echo once")
    assert info.value.status == status
    assert standin.state.calls[operation] == 1
    assert standin.state.executions == []
    assert sleeps.delays == []


async def test_slow_execution_times_out_once(client: AcasClient, standin: StandinServer) -> None:
    sid = await running(client)
    standin.state.add_fault(operation=EXEC, delay=1.0)
    with pytest.raises(AcasTimeout) as info:
        await client.execute_command(sid, ["echo", "slow"], read_timeout=0.2)
    assert disposal_code(info.value) is DisposalCode.TIMEOUT
    assert standin.state.calls[EXEC] == 1
    assert_clean(info.value, standin)


async def test_create_is_never_retried(
    client: AcasClient, standin: StandinServer, sleeps: SleepRecorder
) -> None:
    standin.state.add_fault(operation=CREATE, status=429, retry_after="0", times=-1)
    with pytest.raises(AcasThrottled):
        await client.create_sandbox({"labels": {"a": "b"}})
    assert standin.state.calls[CREATE] == 1
    assert standin.state.sandboxes == {}


# -- faults -> typed errors -> DisposalCode ----------


async def test_server_error_is_unknown_with_code(
    client: AcasClient, standin: StandinServer
) -> None:
    sid = await running(client)
    standin.state.add_fault(operation=DELETE, status=500, code="InternalFailure")
    with pytest.raises(AcasServerError) as info:
        await client.delete_sandbox(sid)
    assert standin.state.calls[DELETE] == 1  # 500 is not retried
    failure = disposal_failure(info.value, "acas-test")
    assert failure.code is DisposalCode.UNKNOWN
    assert "InternalFailure" in failure.detail and "500" in failure.detail
    assert_clean(info.value, standin)


async def test_expired_token_is_refused(client: AcasClient, standin: StandinServer) -> None:
    sid = await running(client)
    standin.state.expired_tokens.add(SECRET_TOKEN)
    with pytest.raises(AcasAuthError) as info:
        await client.get_sandbox(sid)
    assert info.value.status == 401
    assert info.value.code == "ExpiredAuthenticationToken"
    assert standin.state.calls[GET] == 1 + 2  # idempotent: one retry with a fresh token
    assert disposal_code(info.value) is DisposalCode.REFUSED
    assert_clean(info.value, standin)
    before = standin.state.calls[EXEC]
    with pytest.raises(AcasAuthError):
        await client.execute_command(sid, ["true"])
    assert standin.state.calls[EXEC] - before == 1


async def test_forbidden_is_refused(client: AcasClient, standin: StandinServer) -> None:
    sid = await running(client)
    standin.state.add_fault(operation=DELETE, status=403, code="AuthorizationFailed")
    with pytest.raises(AcasAuthError) as info:
        await client.delete_sandbox(sid)
    assert disposal_failure(info.value, "acas-test").code is DisposalCode.REFUSED


async def test_slow_response_is_a_timeout(client: AcasClient, standin: StandinServer) -> None:
    sid = await running(client)
    standin.state.add_fault(operation=GET, delay=3.0)
    with pytest.raises(AcasTimeout) as info:
        await client.get_sandbox(sid)
    assert disposal_code(info.value) is DisposalCode.TIMEOUT
    assert_clean(info.value, standin)


async def test_delete_that_leaves_the_sandbox_listed(
    client: AcasClient, standin: StandinServer
) -> None:
    sid = await running(client, {"k": "v"})
    standin.state.delete_leaves_listed = True
    with pytest.raises(AcasStillPresent) as info:
        await client.delete_and_wait(sid, within=0.2)
    assert disposal_code(info.value) is DisposalCode.TIMEOUT
    assert [s.id for s in await client.list_sandboxes({"k": "v"})] == [sid]


async def test_unreachable(sleeps: SleepRecorder) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = make_config(f"http://127.0.0.1:{port}")
    async with AcasClient(config, StaticTokenProvider(SECRET_TOKEN), sleep=sleeps) as client:
        with pytest.raises(AcasUnreachable) as info:
            await client.get_sandbox("x")
        assert info.value.attempts == 4 and len(sleeps.delays) == 3
        assert disposal_code(info.value) is DisposalCode.UNREACHABLE
        assert SECRET_TOKEN not in str(info.value) and str(port) not in str(info.value)
        sleeps.delays.clear()
        with pytest.raises(AcasUnreachable):
            await client.execute_command("x", ["true"])
        assert sleeps.delays == []


@pytest.mark.parametrize(
    ("error", "expected", "retried"),
    [
        (httpx.ConnectError, AcasUnreachable, True),
        (httpx.ConnectTimeout, AcasUnreachable, True),
        (httpx.RemoteProtocolError, AcasUnreachable, True),
        (httpx.ReadError, AcasUnreachable, True),
        (httpx.ReadTimeout, AcasTimeout, False),
        (httpx.PoolTimeout, AcasTimeout, False),
    ],
)
async def test_transport_errors(
    error: type[httpx.TransportError],
    expected: type[AcasError],
    retried: bool,
    sleeps: SleepRecorder,
) -> None:
    """Connection failures and broken exchanges are retried (idempotent calls only) and end
    unreachable; a timeout once under way is never re-sent."""
    sent: list[str] = []

    def fail(request: httpx.Request) -> httpx.Response:
        sent.append(request.method)
        raise error("boom", request=request)

    config = make_config("https://acas.invalid")
    transport = httpx.MockTransport(fail)
    async with AcasClient(
        config, StaticTokenProvider(SECRET_TOKEN), sleep=sleeps, transport=transport
    ) as client:
        with pytest.raises(expected) as info:
            await client.get_sandbox("x")
        attempts = 4 if retried else 1
        assert info.value.attempts == attempts and len(sent) == attempts
        assert len(sleeps.delays) == attempts - 1
        sent.clear()
        with pytest.raises(expected) as info:
            await client.execute_command("x", ["true"])
        assert info.value.attempts == 1 and len(sent) == 1


def test_unlisted_maps_to_unlisted() -> None:
    error = AcasNotListed(LIST, what="sandbox missing from its labels listing")
    assert disposal_failure(error, "acas-test").code is DisposalCode.UNLISTED


# -- no secrets ----------


async def test_service_text_is_scrubbed(client: AcasClient, standin: StandinServer) -> None:
    sid = await running(client)
    leak = {
        "error": {
            "code": "Leaky",
            "message": f"failed calling {standin.base_url}/x with Bearer {SECRET_TOKEN} "
            "token eyJhbGciOi.eyJzdWIiOi.c2lnbmF0dXJl",
        }
    }
    standin.state.add_fault(operation=GET, status=400, body=leak)
    with pytest.raises(AcasError) as info:
        await client.get_sandbox(sid)
    assert info.value.code == "Leaky"
    assert "eyJ" not in info.value.service_message
    assert_clean(info.value, standin)


async def test_logs_carry_no_token_or_endpoint(
    standin: StandinServer, sleeps: SleepRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with AcasClient(
        make_config(standin.base_url), StaticTokenProvider(SECRET_TOKEN), sleep=sleeps
    ) as client:
        sid = await running(client)
        standin.state.add_fault(operation=GET, status=429, retry_after="0")
        await client.get_sandbox(sid)
        standin.state.add_fault(operation=GET, status=500)
        with pytest.raises(AcasServerError):
            await client.get_sandbox(sid)
        await client.execute_command(sid, ["true"])
    assert any("[endpoint]" in r.getMessage() for r in caplog.records), "httpx logs redacted"
    for record in caplog.records:
        text = record.getMessage()
        assert SECRET_TOKEN not in text
        assert f"127.0.0.1:{standin.port}" not in text, text
        assert "/subscriptions/" not in text, text
    assert repr(StaticTokenProvider(SECRET_TOKEN)).count(SECRET_TOKEN) == 0
    assert SECRET_TOKEN not in repr(client)


def test_error_for_status_shapes() -> None:
    problem = b'{"type":"t","title":"Not Found","status":404,"detail":"Sandbox x not found"}'
    error = error_for_status(GET, 404, problem)
    assert isinstance(error, AcasNotFound) and error.code == "Not Found"
    assert error_for_status(GET, 503, b"").code is None
    assert error_for_status(GET, 418, b"teapot").service_message == "teapot"


def test_parse_retry_after() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0


def test_config_errors_do_not_echo_the_endpoint() -> None:
    with pytest.raises(ValueError) as info:
        make_config("http://internal.example.com:8443/path")
    assert "internal.example.com" not in str(info.value)
