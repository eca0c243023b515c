"""OperatorBackend's acquire and disposal decisions over a stand-in client (the cluster tier runs
the real one): freshness, the backend check, fallback only after disposal, the perSpec floor,
and disposal counted as gone."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any, cast

import maf_sandbox as maf
import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from maf_sandbox.bounded_exec import SandboxExecOutputLimitExceeded

from sandbox_operator import labels as lbl
from sandbox_operator import naming
from sandbox_operator.client import Sandbox as ClientSandbox
from sandbox_operator.client import SandboxClient
from sandbox_operator.client import errors as client_errors
from sandbox_operator.client.dataplane import ExecDataPlane, LocalExecTransport
from sandbox_operator.contract import SandboxKey, SandboxSpec
from sandbox_operator.maf import (
    OperatorAcquireFailed,
    OperatorBackend,
    OperatorBackendMismatch,
    OperatorSandbox,
    sandbox_instance_id,
)
from tests.fixtures.faulty_transports import KillRefused, StreamDrops
from tests.fixtures.maf_translate import ACAS, GVISOR, RUNC, published


def sandbox_object(name: str, kind: str, backend: str, served_from: str = "cold") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "spec": {"kind": kind},
        "status": {
            "backend": backend,
            "servedFrom": served_from,
            "servedBy": {"kind": "Pod", "name": f"{name}-pod"},
            "conditions": [{"type": "Ready", "lastTransitionTime": "2026-12-05T00:00:00Z"}],
        },
    }


class Handle(ClientSandbox):
    """The client's handle as acquire returns it, on local processes (over ``client``'s
    transport), disposed through ``client``, its uses counted."""

    def __init__(
        self, name: str, obj: Mapping[str, Any], created: bool, spec: SandboxSpec, client: StandIn
    ) -> None:
        super().__init__(
            spec,
            ExecDataPlane(client.transport),
            name=name,
            namespace="ns",
            resource=obj,
            created=created,
            lifecycle=client,  # type: ignore[arg-type]
        )
        self.uses = 0

    def report_activity(self) -> None:
        self.uses += 1

    async def close(self) -> None:
        return None


class Custom:
    def __init__(self, client: StandIn) -> None:
        self.client = client

    async def list_namespaced_custom_object(
        self, group: str, version: str, ns: str, plural: str, *, label_selector: str
    ) -> dict[str, Any]:
        if self.client.list_fails:
            raise ApiException(status=503)
        self.client.selectors.append(label_selector)
        return {"items": list(self.client.objects.values())}


class StandIn:
    """What OperatorBackend uses of a SandboxClient, recorded."""

    namespace = "ns"

    def __init__(self) -> None:
        self.observer: Any = None  # the client's observer slot (egress reports go through it)
        self.objects: dict[str, dict[str, Any]] = {}
        self.specs: list[SandboxSpec] = []
        self.disposed: list[str] = []
        self.serve: tuple[str, str] = ("runc", "cold")
        self.sealed: bool | None = None  # status.sealedUntilClaim of a pool claim
        self.created = True
        self.fail: client_errors.SandboxAcquireError | None = None
        self.undeletable: set[str] = set()
        self.list_fails = False
        self.selectors: list[str] = []
        self.custom = Custom(self)
        self.scopes: dict[str, dict[str, Any]] = {}
        self.deleted_scopes: list[str] = []
        self.transport: LocalExecTransport = LocalExecTransport()
        self.keep = False  # another acquire of a name returns the object it holds (resets kept)
        self.resets: list[str] = []

    async def create_scope(
        self, *, scope: str, thread_id: str, name: str | None = None, **kw: Any
    ) -> str:
        name = name or naming.scope_name(scope, thread_id)  # the client's default
        self.scopes[name] = {"scope": scope, "thread_id": thread_id, **kw}
        return name

    async def delete_scope(self, name: str) -> None:
        self.deleted_scopes.append(name)
        self.scopes.pop(name, None)

    async def acquire(
        self, scope_ref: str, agent_dir: str, spec: SandboxSpec, call_id: str = "", **kw: Any
    ) -> Handle:
        self.specs.append(spec)
        if self.fail is not None:
            raise self.fail
        name = f"sbx-{agent_dir}-{spec.kind}"
        held = self.objects.get(name) if self.keep else None
        obj = held if held is not None else sandbox_object(name, spec.kind, *self.serve)
        if self.sealed is not None:
            obj["status"]["sealedUntilClaim"] = self.sealed
        if self.created:
            # A pod made for the Sandbox has its work directory mounted from its start (the
            # backend skips maf's storage-base check on a fresh instance): so do these processes.
            os.makedirs(spec.work_dir, exist_ok=True)
        self.objects[name] = obj
        return Handle(name, obj, self.created, spec, self)

    async def reset(self, sandbox: Any, *, timeout: float | None) -> None:  # noqa: ASYNC109
        """The operator's reset as the client sees it: a new pod serves, status.resets up."""
        obj = self.objects[sandbox.name]
        count = int(obj["status"].get("resets", 0)) + 1
        obj["status"]["resets"] = count
        obj["status"]["servedBy"] = {"kind": "Pod", "name": f"{sandbox.name}-pod-{count}"}
        sandbox.resource = obj
        self.resets.append(sandbox.name)

    async def dispose(self, name: str, *, wait: bool = False, uid: str | None = None) -> None:
        if name in self.undeletable:
            raise TimeoutError
        current = self.objects.get(name)
        if uid is not None and current is not None and current["metadata"]["uid"] != uid:
            return  # the API server's precondition: another object holds the name now
        self.disposed.append(name)
        self.objects.pop(name, None)


