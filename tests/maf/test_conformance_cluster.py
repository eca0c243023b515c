"""maf-sandbox's own conformance suites (``maf_sandbox.conformance``) against this operator on the
real local cluster, once on runc and once on gVisor (conftest: one operator per runtime), and on
Kata where the cluster has it (skipped here: no hardware virtualisation), through
``maf_sandbox.SandboxRouter`` over :class:`~sandbox_operator.maf.OperatorBackend`.

Every suite the backend's declarations call for runs; a probe maf skips says why in pytest's
warnings summary (``ProbeSkipped``). The guest-facing suites share one sandbox, the EXEC suite
last (it may leave the sandbox busy); the suites that need fresh instances acquire their own.
"""

from __future__ import annotations

import socket
import warnings
from collections.abc import Awaitable, Callable

import maf_sandbox as maf
import pytest
from maf_sandbox import conformance
from tests.fixtures.egress_probe import BRIDGE_GATEWAY
from tests.fixtures.maf_cluster import Served, assert_call_scope, assert_program_channel
from tests.fixtures.maf_fingerprint import NodeFingerprintSubject

from sandbox_operator.maf import OperatorBackend, sandbox_instance_id

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FILE_CAPABILITIES = frozenset(
    {
        maf.Capability.EXEC,
        maf.Capability.FILES_IN,
        maf.Capability.FILES_OUT,
        maf.Capability.FILES_LIST,
        maf.Capability.FILES_DELETE,
    }
)
#: The probes' working directory: inside the spec's work dir (maf's default), because the
#: suites plant their "outside" secrets in its sibling (``<work>-outside``) and this operator's
#: pods have a read-only root filesystem (only the work dir's volume and /tmp are writable).
BASE = "/maf-sandbox/work"
WORK = f"{BASE}/probes/work"


def spec_for(
    backend: OperatorBackend, kind: str = "conformance", **fields: object
) -> maf.SandboxSpec:
    """A spec requiring what the suites exercise, of what the backend declares."""
    requires = FILE_CAPABILITIES & backend.declarations.capabilities
    return maf.SandboxSpec(kind=kind, requires=requires, **fields)  # type: ignore[arg-type]


class ProbeSkipped(UserWarning):
    """A maf probe that did not run on this backend, with maf's reason (pytest's warnings
    summary shows it, so a skip is never silent)."""


def report(suite: str, results: tuple[conformance.ProbeResult, ...]) -> list[str]:
    """Warn of each skipped probe with maf's reason; the failures as lines."""
    for r in results:
        if r.skipped is not None:
            warnings.warn(f"{suite}: probe {r.probe.name} skipped: {r.skipped}", ProbeSkipped, 2)
    return [f"{suite}/{r.probe.name}: {r.failure}" for r in results if r.failure is not None]


async def test_guest_suites_on_one_sandbox(
    served: Served, backend: OperatorBackend, router: maf.SandboxRouter, key: maf.SandboxKey
) -> None:
    """files in/out/delete, list (inside files out), reclaim, reach, then exec, on one sandbox
    acquired through the router; every failing probe is reported, not only the first suite's."""
    sandbox = await router.acquire(key, spec_for(backend))
    try:
        capabilities = backend.declarations.capabilities
        subject = conformance.PosixGuestSubject(sandbox, WORK, capabilities, exec_timeout=60)
        runs: list[tuple[str, Callable[[], Awaitable[tuple[conformance.ProbeResult, ...]]]]] = [
            ("FILES_IN", lambda: conformance.run_files_in_probes(subject)),
            ("FILES_OUT", lambda: conformance.run_files_out_probes(subject)),
            ("FILES_DELETE", lambda: conformance.run_files_delete_probes(subject)),
            ("RECLAIM", lambda: conformance.run_reclaim_probes(subject)),
            ("REACH", lambda: conformance.run_reach_probes(subject)),
            ("EXEC", lambda: conformance.run_exec_probes(subject)),
        ]
        failures: list[str] = []
        for suite, run in runs:
            failures += report(suite, await run())
        assert not failures, f"{len(failures)} probes failed on {served.runtime}:\n" + "\n".join(
            failures
        )
    finally:
        await router.dispose(key)


