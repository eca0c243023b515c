"""The file suites: ``files_in``, ``files_out`` and ``files_delete`` over a live ``Sandbox``.

Each writes, reads or removes through the handle's file methods and checks the result with
``exec`` (``cat``, ``test -e``), so the spec must require ``exec`` besides the capability under
test. Escapes (``..``, absolute paths outside the work dir, backslashes, symlinked parents and
destinations, the work dir itself) must be refused with :class:`PathRefused` naming the rule and
must leave nothing behind; caps refuse rather than truncate. See
:mod:`sandbox_operator.conformance.suites` for how the suites run.
"""

from __future__ import annotations

from sandbox_operator.client.errors import PathRefused, SandboxFileNotFound, TransferCapExceeded
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.conformance._probe import (
    Area,
    ConformanceReport,
    Probes,
    cat,
    check,
    exists,
    expect_raises,
    q,
    sh,
    token,
)
from sandbox_operator.contract import Capability

BINARY = bytes(range(256)) * 64 + b"\x00\r\n\x1b\xff" * 100
TEXT = "héllo wörld ✓ 🎉 — ünïcode\nline two\r\n"

#: Exact-size, random, empty and nested files, and links: to a file outside, to the outside
#: directory, and a relative one to a file inside.
_OUT_FIXTURE = (
    "printf 'exactly 17 bytes\\n' > f.txt && head -c 300000 /dev/urandom > rand.bin && "
    ": > empty && mkdir -p sub/inner && printf inner > sub/inner/i.txt && "
    'printf secret > "$OUT/secret" && ln -s "$OUT/secret" link && ln -s "$OUT" linkdir && '
    "ln -s f.txt rel-link"
)

#: A file, a tree, an empty directory, links to a file and the directory outside, and a
#: directory holding a link out.
_DELETE_FIXTURE = (
    "printf x > f && mkdir -p d/e && printf y > d/e/g && mkdir empty && "
    'printf keep > "$OUT/keep" && ln -s "$OUT/keep" link && ln -s "$OUT" linkdir && '
    'mkdir holder && ln -s "$OUT" holder/out'
)


# ------------------------------------------------------------------------------------------------
# files in


async def check_files_in(sandbox: Sandbox) -> ConformanceReport:
    """Writes land, bytes round-trip, UTF-8 text, replace, parents created, every escape refused
    with nothing created, caps refuse."""
    probes = Probes("files_in")
    if not await probes.gate(sandbox, Capability.FILES_IN):
        return probes.done()
    async with probes.guard(), Area(sandbox, "in") as area:

        async def writes_land() -> None:
            await sandbox.write_file(area.path("a.txt"), b"hello")
            check(await cat(sandbox, area.absolute("a.txt")) == b"hello", "content differs")

        async def bytes_round_trip() -> None:
            await sandbox.write_file(area.path("b.bin"), BINARY)
            got = await cat(sandbox, area.absolute("b.bin"))
            check(got == BINARY, f"binary content differs ({len(got)} vs {len(BINARY)} bytes)")

        async def empty_file() -> None:
            await sandbox.write_file(area.path("empty"), b"")
            check(await cat(sandbox, area.absolute("empty")) == b"", "empty file not empty")

        async def utf8_text() -> None:
            await sandbox.write_file(area.path("t.txt"), TEXT)
            check(await cat(sandbox, area.absolute("t.txt")) == TEXT.encode(), "text differs")

        async def absolute_inside_work_dir() -> None:
            await sandbox.write_file(area.absolute("abs.txt"), b"abs")
            check(await cat(sandbox, area.absolute("abs.txt")) == b"abs", "content differs")

        async def replace() -> None:
            await sandbox.write_file(area.path("r.txt"), b"first version, longer")
            await sandbox.write_file(area.path("r.txt"), b"second")
            check(await cat(sandbox, area.absolute("r.txt")) == b"second", "not replaced")

        async def no_replace_refused() -> None:
            await sandbox.write_file(area.path("n.txt"), b"keep")
            await expect_raises(
                PathRefused,
                sandbox.write_file(area.path("n.txt"), b"other", replace=False),
                "replace=False over an existing file",
                rule="exists",
            )
            check(await cat(sandbox, area.absolute("n.txt")) == b"keep", "existing overwritten")

        async def parents_created() -> None:
            await sandbox.write_file(area.path("p/q/r/deep.txt"), b"deep")
            check(await cat(sandbox, area.absolute("p/q/r/deep.txt")) == b"deep", "not written")

        await probes.run_all(writes_land, bytes_round_trip, empty_file, utf8_text)
        await probes.run_all(absolute_inside_work_dir, replace, no_replace_refused, parents_created)

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

        async def escapes_created_nothing() -> None:
            res = await sh(sandbox, f"ls -A {q(area.outside)}")
            names = sorted(res.stdout_text.split())
            check(names == ["target"], f"outside dir holds {names}")
            check(
                await cat(sandbox, f"{area.outside}/target") == b"original",
                "symlink target was written through",
            )
            parent = sandbox.work_dir.rsplit("/", 1)[0] or "/"
            check(
                not await exists(sandbox, f"{parent}/escape-{tok}"),
                "traversal created a file above the work dir",
            )

        async def cap_per_file_refused() -> None:
            cap = sandbox.spec.files_in.max_bytes_per_file
            await expect_raises(
                TransferCapExceeded,
                sandbox.write_file(area.path("big"), b"x" * (cap + 1)),
                "write above filesIn.maxBytesPerFile",
                cap="max_bytes_per_file",
            )
            check(not await exists(sandbox, area.absolute("big")), "capped file was created")

        async def cap_count_refused() -> None:
            limit = sandbox.spec.files_in.max_files
            files = {area.path(f"many/{i}"): b"" for i in range(limit + 1)}
            await expect_raises(
                TransferCapExceeded,
                sandbox.write_files(files),
                "write_files above filesIn.maxFiles",
                cap="max_files",
            )
            check(
                not await exists(sandbox, area.absolute("many")), "part of a refused batch landed"
            )

        await probes.run_all(escapes_created_nothing, cap_per_file_refused, cap_count_refused)
    return probes.done()


