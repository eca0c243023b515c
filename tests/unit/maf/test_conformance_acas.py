"""maf-sandbox's own conformance suites against :class:`OperatorSandbox` over the client's ACA
data plane (:class:`~sandbox_operator.client.dataplane.acas.AcasDataPlane`), on the stand-in in
its ``rooted`` mode: each remote sandbox's directory is its ``/`` for the file API and for
executions alike (chrooted), so the suites' absolute paths mean one thing on both surfaces and
two sandboxes share nothing. The capabilities are what ``OperatorBackend`` declares for an acas
backend with the operator's default declarations: RECLAIM is withheld (``RECLAIM_WITHHELD``).

The same suites run through the operator and maf's router in ``tests/maf/test_conformance_acas.py``;
this is the fast check of the data plane's scripts and the wrapper's path handling."""

from __future__ import annotations

import os
import posixpath
from collections.abc import AsyncIterator

import maf_sandbox as maf
import pytest
from maf_sandbox import conformance

from sandbox_operator.acas.api import AcasClient
from sandbox_operator.acas.auth import StaticTokenProvider
from sandbox_operator.acas.config import default_declarations
from sandbox_operator.client.dataplane.acas import AcasDataPlane
from sandbox_operator.contract.published import PublishedBackend
from sandbox_operator.maf import OperatorSandbox, declarations
from tests.acas_standin import DEFAULT_TOKEN, StandinServer
from tests.fixtures.acas import make_config

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the rooted stand-in needs root (unshare, mount, chroot)"
)

WORK = "/maf-sandbox/work"
#: What OperatorBackend declares for an acas backend with the default declarations.
DECLARED = declarations(
    PublishedBackend(
        name="acas", type="acas", isolation="microvm", declarations=default_declarations()
    )
)
CAPABILITIES = DECLARED.capabilities


def _spec(**fields: object) -> maf.SandboxSpec:
    requires = CAPABILITIES & {
        maf.Capability.EXEC,
        maf.Capability.FILES_IN,
        maf.Capability.FILES_OUT,
        maf.Capability.FILES_LIST,
        maf.Capability.FILES_DELETE,
    }
    return maf.SandboxSpec(kind="conformance", requires=requires, **fields)  # type: ignore[arg-type]


@pytest.fixture
async def standin() -> AsyncIterator[StandinServer]:
    async with StandinServer() as server:
        server.state.rooted = True
        yield server


@pytest.fixture
async def client(standin: StandinServer) -> AsyncIterator[AcasClient]:
    acas = AcasClient(
        make_config(standin.base_url, timeouts={"execute": 60}), StaticTokenProvider(DEFAULT_TOKEN)
    )
    yield acas
    await acas.aclose()


async def _sandbox(
    standin: StandinServer, client: AcasClient, name: str, **fields: object
) -> OperatorSandbox:
    standin.state.seed_sandbox(name)
    spec = _spec(**fields)
    plane = AcasDataPlane(client, name)
    sandbox = OperatorSandbox(
        plane, spec, base=spec.work_dir or WORK, instance_id=name, reclaims=False
    )
    await sandbox.prepare()
    return sandbox


@pytest.fixture
async def subject(standin: StandinServer, client: AcasClient) -> conformance.PosixGuestSubject:
    sandbox = await _sandbox(standin, client, "sbx-1")
    return conformance.PosixGuestSubject(
        sandbox, f"{WORK}/probes/work", CAPABILITIES, exec_timeout=20
    )


def test_declarations() -> None:
    assert maf.Capability.RECLAIM not in CAPABILITIES
    assert maf.Capability.FILES_DELETE in CAPABILITIES


async def test_files_in(subject: conformance.PosixGuestSubject) -> None:
    await conformance.assert_files_in_conformance(subject)


async def test_files_out(subject: conformance.PosixGuestSubject) -> None:
    await conformance.assert_files_out_conformance(subject)


async def test_files_delete(subject: conformance.PosixGuestSubject) -> None:
    await conformance.assert_files_delete_conformance(subject)


async def test_reach(subject: conformance.PosixGuestSubject) -> None:
    await conformance.assert_reach_conformance(subject)


async def test_exec(subject: conformance.PosixGuestSubject) -> None:
    await conformance.assert_exec_conformance(subject)


async def test_reclaim_is_not_declared(subject: conformance.PosixGuestSubject) -> None:
    """maf's reclaim suite refuses a capability the backend does not declare."""
    with pytest.raises(Exception, match="RECLAIM"):
        await conformance.assert_reclaim_conformance(subject)


@pytest.mark.parametrize("work_dir", [None, "/opt/maf-explicit/work"], ids=["allocated", "image"])
async def test_storage_base(
    standin: StandinServer, client: AcasClient, work_dir: str | None
) -> None:
    sandbox = await _sandbox(standin, client, "sbx-base", work_dir=work_dir)
    await conformance.assert_storage_base_conformance(sandbox, CAPABILITIES)


async def test_program_channel(standin: StandinServer, client: AcasClient) -> None:
    sandbox = await _sandbox(standin, client, "sbx-channel")
    await conformance.assert_program_channel_conformance(
        sandbox, maf.ExecProgramChannel(), guest_call_path=posixpath.join(sandbox.base, "call")
    )


async def test_call_scope(standin: StandinServer, client: AcasClient) -> None:
    """Two remote sandboxes share no filesystem (the stand-in's rooted mode gives each its own)."""
    this = await _sandbox(standin, client, "call-1")
    spec_other: list[OperatorSandbox] = []

    async def acquire_another() -> conformance.ConformanceSubject:
        other = await _sandbox(standin, client, "call-2")
        spec_other.append(other)
        return conformance.PosixGuestSubject(other, WORK, CAPABILITIES, exec_timeout=20)

    async def dispose(name: str) -> None:
        standin.state.remove(name)

    subject = conformance.PosixGuestSubject(this, WORK, CAPABILITIES, exec_timeout=20)
    await conformance.assert_call_scope_conformance(
        subject, acquire_another, lambda: dispose("call-1"), lambda: dispose("call-2")
    )
