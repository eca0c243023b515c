"""Host tools over exec on operator-made sandboxes, under runc and gVisor.

One sandbox per runtime (the python image) serves every case in order, cheapest first and the
destructive one last: a program calls a registered tool and gets its answer (and the median
round trip of one call is measured from inside the guest); each refusal reaches the guest by its
type; an overrunning program is signalled and the child it spawned in its session dies; and the
forum's regression case: a tool commits an effect on the host and then the answer path is cut
(the tool deletes the sandbox's pod), so the record says completed + ``delivery_uncertain``, the
effect happened once, and nothing re-sends it, also after the sandbox is acquired again.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from sandbox_operator import naming
from sandbox_operator.client import SandboxAcquireError, SandboxClient
from sandbox_operator.client.errors import DataPlaneError
from sandbox_operator.client.hosttools import (
    Delivery,
    HostToolRegistry,
    HostToolsWarning,
    HostToolUndeclared,
    Identity,
    host_tool,
)
from sandbox_operator.client.hosttools.channel import reclaim_run, run_with_host_tools
from sandbox_operator.client.hosttools.errors import (
    HostToolDeliveryUncertain,
    HostToolRunTimeout,
    SignalOutcome,
)
from sandbox_operator.client.hosttools.layout import guest_run_layout
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.contract import Capability, SandboxSpec, TransferLimits
from tests.fixtures.guest_programs import LEAVES_AN_INJECTOR
from tests.fixtures.operator import PYTHON, Kit, local_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

AGENT = "agents/host-tools"
SMALL = TransferLimits(max_bytes_per_file=256, max_total_bytes=1024, max_files=4)
CALLS_MEASURED = 20


def spec() -> SandboxSpec:
    return SandboxSpec.model_validate(
        {
            "kind": "python",
            "image": PYTHON,
            "requires": frozenset(
                {
                    Capability.EXEC,
                    Capability.FILES_IN,
                    Capability.FILES_OUT,
                    Capability.HOST_TOOLS,
                }
            ),
            "resources": {
                "requests": {"cpu": "10m", "memory": "32Mi"},
                "limits": {"cpu": "1", "memory": "256Mi"},
            },
        }
    )


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostToolsWarning)
        yield


@pytest.fixture
async def aclient(kubeconfig: str, namespace: str) -> AsyncIterator[SandboxClient]:
    c = await SandboxClient.from_kubeconfig(namespace, kubeconfig=kubeconfig, default_timeout=180)
    yield c
    await c.close()


@host_tool(source=None, sink=None, identity=None)
def add(a: int, b: int) -> int:
    return a + b


@host_tool(source="test", sink=None, identity=None)
def big(n: int) -> str:
    return "x" * n


@host_tool(source="mail", sink="mail", identity=Identity.USER)
def send(to: str, user_identity: object) -> str:
    return to


def undeclared(x: int) -> int:
    return x


MEASURE = f"""
import json, time, sandbox_host_tools as host
took = []
for i in range({CALLS_MEASURED}):
    started = time.monotonic()
    assert host.add(a=i, b=1) == i + 1
    took.append(time.monotonic() - started)
print(json.dumps(took))
"""

REFUSALS = """
import sandbox_host_tools as host

def attempt(label, tool, **arguments):
    try:
        print(label, "ok", host.call(tool, **arguments))
    except host.HostToolError as exc:
        print(label, type(exc).__name__)

attempt("unregistered", "nope")
attempt("response", "big", n=10_000)
attempt("user", "send", to="someone")
attempt("request", "add", a=1, b=2, pad="y" * 10_000)
attempt("answered", "add", a=1, b=2)
attempt("cap", "add", a=1, b=2)
"""

OVERRUN = """
import subprocess, time, sandbox_host_tools as host
child = subprocess.Popen(["sleep", "300"])
open("child.pid", "w").write(str(child.pid))
print("before", host.add(a=1, b=1), flush=True)
time.sleep(300)
"""


QUIET = """
import time
time.sleep(3)
print("quiet")
"""

PLANTS_A_FIFO = """
import os, time
os.mkfifo("../transport/calls/1.req")
time.sleep(300)
"""

PLANTS_USERCUSTOMIZE = """
import os, site
path = site.getusersitepackages()
os.makedirs(path, exist_ok=True)
with open(os.path.join(path, "usercustomize.py"), "w") as f:
    f.write("open('/tmp/usercustomize-ran', 'w').write('ran')\\n")