@pytest.mark.parametrize("work_dir", [None, "/opt/maf-explicit/work"], ids=["allocated", "image"])
async def test_storage_base(
    backend: OperatorBackend, router: maf.SandboxRouter, key: maf.SandboxKey, work_dir: str | None
) -> None:
    sandbox = await router.acquire(key, spec_for(backend, work_dir=work_dir))
    try:
        await conformance.assert_storage_base_conformance(
            sandbox, backend.declarations.capabilities
        )
    finally:
        await router.dispose(key)


async def test_fresh_acquire(backend: OperatorBackend, key: maf.SandboxKey) -> None:
    """A new instance reports fresh; a reacquire resumes it and does not."""
    spec = spec_for(backend, kind="fresh")
    first = await backend.acquire(key, spec)
    try:
        await conformance.assert_fresh_acquire_conformance(
            first, lambda: backend.acquire(key, spec)
        )
    finally:
        assert await backend.dispose(key) is None


async def test_instance_disposal(backend: OperatorBackend, key: maf.SandboxKey) -> None:
    """Disposing one instance by id, twice, removes it and keeps its sibling: the same key's
    other kind (another sandbox: maf's ``dispose(key, kind=...)`` addresses one of several),
    observed through the API server (the Sandbox objects' instance ids)."""
    first = await backend.acquire(key, spec_for(backend, kind="first"))
    try:
        sibling = await backend.acquire(key, spec_for(backend, kind="second"))

        async def exists(identity: str) -> bool:
            listing = await backend.client.custom.list_namespaced_custom_object(
                "sandbox-operator.dev", "v1alpha1", backend.client.namespace, "sandboxes"
            )
            return any(
                sandbox_instance_id(item) == identity
                and not item["metadata"].get("deletionTimestamp")
                for item in listing["items"]
            )

        await conformance.assert_instance_disposal_conformance(
            backend, key, "first", first.instance_id, [sibling.instance_id], exists
        )
    finally:
        assert await backend.dispose(key) is None


async def test_call_scope(
    backend: OperatorBackend, router: maf.SandboxRouter, key: maf.SandboxKey
) -> None:
    """Two calls of one conversation get two sandboxes that share nothing (declared: call)."""
    spec = spec_for(backend, kind="per-call", isolation_scope=maf.IsolationScope.CALL)
    await assert_call_scope(backend, router, key, spec, BASE)


async def test_program_channel(
    backend: OperatorBackend, router: maf.SandboxRouter, key: maf.SandboxKey
) -> None:
    await assert_program_channel(router, key, spec_for(backend))


async def test_egress_closed_reaches_nothing(
    backend: OperatorBackend, router: maf.SandboxRouter, key: maf.SandboxKey
) -> None:
    """maf's default egress (closed) on this backend: the guest cannot open a connection to the
    node's API server port on the pod bridge, which this test process itself can reach (the
    positive control). maf has no closed-egress suite; this is the probe for it."""
    port = 6443
    with socket.create_connection((BRIDGE_GATEWAY, port), timeout=5):
        pass  # reachable from the node: what the sandbox must not reach
    spec = spec_for(backend)
    assert spec.egress is maf.Egress.CLOSED
    sandbox = await router.acquire(key, spec)
    try:
        program = (
            "import socket,sys\n"
            "try:\n"
            f"    socket.create_connection(({BRIDGE_GATEWAY!r}, {port}), timeout=3)\n"
            "except OSError as e:\n"
            "    print('refused', type(e).__name__); sys.exit(0)\n"
            "print('connected'); sys.exit(3)\n"
        )
        result = await sandbox.exec(["python3", "-c", program], working_directory=".", timeout=30)
        assert result.exit_code == 0 and "refused" in result.stdout, result
    finally:
        await router.dispose(key)


