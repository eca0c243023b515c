"""The conformance suites: each takes a live ``Sandbox`` (any backend) and holds it to the
contract. Every probe is named, runs even when an earlier one failed, and a wrong exception type
counts as a failure. ``check_*`` returns a :class:`ConformanceReport`; ``assert_*`` raises one
:class:`ConformanceError` listing every failed probe.

The suites set up their fixtures (symlinks, directories outside the work dir) with ``exec``, so the
sandbox's spec must require ``exec`` besides the capability under test; probes for a capability
the spec did not require are skipped (and a call to it must be refused, which is itself probed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

from sandbox_operator.client.errors import (
    CapabilityNotRequired,
    ExecTimeout,
    OutputBudgetExceeded,
    PathRefused,
    SandboxFileNotFound,
    TransferCapExceeded,
)
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.conformance._probe import (
    Area,
    ConformanceReport,
    Probes,
    check,
    expect_raises,
    q,
    sh,
    token,
)
from sandbox_operator.contract import Capability

BINARY = bytes(range(256)) * 64 + b"\x00\r\n\x1b\xff" * 100
TEXT = "héllo wörld ✓ 🎉 — ünïcode\nline two\r\n"


async def _cat(sandbox: Sandbox, absolute: str) -> bytes:
    res = await sandbox.exec(["cat", absolute], cwd="/")
    if res.exit_code != 0:
        raise AssertionError(f"cat {absolute!r} failed: {res.stderr_text[:200]}")
    return res.stdout


async def _exists(sandbox: Sandbox, absolute: str) -> bool:
    res = await sandbox.exec(["sh", "-c", 'test -e "$1" || test -L "$1"', "sh", absolute], cwd="/")
    return res.exit_code == 0


def _missing_capability(sandbox: Sandbox, *caps: Capability) -> list[str]:
    return [c.value for c in caps if c not in sandbox.required]


async def _gated(
    probes: Probes, sandbox: Sandbox, capability: Capability, name: str, call: Awaitable[Any]
) -> None:
    """When the spec did not require ``capability``: the method must refuse, naming it."""

    async def probe() -> None:
        await expect_raises(
            CapabilityNotRequired,
            call,
            name,
            capability=capability.value,
        )

    await probes.run(f"{name}_refused_without_capability", probe)


# ------------------------------------------------------------------------------------------------
# files in


async def check_files_in(sandbox: Sandbox) -> ConformanceReport:
    """Writes land, bytes round-trip, UTF-8 text, replace, parents created, every escape refused
    with nothing created, caps refuse."""
    probes = Probes("files_in")
    missing = _missing_capability(sandbox, Capability.EXEC, Capability.FILES_IN)
    if missing:
        if Capability.FILES_IN not in sandbox.required:
            await _gated(
                probes, sandbox, Capability.FILES_IN, "write_file", sandbox.write_file("x", b"")
            )
        probes.skip(f"all (spec does not require {', '.join(missing)})")
        return probes.done()
    async with probes.guard(), Area(sandbox, "in") as area:

        async def writes_land() -> None:
            await sandbox.write_file(area.path("a.txt"), b"hello")
            check(await _cat(sandbox, area.absolute("a.txt")) == b"hello", "content differs")

        async def bytes_round_trip() -> None:
            await sandbox.write_file(area.path("b.bin"), BINARY)
            got = await _cat(sandbox, area.absolute("b.bin"))
            check(got == BINARY, f"binary content differs ({len(got)} vs {len(BINARY)} bytes)")

        async def empty_file() -> None:
            await sandbox.write_file(area.path("empty"), b"")
            check(await _cat(sandbox, area.absolute("empty")) == b"", "empty file not empty")

        async def utf8_text() -> None:
            await sandbox.write_file(area.path("t.txt"), TEXT)
            check(await _cat(sandbox, area.absolute("t.txt")) == TEXT.encode(), "text differs")

        async def absolute_inside_work_dir() -> None:
            await sandbox.write_file(area.absolute("abs.txt"), b"abs")
            check(await _cat(sandbox, area.absolute("abs.txt")) == b"abs", "content differs")

        async def replace() -> None:
            await sandbox.write_file(area.path("r.txt"), b"first version, longer")
            await sandbox.write_file(area.path("r.txt"), b"second")
            check(await _cat(sandbox, area.absolute("r.txt")) == b"second", "not replaced")

        async def no_replace_refused() -> None:
            await sandbox.write_file(area.path("n.txt"), b"keep")
            await expect_raises(
                PathRefused,
                sandbox.write_file(area.path("n.txt"), b"other", replace=False),
                "replace=False over an existing file",
                rule="exists",
            )
            check(await _cat(sandbox, area.absolute("n.txt")) == b"keep", "existing overwritten")

        async def parents_created() -> None:
            await sandbox.write_file(area.path("p/q/r/deep.txt"), b"deep")
            check(await _cat(sandbox, area.absolute("p/q/r/deep.txt")) == b"deep", "not written")

        await probes.run("writes_land", writes_land)
        await probes.run("bytes_round_trip", bytes_round_trip)
        await probes.run("empty_file", empty_file)
        await probes.run("utf8_text", utf8_text)
        await probes.run("absolute_inside_work_dir", absolute_inside_work_dir)
        await probes.run("replace", replace)
        await probes.run("no_replace_refused", no_replace_refused)
        await probes.run("parents_created", parents_created)

        # Escapes: each must raise PathRefused and create nothing anywhere.
        tok = token()
        await sh(
            sandbox,
            f"cd {q(area.abs)} && ln -s {q(area.outside)} linkdir && "
            f"printf original > {q(area.outside)}/target && "
            f"ln -s {q(area.outside)}/target linkfile && "
            f"ln -s {q(area.outside)}/absent-{tok} danglink",
        )
        escapes = {
            "refuses_parent_traversal": (f"{area.rel}/../../escape-{tok}", "parent_traversal"),
            "refuses_dotdot_only": ("..", "parent_traversal"),
            "refuses_absolute_outside": (f"{area.outside}/abs-{tok}", "absolute_outside_work_dir"),
            "refuses_backslash": (f"{area.rel}\\..\\bs-{tok}", "backslash"),
            "refuses_symlinked_parent": (area.path(f"linkdir/via-{tok}"), "symlinked_parent"),
            "refuses_symlink_destination": (area.path("linkfile"), "symlink_destination"),
            "refuses_dangling_symlink_destination": (area.path("danglink"), "symlink_destination"),
            "refuses_work_dir_itself": (".", "work_dir_itself"),
            "refuses_work_dir_absolute": (sandbox.work_dir, "work_dir_itself"),
            "refuses_empty_path": ("", "empty"),
        }

        for probe_name, (path, rule) in escapes.items():

            async def escape(path: str = path, rule: str = rule) -> None:
                await expect_raises(
                    PathRefused, sandbox.write_file(path, b"ESCAPED"), f"write {path!r}", rule=rule
                )

            await probes.run(probe_name, escape)

        async def nothing_created_outside() -> None:
            res = await sh(sandbox, f"ls -A {q(area.outside)}")
            names = sorted(res.stdout_text.split())
            check(names == ["target"], f"outside dir holds {names}")
            check(
                await _cat(sandbox, f"{area.outside}/target") == b"original",
                "symlink target was written through",
            )
            parent = sandbox.work_dir.rsplit("/", 1)[0] or "/"
            check(
                not await _exists(sandbox, f"{parent}/escape-{tok}"),
                "traversal created a file above the work dir",
            )

        await probes.run("escapes_created_nothing", nothing_created_outside)

        async def cap_per_file() -> None:
            cap = sandbox.spec.files_in.max_bytes_per_file
            await expect_raises(
                TransferCapExceeded,
                sandbox.write_file(area.path("big"), b"x" * (cap + 1)),
                "write above filesIn.maxBytesPerFile",
                cap="max_bytes_per_file",
            )
            check(not await _exists(sandbox, area.absolute("big")), "capped file was created")

        async def cap_count() -> None:
            limit = sandbox.spec.files_in.max_files
            files = {area.path(f"many/{i}"): b"" for i in range(limit + 1)}
            await expect_raises(
                TransferCapExceeded,
                sandbox.write_files(files),
                "write_files above filesIn.maxFiles",
                cap="max_files",
            )
            check(
                not await _exists(sandbox, area.absolute("many")), "part of a refused batch landed"
            )

        await probes.run("cap_per_file_refused", cap_per_file)
        await probes.run("cap_count_refused", cap_count)
    return probes.done()


# ------------------------------------------------------------------------------------------------
# files out


async def check_files_out(sandbox: Sandbox) -> ConformanceReport:
    """Exact sizes, symlinks stat as symlinks and are unreadable, linked parent and work dir
    refused, caps refuse rather than truncate, listing (when files_list is required)."""
    probes = Probes("files_out")
    missing = _missing_capability(sandbox, Capability.EXEC, Capability.FILES_OUT)
    if missing:
        if Capability.FILES_OUT not in sandbox.required:
            await _gated(probes, sandbox, Capability.FILES_OUT, "read_file", sandbox.read_file("x"))
        probes.skip(f"all (spec does not require {', '.join(missing)})")
        return probes.done()
    async with probes.guard(), Area(sandbox, "out") as area:
        await sh(
            sandbox,
            f"cd {q(area.abs)} && printf 'exactly 17 bytes\\n' > f.txt && "
            f"head -c 300000 /dev/urandom > rand.bin && : > empty && mkdir -p sub/inner && "
            f"printf inner > sub/inner/i.txt && printf secret > {q(area.outside)}/secret && "
            f"ln -s {q(area.outside)}/secret link && ln -s {q(area.outside)} linkdir && "
            f"ln -s f.txt rel-link",
        )

        async def exact_size() -> None:
            st = await sandbox.stat(area.path("f.txt"))
            check(st.kind == "file" and st.size == 17, f"stat says {st}")
            data = await sandbox.read_file(area.path("f.txt"))
            check(data == b"exactly 17 bytes\n", f"read {data!r}")

        async def binary_exact() -> None:
            want = await _cat(sandbox, area.absolute("rand.bin"))
            got = await sandbox.read_file(area.path("rand.bin"))
            st = await sandbox.stat(area.path("rand.bin"))
            check(len(want) == 300000, f"setup wrote {len(want)} bytes")
            check(got == want, f"binary read differs ({len(got)} bytes)")
            check(st.size == 300000, f"stat size {st.size}")

        async def empty_file() -> None:
            check(await sandbox.read_file(area.path("empty")) == b"", "empty file not empty")
            check((await sandbox.stat(area.path("empty"))).size == 0, "empty size not 0")

        async def directory_stat() -> None:
            st = await sandbox.stat(area.path("sub"))
            check(st.kind == "dir", f"stat says {st}")

        async def symlink_stat_as_symlink() -> None:
            for name in ("link", "linkdir", "rel-link"):
                st = await sandbox.stat(area.path(name))
                check(st.kind == "symlink", f"{name}: stat says {st.kind}")

        async def symlink_unreadable() -> None:
            for name in ("link", "rel-link"):
                await expect_raises(
                    PathRefused,
                    sandbox.read_file(area.path(name)),
                    f"read symlink {name}",
                    rule="symlink_destination",
                )

        async def linked_parent_refused() -> None:
            await expect_raises(
                PathRefused,
                sandbox.read_file(area.path("linkdir/secret")),
                "read through a symlinked parent",
                rule="symlinked_parent",
            )
            await expect_raises(
                PathRefused,
                sandbox.stat(area.path("linkdir/secret")),
                "stat through a symlinked parent",
                rule="symlinked_parent",
            )

        async def work_dir_refused() -> None:
            await expect_raises(PathRefused, sandbox.read_file("."), "read work dir")
            await expect_raises(PathRefused, sandbox.read_file(sandbox.work_dir), "read work dir")

        async def escapes_refused() -> None:
            await expect_raises(PathRefused, sandbox.read_file("../etc/passwd"), "read ..")
            await expect_raises(PathRefused, sandbox.read_file("/etc/passwd"), "read /etc/passwd")
            await expect_raises(PathRefused, sandbox.read_file("a\\b"), "read backslash")

        async def directory_unreadable() -> None:
            await expect_raises(PathRefused, sandbox.read_file(area.path("sub")), "read a dir")

        async def missing_not_found() -> None:
            await expect_raises(SandboxFileNotFound, sandbox.read_file(area.path("nope")), "read")
            await expect_raises(SandboxFileNotFound, sandbox.stat(area.path("nope/x")), "stat")

        async def cap_refuses_not_truncates() -> None:
            await expect_raises(
                TransferCapExceeded,
                sandbox.read_file(area.path("rand.bin"), max_bytes=1000),
                "read above max_bytes",
            )

        await probes.run("exact_size", exact_size)
        await probes.run("binary_exact", binary_exact)
        await probes.run("empty_file", empty_file)
        await probes.run("directory_stat", directory_stat)
        await probes.run("symlink_stat_as_symlink", symlink_stat_as_symlink)
        await probes.run("symlink_unreadable", symlink_unreadable)
        await probes.run("linked_parent_refused", linked_parent_refused)
        await probes.run("work_dir_refused", work_dir_refused)
        await probes.run("escapes_refused", escapes_refused)
        await probes.run("directory_unreadable", directory_unreadable)
        await probes.run("missing_not_found", missing_not_found)
        await probes.run("cap_refuses_not_truncates", cap_refuses_not_truncates)

        if Capability.FILES_LIST in sandbox.required:

            async def listing() -> None:
                entries = {e.name: (e.kind, e.size) for e in await sandbox.list_dir(area.rel)}
                want = {
                    "f.txt": ("file", 17),
                    "rand.bin": ("file", 300000),
                    "empty": ("file", 0),
                    "sub": ("dir", 0),
                    "link": ("symlink", 0),
                    "linkdir": ("symlink", 0),
                    "rel-link": ("symlink", 0),
                }
                check(entries == want, f"listing {entries}")

            async def listing_linked_dir_refused() -> None:
                await expect_raises(
                    PathRefused, sandbox.list_dir(area.path("linkdir")), "list a symlinked dir"
                )

            await probes.run("listing", listing)
            await probes.run("listing_linked_dir_refused", listing_linked_dir_refused)
        else:
            await _gated(probes, sandbox, Capability.FILES_LIST, "list_dir", sandbox.list_dir())
    return probes.done()


# ------------------------------------------------------------------------------------------------
# exec


async def check_exec(sandbox: Sandbox, *, kill_timeout: float = 2.0) -> ConformanceReport:
    """Exit codes, verbatim argv, shell strings, cwd, env, binary stdin/stdout, stderr apart,
    timeout kills the process group within bounds (with partial output), output budget."""
    probes = Probes("exec")
    if Capability.EXEC not in sandbox.required:
        await _gated(probes, sandbox, Capability.EXEC, "exec", sandbox.exec(["true"]))
        probes.skip("all (spec does not require exec)")
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
            for _ in range(20):
                res = await sandbox.exec(
                    [
                        "sh",
                        "-c",
                        f"for p in $(cat {q(pidfile)}); do kill -0 $p 2>/dev/null && "
                        "! grep -q '^State:.*Z' /proc/$p/status 2>/dev/null && echo $p; "
                        "done; true",
                    ]
                )
                if not res.stdout.strip():
                    return
                await asyncio.sleep(0.5)
            raise AssertionError(f"still running after the kill: {res.stdout_text.split()}")

        async def output_budget() -> None:
            await expect_raises(
                OutputBudgetExceeded,
                sandbox.exec(["sh", "-c", "yes | head -c 3000000"], max_output_bytes=100_000),
                "output above the budget",
            )

        async def output_under_budget_whole() -> None:
            res = await sandbox.exec(["sh", "-c", "yes | head -c 1000000"])
            check(len(res.stdout) == 1_000_000, f"got {len(res.stdout)} bytes")

        await probes.run("exit_codes", exit_codes)
        await probes.run("command_not_found", command_not_found)
        await probes.run("verbatim_argv", verbatim_argv)
        await probes.run("shell_string", shell_string)
        await probes.run("stdout_stderr_apart", stdout_stderr_apart)
        await probes.run("binary_stdin_stdout", binary_stdin_stdout)
        await probes.run("default_cwd_is_work_dir", default_cwd_is_work_dir)
        await probes.run("cwd", cwd)
        await probes.run("env", env)
        await probes.run("timeout_kills_group", timeout_kills_group)
        await probes.run("output_budget_refuses", output_budget)
        await probes.run("output_under_budget_whole", output_under_budget_whole)
    return probes.done()


# ------------------------------------------------------------------------------------------------
# files delete


async def check_files_delete(sandbox: Sandbox) -> ConformanceReport:
    """Remove files and directories; links removed, never followed; missing is success;
    symlinked parents and the work dir refused."""
    probes = Probes("files_delete")
    missing = _missing_capability(sandbox, Capability.EXEC, Capability.FILES_DELETE)
    if missing:
        if Capability.FILES_DELETE not in sandbox.required:
            await _gated(probes, sandbox, Capability.FILES_DELETE, "remove", sandbox.remove("x"))
        probes.skip(f"all (spec does not require {', '.join(missing)})")
        return probes.done()
    async with probes.guard(), Area(sandbox, "del") as area:
        await sh(
            sandbox,
            f"cd {q(area.abs)} && printf x > f && mkdir -p d/e && printf y > d/e/g && "
            f"mkdir empty && printf keep > {q(area.outside)}/keep && "
            f"ln -s {q(area.outside)}/keep link && ln -s {q(area.outside)} linkdir && "
            f"mkdir holder && ln -s {q(area.outside)} holder/out",
        )

        async def remove_file() -> None:
            check(await sandbox.remove(area.path("f")) is True, "remove returned False")
            check(not await _exists(sandbox, area.absolute("f")), "file still there")

        async def missing_is_success() -> None:
            check(await sandbox.remove(area.path("nope")) is False, "missing returned True")
            check(await sandbox.remove(area.path("nope/deeper")) is False, "missing parent")

        async def dir_needs_recursive() -> None:
            await expect_raises(
                PathRefused,
                sandbox.remove(area.path("d")),
                "non-recursive remove of a non-empty dir",
                rule="destination_is_directory",
            )
            check(await _exists(sandbox, area.absolute("d/e/g")), "dir content removed")
            check(await sandbox.remove(area.path("empty")) is True, "empty dir not removed")

        async def recursive() -> None:
            check(await sandbox.remove(area.path("d"), recursive=True), "returned False")
            check(not await _exists(sandbox, area.absolute("d")), "dir still there")

        async def link_not_followed() -> None:
            check(await sandbox.remove(area.path("link")), "returned False")
            check(not await _exists(sandbox, area.absolute("link")), "link still there")
            check(await _exists(sandbox, f"{area.outside}/keep"), "link target removed")

        async def linked_dir_not_followed() -> None:
            await sandbox.remove(area.path("linkdir"), recursive=True)
            check(not await _exists(sandbox, area.absolute("linkdir")), "link still there")
            check(await _exists(sandbox, f"{area.outside}/keep"), "followed the dir link")
            await sandbox.remove(area.path("holder"), recursive=True)
            check(await _exists(sandbox, f"{area.outside}/keep"), "followed a link inside")

        async def symlinked_parent_refused() -> None:
            await sh(sandbox, f"ln -sfn {q(area.outside)} {q(area.absolute('linkdir2'))}")
            await expect_raises(
                PathRefused,
                sandbox.remove(area.path("linkdir2/keep")),
                "remove through a symlinked parent",
                rule="symlinked_parent",
            )
            check(await _exists(sandbox, f"{area.outside}/keep"), "removed through the link")

        async def work_dir_refused() -> None:
            await expect_raises(PathRefused, sandbox.remove(".", recursive=True), "remove .")
            await expect_raises(
                PathRefused, sandbox.remove(sandbox.work_dir, recursive=True), "remove work dir"
            )
            await expect_raises(PathRefused, sandbox.remove("..", recursive=True), "remove ..")

        await probes.run("remove_file", remove_file)
        await probes.run("missing_is_success", missing_is_success)
        await probes.run("dir_needs_recursive", dir_needs_recursive)
        await probes.run("recursive", recursive)
        await probes.run("link_not_followed", link_not_followed)
        await probes.run("linked_dir_not_followed", linked_dir_not_followed)
        await probes.run("symlinked_parent_refused", symlinked_parent_refused)
        await probes.run("work_dir_refused", work_dir_refused)
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
    async with probes.guard(), Area(sandbox, "reclaim") as area:
        await sh(
            sandbox,
            f"cd {q(area.abs)} && mkdir -p run/a/b bystander && printf x > run/a/b/f && "
            f"printf y > bystander/f && printf keep > {q(area.outside)}/keep && "
            f"ln -s {q(area.outside)} run/out && ln -s {q(area.outside)}/keep run/a/keep && "
            f"ln -s {q(area.outside)} runlink",
        )

        async def dir_gone() -> None:
            await sandbox.reclaim(area.path("run"))
            check(not await _exists(sandbox, area.absolute("run")), "directory still there")

        async def bystander_survives() -> None:
            check(await _exists(sandbox, area.absolute("bystander/f")), "bystander removed")

        async def links_not_followed() -> None:
            check(await _exists(sandbox, f"{area.outside}/keep"), "followed a link inside")

        async def link_itself_removed() -> None:
            await sandbox.reclaim(area.path("runlink"))
            check(not await _exists(sandbox, area.absolute("runlink")), "link still there")
            check(await _exists(sandbox, f"{area.outside}/keep"), "followed the link")

        async def missing_is_success() -> None:
            await sandbox.reclaim(area.path("never-created"))
            await sandbox.reclaim(area.path("never/created/either"))

        async def escapes_refused() -> None:
            await expect_raises(PathRefused, sandbox.reclaim(".."), "reclaim ..")
            await expect_raises(PathRefused, sandbox.reclaim(area.outside), "reclaim outside")
            await expect_raises(PathRefused, sandbox.reclaim("."), "reclaim the work dir")

        await probes.run("dir_gone", dir_gone)
        await probes.run("bystander_survives", bystander_survives)
        await probes.run("links_not_followed", links_not_followed)
        await probes.run("link_itself_removed", link_itself_removed)
        await probes.run("missing_is_success", missing_is_success)
        await probes.run("escapes_refused", escapes_refused)
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
        check(not await _exists(second, f"{second.work_dir}/{rel}"), "second sees first's file")
        check(not await _exists(first, f"{first.work_dir}/{rel}2"), "first sees second's file")
        check(await _cat(first, f"{first.work_dir}/{rel}") == b"one", "first lost its file")

    async def tmp_not_shared() -> None:
        await sh(first, f'printf one > "${{TMPDIR:-/tmp}}/call-scope-{tok}"')
        res = await second.exec(["sh", "-c", f'test -e "${{TMPDIR:-/tmp}}/call-scope-{tok}"'])
        check(res.exit_code != 0, "second sees first's temporary directory")
        await first.exec(["sh", "-c", f'rm -f "${{TMPDIR:-/tmp}}/call-scope-{tok}"'])

    await probes.run("distinct_sandboxes", distinct_sandboxes)
    await probes.run("files_not_shared", files_not_shared)
    await probes.run("tmp_not_shared", tmp_not_shared)
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


async def assert_files_in_conformance(sandbox: Sandbox) -> None:
    (await check_files_in(sandbox)).raise_for_failures()


async def assert_files_out_conformance(sandbox: Sandbox) -> None:
    (await check_files_out(sandbox)).raise_for_failures()


async def assert_exec_conformance(sandbox: Sandbox) -> None:
    (await check_exec(sandbox)).raise_for_failures()


async def assert_files_delete_conformance(sandbox: Sandbox) -> None:
    (await check_files_delete(sandbox)).raise_for_failures()


async def assert_reclaim_conformance(sandbox: Sandbox) -> None:
    (await check_reclaim(sandbox)).raise_for_failures()


async def assert_call_scope_conformance(first: Sandbox, second: Sandbox) -> None:
    (await check_call_scope(first, second)).raise_for_failures()


async def assert_sandbox_conformance(sandbox: Sandbox) -> None:
    """Run every single-sandbox suite; raise one error listing every failed probe of all."""
    from sandbox_operator.conformance._probe import ConformanceError, ProbeFailure

    failures: list[ProbeFailure] = []
    for report in await check_sandbox(sandbox):
        failures += [ProbeFailure(f"{report.suite}.{f.probe}", f.detail) for f in report.failures]
    if failures:
        raise ConformanceError("sandbox", failures)