KEY = maf.SandboxKey("tenant", "thread", "agent")
CAPS = frozenset({maf.Capability.EXEC, maf.Capability.FILES_IN})


@pytest.fixture
def spec(tmp_path: Any) -> maf.SandboxSpec:
    return maf.SandboxSpec(
        kind="python", image="img", work_dir=os.path.join(tmp_path, "work"), requires=CAPS
    )


def backend(client: StandIn, **kw: Any) -> OperatorBackend:
    doc = kw.pop("doc", published(RUNC, GVISOR))
    return OperatorBackend(cast(SandboxClient, client), doc, **kw)


async def test_fresh_only_when_created_cold(spec: maf.SandboxSpec) -> None:
    client = StandIn()
    got = await backend(client).acquire(KEY, spec)
    assert isinstance(got, OperatorSandbox) and got.freshly_created is True
    assert got.instance_id == sandbox_instance_id(client.objects[got.name])
    assert got.pod == f"{got.name}-pod"
    client.created = False
    assert (await backend(client).acquire(KEY, spec)).freshly_created is False
    client.created, client.serve = True, ("runc", "pool-a")
    assert (await backend(client).acquire(KEY, spec)).freshly_created is False


async def test_a_pool_claim_is_fresh_only_when_its_pod_was_sealed_until_the_claim(
    spec: maf.SandboxSpec, caplog: pytest.LogCaptureFixture
) -> None:
    """(#36 item 2) The operator records whether the claimed pod was sealed from its creation to
    the claim (status.sealedUntilClaim); only then is the new instance a trusted baseline. A
    pool claim it cannot vouch for says why, in one log line."""
    client = StandIn()
    client.serve = ("runc", "SandboxWarmPool/pool-a")
    client.sealed = True
    assert (await backend(client).acquire(KEY, spec)).freshly_created is True
    client.sealed = False
    with caplog.at_level("INFO", logger="sandbox_operator.maf._backend"):
        assert (await backend(client).acquire(KEY, spec)).freshly_created is False
    assert "does not vouch were sealed until the claim" in caplog.text
    client.created, client.sealed = False, True  # not this acquire's: never fresh
    assert (await backend(client).acquire(KEY, spec)).freshly_created is False


