"""AcasDataPlane (the client's view of an acas sandbox) against the loopback stand-in, and the
client conformance suites through a `Sandbox` handle over it."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from sandbox_operator.acas.api import AcasClient
from sandbox_operator.acas.auth import StaticTokenProvider
from sandbox_operator.acas.config import ACAS_CAPABILITIES
from sandbox_operator.client.dataplane import DataPlane
from sandbox_operator.client.dataplane.acas import AcasDataPlane, acas_dataplane_factory
from sandbox_operator.client.errors import (
    DataPlaneError,
    ExecSetupError,
    ExecTimeout,
    OutputBudgetExceeded,
    PathRefused,
    SandboxFileNotFound,
    TransferCapExceeded,
)
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.conformance import suites
from sandbox_operator.contract import SandboxSpec
from tests.acas_standin import DEFAULT_TOKEN, StandinServer
from tests.fixtures.acas import make_config

EXEC = "SandboxLifecycleOperations_PostSandboxExecuteCommand"


@pytest.fixture
async def standin() -> AsyncIterator[StandinServer]:
    async with StandinServer() as server:
        server.state.host_paths = True  # files and executions see the same absolute paths
        yield server


@pytest.fixture
def base() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="acas-dp-")
    os.makedirs(os.path.join(path, "tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def plane(standin: StandinServer, base: str) -> AsyncIterator[AcasDataPlane]:
    client = AcasClient(
        make_config(standin.base_url, timeouts={"execute": 30}), StaticTokenProvider(DEFAULT_TOKEN)
    )
    sandbox = standin.state.seed_sandbox("sbx-remote-1")
    assert sandbox.state == "Running"
    dp = AcasDataPlane(client, "sbx-remote-1", owns_client=True, tmp_dir=os.path.join(base, "tmp"))
    yield dp
    await dp.close()


def test_is_a_dataplane(plane: AcasDataPlane) -> None:
    assert isinstance(plane, DataPlane)


async def test_exec_basics(plane: AcasDataPlane, standin: StandinServer, base: str) -> None:
    work = os.path.join(base, "work")
    res = await plane.exec(
        ["sh", "-c", 'echo "$A"; pwd; echo err >&2; exit 4'],
        cwd=work,
        create_cwd=True,
        env={"A": "x y"},
        timeout=10,
    )
    assert (res.exit_code, res.stdout, res.stderr) == (4, f"x y\n{work}\n".encode(), b"err\n")
    assert standin.state.calls[EXEC] == 1
    with pytest.raises(ExecSetupError) as info:
        await plane.exec(["true"], cwd=os.path.join(base, "missing"), timeout=5)
    assert info.value.what == "cwd"
    with pytest.raises(ExecSetupError):
        await plane.exec(["true"], cwd=work, env={"BAD-NAME": "1"}, timeout=5)


#: Every byte value, invalid UTF-8 among them, as maf's exec probe sends it.
RAW = bytes(range(256)) + b"\xe2\x82"


def _printf(raw: bytes) -> str:
    return "".join(f"\\{byte:03o}" for byte in raw)


async def test_exec_output_is_byte_exact(plane: AcasDataPlane, base: str) -> None:
    """The service's JSON strings cannot carry bytes that are not UTF-8; the wrapper's envelope
    does, so both streams come back exactly and apart, and the capture directory is gone."""
    script = f"printf '{_printf(RAW)}'; printf '{_printf(RAW[::-1])}' >&2; exit 7"
    res = await plane.exec(["sh", "-c", script], cwd=base, timeout=10)
    assert (res.exit_code, res.stdout, res.stderr) == (7, RAW, RAW[::-1])
    assert not [n for n in os.listdir(os.path.join(base, "tmp")) if n.startswith(".sbx-")]


async def test_exec_output_without_base64_in_the_image(plane: AcasDataPlane, base: str) -> None:
    """An image without ``base64`` gets its streams as ``od`` hex: still byte-exact."""
    bin_dir = os.path.join(base, "bin")
    os.makedirs(bin_dir)
    for tool in ("sh", "od", "wc", "mkdir", "rm", "rmdir", "setsid", "sleep", "cat"):
        found = shutil.which(tool)
        assert found is not None, tool
        os.symlink(found, os.path.join(bin_dir, tool))
    script = f"printf '{_printf(RAW)}'; printf 'e\\377' >&2"
    res = await plane.exec(["sh", "-c", script], cwd=base, timeout=10, env={"PATH": bin_dir})
    assert (res.exit_code, res.stdout, res.stderr) == (0, RAW, b"e\xff")


async def test_exec_stdin(plane: AcasDataPlane, base: str) -> None:
    res = await plane.exec(["wc", "-c"], stdin=b"12345", cwd=base, timeout=10)
    assert res.stdout.strip() == b"5"
    assert not [n for n in os.listdir(os.path.join(base, "tmp")) if n.startswith(".sbx-stdin")]


async def test_exec_timeout_kills_the_group(plane: AcasDataPlane, base: str) -> None:
    with pytest.raises(ExecTimeout) as info:
        await plane.exec(["sh", "-c", "echo started; sleep 30 & sleep 30"], cwd=base, timeout=0.5)
    assert info.value.kill_delivered and info.value.kill_reach == "group"
    assert info.value.stdout == b"started\n"


async def test_exec_output_budget(plane: AcasDataPlane, base: str) -> None:
    with pytest.raises(OutputBudgetExceeded):
        await plane.exec(
            ["sh", "-c", "yes | head -c 5000"], cwd=base, timeout=10, max_output_bytes=100
        )


async def test_exec_on_stopped_sandbox(plane: AcasDataPlane, standin: StandinServer) -> None:
    standin.state.sandboxes["sbx-remote-1"].state = "Stopped"
    with pytest.raises(DataPlaneError) as info:
        await plane.exec(["true"], cwd="/", timeout=5)
    assert "409" in str(info.value) and str(standin.port) not in str(info.value)


async def test_files(plane: AcasDataPlane, base: str) -> None:
    work = os.path.join(base, "work")
    await plane.write_file(work, "a/b/c.bin", bytes(range(256)))
    assert await plane.read_file(work, "a/b/c.bin", max_bytes=1000) == bytes(range(256))
    st = await plane.stat(work, "a/b/c.bin")
    assert (st.kind, st.size) == ("file", 256)
    assert [(e.name, e.kind) for e in await plane.list_dir(work, "")] == [("a", "dir")]
    with pytest.raises(TransferCapExceeded):
        await plane.read_file(work, "a/b/c.bin", max_bytes=10)
    with pytest.raises(PathRefused) as refused:
        await plane.write_file(work, "a/b/c.bin", b"x", replace=False)
    assert refused.value.rule == "exists"
    with pytest.raises(SandboxFileNotFound):
        await plane.read_file(work, "nope", max_bytes=10)
    with pytest.raises(PathRefused) as refused:
        await plane.remove(work, "a", recursive=False)
    assert refused.value.rule == "destination_is_directory"
    assert await plane.remove(work, "a", recursive=True) is True
    assert await plane.remove(work, "a", recursive=True) is False


async def test_symlinks_are_refused(plane: AcasDataPlane, base: str) -> None:
    work = os.path.join(base, "work")
    outside = os.path.join(base, "outside")
    os.makedirs(work)
    os.makedirs(outside)
    os.symlink(outside, os.path.join(work, "link"))
    os.symlink(os.path.join(outside, "f"), os.path.join(work, "flink"))
    with pytest.raises(PathRefused) as info:
        await plane.write_file(work, "link/x", b"1")
    assert info.value.rule == "symlinked_parent"
    with pytest.raises(PathRefused) as info:
        await plane.write_file(work, "flink", b"1")
    assert info.value.rule == "symlink_destination"
    assert os.listdir(outside) == []


async def test_factory(standin: StandinServer) -> None:
    client = AcasClient(make_config(standin.base_url), StaticTokenProvider(DEFAULT_TOKEN))
    try:
        factory = acas_dataplane_factory({"acas-test": client})
        obj: dict[str, Any] = {
            "status": {"backend": "acas-test", "servedBy": {"kind": "AcasSandbox", "name": "r1"}}
        }
        dp = factory(None, obj)
        assert isinstance(dp, AcasDataPlane) and dp.sandbox_id == "r1"
        with pytest.raises(DataPlaneError):
            factory(None, {"status": {"backend": "other", "servedBy": {"name": "r1"}}})
    finally:
        await client.aclose()


# -- conformance suites -----------------------------------------------------------------------


@pytest.fixture
def sandbox(plane: AcasDataPlane, base: str) -> Sandbox:
    spec = SandboxSpec.model_validate(
        {
            "kind": "acas",
            "image": "ubuntu",
            "work_dir": os.path.join(base, "work"),
            "requires": ACAS_CAPABILITIES,
        }
    )
    return Sandbox(spec, plane, name="acas-conformance")


#: The client's own suites, every probe passing: the binary ones (`exec.binary_stdin_stdout`,
#: `files_in.bytes_round_trip`, `files_out.binary_exact`) verify with `cat` over exec, which is
#: byte-exact through the wrapper's envelope (they failed while stdout came back as JSON text).
SUITES = ("check_exec", "check_files_in", "check_files_out", "check_files_delete", "check_reclaim")


@pytest.mark.parametrize("suite", SUITES)
async def test_conformance(sandbox: Sandbox, suite: str) -> None:
    report = await getattr(suites, suite)(sandbox)
    assert not report.failed, report
    assert report.passed and not report.skipped


async def test_register_acas_dataplane(standin: StandinServer) -> None:
    from kubernetes_asyncio import client as k8s

    from sandbox_operator.client import SandboxClient
    from sandbox_operator.client.dataplane.acas import acas_dataplanes

    client = AcasClient(make_config(standin.base_url), StaticTokenProvider(DEFAULT_TOKEN))
    sandbox_client = SandboxClient(
        k8s.ApiClient(), "ns", dataplanes=acas_dataplanes({"acas-test": client})
    )
    assert "AcasSandbox" in sandbox_client.dataplanes
    await sandbox_client.close()
    await client.aclose()


async def test_call_scope_conformance(standin: StandinServer, base: str) -> None:
    """Two remote sandboxes (per-call scope) do not share files or temporary directories."""
    handles = []
    client = AcasClient(make_config(standin.base_url), StaticTokenProvider(DEFAULT_TOKEN))
    try:
        for n in (1, 2):
            standin.state.seed_sandbox(f"call-{n}")
            spec = SandboxSpec.model_validate(
                {
                    "kind": "acas",
                    "image": "ubuntu",
                    "work_dir": os.path.join(base, f"call-{n}", "work"),
                    "requires": ACAS_CAPABILITIES,
                }
            )
            handles.append(Sandbox(spec, AcasDataPlane(client, f"call-{n}"), name=f"call-{n}"))
        report = await suites.check_call_scope(handles[0], handles[1])
        assert report.ok, report
    finally:
        await client.aclose()
