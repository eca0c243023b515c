"""The host-tool contract: declarations, the registry's gates, one run's door and its records."""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox_operator.client.hosttools import (
    Delivery,
    HostToolArgumentsInvalid,
    HostToolCallCapExceeded,
    HostToolFailed,
    HostToolIdentityNotAllowed,
    HostToolNameInvalid,
    HostToolNotRegistered,
    HostToolRegistry,
    HostToolRegistrySealed,
    HostToolRequestInvalid,
    HostToolRequestTooLarge,
    HostToolResponseTooLarge,
    HostToolResultInvalid,
    HostToolRun,
    HostToolSignatureInvalid,
    HostToolsWarning,
    HostToolUndeclared,
    Identity,
    UserIdentityUnavailable,
    host_tool,
)
from sandbox_operator.client.hosttools.registry import request_depth
from sandbox_operator.client.observer import HostToolCalled, SandboxObserver
from sandbox_operator.contract import SandboxKey, TransferLimits

LIMITS = TransferLimits(max_bytes_per_file=4096, max_total_bytes=8192, max_files=4)
KEY = SandboxKey(scope="s", thread_id="t", agent_dir="a", call_id="")


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostToolsWarning)
        yield


@host_tool(source="orders-db", sink=None, identity=Identity.APP)
def lookup(order: int, detail: bool = False) -> dict[str, Any]:
    return {"order": order, "detail": detail, "text": "héllo ✓"}


def undeclared(x: int) -> int:
    return x


class Recorder(SandboxObserver):
    def __init__(self) -> None:
        self.events: list[HostToolCalled] = []

    def host_tool_called(self, event: HostToolCalled) -> None:
        self.events.append(event)


def run_of(registry: HostToolRegistry, **kw: Any) -> HostToolRun:
    return registry.start_run(
        limits_in=kw.pop("limits_in", LIMITS), limits_out=LIMITS, key=KEY, **kw
    )


def request(tool: str, **arguments: Any) -> bytes:
    return json.dumps({"tool": tool, "arguments": arguments}).encode()


def answer(payload: bytes) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(payload)
    return body


# -- registration ---------------------------------------------------------------------------


def test_registry_starts_empty_and_nothing_is_callable() -> None:
    registry = HostToolRegistry()
    assert registry.names == ()
    run = run_of(registry)
    with pytest.raises(HostToolNotRegistered):
        asyncio.run(run.call("lookup", {"order": 1}))


def test_undeclared_function_is_refused() -> None:
    with pytest.raises(HostToolUndeclared) as err:
        HostToolRegistry().register(undeclared)
    assert err.value.tool == "undeclared"


def test_every_leg_is_required() -> None:
    with pytest.raises(TypeError):
        host_tool(source=None, sink=None)  # type: ignore[call-arg]


def test_none_is_an_answer() -> None:
    @host_tool(source=None, sink=None, identity=None)
    def pure(x: int) -> int:
        return x

    assert HostToolRegistry().register(pure).declaration.identity is None


def test_user_identity_is_opt_in() -> None:
    @host_tool(source="mail", sink="mail", identity=Identity.USER)
    def send(to: str, user_identity: object) -> str:
        return to

    with pytest.raises(HostToolIdentityNotAllowed) as err:
        HostToolRegistry().register(send)
    assert err.value.identity == "user" and err.value.allowed == ("app",)
    opted = HostToolRegistry(allowed_identities=frozenset({Identity.APP, Identity.USER}))
    assert opted.register(send).name == "send"
    assert opted.aggregate().user_authority


def test_declaration_read_once_at_registration() -> None:
    @host_tool(source="a", sink=None, identity=Identity.APP)
    def tool(x: int) -> int:
        return x

    registry = HostToolRegistry()
    registered = registry.register(tool)
    tool.__sandbox_host_tool__ = None  # type: ignore[attr-defined]
    assert registry.aggregate().sources == frozenset({"a"})
    assert registered.declaration.source == "a"


def test_sealed_after_policy_derived() -> None:
    registry = HostToolRegistry()
    registry.register(lookup)
    run_of(registry)
    assert registry.sealed
    with pytest.raises(HostToolRegistrySealed):
        registry.register(lookup, name="again")