async def test_served_by_another_backend_is_disposed_and_refused(spec: maf.SandboxSpec) -> None:
    client = StandIn()
    client.serve = ("gvisor", "cold")
    with pytest.raises(OperatorBackendMismatch):
        await backend(client).acquire(KEY, spec)
    assert client.disposed == ["sbx-agent-python"]


async def test_named_backend_under_per_spec_raises_the_floor(spec: maf.SandboxSpec) -> None:
    client = StandIn()
    client.serve = ("gvisor", "cold")
    doc = published(RUNC, GVISOR, selection="perSpec")
    await backend(client, doc=doc, backend="gvisor").acquire(KEY, spec)
    assert client.specs[-1].min_isolation == "hardened_container"


async def test_fallback_only_after_the_sandbox_is_gone(spec: maf.SandboxSpec) -> None:
    client = StandIn()
    client.fail = client_errors.SandboxStartupTimeout(sandbox="sbx-x", namespace="ns")
    with pytest.raises(maf.SandboxBackendUnavailable):
        await backend(client).acquire(KEY, spec)
    assert client.disposed == ["sbx-x"]
    client.undeletable = {"sbx-x"}
    with pytest.raises(OperatorAcquireFailed) as raised:
        await backend(client).acquire(KEY, spec)
    assert not isinstance(raised.value, maf.SandboxBackendUnavailable)


async def test_refusals_are_maf_refusals(spec: maf.SandboxSpec) -> None:
    client = StandIn()
    client.fail = client_errors.SandboxEgressNotEnforced(sandbox="s", namespace="ns")
    with pytest.raises(maf.SandboxEgressNotEnforced):
        await backend(client).acquire(KEY, spec)
    assert client.disposed == []


async def test_dispose_selects_by_key_kind_and_instance() -> None:
    client = StandIn()
    for kind in ("python", "bash"):
        client.objects[f"sbx-{kind}"] = sandbox_object(f"sbx-{kind}", kind, "runc")
    b = backend(client)
    assert await b.dispose(KEY, kind="python", instance_id="stale") is None
    assert client.disposed == []
    ours = SandboxKey(scope="tenant", thread_id="thread", agent_dir="agent")
    assert client.selectors == [lbl.key_selector(ours)]
    python_id = sandbox_instance_id(client.objects["sbx-python"])
    assert await b.dispose(KEY, kind="python", instance_id=python_id) is None
    assert client.disposed == ["sbx-python"]
    assert await b.dispose(KEY) is None
    assert client.disposed == ["sbx-python", "sbx-bash"]


async def test_dispose_never_takes_a_replacement_for_what_it_listed() -> None:
    """A Sandbox recreated under the name between the listing and the delete is a replacement:
    the delete names the listed object's uid, so the replacement stays."""
    client = StandIn()
    client.objects["sbx-python"] = sandbox_object("sbx-python", "python", "runc")
    real_list = client.custom.list_namespaced_custom_object

    async def list_then_replace(*args: Any, **kw: Any) -> dict[str, Any]:
        listed = await real_list(*args, **kw)
        replacement = sandbox_object("sbx-python", "python", "runc")
        replacement["metadata"]["uid"] = "uid-replacement"
        client.objects = {"sbx-python": replacement}
        return listed

    client.custom.list_namespaced_custom_object = list_then_replace  # type: ignore[method-assign]
    assert await backend(client).dispose(KEY, kind="python") is None
    assert client.disposed == []
    assert client.objects["sbx-python"]["metadata"]["uid"] == "uid-replacement"


async def test_scope_purge_counts_only_what_is_gone() -> None:
    client = StandIn()
    for name in ("a", "b", "c"):
        client.objects[name] = sandbox_object(name, "python", "runc")
    client.undeletable = {"b"}
    purge = await backend(client).dispose_scope("tenant", "thread")
    assert purge.disposed == 2
    assert purge.undisposed is not None and purge.undisposed.code == "timeout"
    assert client.selectors == [lbl.scope_selector("tenant", "thread")]
    client.list_fails = True
    purge = await backend(client).dispose_scope("tenant", "thread")
    assert purge.disposed == 0 and purge.undisposed is not None
    assert purge.undisposed.code == "unlisted"
    failure = await backend(client).dispose(KEY)
    assert failure is not None and failure.code == "unlisted"


