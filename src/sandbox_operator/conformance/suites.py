"""The conformance suites: each takes a live ``Sandbox`` (any backend) and holds it to the
contract. Every probe is named, runs even when an earlier one failed, and a wrong exception type
counts as a failure. ``check_*`` returns a :class:`ConformanceReport`; ``assert_*`` raises one
:class:`ConformanceError` listing every failed probe.

The suites set up their fixtures (symlinks, directories outside the work dir) with ``exec``, so the
sandbox's spec must require ``exec`` besides the capability under test; probes for a capability
the spec did not require are skipped (and a call to it must be refused, which is itself probed).
This module holds ``exec``, ``reclaim``, ``call_scope`` and the run of them all; the file suites
live in :mod:`sandbox_operator.conformance.files` and are re-exported here.
"""

from __future__ import annotations

import time

from sandbox_operator.client.errors import ExecTimeout, OutputBudgetExceeded, PathRefused
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.conformance._probe import (
    Area,
    ConformanceError,
    ConformanceReport,
    ProbeFailure,
    Probes,
    asserting,
    cat,
    check,
    exists,
    expect_raises,
    q,
    sh,
    still_running,
    token,
)
from sandbox_operator.conformance.files import (
    BINARY,
    TEXT,
    check_files_delete,
    check_files_in,
    check_files_out,
)
from sandbox_operator.contract import Capability

__all__ = [
    "BINARY",
    "TEXT",
    "assert_call_scope_conformance",
    "assert_exec_conformance",
    "assert_files_delete_conformance",
    "assert_files_in_conformance",
    "assert_files_out_conformance",
    "assert_reclaim_conformance",
    "assert_sandbox_conformance",
    "check_call_scope",
    "check_exec",
    "check_files_delete",
    "check_files_in",
    "check_files_out",
    "check_reclaim",
    "check_sandbox",
]

#: A run directory with links out inside it, a bystander beside it, and a link to outside.
_RECLAIM_FIXTURE = (
    "mkdir -p run/a/b bystander && printf x > run/a/b/f && printf y > bystander/f && "
    'printf keep > "$OUT/keep" && ln -s "$OUT" run/out && ln -s "$OUT/keep" run/a/keep && '
    'ln -s "$OUT" runlink'
)


# ------------------------------------------------------------------------------------------------
# exec


