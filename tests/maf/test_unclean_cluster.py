"""#37 item 4 through maf-sandbox's router on the real node (conftest: one operator per runtime,
runc and gVisor): an exec the caller stops owning whose kill cannot reach its process group
(cancelled, timed out, over ``exec_bounded``'s budget, its stream dropped) raises what maf
expects for that failure, and then the sandbox is retired exactly as the client retires it: the
same wrapper refuses every use with maf's ``SandboxUnclean`` (so the router cannot use it again
within the call), and the key's next acquire gets a new instance in a new pod (so it is not
reused after the call either). A dropped stream whose kill reaches the group is killed and the
instance kept.

The failures are the network's, as in tests/e2e/test_client_unclean.py: the backend's client
reaches the API server for its data plane through a TCP link the test cuts or closes to new
connections (tests/fixtures/exec_link.py); the cluster, kubelet, runtime and command are real.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import maf_sandbox as maf
import pytest
from kubernetes import client
from maf_sandbox.bounded_exec import SandboxExecOutputLimitExceeded
from tests.fixtures.exec_link import ExecLink, linked_client
from tests.fixtures.maf_cluster import Served
from tests.fixtures.operator import PYTHON

from sandbox_operator.client import SandboxClient, pod_dataplane
from sandbox_operator.client.dataplane import DataPlane
from sandbox_operator.maf import OperatorBackend, OperatorSandbox

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: Started, then waits for ``go`` (so the test chooses when it overruns), then runs on.
COMMAND = "touch began; while [ ! -e go ]; do sleep 0.1; done; head -c 1000000 /dev/zero; sleep 600"
SPEC = maf.SandboxSpec(kind="unclean", requires=frozenset({maf.Capability.EXEC}))

#: What maf expects each failure to raise (the maf surface is unchanged).
EXPECTED: dict[str, type[BaseException]] = {
    "cancel": asyncio.CancelledError,
    "timeout": TimeoutError,
    "budget": SandboxExecOutputLimitExceeded,
    "stream": ConnectionError,
}


class Linked:
    """The module's runtime behind an :class:`ExecLink`: the backend's client, the link, and a
    router over the backend."""

    def __init__(self, c: SandboxClient, link: ExecLink, backend: OperatorBackend) -> None:
        self.client, self.link, self.backend = c, link, backend
        self.router = maf.SandboxRouter([backend], min_isolation=backend.isolation)


@pytest.fixture
async def linked(served: Served) -> AsyncIterator[Linked]:
    async with linked_client(served.namespace, served.kubeconfig) as (c, link):
        backend = await OperatorBackend.connect(c, backend=served.runtime, default_image=PYTHON)
        yield Linked(c, link, backend)


def pod_uid(core: client.CoreV1Api, served: Served, sandbox: OperatorSandbox) -> str:
    return str(core.read_namespaced_pod(sandbox.pod, served.namespace).metadata.uid)


async def exists(plane: DataPlane, cwd: str, name: str) -> bool:
    done = await plane.exec(["test", "-e", name], cwd=cwd, timeout=30)
    return done.exit_code == 0


async def until(check: Callable[[], Awaitable[bool]], what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.2)


async def stop_owning(case: str, sandbox: OperatorSandbox, eyes: DataPlane, link: ExecLink) -> None:
    """Run :data:`COMMAND` through maf's surface and stop owning it as ``case`` says, with the
    kill after it refused by the link; raises what the call raised."""
    if case == "budget":
        run = sandbox.exec_bounded(
            COMMAND, working_directory=".", timeout=600, max_output_bytes=10_000
        )
    else:
        run = sandbox.exec(COMMAND, working_directory=".", timeout=20 if case == "timeout" else 600)
    call = asyncio.ensure_future(run)
    await until(lambda: exists(eyes, sandbox.base, "began"), "the command never started")
    link.refuse()  # from here on, no new exec reaches the sandbox: the kill cannot
    if case == "cancel":
        call.cancel()
    elif case == "budget":
        await eyes.exec(["touch", "go"], cwd=sandbox.base, timeout=30)
    elif case == "stream":
        assert link.cut() >= 1
    await call
    raise AssertionError("the exec returned")


@pytest.mark.parametrize("case", sorted(EXPECTED))
async def test_an_exec_whose_kill_cannot_reach_its_group_retires_the_instance(
    served: Served, linked: Linked, core_v1: client.CoreV1Api, key: maf.SandboxKey, case: str
) -> None:
    router = linked.router
    sandbox = await router.acquire(key, SPEC)
    try:
        assert isinstance(sandbox, OperatorSandbox)
        first_pod = pod_uid(core_v1, served, sandbox)
        eyes = pod_dataplane(linked.client.ws_api, served.namespace, sandbox.pod)
        with pytest.raises(EXPECTED[case]):
            await stop_owning(case, sandbox, eyes, linked.link)
        # Within the call: the router holds this wrapper, and every use of it is refused (the
        # link is open again: the refusal is the wrapper's, not the network's).
        linked.link.refuse(False)
        with pytest.raises(maf.SandboxUnclean):
            await sandbox.exec(["true"], working_directory=".", timeout=30)
        with pytest.raises(maf.SandboxUnclean):
            await sandbox.write_file("f", "x", working_directory=".")

        # After it: the key's next acquire is a new instance in a new pod.
        again = await router.acquire(key, SPEC)
        assert isinstance(again, OperatorSandbox)
        assert again.instance_id != sandbox.instance_id
        assert pod_uid(core_v1, served, again) != first_pod, "the next acquire got that pod"
        done = await again.exec(["echo", "ok"], working_directory=".", timeout=60)
        assert done.stdout == "ok\n"
    finally:
        linked.link.refuse(False)
        await router.dispose(key)


async def test_a_dropped_stream_is_killed_with_its_group_and_the_instance_kept(
    served: Served, linked: Linked, core_v1: client.CoreV1Api, key: maf.SandboxKey
) -> None:
    router = linked.router
    sandbox = await router.acquire(key, SPEC)
    try:
        assert isinstance(sandbox, OperatorSandbox)
        eyes = pod_dataplane(linked.client.ws_api, served.namespace, sandbox.pod)
        call = asyncio.ensure_future(
            sandbox.exec("touch began; sleep 4; touch late", working_directory=".", timeout=600)
        )
        await until(lambda: exists(eyes, sandbox.base, "began"), "the command never started")
        assert linked.link.cut() >= 1
        with pytest.raises(ConnectionError):
            await call
        await asyncio.sleep(5)  # past the late write's time
        assert not await exists(eyes, sandbox.base, "late"), "the command ran on"
        done = await sandbox.exec(["echo", "ok"], working_directory=".", timeout=60)
        assert done.stdout == "ok\n"
        again = await router.acquire(key, SPEC)
        assert again.instance_id == sandbox.instance_id
    finally:
        await router.dispose(key)