def test_names_and_signatures_checked() -> None:
    registry = HostToolRegistry()
    registry.register(lookup)
    with pytest.raises(HostToolNameInvalid):
        registry.register(lookup)
    with pytest.raises(HostToolNameInvalid):
        registry.register(lookup, name="not a name")

    @host_tool(source=None, sink=None, identity=None)
    def star(*args: int) -> int:
        return 0

    with pytest.raises(HostToolSignatureInvalid):
        registry.register(star)

    @host_tool(source=None, sink=None, identity=Identity.APP)
    def sneaky(user_identity: object) -> int:
        return 0

    with pytest.raises(HostToolSignatureInvalid):
        registry.register(sneaky)


def test_registering_warns_once() -> None:
    registry = HostToolRegistry()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        registry.register(lookup)
        registry.register(lookup, name="lookup2")
    assert [w.category for w in caught] == [HostToolsWarning]


# -- the door -------------------------------------------------------------------------------


async def test_round_trip_through_the_door() -> None:
    registry = HostToolRegistry()
    registry.register(lookup)
    run = run_of(registry)
    answered = await run.handle_request(1, request("lookup", order="7"))
    assert answer(answered.payload) == {
        "ok": True,
        "result": {"order": 7, "detail": False, "text": "héllo ✓"},
    }
    (record,) = run.records
    assert (record.executed, record.completed, record.delivery) == (True, True, Delivery.PENDING)
    run.delivered(1, len(answered.payload))
    assert run.records[0].delivery is Delivery.DELIVERED
    assert run.records[0].response_bytes == len(answered.payload)


async def test_arguments_validated_host_side_and_never_executed() -> None:
    calls: list[int] = []

    @host_tool(source=None, sink="counter", identity=Identity.APP)
    def bump(by: int) -> int:
        calls.append(by)
        return len(calls)

    registry = HostToolRegistry()
    registry.register(bump)
    run = run_of(registry)
    body = answer((await run.handle_request(1, request("bump", by="x", extra=1))).payload)
    assert body["ok"] is False and body["error"]["type"] == "HostToolArgumentsInvalid"
    assert "x" not in body["error"]["message"].split(":")[-1].replace("extra", "")
    assert calls == []
    with pytest.raises(HostToolArgumentsInvalid) as err:
        await run.call("bump", {"user_identity": "forged"})
    assert "user_identity" in err.value.fields and calls == []


async def test_malformed_requests_refused() -> None:
    registry = HostToolRegistry()
    registry.register(lookup)
    run = run_of(registry)
    for seq, raw in enumerate([b"not json", b"[1]", b'{"arguments": {}}'], start=1):
        body = answer((await run.handle_request(seq, raw)).payload)
        assert body["error"]["type"] == HostToolRequestInvalid.__name__
    body = answer((await run.handle_request(9, b'{"tool": "lookup", "arguments": 3}')).payload)
    assert body["error"]["type"] == HostToolArgumentsInvalid.__name__


async def test_a_deeply_nested_request_is_a_typed_refusal_with_a_record() -> None:
    """A request nested deeper than the parser can recurse (200 KB of brackets) is refused as
    invalid and recorded, never a RecursionError out of the door; brackets inside strings are
    data and do not count."""
    registry = HostToolRegistry()
    registry.register(lookup)
    big = TransferLimits(max_bytes_per_file=512 * 1024, max_total_bytes=1024 * 1024, max_files=4)
    run = registry.start_run(limits_in=big, limits_out=big, key=KEY)
    nested = b'{"tool": "lookup", "arguments": {"order": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    body = answer((await run.handle_request(1, nested)).payload)
    assert body["error"]["type"] == HostToolRequestInvalid.__name__
    assert "deeper than 32" in body["error"]["message"]
    record = run.records[0]
    assert (record.sequence, record.executed, record.refusal) == (
        1,
        False,
        "HostToolRequestInvalid",
    )
    # Brackets in a string are not nesting: the call is served (a top-level key beside
    # ``tool`` and ``arguments`` is ignored).
    text = json.dumps({"tool": "lookup", "arguments": {"order": 1, "detail": False}})
    padded = text[:-1] + ', "pad": "' + "[{" * 1000 + '"}'
    body = answer((await run.handle_request(2, padded.encode())).payload)
    assert body["ok"] is True
    assert [r.sequence for r in run.records] == [1, 2]