async def check_exec(sandbox: Sandbox, *, kill_timeout: float = 2.0) -> ConformanceReport:
    """Exit codes, verbatim argv, shell strings, cwd, env, binary stdin/stdout, stderr apart,
    timeout kills the process group within bounds (with partial output), output budget."""
    probes = Probes("exec")
    if not await probes.gate(sandbox, Capability.EXEC):
        return probes.done()
    async with probes.guard(), Area(sandbox, "exec") as area:

        async def exit_codes() -> None:
            for argv, want in (
                (["true"], 0),
                (["false"], 1),
                (["sh", "-c", "exit 7"], 7),
                (["sh", "-c", "exit 255"], 255),
            ):
                res = await sandbox.exec(argv)
                check(res.exit_code == want, f"{argv}: exit {res.exit_code}, expected {want}")

        async def command_not_found() -> None:
            res = await sandbox.exec([f"no-such-command-{token()}"])
            check(res.exit_code == 127, f"exit {res.exit_code}, expected 127")

        async def verbatim_argv() -> None:
            args = ["a b$(echo x)c", "'q'", '"d"', "*", "$HOME", "`id`", "", "a\\nb", "-n", ";|&"]
            res = await sandbox.exec(["printf", "[%s]", *args])
            want = "".join(f"[{a}]" for a in args).encode()
            check(res.stdout == want, f"stdout {res.stdout!r}, expected {want!r}")

        async def shell_string() -> None:
            res = await sandbox.exec("echo $((40 + 2)) | tr 4 X")
            check(res.stdout == b"X2\n", f"stdout {res.stdout!r}")

        async def stdout_stderr_apart() -> None:
            res = await sandbox.exec(["sh", "-c", "printf out; printf err >&2; exit 3"])
            check((res.stdout, res.stderr, res.exit_code) == (b"out", b"err", 3), f"{res}")

        async def binary_stdin_stdout() -> None:
            res = await sandbox.exec(["cat"], stdin=BINARY)
            check(res.stdout == BINARY, f"binary stdin round trip differs ({len(res.stdout)})")

        async def default_cwd_is_work_dir() -> None:
            res = await sandbox.exec(["pwd"])
            check(res.stdout_text.strip() == sandbox.work_dir, f"pwd {res.stdout_text.strip()}")

        async def cwd() -> None:
            res = await sandbox.exec(["pwd"], cwd=area.rel)
            check(res.stdout_text.strip() == area.abs, f"pwd {res.stdout_text.strip()}")
            res = await sandbox.exec(["pwd"], cwd="/")
            check(res.stdout_text.strip() == "/", f"pwd {res.stdout_text.strip()}")

        async def env() -> None:
            res = await sandbox.exec(
                ["sh", "-c", 'printf %s "$SBX_PROBE"'], env={"SBX_PROBE": "v a$l'ue"}
            )
            check(res.stdout == b"v a$l'ue", f"stdout {res.stdout!r}")

        async def timeout_kills_group() -> None:
            pidfile = area.absolute("pids")
            script = (
                f"echo started; sleep 300 & echo $! > {q(pidfile)}; echo $$ >> {q(pidfile)}; wait"
            )
            start = time.monotonic()
            exc = await expect_raises(
                ExecTimeout,
                sandbox.exec(["sh", "-c", script], timeout=kill_timeout),
                "a command past its timeout",
            )
            elapsed = time.monotonic() - start
            assert isinstance(exc, ExecTimeout)
            check(elapsed < kill_timeout + 20, f"took {elapsed:.1f}s for a {kill_timeout}s timeout")
            check(exc.kill_delivered, "kill not delivered")
            check(exc.stdout == b"started\n", f"partial stdout {exc.stdout!r}")
            res = await sandbox.exec(["cat", pidfile], cwd="/")
            alive = await still_running(sandbox, [int(p) for p in res.stdout_text.split()])
            if alive:
                raise AssertionError(f"still running after the kill: {alive}")

        async def output_budget_refuses() -> None:
            await expect_raises(
                OutputBudgetExceeded,
                sandbox.exec(["sh", "-c", "yes | head -c 3000000"], max_output_bytes=100_000),
                "output above the budget",
            )

        async def output_under_budget_whole() -> None:
            res = await sandbox.exec(["sh", "-c", "yes | head -c 1000000"])
            check(len(res.stdout) == 1_000_000, f"got {len(res.stdout)} bytes")

        await probes.run_all(exit_codes, command_not_found, verbatim_argv, shell_string)
        await probes.run_all(stdout_stderr_apart, binary_stdin_stdout, default_cwd_is_work_dir)
        await probes.run_all(cwd, env, timeout_kills_group)
        await probes.run_all(output_budget_refuses, output_under_budget_whole)
    return probes.done()


# ------------------------------------------------------------------------------------------------
# reclaim


