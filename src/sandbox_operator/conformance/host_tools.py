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
from collections.abc import Mapping
from typing import Any

from sandbox_operator.client.errors import CapabilityNotRequired
from sandbox_operator.client.hosttools import Delivery, HostToolRegistry, HostToolRun
from sandbox_operator.client.hosttools.channel import (
    CHANNEL_CAPABILITIES,
    HostToolRunResult,
    reclaim_run,
    run_with_host_tools,
)
from sandbox_operator.client.hosttools.errors import (
    HostToolDeliveryUncertain,
    HostToolFileNameReserved,
    HostToolRunTimeout,
    SignalOutcome,
)
from sandbox_operator.client.hosttools.layout import SHIM_FILE, GuestRunLayout, guest_run_layout
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.conformance._host_tools_support import (
    FORGED_SHIM,
    PAYLOAD,
    PRELUDE,
    REQUIRED,
    SHADOWED_DEPENDENCIES,
    Host,
    acks,
    expect_record,
    no_overclaim,
    ran_ok,
    registry_for,
    reported,
)
from sandbox_operator.conformance._probe import (
    Area,
    ConformanceReport,
    Probes,
    asserting,
    check,
    exists,
    expect_raises,
    q,
    still_running,
)

__all__ = ["PAYLOAD", "REQUIRED", "assert_host_tools_conformance", "check_host_tools"]


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
        channel_missing = [c for c in CHANNEL_CAPABILITIES if c not in sandbox.required]
        if channel_missing:
            run = registry_for(Host(), max_calls=4).start_run(
                limits_in=sandbox.spec.files_in, limits_out=sandbox.spec.files_out
            )

            async def run_refused_without_capability() -> None:
                await expect_raises(
                    CapabilityNotRequired,
                    run_with_host_tools(sandbox, "pass", run, timeout=run_timeout),
                    "a host-tool run without the channel's capabilities",
                    capability=channel_missing[0].value,
                )

            await probes.run_all(run_refused_without_capability)
        probes.skip(f"all (spec does not require {', '.join(missing)})")
        return probes.done()

    host = Host()
    registry = registry_for(host, max_calls=32)
    capped = registry_for(host, max_calls=3)
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
            PRELUDE + body,
            run,
            files=files,
            layout=layout,
            timeout=timeout or run_timeout,
        )

    async def answered(
        body: str, run: HostToolRun, want: Any = ..., **options: Any
    ) -> tuple[HostToolRunResult, Any]:
        """Run ``body`` to a clean exit; return it and the value it reported (``want``, if given:
        anything else is a failure)."""
        result = await execute(body, run, **options)
        ran_ok(result)
        got = reported(result.stdout)
        if want is not ...:
            check(got == want, f"guest saw {str(got)[:300]}, expected {want}")
        return result, got

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
            result, verdict = await answered(body, run)
            check(verdict["dump"] == expected, f"answer differs: {verdict['dump'][:300]!r}")
            check(verdict["equal"] is True, "the decoded answer is not equal to the value sent")
            check(verdict["via_call"] is True, "host.call('echo', ...) answered differently")
            check(host.executed["echo"] - before == 2, "echo ran other than twice")
            check(len(result.records) == 2, f"{len(result.records)} records for 2 calls")
            for sequence in (1, 2):
                expect_record(result.records, sequence, "echo", ran=True)
            no_overclaim(result.records, acks(result.stdout))

        async def unregistered_tool_refused() -> None:
            run = start()
            body = (
                "report([attempt(lambda: host.call('no_such_tool', x=1)),"
                " attempt(lambda: host.call('../echo', value=1))])\n"
            )
            result, _ = await answered(body, run, [{"refused": "HostToolNotRegistered"}] * 2)
            for sequence, tool in ((1, "no_such_tool"), (2, "../echo")):
                expect_record(result.records, sequence, tool, "HostToolNotRegistered", ran=False)

        async def bad_arguments_refused_not_executed() -> None:
            run = start()
            body = (
                "report([attempt(lambda: host.commit(n='seven')),"
                " attempt(lambda: host.commit(n=1, extra=2)),"
                " attempt(lambda: host.commit()),"
                " attempt(lambda: host.commit(n=[1]))])\n"
            )
            before = host.executed["commit"]
            result, _ = await answered(body, run, [{"refused": "HostToolArgumentsInvalid"}] * 4)
            check(host.executed["commit"] == before, "the tool ran on invalid arguments")
            for r in result.records:
                expect_record(r, r.sequence, "commit", "HostToolArgumentsInvalid", ran=False)

        async def cap_counts_refusals() -> None:
            run = start(capped)
            body = (
                "report([attempt(lambda: host.call('no_such_tool')),"
                " attempt(lambda: host.commit(n='x')),"
                " attempt(lambda: host.commit(n=1)),"
                " attempt(lambda: host.commit(n=2))])\n"
            )
            want = [
                {"refused": "HostToolNotRegistered"},
                {"refused": "HostToolArgumentsInvalid"},
                {"ok": 2},
                {"refused": "HostToolCallCapExceeded"},
            ]
            before = host.executed["commit"]
            result, _ = await answered(body, run, want)
            check(host.executed["commit"] - before == 1, "commit ran other than once")
            check(run.calls_made == 3, f"calls_made {run.calls_made}, expected the cap (3)")
            expect_record(result.records, 4, "commit", "HostToolCallCapExceeded", ran=False)

        async def oversized_response_refused() -> None:
            run = start(max_bytes_per_file=4096)
            body = (
                "report([attempt(lambda: host.blob(size=100000)),"
                " attempt(lambda: host.blob(size=10))])\n"
            )
            before = host.executed["blob"]
            want = [{"refused": "HostToolResponseTooLarge"}, {"ok": "x" * 10}]
            result, _ = await answered(body, run, want)
            check(host.executed["blob"] - before == 2, "blob ran other than twice")
            expect_record(result.records, 1, "blob", "HostToolResponseTooLarge", ran=True)

        async def transport_removed() -> None:
            run = start()
            result, _ = await answered("report(host.echo(value='bye'))\n", run, "bye")
            layout = result.layout
            check(result.transport_removed is True, "the channel reports the transport kept")
            check(
                not await exists(sandbox, layout.transport_path),
                "the transport directory is still there after the run",
            )
            check(await exists(sandbox, layout.work_path), "work/ is gone before collection")
            check(await reclaim_run(sandbox, layout) is True, "reclaim_run reports failure")
            check(not await exists(sandbox, layout.root_path), "the run directory is still there")

        async def cwd_is_work_dir() -> None:
            run = start()
            body = (
                "report({'cwd': os.getcwd(),"
                " 'data': open('data/in.txt', encoding='utf-8').read(),"
                " 'echo': host.echo(value='here')})\n"
            )
            result, got = await answered(body, run, files={"data/in.txt": "hello ✓"})
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
                execute("report(1)\n", start(), files={SHIM_FILE: FORGED_SHIM}),
                "a run file named like the shim",
            )
            # Placed in work/ by other means (a write, an earlier program), together with
            # modules the shim imports: the program must still import the real ones.
            layout = guest_run_layout(sandbox)
            await sandbox.write_file(f"{layout.work}/{SHIM_FILE}", FORGED_SHIM)
            shadows = {
                f"{name}.py": f"raise ImportError('work/{name}.py was imported')\n"
                for name in SHADOWED_DEPENDENCIES
            }
            body = (
                "report({'shim': os.path.dirname(os.path.realpath(host.__file__)),"
                " 'echo': host.echo(value='real')})\n"
            )
            before = host.executed["echo"]
            _, got = await answered(body, start(), files=shadows, layout=layout)
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
                not await exists(sandbox, layout.transport_path),
                "the transport directory is still there after the overrun",
            )
            res = await sandbox.exec(["cat", pids], cwd="/")
            check(res.exit_code == 0, "the program never wrote its pids")
            started = [int(p) for p in res.stdout_text.split()]
            alive = await still_running(sandbox, started)
            check(
                not alive,
                f"still running after the signal ({exc.signal.value}): {alive} of "
                f"launcher/program/child {started}",
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
            expect_record(
                exc.record, exc.record.sequence, "commit", ran=True, delivery=Delivery.UNCERTAIN
            )
            check(len(run.records) == 1, f"{len(run.records)} records for one call")
            check(run.answered(1), "the call is not marked answered (it could be re-run)")
            await asyncio.sleep(0.5)
            check(host.executed["commit"] - before == 1, "the call was re-run")
            check(
                exc.transport_removed is True and not await exists(sandbox, layout.transport_path),
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
                no_overclaim(timed_out.records, acks(timed_out.stdout))
                raise
            ran_ok(result)
            no_overclaim(result.records, acks(result.stdout))
            check(len(result.records) == 3, f"{len(result.records)} records for 3 calls")

        await probes.run_all(round_trip_exact, unregistered_tool_refused)
        await probes.run_all(bad_arguments_refused_not_executed, cap_counts_refusals)
        await probes.run_all(oversized_response_refused, transport_removed, cwd_is_work_dir)
        await probes.run_all(model_files_cannot_shadow_shim, overrun_signalled)
        await probes.run_all(delivery_uncertain_when_cut, delivered_means_received)

        for layout in layouts:
            with contextlib.suppress(Exception):
                await reclaim_run(sandbox, layout)
        with contextlib.suppress(Exception):
            await sandbox.exec(
                ["sh", "-c", f"rmdir {q(sandbox.work_dir)}/.host-tools 2>/dev/null; true"],
                cwd="/",
            )
    return probes.done()


assert_host_tools_conformance = asserting(check_host_tools)
