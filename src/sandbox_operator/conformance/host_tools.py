"""The ``host_tools`` conformance suite: a sandbox serves host tools through the client's channel.

The channel (:mod:`sandbox_operator.client.hosttools.channel`) is built on nothing but ``exec``,
``files_in`` and ``files_out``, so whether a backend can serve host tools is a question about
those primitives holding up under the channel's use of them: a detached launcher that outlives the
exec that started it, a response written exactly where the guest waits for it (or an honest
failure), a removal that removes, a signal that reaches the program's session. The suite builds
its own registry of three small tools, runs Python programs in the sandbox through the real
channel and holds each run to the contract:

- a round trip returns the tool's answer unchanged (unicode, nested JSON);
- an unregistered tool, bad arguments and an exhausted cap are refused with their type in the
  guest, the refused tool never runs, and refusals count toward the cap;
- an oversized response is refused and recorded as executed and completed;
- the transport files are gone after the run (checked with ``test -e``, not taken on trust);
- the program's working directory is the run's ``work/`` and files placed there (by the caller,
  or by anything else that writes the work dir) cannot replace the shim or what it imports;
- a program that overruns is signalled, reported with a signal outcome, and it and the child it
  started in its session are gone;
- records never claim a delivery that did not happen: every ``delivered`` answer was received by
  the guest, and an answer that could not be written back is ``delivery_uncertain`` with the
  effect recorded and nothing re-run.

The spec must require ``exec``, ``files_in``, ``files_out`` and ``host_tools``, and the image
must have ``python3``. Like the other suites: every probe is named and runs, a wrong exception
type is a failure, ``check_host_tools`` returns a :class:`ConformanceReport` and
``assert_host_tools_conformance`` raises one :class:`ConformanceError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import warnings
from collections import Counter
from collections.abc import Mapping
from typing import Any

from sandbox_operator.client.errors import CapabilityNotRequired
from sandbox_operator.client.hosttools import (
    Delivery,
    HostToolCallRecord,
    HostToolRegistry,
    HostToolRun,
    HostToolsWarning,
    host_tool,
)
from sandbox_operator.client.hosttools.channel import (
    SHIM_FILE,
    GuestRunLayout,
    HostToolRunResult,
    guest_run_layout,
    reclaim_run,
    run_with_host_tools,
)
from sandbox_operator.client.hosttools.errors import (
    HostToolDeliveryUncertain,
    HostToolFileNameReserved,
    HostToolRunTimeout,
    SignalOutcome,
)
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.conformance._probe import (
    Area,
    ConformanceReport,
    ProbeFailed,
    Probes,
    check,
    expect_raises,
    q,
)
from sandbox_operator.contract import Capability

#: What the suite's spec must require.
REQUIRED = (Capability.EXEC, Capability.FILES_IN, Capability.FILES_OUT, Capability.HOST_TOOLS)

#: A value that exercises JSON end to end: non-ASCII in keys and values, escapes, NUL, line and
#: paragraph separators, deep nesting, every JSON type, large and negative numbers.
PAYLOAD: dict[str, Any] = {
    "text": "héllo wörld ✓ 🎉 — ünïcode, 中文, עברית",
    "escapes": 'quote" back\\slash /slash\ttab\nnewline\r\x00nul\x1bescape\u2028\u2029',
    "ключ из слов": "value",
    "numbers": [0, -1, 2**62, -(2**62), 3.5, -0.25, 1e300, 1.5e-300],
    "literals": [True, False, None, "", [], {}],
    "nested": {"a": [{"b": [{"c": [[["deep"]]]}]}], "empty": {"list": [], "object": {}}},
}

#: The guest side every probe's program starts with: the shim and a way to report an outcome.
_PRELUDE = """\
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
_FORGED_SHIM = """\
class HostToolError(Exception):
    pass


def call(tool, /, **arguments):
    return "FORGED"


def echo(**arguments):
    return "FORGED"
"""

#: Modules the shim imports that live on disk (``os`` and ``time`` are built in or frozen): one
#: of these in ``work/`` would run in the program before the shim does anything.
_SHADOWED_DEPENDENCIES = ("json", "threading")


class _Host:
    """The host side of the suite's tools: counts what each body actually did."""

    def __init__(self) -> None:
        self.executed: Counter[str] = Counter()


def _registry(host: _Host, *, max_calls: int) -> HostToolRegistry:
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


