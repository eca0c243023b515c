"""maf-sandbox's own conformance suites against :class:`OperatorSandbox` over the client's local
data plane (commands are local processes in a temp directory): the wrapper's maf semantics and
our data plane's scripts, checked without a cluster."""

from __future__ import annotations

import os
import posixpath
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import maf_sandbox as maf
import pytest
from maf_sandbox import conformance

from sandbox_operator.client.dataplane import local_dataplane
from sandbox_operator.maf import OperatorSandbox

ALL_FILES = frozenset(
    {
        maf.Capability.EXEC,
        maf.Capability.FILES_IN,
        maf.Capability.FILES_OUT,
        maf.Capability.FILES_LIST,
        maf.Capability.FILES_DELETE,
        maf.Capability.RECLAIM,
    }
)


def _spec(work_dir: str | None) -> maf.SandboxSpec:
    return maf.SandboxSpec(
        kind="conformance", work_dir=work_dir, requires=ALL_FILES - {maf.Capability.RECLAIM}
    )


async def _sandbox(root: str, work_dir: str | None = None) -> OperatorSandbox:
    base = posixpath.join(root, "base") if work_dir is None else work_dir
    plane = local_dataplane({"TMPDIR": root})
    sandbox = OperatorSandbox(plane, _spec(work_dir), base=base, instance_id="local")
    await sandbox.prepare()
    return sandbox


@pytest.fixture
def root(tmp_path: Path) -> str:
    """The temp dir, resolved: one reached through a link (macOS /var) is refused as one."""
    return os.path.realpath(tmp_path)


@pytest.fixture
async def subject(root: str) -> AsyncIterator[conformance.PosixGuestSubject]:
    work = posixpath.join(root, "maf-sandbox", "work")
    sandbox = await _sandbox(root, work)
    yield conformance.PosixGuestSubject(sandbox, work, ALL_FILES, exec_timeout=20)
    await sandbox.dataplane.close()


async def test_files_in(subject: conformance.PosixGuestSubject) -> None:
    await conformance.assert_files_in_conformance(subject)


async def test_files_out(subject: conformance.PosixGuestSubject) -> None:
    await conformance.assert_files_out_conformance(subject)


async def test_files_delete(subject: conformance.PosixGuestSubject) -> None:
    await conformance.assert_files_delete_conformance(subject)


async def test_exec(subject: conformance.PosixGuestSubject) -> None:
    await conformance.assert_exec_conformance(subject)


async def test_reclaim(subject: conformance.PosixGuestSubject) -> None:
    await conformance.assert_reclaim_conformance(subject)


async def test_reach(subject: conformance.PosixGuestSubject) -> None:
    await conformance.assert_reach_conformance(subject)


@pytest.mark.parametrize("explicit", [False, True])
async def test_storage_base(root: str, explicit: bool) -> None:
    work_dir = posixpath.join(root, "image", "work") if explicit else None
    sandbox = await _sandbox(root, work_dir)
    try:
        await conformance.assert_storage_base_conformance(sandbox, ALL_FILES)
        listed = await sandbox.dataplane.exec(["test", "-d", sandbox.base], cwd="/", timeout=10)
        assert listed.exit_code == 0, "the storage base is not a directory"
    finally:
        await sandbox.dataplane.close()


async def test_program_channel(root: str) -> None:
    sandbox = await _sandbox(root)
    try:
        await conformance.assert_program_channel_conformance(
            sandbox, maf.ExecProgramChannel(), guest_call_path=posixpath.join(sandbox.base, "call")
        )
    finally:
        await sandbox.dataplane.close()


class CountingPlane:
    """A data plane recording how many round trips each method costs."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return await method(*args, **kwargs)

        return call


async def test_a_file_method_costs_two_round_trips_whatever_the_depth(root: str) -> None:
    plane = CountingPlane(local_dataplane({"TMPDIR": root}))
    work = posixpath.join(root, "a", "b", "c", "work")
    sandbox = OperatorSandbox(plane, _spec(work), base=work, instance_id="local")
    await sandbox.prepare()
    plane.calls.clear()
    await sandbox.write_file("d/e/f/g.txt", b"x", working_directory=".")
    assert plane.calls == ["exec", "write_file"]  # one batch of stats, one write
    plane.calls.clear()
    assert await sandbox.read_file("d/e/f/g.txt", working_directory=".", max_bytes=8) == b"x"
    assert plane.calls == ["exec", "read_file"]
    await plane.inner.close()


class FailingPlane:
    """A data plane whose every exec raises ``error`` (what a served plane raises)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def exec(self, *args: Any, **kwargs: Any) -> Any:
        raise self.error

    async def close(self) -> None:
        return None


def _run_code_sandbox(error: BaseException) -> OperatorSandbox:
    spec = maf.SandboxSpec(
        kind="queued", requires=frozenset({maf.Capability.EXEC, maf.Capability.RUN_CODE})
    )
    return OperatorSandbox(
        FailingPlane(error),  # type: ignore[arg-type]
        spec,
        base="/maf-sandbox/work",
        instance_id="x",
    )


async def test_a_bound_spent_waiting_for_the_sandbox_is_maf_queued_timeout() -> None:
    """#25 item 9: the client's ExecQueuedTimeout (nothing ran) is maf's SandboxQueuedTimeout,
    so a kind tells the model to retry unchanged rather than to make the program smaller."""
    from sandbox_operator.client.errors import ExecQueuedTimeout, ExecTimeout

    queued = ExecQueuedTimeout(argv=("python3", "-"), timeout=1.0, waited=1.0, waited_for="resume")
    with pytest.raises(maf.SandboxQueuedTimeout):
        await _run_code_sandbox(queued).run_code("print(1)", timeout=1.0)
    overran = ExecTimeout(
        argv=("python3", "-"),
        timeout=1.0,
        stdout=b"",
        stderr=b"",
        kill_delivered=True,
        kill_reach="group",
    )
    with pytest.raises(TimeoutError) as caught:
        await _run_code_sandbox(overran).run_code("print(1)", timeout=1.0)
    assert not isinstance(caught.value, maf.SandboxQueuedTimeout)