async def test_a_purge_from_another_process_deletes_the_conversations_scope(
    spec: maf.SandboxSpec,
) -> None:
    """A conversation purge is served wherever it lands: a backend (another replica) that never
    acquired in the conversation deletes its SandboxScope too, by the name every process
    derives, not only its Sandboxes."""
    client = StandIn()
    await backend(client).acquire(KEY, spec)
    (ref,) = client.scopes
    assert ref == naming.scope_name("tenant", "thread")
    other = backend(client)  # never acquired: holds nothing of the conversation in memory
    purge = await other.dispose_scope("tenant", "thread")
    assert purge.disposed == 1 and purge.undisposed is None
    assert client.deleted_scopes == [ref] and not client.scopes


async def test_a_purge_that_left_a_sandbox_keeps_the_scope() -> None:
    client = StandIn()
    client.objects["a"] = sandbox_object("a", "python", "runc")
    client.undeletable = {"a"}
    purge = await backend(client).dispose_scope("tenant", "thread")
    assert purge.undisposed is not None
    assert client.deleted_scopes == []


async def test_the_scope_binds_the_backends_agents(spec: maf.SandboxSpec) -> None:
    """With agent_service_accounts the conversation's SandboxScope names those agents (the
    conversation boundary: they may use it), once per conversation per process."""
    client = StandIn()
    b = backend(client, agent_service_accounts=["agent-a", "agent-b"])
    await b.acquire(KEY, spec)
    await b.acquire(maf.SandboxKey("tenant", "thread", "other"), spec)
    assert client.scopes == {
        naming.scope_name("tenant", "thread"): {
            "scope": "tenant",
            "thread_id": "thread",
            "agent_service_accounts": ("agent-a", "agent-b"),
        }
    }


async def test_a_scope_whose_agents_were_not_granted_fails_the_acquire(
    spec: maf.SandboxSpec,
) -> None:
    """The operator did not report the agents' scope Ready: OperatorAcquireFailed with its
    reason (no fallback, nothing acquired), and the next acquire converges the scope again."""
    client = StandIn()
    refusals = [client_errors.SandboxScopeNotReady(scope_ref="s", namespace="ns",
                                                   reason="AccessNotGranted")]  # fmt: skip
    real_create = client.create_scope

    async def create_scope(**kw: Any) -> str:
        if refusals:
            raise refusals.pop()
        return await real_create(**kw)

    client.create_scope = create_scope  # type: ignore[method-assign]
    b = backend(client, agent_service_accounts=["agent-a"])
    with pytest.raises(OperatorAcquireFailed) as raised:
        await b.acquire(KEY, spec)
    assert raised.value.reason == "AccessNotGranted"
    assert not isinstance(raised.value, maf.SandboxBackendUnavailable) and client.specs == []
    assert (await b.acquire(KEY, spec)).name == "sbx-agent-python"
    assert list(client.scopes) == [naming.scope_name("tenant", "thread")]


async def test_maf_router_serves_through_the_backend(spec: maf.SandboxSpec) -> None:
    """maf's own router accepts the backend (declarations readable, rung placed) and routes a
    spec to it per spec, refusing one the declarations do not cover before any acquire."""
    client = StandIn()
    client.serve = ("gvisor", "cold")
    closed = {**GVISOR, "declarations": {**GVISOR["declarations"], "egressModes": ["closed"]}}
    doc = published(RUNC, closed, selection="perSpec")
    router = maf.SandboxRouter(
        [backend(client, doc=doc, backend="gvisor")],
        min_isolation=maf.Isolation.HARDENED_CONTAINER,
        selection=maf.Selection.PER_SPEC,
    )
    got = await router.acquire(KEY, spec)
    assert got.instance_id == sandbox_instance_id(client.objects["sbx-agent-python"])
    listing = maf.SandboxSpec(
        kind="ls", image="img", requires=CAPS | {maf.Capability.FILES_LIST}, work_dir=None
    )
    with pytest.raises(maf.SandboxCapabilityNotSupported):
        await router.acquire(maf.SandboxKey("tenant", "thread", "other"), listing)
    assert [s.kind for s in client.specs] == ["python"]


