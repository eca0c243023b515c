"""The Sandbox handle over a local data plane: gating, caps, exec semantics, files."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sandbox_operator.client import (
    CapabilityNotRequired,
    ExecSetupError,
    ExecTimeout,
    OutputBudgetExceeded,
    PathRefused,
    Sandbox,
    SandboxFileNotFound,
    TransferCapExceeded,
)
from sandbox_operator.contract import Capability
from sandbox_operator.testing.fakes import local_sandbox


@pytest.fixture
def sb(tmp_path: Path) -> Sandbox:
    return local_sandbox(
        root=str(tmp_path),
        files_in={"max_bytes_per_file": 1000, "max_total_bytes": 1500, "max_files": 3},
        files_out={"max_bytes_per_file": 1000, "max_total_bytes": 1500, "max_files": 3},
    )


GATED = [
    ("exec", Capability.EXEC, lambda s: s.exec(["true"])),
    ("run_code", Capability.RUN_CODE, lambda s: s.run_code("print(1)")),
    ("write_file", Capability.FILES_IN, lambda s: s.write_file("a", b"")),
    ("write_files", Capability.FILES_IN, lambda s: s.write_files({"a": b""})),
    ("read_file", Capability.FILES_OUT, lambda s: s.read_file("a")),
    ("stat", Capability.FILES_OUT, lambda s: s.stat("a")),
    ("list_dir", Capability.FILES_LIST, lambda s: s.list_dir()),
    ("remove", Capability.FILES_DELETE, lambda s: s.remove("a")),
]


@pytest.mark.parametrize(("method", "cap", "call"), GATED, ids=[g[0] for g in GATED])
async def test_methods_gated_by_required_capabilities(
    tmp_path: Path, method: str, cap: Capability, call: object
) -> None:
    others = frozenset(Capability) - {cap}
    sb = local_sandbox(root=str(tmp_path), requires=others)
    with pytest.raises(CapabilityNotRequired) as info:
        await call(sb)  # type: ignore[operator]
    assert info.value.capability == cap.value
    assert info.value.method == method
    assert cap.value in str(info.value) and method in str(info.value)


async def test_reclaim_needs_no_capability(tmp_path: Path) -> None:
    sb = local_sandbox(root=str(tmp_path), requires=frozenset())
    (tmp_path / "work" / "run").mkdir(parents=True)
    await sb.reclaim("run")
    assert not (tmp_path / "work" / "run").exists()
    await sb.reclaim("run")  # missing is success


async def test_argv_verbatim_and_shell_string(sb: Sandbox) -> None:
    res = await sb.exec(["echo", "a b$(echo x)c"])
    assert res.stdout == b"a b$(echo x)c\n"
    assert res.stdout_text == "a b$(echo x)c\n"
    res = await sb.exec("echo a b$(echo x)c")
    assert res.stdout == b"a bxc\n"


async def test_exec_exit_stdin_env_cwd(sb: Sandbox) -> None:
    res = await sb.exec(["sh", "-c", "cat; echo $V >&2; pwd; exit 4"], stdin="in", env={"V": "v"})
    assert res.exit_code == 4 and not res.ok
    assert res.stdout == b"in" + (sb.work_dir + "\n").encode()
    assert res.stderr == b"v\n"


async def test_exec_refuses_bad_env_and_cwd(sb: Sandbox) -> None:
    with pytest.raises(ExecSetupError) as info:
        await sb.exec(["true"], env={"A B": "x"})
    assert info.value.what == "env"
    with pytest.raises(ExecSetupError) as info:
        await sb.exec(["true"], cwd="/nonexistent-dir-xyz")
    assert info.value.what == "cwd"
    with pytest.raises(PathRefused):
        await sb.exec(["true"], cwd="../up")


async def test_timeout_kills_and_keeps_partial_output(sb: Sandbox) -> None:
    start = time.monotonic()
    with pytest.raises(ExecTimeout) as info:
        await sb.exec(["sh", "-c", "echo partial; sleep 60"], timeout=0.5)
    assert time.monotonic() - start < 5
    assert info.value.stdout == b"partial\n"
    assert info.value.kill_delivered is True
    assert info.value.kill_reach == "group"


async def test_output_budget_raises_not_truncates(sb: Sandbox) -> None:
    with pytest.raises(OutputBudgetExceeded) as info:
        await sb.exec(["sh", "-c", "yes | head -c 500000"], max_output_bytes=1000)
    assert info.value.budget == 1000
    res = await sb.exec(["sh", "-c", "yes | head -c 1000"], max_output_bytes=1000)
    assert len(res.stdout) == 1000


async def test_run_code(sb: Sandbox) -> None:
    res = await sb.run_code("import sys\nprint(sum(range(10)))\nsys.exit(3)")
    assert (res.stdout, res.exit_code) == (b"45\n", 3)
    res = await sb.run_code("echo $((6*7))", language="sh")
    assert res.stdout == b"42\n"
    with pytest.raises(ExecSetupError):
        await sb.run_code("x", language="cobol")


async def test_write_read_round_trip(sb: Sandbox) -> None:
    data = bytes(range(256)) * 3
    await sb.write_file("x/y.bin", data)
    assert await sb.read_file("x/y.bin") == data
    assert (await sb.stat("x/y.bin")).size == len(data)
    await sb.write_file("t.txt", "héllo")
    assert await sb.read_text("t.txt") == "héllo"
    assert [e.name for e in await sb.list_dir()] == ["t.txt", "x"]
    assert await sb.exists("t.txt") and not await sb.exists("nope")


async def test_files_in_caps_refuse_before_sending(sb: Sandbox, tmp_path: Path) -> None:
    with pytest.raises(TransferCapExceeded) as info:
        await sb.write_file("big", b"x" * 1001)
    assert (info.value.direction, info.value.cap, info.value.limit) == (
        "filesIn",
        "max_bytes_per_file",
        1000,
    )
    with pytest.raises(TransferCapExceeded) as info:
        await sb.write_files({"a": b"x" * 800, "b": b"x" * 800})
    assert info.value.cap == "max_total_bytes"
    with pytest.raises(TransferCapExceeded) as info:
        await sb.write_files({str(i): b"" for i in range(4)})
    assert info.value.cap == "max_files"
    assert not (tmp_path / "work" / "a").exists()
    assert not (tmp_path / "work" / "0").exists()


async def test_read_caps_refuse_not_truncate(sb: Sandbox, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "big").write_bytes(b"x" * 1001)
    (work / "mid").write_bytes(b"x" * 600)
    with pytest.raises(TransferCapExceeded) as info:
        await sb.read_file("big")
    assert (info.value.direction, info.value.cap, info.value.actual) == (
        "filesOut",
        "max_bytes_per_file",
        1001,
    )
    with pytest.raises(TransferCapExceeded) as info:
        await sb.read_file("mid", max_bytes=599)
    assert (info.value.direction, info.value.limit) == ("read", 599)
    assert len(await sb.read_file("mid", max_bytes=600)) == 600


async def test_symlinks_refused_and_not_followed(sb: Sandbox, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "ld").symlink_to(outside)
    (work / "lf").symlink_to(outside / "secret")
    for path, rule in [("ld/x", "symlinked_parent"), ("lf", "symlink_destination")]:
        with pytest.raises(PathRefused) as info:
            await sb.write_file(path, b"pwned")
        assert info.value.rule == rule
    assert (outside / "secret").read_text() == "s"
    assert not (outside / "x").exists()
    assert (await sb.stat("lf")).kind == "symlink"
    with pytest.raises(PathRefused):
        await sb.read_file("lf")
    assert await sb.remove("lf") is True
    assert (outside / "secret").exists()
    with pytest.raises(SandboxFileNotFound):
        await sb.read_file("missing")
    assert await sb.remove("missing/deeper") is False


async def test_symlinked_work_dir_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    sb = local_sandbox(root=str(tmp_path))
    (tmp_path / "work").symlink_to(real)
    with pytest.raises(PathRefused) as info:
        await sb.write_file("a", b"x")
    assert info.value.rule == "symlinked_work_dir"
    assert not (real / "a").exists()