def test_request_depth_reads_brackets_outside_strings() -> None:
    assert request_depth(b"{}") == 1
    assert request_depth(b'{"a": [[1], {"b": [2]}]}') == 4
    assert request_depth(b'{"a": "' + b"[" * 100 + b'"}') == 1
    # A string holding an escaped quote ends where JSON says; the brackets after it are real.
    assert request_depth(b'{"a": "\\"", "b": ' + b"[" * 40) == 33  # counted up to the bound
    assert request_depth(b"[" * 32 + b"]" * 32 + b"[" * 20) == 32


async def test_the_request_cap_is_the_registrys_when_smaller_than_the_spec() -> None:
    """The door parses at most the registry's ``max_request_bytes`` (1 MiB by default), whatever
    ``filesOut`` allows; the refusal is answered and recorded."""
    big = TransferLimits(
        max_bytes_per_file=64 * 1024 * 1024, max_total_bytes=128 * 1024 * 1024, max_files=4
    )
    default = HostToolRegistry().start_run(limits_in=big, limits_out=big, key=KEY)
    assert default.max_request_bytes == 1024 * 1024
    registry = HostToolRegistry(max_request_bytes=100)
    registry.register(lookup)
    run = registry.start_run(limits_in=big, limits_out=big, key=KEY)
    assert run.max_request_bytes == 100
    body = answer(
        (await run.handle_request(1, request("lookup", order=1, detail=True) * 4)).payload
    )
    assert body["error"]["type"] == HostToolRequestTooLarge.__name__
    assert run.records[0].refusal == "HostToolRequestTooLarge"
    with pytest.raises(ValueError, match="max_request_bytes"):
        HostToolRegistry(max_request_bytes=0)


async def test_malformed_requests_count_toward_the_cap() -> None:
    """docs/host-tools.md: every request counts, the malformed ones included."""
    registry = HostToolRegistry(max_calls_per_run=2)
    registry.register(lookup)
    run = run_of(registry)
    for seq in (1, 2):
        body = answer((await run.handle_request(seq, b"not json")).payload)
        assert body["error"]["type"] == HostToolRequestInvalid.__name__
    body = answer((await run.handle_request(3, request("lookup", order=1))).payload)
    assert body["error"]["type"] == HostToolCallCapExceeded.__name__
    assert run.calls_made == 2
    assert [r.executed for r in run.records] == [False, False, False]


async def test_cap_counts_refusals() -> None:
    registry = HostToolRegistry(max_calls_per_run=2)
    registry.register(lookup)
    run = run_of(registry)
    with pytest.raises(HostToolNotRegistered):
        await run.call("missing", {})
    assert await run.call("lookup", {"order": 1})
    with pytest.raises(HostToolCallCapExceeded) as err:
        await run.call("lookup", {"order": 2})
    assert err.value.cap == 2
    assert [r.executed for r in run.records] == [False, True, False]


async def test_request_and_response_caps() -> None:
    @host_tool(source="blob", sink=None, identity=Identity.APP)
    def big(n: int) -> str:
        return "x" * n

    registry = HostToolRegistry()
    registry.register(big)
    run = run_of(registry)
    body = answer((await run.handle_request(1, b"{" + b" " * 5000 + b"}")).payload)
    assert body["error"]["type"] == HostToolRequestTooLarge.__name__
    with pytest.raises(HostToolResponseTooLarge) as err:
        await run.call("big", {"n": 5000})
    assert err.value.limit == 4096 and err.value.actual > 4096
    record = run.records[-1]
    assert (record.executed, record.completed, record.refusal) == (
        True,
        True,
        "HostToolResponseTooLarge",
    )