async def test_nothing_left_behind(
    served: Served, backend: OperatorBackend, router: maf.SandboxRouter, key: maf.SandboxKey
) -> None:
    """A call (write an input, run a program over it, read its output, delete the call's
    directory) leaves no changed path and no process behind, as the node sees the pod."""
    sandbox = await router.acquire(key, spec_for(backend))
    try:
        subject = NodeFingerprintSubject(sandbox)

        async def call() -> None:
            await sandbox.write_file("call/in.txt", b"4 5\n", working_directory=".")
            run = await sandbox.exec(
                ["sh", "-c", "read a b < call/in.txt; echo $((a*b)) > call/out.txt"],
                working_directory=".",
                timeout=60,
            )
            assert run.exit_code == 0, run
            out = await sandbox.read_file("call/out.txt", working_directory=".", max_bytes=64)
            assert out == b"20\n"
            await sandbox.remove("call", working_directory=".", recursive=True)

        results = await conformance.assert_nothing_left_behind(subject, call)
        skipped = [r.skipped for r in results if r.skipped]
        if skipped:
            pytest.skip(f"{served.runtime}: {skipped[0]}: {subject.unsupported_reason}")
        if subject.not_measured:
            warnings.warn(
                f"{served.runtime}: not measured: {subject.not_measured}", ProbeSkipped, 2
            )
    finally:
        await router.dispose(key)


async def test_nothing_left_behind_can_fail(
    served: Served, backend: OperatorBackend, router: maf.SandboxRouter, key: maf.SandboxKey
) -> None:
    """The control: a call that leaves a file and a process behind is caught (so the subject's
    clean answer above means something)."""
    sandbox = await router.acquire(key, spec_for(backend))
    try:
        subject = NodeFingerprintSubject(sandbox)

        async def leaky_call() -> None:
            await sandbox.write_file("left.txt", b"x", working_directory=".")
            await sandbox.exec(
                ["sh", "-c", "nohup sleep 300 >/dev/null 2>&1 &"], working_directory=".", timeout=30
            )

        with pytest.raises(conformance.ConformanceFailure) as caught:
            await conformance.assert_nothing_left_behind(subject, leaky_call)
        assert f"{BASE}/left.txt" in str(caught.value)
        assert "sleep" in str(caught.value)
    finally:
        await router.dispose(key)


ATTACHED = maf.Capability.ATTACHED_IDENTITY


def test_router_floor_and_admission(served: Served, backend: OperatorBackend) -> None:
    """maf's default floor (microvm) refuses a backend below it (runc, gVisor) and admits one at
    it (Kata); the host lowering it to the runtime's rung admits it; ``ensure_can_serve`` admits
    a spec it serves and refuses one it does not."""
    if served.isolation is maf.Isolation.MICROVM:
        maf.SandboxRouter([backend])
    else:
        with pytest.raises(maf.SandboxBackendNotPermitted):
            maf.SandboxRouter([backend])
    router = maf.SandboxRouter([backend], min_isolation=served.isolation)
    router.ensure_can_serve(spec_for(backend))
    # One a spec can require alone (ATTACHED_IDENTITY needs identity bounds; RECLAIM is
    # forbidden in requires).
    alone = (c for c in maf.Capability if c not in (ATTACHED, maf.Capability.RECLAIM))
    missing = next(c for c in alone if c not in backend.declarations.capabilities)
    with pytest.raises(maf.SandboxCapabilityNotSupported):
        router.ensure_can_serve(maf.SandboxSpec(kind="needs-more", requires=frozenset({missing})))
    stronger = maf.SandboxSpec(kind="stronger", min_isolation=maf.Isolation.MICROVM)
    if served.isolation is maf.Isolation.MICROVM:
        router.ensure_can_serve(stronger)
    else:
        with pytest.raises(maf.SandboxBackendNotPermitted):
            router.ensure_can_serve(stronger)