async def test_a_purged_scope_is_converged_again(spec: maf.SandboxSpec) -> None:
    client = StandIn()
    b = backend(client)
    await b.acquire(KEY, spec)
    client.fail = client_errors.SandboxScopeNotFound(sandbox="", namespace="ns")
    original = client.acquire
    calls: list[str] = []

    async def once_missing(scope_ref: str, *args: Any, **kw: Any) -> Handle:
        calls.append(scope_ref)
        if len(calls) == 1:
            raise client_errors.SandboxScopeNotFound(sandbox="", namespace="ns")
        client.fail = None
        return await original(scope_ref, *args, **kw)

    client.acquire = once_missing  # type: ignore[method-assign]
    assert (await b.acquire(KEY, spec)).name == "sbx-agent-python"
    assert len(calls) == 2


async def test_the_routers_record_names_the_served_backend_rung_and_egress(
    spec: maf.SandboxSpec,
) -> None:
    """What maf's router records for an acquire through this backend (its SandboxAcquired event
    and the EffectiveState built from it) names the operator backend, its rung and the egress
    modes the operator publishes for it."""
    events: list[maf.SandboxAcquired] = []

    class Recorder(maf.SandboxObserver):
        def sandbox_acquired(self, event: maf.SandboxAcquired) -> None:
            events.append(event)

    client = StandIn()
    client.serve = ("gvisor", "cold")
    modes = ["closed", "allowlist"]
    gvisor = {**GVISOR, "declarations": {**GVISOR["declarations"], "egressModes": modes}}
    router = maf.SandboxRouter(
        [backend(client, doc=published(RUNC, gvisor, selection="perSpec"), backend="gvisor")],
        min_isolation=maf.Isolation.HARDENED_CONTAINER,
        observer=Recorder(),
    )
    await router.acquire(KEY, spec)
    (event,) = [e for e in events if e.refusal is None]
    assert event.backend == "sandbox-operator/gvisor"
    assert event.isolation is maf.Isolation.HARDENED_CONTAINER
    assert event.declarations is not None
    assert event.declarations.egress_modes == {maf.Egress(m) for m in modes}
    state = maf.EffectiveState.of(event).as_dict()
    assert state["backend"] == "sandbox-operator/gvisor"
    assert state["isolation"] == "hardened_container"


def exists(path: str) -> bool:
    return os.path.exists(path)


@pytest.mark.parametrize("case", ["timeout", "cancel", "budget", "stream"])
async def test_an_exec_whose_kill_fell_short_retires_the_sandbox_as_the_client_does(
    spec: maf.SandboxSpec, tmp_path: Any, case: str
) -> None:
    """#37 item 4: the maf backend's execs go through the client's unclean rule. A command
    cancelled, timed out, over its budget or cut off from its stream whose kill did not reach its
    group: maf's own exception for the failure, the Sandbox disposed (that object, by uid), and
    every later use refused with maf's SandboxUnclean, so the router cannot use it again. Before,
    the backend called the data plane directly and nothing was retired."""
    client = StandIn()
    client.transport = StreamDrops(0.5, refuse_kill=True) if case == "stream" else KillRefused()
    sandbox = await backend(client).acquire(KEY, spec)
    began = os.path.join(tmp_path, "began")
    if case == "timeout":
        with pytest.raises(TimeoutError):
            await sandbox.exec("sleep 3", working_directory=".", timeout=0.3)
    elif case == "budget":
        with pytest.raises(SandboxExecOutputLimitExceeded):
            await sandbox.exec_bounded(
                "head -c 200000 /dev/zero; sleep 3",
                working_directory=".",
                timeout=30,
                max_output_bytes=1000,
            )
    elif case == "stream":
        with pytest.raises(ConnectionError):
            await sandbox.exec("sleep 3", working_directory=".", timeout=30)
    else:
        call = asyncio.ensure_future(
            sandbox.exec(f"touch {began}; sleep 3", working_directory=".", timeout=30)
        )
        for _ in range(500):  # the command has started: its kill has a pid to aim at
            if exists(began):
                break
            await asyncio.sleep(0.02)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    await asyncio.sleep(0)  # the disposal runs in the background
    assert client.disposed == [sandbox.name]
    with pytest.raises(maf.SandboxUnclean):
        await sandbox.exec(["true"], working_directory=".", timeout=10)
    with pytest.raises(maf.SandboxUnclean):
        await sandbox.write_file("f", "x", working_directory=".")