print("planted")
"""

LOOKS_FOR_USERCUSTOMIZE = """
import os, sys
print(os.path.exists("/tmp/usercustomize-ran"), "usercustomize" in sys.modules)
"""

COMMIT_THEN_CUT = """
import sandbox_host_tools as host
print(host.commit(), flush=True)
print(host.commit(), flush=True)
"""


async def process_state(sb: Sandbox, pid: int) -> str:
    """``R``/``S``/``Z``... from /proc, or ``gone``."""
    res = await sb.exec(["sh", "-c", 'cat "/proc/$1/stat" 2>/dev/null || echo gone', "x", str(pid)])
    text = res.stdout_text.strip()
    return "gone" if text == "gone" else text.rsplit(")", 1)[1].split()[0]


async def acquire_again(aclient: SandboxClient, scope_ref: str, gone: Sandbox) -> Sandbox:
    """The same key again, once it serves a live sandbox. Until the operator has seen the pod
    go, the Sandbox still reads Ready and its handle's exec finds no pod; then it is failed and
    its backend objects removed, the host disposes of it, and the key serves anew."""
    deadline = time.monotonic() + 240
    while True:
        try:
            again = await aclient.acquire(scope_ref, AGENT, spec(), timeout=120)
            if (await again.exec(["echo", "up"])).stdout == b"up\n":
                return again
        except SandboxAcquireError:
            await aclient.dispose(gone, wait=True)
        except DataPlaneError:
            pass  # the old pod's name, not there any more: not noticed yet
        assert time.monotonic() < deadline, "the key never served again"
        await asyncio.sleep(2)


@pytest.mark.parametrize("runtime", ["runc", "gvisor"])
async def test_host_tools_over_exec(
    aclient: SandboxClient,
    start_operator: Callable[..., Any],
    kit: Kit,
    core_v1: k8s.CoreV1Api,
    runtime: str,
) -> None:
    start_operator(local_config(selection="fixed", pinned=runtime))
    scope_ref = await aclient.create_scope(scope="tenant-a", thread_id=f"host-tools-{runtime}")
    sb = await aclient.acquire(scope_ref, AGENT, spec())

    # 1. A registered tool answers; the median round trip of one call, measured in the guest.
    registry = HostToolRegistry()
    registry.register(add)
    run = registry.start_run(limits_in=sb.spec.files_in, limits_out=sb.spec.files_out)
    result = await run_with_host_tools(sb, MEASURE, run, timeout=120)
    assert result.ok, result.stderr_text
    took = json.loads(result.stdout_text)
    median_ms = statistics.median(took) * 1000
    print(
        f"\n[host-tools] {runtime}: one host-tool call round trip, measured in the guest over "
        f"{len(took)} calls: median {median_ms:.1f} ms (min {min(took) * 1000:.1f}, "
        f"max {max(took) * 1000:.1f})"
    )
    assert len(result.records) == CALLS_MEASURED
    assert all(r.delivery is Delivery.DELIVERED for r in result.records)
    assert result.transport_removed
    assert not await sb.exists(result.layout.transport)
    assert await reclaim_run(sb, result.layout)

    # 2. Refusals, each by its type: an undeclared registration host-side, the rest in the guest.
    refusing = HostToolRegistry(
        allowed_identities=frozenset({Identity.APP, Identity.USER}), max_calls_per_run=5
    )
    with pytest.raises(HostToolUndeclared):
        refusing.register(undeclared)
    for fn in (add, big, send):
        refusing.register(fn)
    run = refusing.start_run(limits_in=SMALL, limits_out=SMALL)
    result = await run_with_host_tools(sb, REFUSALS, run, timeout=120)
    assert result.ok, result.stderr_text
    assert dict(line.split(" ", 1) for line in result.stdout_text.splitlines()) == {
        "unregistered": "HostToolNotRegistered",
        "response": "HostToolResponseTooLarge",
        "user": "UserIdentityUnavailable",
        "request": "HostToolRequestTooLarge",
        "answered": "ok 3",
        "cap": "HostToolCallCapExceeded",
    }
    response = result.records[1]
    assert (response.executed, response.completed) == (True, True)  # the tool did run
    await reclaim_run(sb, result.layout)

    # 3. An overrunning program is signalled, and so is the child it spawned in its session.
    layout = guest_run_layout(sb)
    run = registry_for_overrun().start_run(limits_in=sb.spec.files_in, limits_out=sb.spec.files_out)
    with pytest.raises(HostToolRunTimeout) as overrun:
        await run_with_host_tools(sb, OVERRUN, run, timeout=8, layout=layout)
    assert overrun.value.signal is SignalOutcome.GROUP
    assert overrun.value.stdout == b"before 2\n"
    assert "was sent SIGKILL" in str(overrun.value)
    assert overrun.value.transport_removed is True
    child = int(await sb.read_text(f"{layout.work}/child.pid"))
    for _ in range(50):
        state = await process_state(sb, child)
        if state in ("gone", "Z"):
            break
        await asyncio.sleep(0.2)
    assert state in ("gone", "Z"), state  # a zombie: pid 1 of the sandbox reaps nobody
    assert await reclaim_run(sb, layout)

    # 3b. A process the program left (double fork, setsid) is ended when the run ends, and the
    # next run's channel sees no call its program did not make (#28 item 2).
    counter = Counter()
    first = await run_with_host_tools(
        sb, LEAVES_AN_INJECTOR, counting(counter).start_run(**limits(sb)), timeout=120
    )
    assert first.ok and first.stdout == b"left one\n", first.stderr_text
    assert first.leftovers_ended >= 1
    injector = int(await sb.read_text(f"{first.layout.work}/injector.pid"))
    assert await process_state(sb, injector) in ("gone", "Z")
    second = await run_with_host_tools(
        sb, QUIET, counting(counter).start_run(**limits(sb)), timeout=120
    )
    assert second.stdout == b"quiet\n" and second.records == () and counter.value == 0
    for done in (first, second):
        assert await reclaim_run(sb, done.layout)

    # 3c. A FIFO at the next request's name is never opened: the request is refused and the
    # run ends at its deadline as a run timeout, not an exec timeout (#28 item 4).
    started = time.monotonic()
    with pytest.raises(HostToolRunTimeout) as fifo:
        await run_with_host_tools(
            sb, PLANTS_A_FIFO, registry_for_overrun().start_run(**limits(sb)), timeout=8
        )
    assert time.monotonic() - started < 8 + 10
    assert [r.refusal for r in fifo.value.records] == ["HostToolRequestInvalid"]
    assert fifo.value.signal is SignalOutcome.GROUP and fifo.value.leftovers_ended == 0

    # 3d. A usercustomize planted in the user site (HOME is /tmp, writable) by one run does not
    # run before the next (#25 item 7: the program runs with the user site off).
    plant = await run_with_host_tools(
        sb, PLANTS_USERCUSTOMIZE, registry_for_overrun().start_run(**limits(sb)), timeout=120
    )
    assert plant.ok and plant.stdout == b"planted\n", plant.stderr_text
    looked = await run_with_host_tools(
        sb, LOOKS_FOR_USERCUSTOMIZE, registry_for_overrun().start_run(**limits(sb)), timeout=120
    )
    assert looked.ok and looked.stdout == b"False False\n", (looked.stdout, looked.stderr_text)
    # ... whereas a python started with the user site on does run it (the plant is real).
    plain = await sb.exec(
        ["python3", "-c", "import os; print(os.path.exists('/tmp/usercustomize-ran'))"]
    )
    assert plain.stdout_text.strip() == "True", plain.stdout_text
    assert (await sb.exec(["rm", "-rf", "/tmp/.local", "/tmp/usercustomize-ran"])).ok
    for done in (plant, looked):
        assert await reclaim_run(sb, done.layout)

    # 4. The forum case: the effect commits, then the answer path is cut (the pod is deleted).
    pod = naming.pod_name(sb.name)
    assert kit.pod(pod) is not None
    counter = {"value": 0}

    @host_tool(source="host-counter", sink="host-counter", identity=Identity.APP)
    def commit() -> int:
        counter["value"] += 1
        core_v1.delete_namespaced_pod(pod, kit.ns, grace_period_seconds=0)
        return counter["value"]

    cutting = HostToolRegistry()
    cutting.register(commit)
    run = cutting.start_run(limits_in=sb.spec.files_in, limits_out=sb.spec.files_out)
    with pytest.raises(HostToolDeliveryUncertain) as cut:
        await run_with_host_tools(sb, COMMIT_THEN_CUT, run, timeout=120)
    record = cut.value.record
    assert (record.sequence, record.tool) == (1, "commit")
    assert record.executed and record.completed
    assert record.delivery is Delivery.UNCERTAIN and record.response_bytes == 0
    assert run.records == (record,)
    assert counter["value"] == 1
    # Nothing re-sends the call, also once the key serves again.
    await acquire_again(aclient, scope_ref, sb)
    await asyncio.sleep(5)
    assert counter["value"] == 1
    assert run.records == (record,)


class Counter:
    def __init__(self) -> None:
        self.value = 0


def counting(counter: Counter) -> HostToolRegistry:
    @host_tool(source="host-counter", sink="host-counter", identity=Identity.APP)
    def bump() -> int:
        counter.value += 1
        return counter.value

    registry = HostToolRegistry()
    registry.register(bump)
    return registry


def limits(sb: Sandbox) -> dict[str, TransferLimits]:
    return {"limits_in": sb.spec.files_in, "limits_out": sb.spec.files_out}


def registry_for_overrun() -> HostToolRegistry:
    registry = HostToolRegistry()
    registry.register(add)
    return registry
