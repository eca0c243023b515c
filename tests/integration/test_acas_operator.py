"""The real operator (a subprocess on the host, kopf against the real API server) with an `acas`
backend pointed at the stand-in (a real HTTP server on 127.0.0.1, its own process, steered over
`/_standin/*`). No Kubernetes fakes: Sandboxes, SandboxScopes, Secrets and pods are real objects.

The operator reads its acas credential from a real Secret (`tokenKey`: the static-token path the
config offers for the stand-in); rotating that Secret is how the expired-token test recovers.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from sandbox_operator import labels as lbl
from sandbox_operator.acas import AcasBackendConfig, AcasClient, StaticTokenProvider
from sandbox_operator.client import DataPlaneError, SandboxClient
from sandbox_operator.client.dataplane.acas import acas_dataplanes
from sandbox_operator.contract import Capability, SandboxSpec
from tests.fixtures.acas_operator import TOKEN, Acas, acas_backend
from tests.fixtures.operator import Kit

pytestmark = [pytest.mark.integration]


# -- the stand-in, as a process of its own --


# -- operator with an acas backend --


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"{what}: not within {timeout}s")


def condition(kit: Kit, obj: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    cond = kit.condition(obj, ctype)
    assert cond is not None, (ctype, obj)
    return cond


def disposed_condition(kit: Kit, name: str, timeout: float = 40) -> dict[str, Any]:
    obj = kit.wait_condition(
        name, "Disposed", reasons=("DisposalFailed",), status="False", timeout=timeout
    )
    cond = kit.condition(obj, "Disposed")
    assert cond is not None
    return cond


# -- (a) routed to acas -> Ready, labelled at the service --


def test_sandbox_on_acas_becomes_ready_with_labels_at_the_service(acas: Acas) -> None:
    kit = acas.kit
    acas.start()
    kit.scope(scope="tenant-a", thread_id="thread-1")
    kit.sandbox("agent-one", agent_dir="agents/one", egress="closed")
    obj = acas.wait_ready("agent-one")
    status = obj["status"]
    assert status["backend"] == "acas"
    assert status["isolation"] == "microvm"
    remote = acas.remote("agent-one")
    assert len(remote) == 1, remote
    r = remote[0]
    assert status["servedBy"] == {"kind": "AcasSandbox", "name": r["id"]}
    assert r["state"] == "Running"
    labels = r["labels"]
    # Hashed key parts, the same values the Sandbox object itself carries.
    key_labels = {k: v for k, v in obj["metadata"]["labels"].items() if k.startswith(lbl.GROUP)}
    assert key_labels, obj["metadata"]["labels"]
    for k, v in key_labels.items():
        assert labels[k] == v, k
    assert labels[lbl.SCOPE_LABEL] == lbl.scope_value("tenant-a")
    assert labels[lbl.THREAD_LABEL] == lbl.thread_value("thread-1")
    assert labels[lbl.CONVERSATION_LABEL] == lbl.conversation_value("tenant-a", "thread-1")
    assert labels[lbl.AGENT_DIR_LABEL] == lbl.hash_part("agent-dir", "agents/one")
    assert labels[lbl.MANAGED_BY_LABEL] == lbl.MANAGED_BY_VALUE
    assert labels[lbl.BACKEND_LABEL] == "acas"
    # namespace/name and kind of the Sandbox, and its uid as the owner.
    assert labels[f"{lbl.GROUP}/namespace"] == kit.ns
    assert labels[lbl.SANDBOX_LABEL] == "agent-one"
    assert labels[f"{lbl.GROUP}/kind"] == "shell"
    assert labels[f"{lbl.GROUP}/owner-uid"] == obj["metadata"]["uid"]
    # No original (unhashed) key string is a label value.
    assert "tenant-a" not in labels.values() and "thread-1" not in labels.values()
    # Confinement went with the create: egress default deny, a lifetime that bounds an orphan.
    assert r["egressPolicy"]["http"]["defaultAction"] == "Deny"
    assert r["egressPolicy"]["transportRules"]["defaultAction"] == "Deny"
    assert r["lifecycle"]["autoDeletePolicy"]["enabled"] is True
    # Deleting the Sandbox disposes the remote sandbox and waits until the service says gone.
    kit.delete("agent-one")
    kit.wait_gone("agent-one", timeout=30)
    assert acas.remote("agent-one") == []
    acas.assert_logs_clean()


# -- (b) per-spec selection: microvm floor -> acas, container floor -> runc --


def test_per_spec_selection_sends_microvm_to_acas_and_container_to_runc(acas: Acas) -> None:
    kit = acas.kit
    acas.start(acas.config(perspec_with_runc=True))
    kit.scope()
    kit.sandbox("needs-microvm", minIsolation="microvm")
    kit.sandbox("container-is-enough", minIsolation="container")
    remote_obj = acas.wait_ready("needs-microvm")
    assert remote_obj["status"]["backend"] == "acas"
    assert remote_obj["status"]["isolation"] == "microvm"
    assert remote_obj["status"]["effectiveFloor"] == "microvm"
    assert remote_obj["status"]["servedBy"]["kind"] == "AcasSandbox"
    local_obj = kit.wait_condition("container-is-enough", "Admitted", status="True", timeout=60)
    assert local_obj["status"]["backend"] == "runc"
    assert local_obj["status"]["isolation"] == "container"
    pod = wait_for(lambda: kit.pod("container-is-enough"), 30, "pod of container-is-enough")
    assert pod.spec.runtime_class_name == "runc"
    # Each went to exactly one backend: no pod for the microvm one, no remote one for runc.
    assert kit.pod("needs-microvm") is None
    assert len(acas.remote("needs-microvm")) == 1
    assert acas.remote("container-is-enough") == []


# -- (c) scope deletion from a fresh operator process disposes by listing on the service --


@pytest.mark.slow
def test_fresh_operator_purges_a_deleted_scope_by_listing_the_service(acas: Acas) -> None:
    kit = acas.kit
    config = acas.config()
    a = acas.start(config)
    kit.scope("conv", scope="tenant-p", thread_id="thread-p")
    for name in ("p-one", "p-two", "p-orphan"):
        kit.sandbox(name, agent_dir=f"agents/{name}")
    for name in ("p-one", "p-two", "p-orphan"):
        acas.wait_ready(name)
    assert len(acas.standin.sandboxes()) == 3
    a.kill()  # SIGKILL: nothing is cleaned up, nothing is remembered anywhere but labels
    # While no operator runs, one Sandbox object vanishes without disposal (finalizer removed by
    # hand): its remote sandbox is now claimed by no Sandbox at all.
    kit.custom.patch_namespaced_custom_object(
        "sandbox-operator.dev",
        "v1alpha1",
        kit.ns,
        "sandboxes",
        "p-orphan",
        {"metadata": {"finalizers": None}},
    )
    kit.delete("p-orphan")
    kit.wait_gone("p-orphan", timeout=20)
    assert len(acas.standin.sandboxes()) == 3
    lists_before = acas.standin.calls("list")
    b = acas.start(config)
    assert b is not a
    kit.delete("conv", plural="sandboxscopes")
    kit.wait_gone("conv", plural="sandboxscopes", timeout=60)
    assert acas.standin.sandboxes() == []
    assert kit.list("sandboxes") == []
    assert acas.standin.calls("list") > lists_before
    assert acas.standin.calls("delete") >= 3


# -- (d) faults -> the documented condition or DisposalCode --


@pytest.mark.slow
def test_429_with_retry_after_on_listing_is_waited_for_and_the_sandbox_gets_ready(
    acas: Acas,
) -> None:
    kit = acas.kit
    acas.start()
    kit.scope()
    acas.standin.fault("list", status=429, retryAfter="2", times=2, code="TooManyRequests")
    started = time.monotonic()
    kit.sandbox("throttled")
    obj = acas.wait_ready("throttled")
    assert time.monotonic() - started >= 2.0  # at least one Retry-After was honoured
    assert [f["hits"] for f in acas.standin.faults()] == [2]
    # A throttled idempotent call is retried inside the driver, never surfaced as a failure.
    assert condition(kit, obj, "Admitted")["status"] == "True"
    events: list[Any] = list(kit.events("throttled"))
    assert not any(e.type == "Warning" for e in events)
    assert len(acas.remote("throttled")) == 1


def test_429_on_create_is_not_resent_and_the_sandbox_still_converges(acas: Acas) -> None:
    kit = acas.kit
    acas.start()
    kit.scope()
    acas.standin.fault("create", status=429, retryAfter="0", times=1, code="TooManyRequests")
    kit.sandbox("create-throttled")
    acas.wait_ready("create-throttled", timeout=60)
    # The throttled create was not retried blindly: a later reconcile pass looked again by
    # labels and created exactly one sandbox.
    assert acas.standin.calls("create") == 2
    assert len(acas.remote("create-throttled")) == 1
    assert len(acas.standin.sandboxes()) == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "code", "detail"),
    [
        ({"status": 500, "times": -1}, "unknown", "status=500 code=InjectedFault"),
        (
            {"status": 429, "retryAfter": "0", "times": -1, "code": "TooManyRequests"},
            "unknown",
            "status=429 code=TooManyRequests",
        ),
        ({"status": 403, "times": -1, "code": "AuthorizationFailed"}, "refused", "status=403"),
        ({"delay": 8, "times": -1}, "timeout", "AzureSandboxes_Delete"),
    ],
    ids=["500", "429-exhausted", "403", "slow"],
)
def test_delete_fault_yields_disposal_failed_with_its_code_then_lands(
    acas: Acas, fault: dict[str, Any], code: str, detail: str
) -> None:
    kit = acas.kit
    acas.start()
    kit.scope()
    kit.sandbox("victim")
    acas.wait_ready("victim")
    acas.standin.fault("delete", **fault)
    kit.delete("victim")
    cond = disposed_condition(kit, "victim")
    assert f"disposal failed ({code}) on backend acas" in cond["message"], cond
    assert detail in cond["message"], cond
    assert acas.standin.base_url not in cond["message"]
    assert "127.0.0.1" not in cond["message"] and TOKEN not in cond["message"]
    ready = kit.condition(kit.get("victim"), "Ready")
    assert ready is not None and ready["reason"] == "DisposalFailed"
    assert len(acas.remote("victim")) == 1
    # The fault clears: the finalizer's retry lands and the remote sandbox is gone.
    acas.standin.reset()
    kit.wait_gone("victim", timeout=60)
    assert acas.remote("victim") == []
    acas.assert_logs_clean()


@pytest.mark.slow
def test_scope_purge_with_a_failing_delete_records_each_undisposed_code(acas: Acas) -> None:
    kit = acas.kit
    acas.start()
    kit.scope("conv", scope="tenant-f", thread_id="thread-f")
    kit.sandbox("f-one")
    acas.wait_ready("f-one")
    acas.standin.fault("delete", status=500, times=-1)
    kit.delete("conv", plural="sandboxscopes")
    obj = kit.wait_condition(
        "conv",
        "Disposed",
        reasons=("PurgeIncomplete",),
        status="False",
        timeout=60,
        plural="sandboxscopes",
    )
    undisposed = obj["status"]["lastPurge"]["undisposed"]
    assert undisposed, obj["status"]
    assert {u["backend"] for u in undisposed} == {"acas"}
    assert {u["code"] for u in undisposed} == {"unknown"}
    assert all("AzureSandboxes_Delete status=500" in u["detail"] for u in undisposed)
    assert len(acas.remote("f-one")) == 1
    acas.standin.reset()
    kit.wait_gone("conv", plural="sandboxscopes", timeout=90)
    wait_for(lambda: acas.standin.sandboxes() == [], 60, "remote sandboxes purged")


@pytest.mark.slow
def test_delete_that_leaves_the_sandbox_listed_times_out(acas: Acas) -> None:
    kit = acas.kit
    acas.start()
    kit.scope()
    kit.sandbox("sticky")
    acas.wait_ready("sticky")
    acas.standin.configure(deleteLeavesListed=True)
    kit.delete("sticky")
    cond = disposed_condition(kit, "sticky")
    assert "disposal failed (timeout) on backend acas" in cond["message"], cond
    assert "AzureSandboxes_Delete" in cond["message"]
    assert len(acas.remote("sticky")) == 1  # the service still lists it: not reported gone
    acas.standin.configure(deleteLeavesListed=False)
    kit.wait_gone("sticky", timeout=60)
    assert acas.remote("sticky") == []


def test_expired_token_refuses_disposal_until_the_secret_is_rotated(acas: Acas) -> None:
    kit = acas.kit
    acas.start()
    kit.scope()
    kit.sandbox("creds")
    acas.wait_ready("creds")
    acas.standin.configure(expiredTokens=[TOKEN])
    kit.delete("creds")
    cond = disposed_condition(kit, "creds")
    assert "disposal failed (refused) on backend acas" in cond["message"], cond
    assert "status=401 code=ExpiredAuthenticationToken" in cond["message"]
    assert TOKEN not in cond["message"]
    # A new token in the Secret is read on the next attempt (the 401 dropped the old one).
    acas.standin.configure(tokens=[TOKEN, "rotated-token"])
    acas.set_token("rotated-token")
    kit.wait_gone("creds", timeout=60)
    assert acas.remote("creds") == []
    acas.assert_logs_clean("rotated-token")


def test_expired_token_at_start_makes_the_backend_unavailable(acas: Acas) -> None:
    kit = acas.kit
    acas.standin.configure(expiredTokens=[TOKEN])
    acas.start()
    kit.scope()
    kit.sandbox("no-creds")
    obj = kit.wait_condition(
        "no-creds", "Admitted", reasons=("BackendUnavailable",), status="False", timeout=60
    )
    msg = condition(kit, obj, "Admitted")["message"]
    assert "acas" in msg
    assert TOKEN not in msg and acas.standin.base_url not in msg
    assert acas.standin.sandboxes() == []
    assert acas.standin.calls("create") == 0


def test_created_sandbox_missing_from_its_listing_is_startup_failed_and_removed(
    acas: Acas,
) -> None:
    kit = acas.kit
    acas.start()
    kit.scope()
    # Every listing answers empty: the new sandbox could never be found again by labels.
    acas.standin.fault("list", status=200, body=[], times=-1)
    kit.sandbox("unfindable")
    obj = kit.wait_condition("unfindable", "Ready", reasons=("StartupFailed",), timeout=60)
    msg = condition(kit, obj, "Ready")["message"]
    assert "missing from its label listing" in msg, msg
    assert acas.standin.calls("create") == 1
    assert acas.standin.sandboxes() == []  # deleted by id at once, not left as an orphan


def test_remote_failure_before_ready_is_startup_failed(acas: Acas) -> None:
    kit = acas.kit
    acas.start()
    kit.scope()
    acas.standin.configure(startupState="Failed")
    kit.sandbox("broken")
    obj = kit.wait_condition("broken", "Ready", reasons=("StartupFailed",), timeout=60)
    assert "Failed" in condition(kit, obj, "Ready")["message"]
    wait_for(lambda: acas.remote("broken") == [], 30, "failed remote sandbox disposed")


@pytest.mark.slow
def test_remote_that_never_starts_is_startup_timeout(acas: Acas) -> None:
    kit = acas.kit
    acas.start()
    kit.scope()
    acas.standin.configure(readyAfterSeconds=3600)
    kit.sandbox("stuck", lifetime={"startupTimeoutSeconds": 5})
    kit.wait_condition("stuck", "Ready", reasons=("StartupTimeout",), timeout=60)
    wait_for(lambda: acas.remote("stuck") == [], 30, "stuck remote sandbox disposed")


# -- (e) a command execution is never sent twice by a retry --


@pytest.fixture
async def sandbox_client(
    acas: Acas, kubeconfig: str, namespace: str
) -> AsyncIterator[SandboxClient]:
    config = AcasBackendConfig.model_validate(acas_backend(acas.standin, namespace))
    remote = AcasClient(config, StaticTokenProvider(TOKEN))
    c = await SandboxClient.from_kubeconfig(
        namespace, kubeconfig=kubeconfig, dataplanes=acas_dataplanes({"acas": remote})
    )
    yield c
    await c.close()
    await remote.aclose()


@pytest.mark.slow
async def test_exec_is_sent_once_whatever_the_answer(
    acas: Acas, sandbox_client: SandboxClient, tmp_path: Path
) -> None:
    acas.start()
    acas.standin.configure(hostPaths=True)  # exec and file paths agree (loopback only)
    work = tmp_path / "work"
    work.mkdir()
    scope_ref = await sandbox_client.create_scope(scope="tenant-e", thread_id="thread-e")
    spec = SandboxSpec.model_validate(
        {
            "kind": "shell",
            "image": "sandbox-operator.dev/busybox:1",
            "workDir": str(work),
            "requires": [
                Capability.EXEC,
                Capability.RUN_CODE,
                Capability.FILES_IN,
                Capability.FILES_OUT,
            ],
        }
    )
    sandbox = await sandbox_client.acquire(scope_ref, "agents/e", spec, timeout=60)
    standin = acas.standin
    ok = await sandbox.exec("echo hello; echo oops >&2; exit 3")
    assert (ok.exit_code, ok.stdout, ok.stderr) == (3, b"hello\n", b"oops\n")
    base_calls = standin.calls("exec")
    base_runs = standin.state()["executions"]
    assert (base_calls, base_runs) == (1, 1)
    # The same handle serves code and files over the service's API.
    code = await sandbox.run_code("print(6 * 7)")
    assert (code.exit_code, code.stdout) == (0, b"42\n")
    await sandbox.write_file("notes/in.txt", b"payload")
    assert await sandbox.read_file("notes/in.txt") == b"payload"
    base_calls = standin.calls("exec")
    base_runs = standin.state()["executions"]

    # Statuses a retry would cure for an idempotent call: for an execution, one attempt only.
    faults: list[dict[str, Any]] = [
        {"status": 503, "retryAfter": "0", "code": "ServiceUnavailable"},
        {"status": 429, "retryAfter": "0", "code": "TooManyRequests"},
        {"status": 500},
    ]
    for n, fault in enumerate(faults, start=1):
        standin.fault("exec", times=1, **fault)
        with pytest.raises(DataPlaneError) as info:
            await sandbox.exec("echo run >> counter")
        assert f"status={fault['status']}" in str(info.value)
        assert standin.calls("exec") == base_calls + n
        assert standin.state()["executions"] == base_runs  # the fault answered; nothing ran
    assert not (work / "counter").exists()
    calls = standin.calls("exec")

    # A slow answer (within the wait) is waited for, not re-sent: the command ran once.
    standin.fault("exec", delay=2, times=1)
    slow = await sandbox.exec("echo run >> counter; echo done")
    assert slow.stdout == b"done\n"
    assert standin.calls("exec") == calls + 1
    assert (work / "counter").read_text() == "run\n"

    # An idempotent call next to it is retried on the same status (the contrast).
    stats = standin.calls("SandboxFilesOperations_GetSandboxFileStat")
    standin.fault("SandboxFilesOperations_GetSandboxFileStat", status=503, retryAfter="0", times=1)
    assert await sandbox.exists("counter")
    # work dir: the 503, then its retry; then the file itself.
    assert standin.calls("SandboxFilesOperations_GetSandboxFileStat") == stats + 3


@pytest.mark.slow
def test_server_error_on_every_create_ends_in_startup_timeout(acas: Acas) -> None:
    kit = acas.kit
    acas.start()
    kit.scope()
    acas.standin.fault("create", status=500, times=-1)
    kit.sandbox("never", lifetime={"startupTimeoutSeconds": 12})
    # admitted at once; Creating says what failed (never the endpoint); retried with backoff
    deadline = time.monotonic() + 20
    while True:
        obj = kit.wait_condition("never", "Ready", reasons=("Creating",), timeout=20)
        message = str((kit.condition(obj, "Ready") or {}).get("message", ""))
        if "AzureSandboxes_Create" in message or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert (kit.condition(obj, "Admitted") or {}).get("status") == "True"
    assert "HTTP 500" in message, message
    assert "127.0.0.1" not in message and TOKEN not in message
    kit.wait_condition("never", "Ready", reasons=("StartupTimeout",), timeout=40)
    assert acas.standin.calls("create") >= 2  # retried, not given up after one error
    assert acas.standin.sandboxes() == []


def test_remote_sandbox_missing_from_its_listing_is_unlisted_at_disposal(acas: Acas) -> None:
    """The status recorded the remote id; once the label listing drops it, disposal still
    goes after that id, and when it cannot delete it the code is `unlisted` (never "disposed")."""
    kit = acas.kit
    acas.start()
    kit.scope()
    kit.sandbox("lost")
    obj = acas.wait_ready("lost")
    remote_id = obj["status"]["servedBy"]["name"]
    assert [s["id"] for s in acas.remote("lost")] == [remote_id]
    acas.standin.fault("list", status=200, body=[], times=-1)
    acas.standin.fault("delete", status=500, times=-1)
    kit.delete("lost")
    cond = disposed_condition(kit, "lost")
    assert "disposal failed (unlisted) on backend acas" in cond["message"], cond
    assert remote_id in cond["message"] and "AzureSandboxes_Delete status=500" in cond["message"]
    assert "127.0.0.1" not in cond["message"] and TOKEN not in cond["message"]
    assert kit.get("lost") is not None  # the finalizer holds
    # The delete works again while the listing still misses it: removed by its recorded id.
    acas.standin.reset()
    acas.standin.fault("list", status=200, body=[], times=-1)
    kit.wait_gone("lost", timeout=60)
    assert all(s["id"] != remote_id for s in acas.standin.sandboxes())


# -- (f) suspend and resume through the service's stop and resume --


def _file_url(acas: Acas, remote_id: str) -> str:
    return (
        f"{acas.standin.base_url}/subscriptions/sub-test/resourceGroups/rg-test"
        f"/sandboxGroups/group-test/sandboxes/{remote_id}/files"
    )


def _file(acas: Acas, remote_id: str, data: bytes | None = None) -> int | bytes:
    """Write (`data`) or read /workspace/kept.bin in the remote sandbox, over the service API."""
    import httpx

    params = {"api-version": "2026-09-01-preview", "path": "/workspace/kept.bin"}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    if data is not None:
        params["createDirs"] = "true"
        response = httpx.post(
            _file_url(acas, remote_id), params=params, headers=headers, content=data
        )
        return response.status_code
    response = httpx.get(_file_url(acas, remote_id), params=params, headers=headers)
    return response.content if response.status_code == 200 else response.status_code


def _patch_suspended(kit: Kit, name: str, suspended: bool) -> None:
    kit.custom.patch_namespaced_custom_object(
        "sandbox-operator.dev",
        "v1alpha1",
        kit.ns,
        "sandboxes",
        name,
        {"spec": {"suspended": suspended}},
    )


def test_suspend_and_resume_stop_and_resume_the_remote_sandbox(acas: Acas) -> None:
    kit = acas.kit
    acas.start()
    kit.scope()
    kit.sandbox("keeper", storage={"size": "1Gi"})
    obj = acas.wait_ready("keeper")
    remote_id = obj["status"]["servedBy"]["name"]
    (remote,) = acas.remote("keeper")
    assert remote["resources"]["disk"] == "1Gi"  # spec.storage.size is the disk asked for
    content = bytes(range(256)) * 4
    assert _file(acas, remote_id, content) == 201

    _patch_suspended(kit, "keeper", True)
    obj = kit.wait_condition("keeper", "Ready", reasons=("Suspended",), status="False", timeout=60)
    (remote,) = acas.remote("keeper")
    assert remote["id"] == remote_id  # stopped, not deleted
    assert remote["state"] == "Stopped"
    assert remote["stateDetails"]["stoppedReason"] == "UserStopped"
    assert obj["status"]["suspendedBy"] == "spec" and obj["status"]["suspendCount"] == 1
    assert _file(acas, remote_id) == 409  # no data plane while stopped
    assert acas.standin.calls("SandboxLifecycleOperations_PostSandboxStop") == 1

    _patch_suspended(kit, "keeper", False)
    obj = wait_for(
        lambda: (
            (o := kit.get("keeper"))
            and (kit.condition(o, "Ready") or {}).get("status") == "True"
            and o
        ),
        60,
        "keeper Ready again",
    )
    (remote,) = acas.remote("keeper")
    assert (remote["id"], remote["state"]) == (remote_id, "Running")
    assert obj["status"]["servedBy"]["name"] == remote_id
    assert obj["status"].get("resumeCount") == 1, obj["status"]
    assert _file(acas, remote_id) == content  # byte for byte
    assert acas.standin.calls("create") == 1
    assert acas.standin.calls("SandboxLifecycleOperations_PostSandboxResume") == 1
    # Each request as the reference has it: POST, its path, api-version only, no body.
    requests = acas.standin.state()["lifecycleRequests"]
    assert [r["operation"].rsplit("_", 1)[1] for r in requests] == [
        "PostSandboxStop",
        "PostSandboxResume",
    ]
    for r, suffix in zip(requests, ("stop", "resume"), strict=True):
        assert r["method"] == "POST"
        assert r["path"].endswith(f"/sandboxGroups/group-test/sandboxes/{remote_id}/{suffix}")
        assert r["query"] == {"api-version": "2026-09-01-preview"}
        assert r["hasBody"] is False

    kit.delete("keeper")
    kit.wait_gone("keeper", timeout=30)
    assert acas.remote("keeper") == []
    acas.assert_logs_clean()


def test_a_sandbox_the_service_idle_stops_is_suspended_and_resumed_by_use(acas: Acas) -> None:
    from datetime import UTC, datetime, timedelta

    kit = acas.kit
    acas.start(acas.config(observeIntervalSeconds=1))
    kit.scope()
    kit.sandbox("dozer", storage={"size": "1Gi"})
    obj = acas.wait_ready("dozer")
    remote_id = obj["status"]["servedBy"]["name"]
    # The service's own idle auto-suspend (its lifecycle autoSuspendPolicy) stops it.
    acas.standin._call(
        f"/_standin/sandboxes/{remote_id}/state", {"state": "Stopped", "stoppedReason": "Idle"}
    )
    obj = kit.wait_condition("dozer", "Ready", reasons=("Suspended",), status="False", timeout=30)
    assert obj["status"]["suspendedBy"] == "idle"
    assert acas.standin.calls("SandboxLifecycleOperations_PostSandboxStop") == 0  # already
    # A use (the client's activity stamp) resumes it: the same remote sandbox, running again.
    time.sleep(1.1)
    stamp = (datetime.now(UTC) + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    kit.custom.patch_namespaced_custom_object(
        "sandbox-operator.dev",
        "v1alpha1",
        kit.ns,
        "sandboxes",
        "dozer",
        {"metadata": {"annotations": {lbl.LAST_ACTIVITY_ANNOTATION: stamp}}},
    )
    acas.wait_ready("dozer", timeout=30)
    (remote,) = acas.remote("dozer")
    assert (remote["id"], remote["state"]) == (remote_id, "Running")
    assert acas.standin.calls("SandboxLifecycleOperations_PostSandboxResume") == 1
    assert acas.standin.calls("create") == 1