def _reported(stdout: bytes) -> Any:
    """The value the program passed to ``report`` (its last RESULT line)."""
    lines = [
        ln for ln in stdout.decode("utf-8", "replace").splitlines() if ln.startswith("RESULT ")
    ]
    if not lines:
        raise ProbeFailed(f"the program reported nothing (stdout {stdout[-300:]!r})")
    return json.loads(lines[-1][len("RESULT ") :])


def _acks(stdout: bytes) -> set[int]:
    """Sequences the guest says it received an answer for (``ACK <n>`` lines)."""
    text = stdout.decode("utf-8", "replace")
    return {int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("ACK ")}


def _record(records: tuple[HostToolCallRecord, ...], sequence: int) -> HostToolCallRecord:
    for record in records:
        if record.sequence == sequence:
            return record
    raise ProbeFailed(f"no record of call {sequence} (records: {records})")


def _expect_record(
    record: HostToolCallRecord,
    *,
    tool: str,
    refusal: str | None,
    executed: bool,
    completed: bool,
    delivery: Delivery = Delivery.DELIVERED,
) -> None:
    got = (record.tool, record.refusal, record.executed, record.completed, record.delivery)
    want = (tool, refusal, executed, completed, delivery)
    check(got == want, f"call {record.sequence}: record {got}, expected {want}")
    if delivery is Delivery.DELIVERED:
        check(record.response_bytes > 0, f"call {record.sequence}: delivered 0 bytes")
    else:
        check(record.response_bytes == 0, f"call {record.sequence}: undelivered but bytes")


def _no_overclaim(records: tuple[HostToolCallRecord, ...], acks: set[int]) -> None:
    """Every answer a record calls delivered was received by the guest."""
    claimed = {r.sequence for r in records if r.delivery is Delivery.DELIVERED}
    missing = sorted(claimed - acks)
    check(
        not missing,
        f"records say calls {missing} were delivered; the guest never received them",
    )


def _ok(result: HostToolRunResult) -> None:
    check(
        result.exit_code == 0,
        f"program exited {result.exit_code}: {result.stderr_text[-400:]}",
    )


async def _exists(sandbox: Sandbox, absolute: str) -> bool:
    res = await sandbox.exec(["sh", "-c", 'test -e "$1" || test -L "$1"', "sh", absolute], cwd="/")
    return res.exit_code == 0


async def _running(sandbox: Sandbox, pids: list[int]) -> list[int]:
    """Which of ``pids`` are still alive (zombies count as gone)."""
    script = (
        'for p in "$@"; do kill -0 "$p" 2>/dev/null && '
        "! grep -q '^State:.*Z' /proc/$p/status 2>/dev/null && echo \"$p\"; done; true"
    )
    res = await sandbox.exec(["sh", "-c", script, "sh", *map(str, pids)], cwd="/")
    return [int(p) for p in res.stdout_text.split()]


