"""What the ``host_tools`` suite runs and reads: the guest programs' texts, the suite's own tools
and registry, and the checks on what a run reports (its RESULT and ACK lines, its call records).

Kept apart from :mod:`sandbox_operator.conformance.host_tools` so that module reads as the list of
probes; nothing here talks to a sandbox.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from typing import Any

from sandbox_operator.client.hosttools import (
    Delivery,
    HostToolCallRecord,
    HostToolRegistry,
    HostToolsWarning,
    host_tool,
)
from sandbox_operator.client.hosttools.channel import RUN_CAPABILITIES, HostToolRunResult
from sandbox_operator.conformance._probe import ProbeFailed, check

#: What the suite's spec must require.
REQUIRED = RUN_CAPABILITIES

#: A value that exercises JSON end to end: non-ASCII in keys and values, escapes, NUL, line and
#: paragraph separators, deep nesting, every JSON type, large and negative numbers.
PAYLOAD: dict[str, object] = {
    "text": "héllo wörld ✓ 🎉 — ünïcode, 中文, עברית",
    "escapes": 'quote" back\\slash /slash\ttab\nnewline\r\x00nul\x1bescape\u2028\u2029',
    "ключ из слов": "value",
    "numbers": [0, -1, 2**62, -(2**62), 3.5, -0.25, 1e300, 1.5e-300],
    "literals": [True, False, None, "", [], {}],
    "nested": {"a": [{"b": [{"c": [[["deep"]]]}]}], "empty": {"list": [], "object": {}}},
}

#: The guest side every probe's program starts with: the shim and a way to report an outcome.
PRELUDE = """\
import json, os, sys
import sandbox_host_tools as host


def attempt(fn):
    try:
        return {"ok": fn()}
    except host.HostToolError as exc:
        return {"refused": type(exc).__name__}
    except Exception as exc:
        return {"raised": type(exc).__name__}


def report(value):
    sys.stdout.write("RESULT " + json.dumps(value) + "\\n")
    sys.stdout.flush()
"""

#: A module planted in ``work/`` under the shim's name: imported instead of the shim, it answers
#: every tool with a forgery.
FORGED_SHIM = """\
class HostToolError(Exception):
    pass


def call(tool, /, **arguments):
    return "FORGED"


def echo(**arguments):
    return "FORGED"
"""

#: Modules the shim imports that live on disk (``os`` and ``time`` are built in or frozen): one
#: of these in ``work/`` would run in the program before the shim does anything.
SHADOWED_DEPENDENCIES = ("json", "threading")


class Host:
    """The host side of the suite's tools: counts what each body actually did."""

    def __init__(self) -> None:
        self.executed: Counter[str] = Counter()


def registry_for(host: Host, *, max_calls: int) -> HostToolRegistry:
    registry = HostToolRegistry(max_calls_per_run=max_calls)

    @host_tool(source=None, sink=None, identity=None)
    def echo(value: Any) -> Any:
        host.executed["echo"] += 1
        return value

    @host_tool(source=None, sink="conformance-counter", identity=None)
    def commit(n: int) -> int:
        host.executed["commit"] += 1
        return n + 1

    @host_tool(source="conformance-generator", sink=None, identity=None)
    def blob(size: int) -> str:
        host.executed["blob"] += 1
        return "x" * size

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostToolsWarning)
        for fn in (echo, commit, blob):
            registry.register(fn)
    return registry


def reported(stdout: bytes) -> Any:
    """The value the program passed to ``report`` (its last RESULT line)."""
    lines = [
        ln for ln in stdout.decode("utf-8", "replace").splitlines() if ln.startswith("RESULT ")
    ]
    if not lines:
        raise ProbeFailed(f"the program reported nothing (stdout {stdout[-300:]!r})")
    return json.loads(lines[-1][len("RESULT ") :])


def acks(stdout: bytes) -> set[int]:
    """Sequences the guest says it received an answer for (``ACK <n>`` lines)."""
    text = stdout.decode("utf-8", "replace")
    return {int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("ACK ")}


def expect_record(
    records: tuple[HostToolCallRecord, ...] | HostToolCallRecord,
    sequence: int,
    tool: str,
    refusal: str | None = None,
    *,
    ran: bool,
    delivery: Delivery = Delivery.DELIVERED,
) -> None:
    """Call ``sequence`` (found in ``records``, or the record itself) was of ``tool``, refused
    with ``refusal`` (or not), executed and completed (``ran``) or neither, and ``delivery``."""
    if isinstance(records, HostToolCallRecord):
        records = (records,)
    record = next((r for r in records if r.sequence == sequence), None)
    if record is None:
        raise ProbeFailed(f"no record of call {sequence} (records: {records})")
    got = (record.tool, record.refusal, record.executed, record.completed, record.delivery)
    want = (tool, refusal, ran, ran, delivery)
    check(got == want, f"call {record.sequence}: record {got}, expected {want}")
    if delivery is Delivery.DELIVERED:
        check(record.response_bytes > 0, f"call {record.sequence}: delivered 0 bytes")
    else:
        check(record.response_bytes == 0, f"call {record.sequence}: undelivered but bytes")


def no_overclaim(records: tuple[HostToolCallRecord, ...], acks: set[int]) -> None:
    """Every answer a record calls delivered was received by the guest."""
    claimed = {r.sequence for r in records if r.delivery is Delivery.DELIVERED}
    missing = sorted(claimed - acks)
    check(
        not missing,
        f"records say calls {missing} were delivered; the guest never received them",
    )


def ran_ok(result: HostToolRunResult) -> None:
    """The program exited 0 (else its stderr's tail is the failure)."""
    check(
        result.exit_code == 0,
        f"program exited {result.exit_code}: {result.stderr_text[-400:]}",
    )