# ------------------------------------------------------------------------------------------------
# files out


async def check_files_out(sandbox: Sandbox) -> ConformanceReport:
    """Exact sizes, symlinks stat as symlinks and are unreadable, linked parent and work dir
    refused, caps refuse rather than truncate, listing (when files_list is required)."""
    probes = Probes("files_out")
    if not await probes.gate(sandbox, Capability.FILES_OUT):
        return probes.done()
    async with probes.guard(), Area(sandbox, "out", setup=_OUT_FIXTURE) as area:

        async def exact_size() -> None:
            st = await sandbox.stat(area.path("f.txt"))
            check(st.kind == "file" and st.size == 17, f"stat says {st}")
            data = await sandbox.read_file(area.path("f.txt"))
            check(data == b"exactly 17 bytes\n", f"read {data!r}")

        async def binary_exact() -> None:
            want = await cat(sandbox, area.absolute("rand.bin"))
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

        await probes.run_all(exact_size, binary_exact, empty_file, directory_stat)
        await probes.run_all(symlink_stat_as_symlink, symlink_unreadable, linked_parent_refused)
        await probes.run_all(work_dir_refused, escapes_refused, directory_unreadable)
        await probes.run_all(missing_not_found, cap_refuses_not_truncates)

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

            await probes.run_all(listing, listing_linked_dir_refused)
        else:
            await probes.refuses(sandbox, Capability.FILES_LIST)
    return probes.done()


# ------------------------------------------------------------------------------------------------
# files delete


async def check_files_delete(sandbox: Sandbox) -> ConformanceReport:
    """Remove files and directories; links removed, never followed; missing is success;
    symlinked parents and the work dir refused."""
    probes = Probes("files_delete")
    if not await probes.gate(sandbox, Capability.FILES_DELETE):
        return probes.done()
    async with probes.guard(), Area(sandbox, "del", setup=_DELETE_FIXTURE) as area:

        async def remove_file() -> None:
            check(await sandbox.remove(area.path("f")) is True, "remove returned False")
            check(not await exists(sandbox, area.absolute("f")), "file still there")

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
            check(await exists(sandbox, area.absolute("d/e/g")), "dir content removed")
            await expect_raises(
                PathRefused,
                sandbox.remove(area.path("empty")),
                "non-recursive remove of an empty dir",
                rule="destination_is_directory",
            )
            check(await exists(sandbox, area.absolute("empty")), "empty dir removed")

        async def recursive() -> None:
            check(await sandbox.remove(area.path("d"), recursive=True), "returned False")
            check(not await exists(sandbox, area.absolute("d")), "dir still there")

        async def link_not_followed() -> None:
            check(await sandbox.remove(area.path("link")), "returned False")
            check(not await exists(sandbox, area.absolute("link")), "link still there")
            check(await exists(sandbox, f"{area.outside}/keep"), "link target removed")

        async def linked_dir_not_followed() -> None:
            await sandbox.remove(area.path("linkdir"), recursive=True)
            check(not await exists(sandbox, area.absolute("linkdir")), "link still there")
            check(await exists(sandbox, f"{area.outside}/keep"), "followed the dir link")
            await sandbox.remove(area.path("holder"), recursive=True)
            check(await exists(sandbox, f"{area.outside}/keep"), "followed a link inside")

        async def symlinked_parent_refused() -> None:
            await sh(sandbox, f"ln -sfn {q(area.outside)} {q(area.absolute('linkdir2'))}")
            await expect_raises(
                PathRefused,
                sandbox.remove(area.path("linkdir2/keep")),
                "remove through a symlinked parent",
                rule="symlinked_parent",
            )
            check(await exists(sandbox, f"{area.outside}/keep"), "removed through the link")

        async def work_dir_refused() -> None:
            await expect_raises(PathRefused, sandbox.remove(".", recursive=True), "remove .")
            await expect_raises(
                PathRefused, sandbox.remove(sandbox.work_dir, recursive=True), "remove work dir"
            )
            await expect_raises(PathRefused, sandbox.remove("..", recursive=True), "remove ..")

        await probes.run_all(remove_file, missing_is_success, dir_needs_recursive, recursive)
        await probes.run_all(link_not_followed, linked_dir_not_followed)
        await probes.run_all(symlinked_parent_refused, work_dir_refused)
    return probes.done()