async def test_user_identity_served_only_through_minting() -> None:
    seen: list[object] = []

    @host_tool(source="mail", sink="mail", identity=Identity.USER)
    def send(to: str, user_identity: object) -> str:
        seen.append(user_identity)
        return to

    both = frozenset({Identity.APP, Identity.USER})
    unminted = HostToolRegistry(allowed_identities=both)
    unminted.register(send)
    with pytest.raises(UserIdentityUnavailable):
        await run_of(unminted).call("send", {"to": "a"})
    assert seen == []

    async def mint() -> object:
        return "token-for-run"

    minted = HostToolRegistry(allowed_identities=both, mint_user_identity=mint)
    minted.register(send)
    assert await run_of(minted).call("send", {"to": "b"}) == "b"
    assert seen == ["token-for-run"]

    async def broken() -> object:
        raise RuntimeError("secret endpoint https://idp.example")

    failing = HostToolRegistry(allowed_identities=both, mint_user_identity=broken)
    failing.register(send)
    with pytest.raises(UserIdentityUnavailable) as err:
        await run_of(failing).call("send", {"to": "c"})
    assert "example" not in str(err.value) and "RuntimeError" in str(err.value)


async def test_body_failure_and_unencodable_result() -> None:
    @host_tool(source=None, sink="db", identity=Identity.APP)
    async def boom() -> None:
        raise KeyError("password=hunter2")

    @host_tool(source=None, sink=None, identity=Identity.APP)
    def weird() -> object:
        return object()

    registry = HostToolRegistry()
    registry.register(boom)
    registry.register(weird)
    run = run_of(registry)
    body = answer((await run.handle_request(1, request("boom"))).payload)
    assert body["error"]["type"] == HostToolFailed.__name__
    assert "hunter2" not in body["error"]["message"]
    assert (run.records[0].executed, run.records[0].completed) == (True, False)
    with pytest.raises(HostToolResultInvalid):
        await run.call("weird", {})
    assert run.records[-1].completed


async def test_a_sequence_is_never_executed_twice() -> None:
    effects: list[int] = []

    @host_tool(source=None, sink="ledger", identity=Identity.APP)
    def commit(amount: int) -> int:
        effects.append(amount)
        return sum(effects)

    registry = HostToolRegistry()
    registry.register(commit)
    run = run_of(registry)
    first = await run.handle_request(1, request("commit", amount=5))
    run.delivery_failed(1)
    again = await run.handle_request(1, request("commit", amount=5))
    assert first.payload == again.payload and effects == [5]
    record = run.records[0]
    assert (record.completed, record.delivery, record.response_bytes) == (
        True,
        Delivery.UNCERTAIN,
        0,
    )
    assert run.answered(1) and not run.answered(2)


async def test_cancelled_body_is_uncertain() -> None:
    started = asyncio.Event()

    @host_tool(source=None, sink="ledger", identity=Identity.APP)
    async def slow() -> int:
        started.set()
        await asyncio.sleep(30)
        return 1

    registry = HostToolRegistry()
    registry.register(slow)
    run = run_of(registry)
    task = asyncio.ensure_future(run.handle_request(1, request("slow")))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    record = run.records[0]
    assert (record.executed, record.completed, record.delivery) == (
        True,
        False,
        Delivery.UNCERTAIN,
    )


async def test_observer_gets_one_event_per_settled_call() -> None:
    recorder = Recorder()
    registry = HostToolRegistry(observer=recorder)
    registry.register(lookup)
    run = registry.start_run(limits_in=LIMITS, limits_out=LIMITS, key=KEY, call="call-1")
    answered = await run.handle_request(1, request("lookup", order=1))
    assert recorder.events == []  # not settled yet
    run.delivered(1, len(answered.payload))
    with pytest.raises(HostToolNotRegistered):
        await run.call("nope", {})
    first, second = recorder.events
    assert (first.key, first.call, first.tool, first.source, first.identity) == (
        KEY,
        "call-1",
        "lookup",
        "orders-db",
        "app",
    )
    assert first.delivery == "delivered" and first.response_bytes == len(answered.payload)
    assert second.refusal == "HostToolNotRegistered" and not second.executed


async def test_observer_that_raises_changes_nothing() -> None:
    class Broken(SandboxObserver):
        def host_tool_called(self, event: HostToolCalled) -> None:
            raise RuntimeError("observer bug")

    registry = HostToolRegistry(observer=Broken())
    registry.register(lookup)
    run = run_of(registry)
    assert (await run.call("lookup", {"order": 3}))["order"] == 3