async def test_a_lost_stream_whose_kill_reached_the_group_leaves_the_sandbox_in_use(
    spec: maf.SandboxSpec,
) -> None:
    client = StandIn()
    client.transport = StreamDrops(0.5)
    sandbox = await backend(client).acquire(KEY, spec)
    with pytest.raises(ConnectionError):
        await sandbox.exec("sleep 3", working_directory=".", timeout=30)
    assert client.disposed == []
    client.transport.after = 30.0
    result = await sandbox.exec(["echo", "ok"], working_directory=".", timeout=10)
    assert result.stdout == "ok\n"


class CountingTransport(LocalExecTransport):
    """Local processes, each command counted."""

    def __init__(self) -> None:
        super().__init__()
        self.commands: list[list[str]] = []

    async def run(self, argv: Any, **kw: Any) -> Any:
        self.commands.append(list(argv))
        return await super().run(argv, **kw)


async def test_the_storage_base_is_checked_on_a_reused_instance_only(
    spec: maf.SandboxSpec,
) -> None:
    """maf's acquire duty (the base is a real directory): on a fresh instance the base is the
    pod's work-directory volume, mounted when the pod was made, so the acquire runs no command
    in it; on a reused one (another acquire made it) the check runs, and makes a missing base."""
    client = StandIn()
    counting = CountingTransport()
    client.transport = counting
    fresh = await backend(client).acquire(KEY, spec)
    assert fresh.freshly_created and counting.commands == []
    base = spec.work_dir
    assert base is not None
    client.created = False
    os.rmdir(base)
    reused = await backend(client).acquire(KEY, spec)
    assert not reused.freshly_created and counting.commands
    assert exists(base)


async def test_an_instance_this_backend_reset_is_handed_out_without_the_base_check(
    spec: maf.SandboxSpec,
) -> None:
    """A reset puts a pod nothing has used in place: the next acquire here hands it out with
    no storage-base command (its base is the pod's work-directory volume); once handed out, it
    is a reused instance again and the acquire after checks."""
    client = StandIn()
    counting = CountingTransport()
    client.transport, client.keep, client.created = counting, True, False
    base = spec.work_dir
    assert base is not None
    os.makedirs(base, exist_ok=True)
    ours = backend(client, doc=published({**RUNC, "resets": True}, GVISOR))
    first = await ours.acquire(KEY, spec)
    assert counting.commands  # reused: checked
    counting.commands.clear()
    await first.reset(timeout=10)
    assert client.resets == [first.name] and counting.commands == []
    again = await ours.acquire(KEY, spec)
    assert again.instance_id == first.instance_id and counting.commands == []
    await ours.acquire(KEY, spec)
    assert counting.commands


async def test_an_acas_sandboxs_storage_base_is_checked_even_when_fresh(
    spec: maf.SandboxSpec,
) -> None:
    """Nothing mounts an acas sandbox's base when the service makes it: a fresh acquire there
    still runs the check (and makes a missing base)."""
    client = StandIn()
    counting = CountingTransport()
    client.transport, client.serve = counting, ("acas", "cold")
    base = spec.work_dir
    assert base is not None
    fresh = await backend(client, doc=published(ACAS)).acquire(KEY, spec)
    assert fresh.freshly_created and counting.commands