async def check_host_tools(
    sandbox: Sandbox,
    *,
    run_timeout: float = 60.0,
    overrun_timeout: float = 6.0,
) -> ConformanceReport:
    """Run every ``host_tools`` probe (see the module docstring). ``run_timeout`` bounds each run
    that should finish; ``overrun_timeout`` is the timeout of the run that must overrun it."""
    probes = Probes("host_tools")
    missing = [c.value for c in REQUIRED if c not in sandbox.required]
    if missing:
        channel_missing = [
            c
            for c in (Capability.EXEC, Capability.FILES_IN, Capability.FILES_OUT)
            if c not in sandbox.required
        ]
        if channel_missing:
            host = _Host()
            run = _registry(host, max_calls=4).start_run(
                limits_in=sandbox.spec.files_in, limits_out=sandbox.spec.files_out
            )

            async def refused() -> None:
                await expect_raises(
                    CapabilityNotRequired,
                    run_with_host_tools(sandbox, "pass", run, timeout=run_timeout),
                    "a host-tool run without the channel's capabilities",
                    capability=channel_missing[0].value,
                )

            await probes.run("run_refused_without_capability", refused)
        probes.skip(f"all (spec does not require {', '.join(missing)})")
        return probes.done()

    host = _Host()
    registry = _registry(host, max_calls=32)
    capped = _registry(host, max_calls=3)
    layouts: list[GuestRunLayout] = []

    def start(reg: HostToolRegistry = registry, **limits: Any) -> HostToolRun:
        limits_in = sandbox.spec.files_in.model_copy(update=limits)
        return reg.start_run(limits_in=limits_in, limits_out=sandbox.spec.files_out)

    async def execute(
        body: str,
        run: HostToolRun,
        *,
        files: Mapping[str, bytes | str] | None = None,
        layout: GuestRunLayout | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> HostToolRunResult:
        layout = layout or guest_run_layout(sandbox)
        layouts.append(layout)
        return await run_with_host_tools(
            sandbox,
            _PRELUDE + body,
            run,
            files=files,
            layout=layout,
            timeout=timeout or run_timeout,
        )

    async with probes.guard(), Area(sandbox, "hosttools") as area:

        async def round_trip_exact() -> None:
            run = start()
            expected = json.dumps(PAYLOAD, ensure_ascii=False, sort_keys=True)
            body = (
                f"expected = json.loads({expected!r})\n"
                "got = host.echo(value=expected)\n"
                'print("ACK 1", flush=True)\n'
                "report({'equal': got == expected,"
                " 'dump': json.dumps(got, ensure_ascii=False, sort_keys=True),"
                " 'via_call': host.call('echo', value='second') == 'second'})\n"
                'print("ACK 2", flush=True)\n'
            )
            before = host.executed["echo"]
            result = await execute(body, run)
            _ok(result)
            verdict = _reported(result.stdout)
            check(verdict["dump"] == expected, f"answer differs: {verdict['dump'][:300]!r}")
            check(verdict["equal"] is True, "the decoded answer is not equal to the value sent")
            check(verdict["via_call"] is True, "host.call('echo', ...) answered differently")
            check(host.executed["echo"] - before == 2, "echo ran other than twice")
            check(len(result.records) == 2, f"{len(result.records)} records for 2 calls")
            for sequence in (1, 2):
                _expect_record(
                    _record(result.records, sequence),
                    tool="echo",
                    refusal=None,
                    executed=True,
                    completed=True,
                )
            _no_overclaim(result.records, _acks(result.stdout))

        async def unregistered_tool_refused() -> None:
            run = start()
            body = (
                "report([attempt(lambda: host.call('no_such_tool', x=1)),"
                " attempt(lambda: host.call('../echo', value=1))])\n"
            )
            result = await execute(body, run)
            _ok(result)
            got = _reported(result.stdout)
            want = [{"refused": "HostToolNotRegistered"}] * 2
            check(got == want, f"guest saw {got}, expected {want}")
            for sequence in (1, 2):
                _expect_record(
                    _record(result.records, sequence),
                    tool=("no_such_tool", "../echo")[sequence - 1],
                    refusal="HostToolNotRegistered",
                    executed=False,
                    completed=False,
                )

        async def bad_arguments_refused_not_executed() -> None:
            run = start()
            body = (
                "report([attempt(lambda: host.commit(n='seven')),"
                " attempt(lambda: host.commit(n=1, extra=2)),"
                " attempt(lambda: host.commit()),"
                " attempt(lambda: host.commit(n=[1]))])\n"
            )
            before = host.executed["commit"]
            result = await execute(body, run)
            _ok(result)
            got = _reported(result.stdout)
            want = [{"refused": "HostToolArgumentsInvalid"}] * 4
            check(got == want, f"guest saw {got}, expected {want}")
            check(host.executed["commit"] == before, "the tool ran on invalid arguments")
            for record in result.records:
                _expect_record(
                    record,
                    tool="commit",
                    refusal="HostToolArgumentsInvalid",
                    executed=False,
                    completed=False,
                )

        async def cap_counts_refusals() -> None:
            run = start(capped)
            body = (
                "report([attempt(lambda: host.call('no_such_tool')),"
                " attempt(lambda: host.commit(n='x')),"
                " attempt(lambda: host.commit(n=1)),"
                " attempt(lambda: host.commit(n=2))])\n"
            )
            before = host.executed["commit"]
            result = await execute(body, run)
            _ok(result)
            got = _reported(result.stdout)
            want = [
                {"refused": "HostToolNotRegistered"},
                {"refused": "HostToolArgumentsInvalid"},
                {"ok": 2},
                {"refused": "HostToolCallCapExceeded"},
            ]
            check(got == want, f"guest saw {got}, expected {want}")
            check(host.executed["commit"] - before == 1, "commit ran other than once")
            check(run.calls_made == 3, f"calls_made {run.calls_made}, expected the cap (3)")
            _expect_record(
                _record(result.records, 4),
                tool="commit",
                refusal="HostToolCallCapExceeded",
                executed=False,
                completed=False,
            )

        async def oversized_response_refused() -> None:
            run = start(max_bytes_per_file=4096)
            body = (
                "report([attempt(lambda: host.blob(size=100000)),"
                " attempt(lambda: host.blob(size=10))])\n"
            )
            before = host.executed["blob"]
            result = await execute(body, run)
            _ok(result)
            got = _reported(result.stdout)
            want = [{"refused": "HostToolResponseTooLarge"}, {"ok": "x" * 10}]
            check(got == want, f"guest saw {str(got)[:300]}, expected {want}")
            check(host.executed["blob"] - before == 2, "blob ran other than twice")
            _expect_record(
                _record(result.records, 1),
                tool="blob",
                refusal="HostToolResponseTooLarge",
                executed=True,
                completed=True,
            )

        async def transport_removed() -> None:
            run = start()
            result = await execute("report(host.echo(value='bye'))\n", run)
            _ok(result)
            check(_reported(result.stdout) == "bye", "wrong answer")
            layout = result.layout
            check(result.transport_removed is True, "the channel reports the transport kept")
            check(
                not await _exists(sandbox, layout.transport_path),
                "the transport directory is still there after the run",
            )
            check(await _exists(sandbox, layout.work_path), "work/ is gone before collection")
            check(await reclaim_run(sandbox, layout) is True, "reclaim_run reports failure")
            check(not await _exists(sandbox, layout.root_path), "the run directory is still there")

        async def cwd_is_work_dir() -> None:
            run = start()
            body = (
                "report({'cwd': os.getcwd(),"
                " 'data': open('data/in.txt', encoding='utf-8').read(),"
                " 'echo': host.echo(value='here')})\n"
            )
            result = await execute(body, run, files={"data/in.txt": "hello ✓"})
            _ok(result)
            got = _reported(result.stdout)
            layout = result.layout
            check(got["echo"] == "here", f"echo answered {got['echo']!r}")
            check(got["data"] == "hello ✓", f"the caller's file reads {got['data']!r}")
            res = await sandbox.exec(
                ["sh", "-c", 'cd "$1" && pwd -P', "sh", layout.work_path], cwd="/"
            )
            check(
                got["cwd"] == res.stdout_text.strip(),
                f"cwd {got['cwd']!r}, expected the run's work dir {layout.work_path!r}",
            )

        async def model_files_cannot_shadow_shim() -> None:
            # Through `files`: the shim's name is the channel's own.
            await expect_raises(
                HostToolFileNameReserved,
                execute("report(1)\n", start(), files={SHIM_FILE: _FORGED_SHIM}),
                "a run file named like the shim",
            )
            # Placed in work/ by other means (a write, an earlier program), together with
            # modules the shim imports: the program must still import the real ones.
            layout = guest_run_layout(sandbox)
            await sandbox.write_file(f"{layout.work}/{SHIM_FILE}", _FORGED_SHIM)
            shadows = {
                f"{name}.py": f"raise ImportError('work/{name}.py was imported')\n"
                for name in _SHADOWED_DEPENDENCIES
            }
            body = (
                "report({'shim': os.path.dirname(os.path.realpath(host.__file__)),"
                " 'echo': host.echo(value='real')})\n"
            )
            before = host.executed["echo"]
            result = await execute(body, start(), files=shadows, layout=layout)
            _ok(result)
            got = _reported(result.stdout)
            check(got["echo"] == "real", f"the program's echo answered {got['echo']!r}")
            check(host.executed["echo"] - before == 1, "the host never served the call")
            check(
                not got["shim"].startswith(layout.work_path) and got["shim"].endswith("transport"),
                f"the shim was imported from {got['shim']!r}",
            )

        async def overrun_signalled() -> None:
            pids = area.absolute("overrun-pids")
            body = (
                "import subprocess, time\n"
                "child = subprocess.Popen(['sleep', '90'])\n"
                f"with open({pids!r}, 'w') as fh:\n"
                "    fh.write('%d %d %d\\n' % (os.getppid(), os.getpid(), child.pid))\n"
                "print('started', flush=True)\n"
                "time.sleep(90)\n"
            )
            layout = guest_run_layout(sandbox)
            start_time = time.monotonic()
            exc = await expect_raises(
                HostToolRunTimeout,
                execute(body, start(), layout=layout, timeout=overrun_timeout),
                "a program past its timeout",
            )
            elapsed = time.monotonic() - start_time
            assert isinstance(exc, HostToolRunTimeout)
            check(
                elapsed < overrun_timeout + 30,
                f"took {elapsed:.1f}s for a {overrun_timeout}s timeout",
            )
            check(isinstance(exc.signal, SignalOutcome), f"signal outcome {exc.signal!r}")
            check(exc.signal is not SignalOutcome.NOT_SENT, "no signal was sent")
            check(b"started" in exc.stdout, f"partial stdout {exc.stdout[:200]!r}")
            check(exc.transport_removed is True, "transport not removed after the overrun")
            check(
                not await _exists(sandbox, layout.transport_path),
                "the transport directory is still there after the overrun",
            )
            res = await sandbox.exec(["cat", pids], cwd="/")
            check(res.exit_code == 0, "the program never wrote its pids")
            started = [int(p) for p in res.stdout_text.split()]
            alive = started
            for _ in range(20):
                alive = await _running(sandbox, started)
                if not alive:
                    return
                await asyncio.sleep(0.5)
            raise ProbeFailed(
                f"still running after the signal ({exc.signal.value}): {alive} of "
                f"launcher/program/child {started}"
            )

        async def delivery_uncertain_when_cut() -> None:
            # A response path the guest cut (its response name taken by a directory): the tool
            # ran and completed, the answer could not be written, and the record says so.
            body = (
                "os.mkdir(os.path.join(os.path.dirname(host.__file__), 'calls', '1.resp'))\n"
                "report(attempt(lambda: host.commit(n=41)))\n"
            )
            before = host.executed["commit"]
            run = start()
            layout = guest_run_layout(sandbox)
            exc = await expect_raises(
                HostToolDeliveryUncertain,
                execute(body, run, layout=layout),
                "an answer that could not be written back",
            )
            assert isinstance(exc, HostToolDeliveryUncertain)
            check(host.executed["commit"] - before == 1, "the tool ran other than once")
            _expect_record(
                exc.record,
                tool="commit",
                refusal=None,
                executed=True,
                completed=True,
                delivery=Delivery.UNCERTAIN,
            )
            check(len(run.records) == 1, f"{len(run.records)} records for one call")
            check(run.answered(1), "the call is not marked answered (it could be re-run)")
            await asyncio.sleep(0.5)
            check(host.executed["commit"] - before == 1, "the call was re-run")
            check(
                exc.transport_removed is True and not await _exists(sandbox, layout.transport_path),
                "transport left behind after the failed delivery",
            )

        async def delivered_means_received() -> None:
            # Answers the records call delivered: the guest must have received each of them.
            body = "".join(
                f"host.echo(value={i})\nprint('ACK {i}', flush=True)\n" for i in (1, 2, 3)
            )
            try:
                result = await execute(body, start(), timeout=min(run_timeout, 30.0))
            except HostToolRunTimeout as timed_out:
                _no_overclaim(timed_out.records, _acks(timed_out.stdout))
                raise
            _ok(result)
            _no_overclaim(result.records, _acks(result.stdout))
            check(len(result.records) == 3, f"{len(result.records)} records for 3 calls")

        await probes.run("round_trip_exact", round_trip_exact)
        await probes.run("unregistered_tool_refused", unregistered_tool_refused)
        await probes.run("bad_arguments_refused_not_executed", bad_arguments_refused_not_executed)
        await probes.run("cap_counts_refusals", cap_counts_refusals)
        await probes.run("oversized_response_refused", oversized_response_refused)
        await probes.run("transport_removed", transport_removed)
        await probes.run("cwd_is_work_dir", cwd_is_work_dir)
        await probes.run("model_files_cannot_shadow_shim", model_files_cannot_shadow_shim)
        await probes.run("overrun_signalled", overrun_signalled)
        await probes.run("delivery_uncertain_when_cut", delivery_uncertain_when_cut)
        await probes.run("delivered_means_received", delivered_means_received)

        for layout in layouts:
            with contextlib.suppress(Exception):
                await reclaim_run(sandbox, layout)
        with contextlib.suppress(Exception):
            await sandbox.exec(
                ["sh", "-c", f"rmdir {q(sandbox.work_dir)}/.host-tools 2>/dev/null; true"],
                cwd="/",
            )
    return probes.done()


async def assert_host_tools_conformance(
    sandbox: Sandbox, *, run_timeout: float = 60.0, overrun_timeout: float = 6.0
) -> None:
    report = await check_host_tools(
        sandbox, run_timeout=run_timeout, overrun_timeout=overrun_timeout
    )
    report.raise_for_failures()