async def check_reclaim(sandbox: Sandbox) -> ConformanceReport:
    """The directory is gone, a bystander survives, links inside are not followed, a missing
    directory is success. Needs only exec (for setup): reclaim is gated by nothing."""
    probes = Probes("reclaim")
    if Capability.EXEC not in sandbox.required:
        probes.skip("all (spec does not require exec, which the setup needs)")
        return probes.done()
    async with probes.guard(), Area(sandbox, "reclaim", setup=_RECLAIM_FIXTURE) as area:

        async def dir_gone() -> None:
            await sandbox.reclaim(area.path("run"))
            check(not await exists(sandbox, area.absolute("run")), "directory still there")

        async def bystander_survives() -> None:
            check(await exists(sandbox, area.absolute("bystander/f")), "bystander removed")

        async def links_not_followed() -> None:
            check(await exists(sandbox, f"{area.outside}/keep"), "followed a link inside")

        async def link_itself_removed() -> None:
            await sandbox.reclaim(area.path("runlink"))
            check(not await exists(sandbox, area.absolute("runlink")), "link still there")
            check(await exists(sandbox, f"{area.outside}/keep"), "followed the link")

        async def missing_is_success() -> None:
            await sandbox.reclaim(area.path("never-created"))
            await sandbox.reclaim(area.path("never/created/either"))

        async def escapes_refused() -> None:
            await expect_raises(PathRefused, sandbox.reclaim(".."), "reclaim ..")
            await expect_raises(PathRefused, sandbox.reclaim(area.outside), "reclaim outside")
            await expect_raises(PathRefused, sandbox.reclaim("."), "reclaim the work dir")

        await probes.run_all(dir_gone, bystander_survives, links_not_followed, link_itself_removed)
        await probes.run_all(missing_is_success, escapes_refused)
    return probes.done()


# ------------------------------------------------------------------------------------------------
# call scope


async def check_call_scope(first: Sandbox, second: Sandbox) -> ConformanceReport:
    """Two per-call sandboxes of one conversation never see each other's files (nor processes
    they left behind, by name)."""
    probes = Probes("call_scope")
    tok = token()

    async def distinct_sandboxes() -> None:
        if first.name or second.name:
            check(first.name != second.name, f"both named {first.name!r}")

    async def files_not_shared() -> None:
        rel = f"call-scope-{tok}"
        await sh(first, f"mkdir -p {q(first.work_dir)} && printf one > {q(first.work_dir)}/{rel}")
        await sh(
            second, f"mkdir -p {q(second.work_dir)} && printf two > {q(second.work_dir)}/{rel}2"
        )
        check(not await exists(second, f"{second.work_dir}/{rel}"), "second sees first's file")
        check(not await exists(first, f"{first.work_dir}/{rel}2"), "first sees second's file")
        check(await cat(first, f"{first.work_dir}/{rel}") == b"one", "first lost its file")

    async def tmp_not_shared() -> None:
        await sh(first, f'printf one > "${{TMPDIR:-/tmp}}/call-scope-{tok}"')
        res = await second.exec(["sh", "-c", f'test -e "${{TMPDIR:-/tmp}}/call-scope-{tok}"'])
        check(res.exit_code != 0, "second sees first's temporary directory")
        await first.exec(["sh", "-c", f'rm -f "${{TMPDIR:-/tmp}}/call-scope-{tok}"'])

    await probes.run_all(distinct_sandboxes, files_not_shared, tmp_not_shared)
    return probes.done()


# ------------------------------------------------------------------------------------------------
# all together


async def check_sandbox(sandbox: Sandbox) -> list[ConformanceReport]:
    """Every single-sandbox suite, in order."""
    return [
        await check_files_in(sandbox),
        await check_files_out(sandbox),
        await check_exec(sandbox),
        await check_files_delete(sandbox),
        await check_reclaim(sandbox),
    ]


assert_files_in_conformance = asserting(check_files_in)
assert_files_out_conformance = asserting(check_files_out)
assert_exec_conformance = asserting(check_exec)
assert_files_delete_conformance = asserting(check_files_delete)
assert_reclaim_conformance = asserting(check_reclaim)
assert_call_scope_conformance = asserting(check_call_scope)


async def assert_sandbox_conformance(sandbox: Sandbox) -> None:
    """Run every single-sandbox suite; raise one error listing every failed probe of all."""
    failures: list[ProbeFailure] = []
    for report in await check_sandbox(sandbox):
        failures += [ProbeFailure(f"{report.suite}.{f.probe}", f.detail) for f in report.failures]
    if failures:
        raise ConformanceError("sandbox", failures)
