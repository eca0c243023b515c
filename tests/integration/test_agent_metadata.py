"""Nothing an agent may write on its Sandboxes wedges the operator (issue 13, finding 4).

Every Sandbox here is created (and deleted) as the agent: a ServiceAccount bound to the chart's
agent Role (create/get/list/watch/delete on Sandboxes), the calls impersonating it, made once for
the module. One operator serves every test here (``module_kit``), a subprocess with the test's
admin identity. Its pods run on no node: the test reports each Ready as a kubelet would
(tests/fixtures/nodeless.py); the chart's Role and admission policy are the real API server's.

* garbage in the operator's and kopf's bookkeeping annotations: served and deleted at once, its
  scope purged (kopf reads no progress or diff base from the object);
* ``last-activity`` in the year 9999: no exception, and idle expiry is not delayed (a stamp from
  the future is ignored);
* annotations up to the API server's 256 KiB limit: served and deleted (the operator's metadata
  patch leaves out what would push the object over the limit; every patch is small);
* a deleted Sandbox carrying another key's labels and a finalizer of someone else's: once the
  operator has let go of it, it does not hold that key at ``KeyUnclean``;
* the chart's ValidatingAdmissionPolicy (``sandboxMetadataPolicy``): the agent's writes of the
  operator's annotations, labels and kopf finalizers are refused, what the client writes passes.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from sandbox_operator import labels as lbl
from sandbox_operator.contract import SandboxKey
from tests.fixtures.chart import template
from tests.fixtures.nodeless import off_node, serve
from tests.fixtures.operator import FINALIZER, GROUP, VERSION, Kit, OperatorProcess, local_config

pytestmark = pytest.mark.integration

AGENT = "agent"
#: The API server's limit on the total size of an object's annotations (keys plus values).
ANNOTATIONS_LIMIT = 256 * 1024
FOREIGN_FINALIZER = "example.com/hold"


class Agent:
    """Sandbox calls made as the agent's ServiceAccount (impersonated)."""

    def __init__(self, api: client.ApiClient, namespace: str):
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.ns = namespace
        self.user = f"system:serviceaccount:{namespace}:{AGENT}"

    def create(self, body: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        kwargs = {"dry_run": "All"} if dry_run else {}
        result: dict[str, Any] = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.ns, "sandboxes", body, **kwargs
        )
        return result

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.ns, "sandboxes", name)


def _write_values(tmp_path: Path, name: str, values: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.fixture(scope="module")
def module_operator_config() -> dict[str, Any]:
    """Every test here shares one operator (``module_kit``). No safety-net resync: whatever is
    served is served from watch events and the operator's own deadlines."""
    return off_node(local_config(floor="container", operator={"resyncSeconds": 3600}))


@pytest.fixture(scope="module")
def agent(
    module_namespace: str, api_client: client.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Agent]:
    """The agent of the module's namespace (its ServiceAccount, Role and RoleBinding are made
    once: they go with the namespace)."""
    ns = module_namespace
    tmp_path = tmp_path_factory.mktemp("agent")
    values = {
        "agentRole": {
            "create": True,
            "namespaces": [ns],
            "subjects": [{"kind": "ServiceAccount", "name": AGENT, "namespace": ns}],
            "restrictExec": False,
        }
    }
    objs = template(values_files=[_write_values(tmp_path, "agent-values.yaml", values)])
    role = next(o for o in objs if o["kind"] == "Role" and o["metadata"]["name"].endswith("-agent"))
    binding = next(
        o for o in objs if o["kind"] == "RoleBinding" and o["metadata"]["name"].endswith("-agent")
    )
    # The Role as the chart ships it: no update on Sandboxes; patch, because the client acquires
    # by server-side apply and stamps last-activity (the metadata policy bounds what it writes).
    (sandbox_rule,) = [r for r in role["rules"] if r["resources"] == ["sandboxes"]]
    assert set(sandbox_rule["verbs"]) == {"create", "get", "list", "watch", "patch", "delete"}
    client.CoreV1Api(api_client).create_namespaced_service_account(
        ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=AGENT))
    )
    rbac = client.RbacAuthorizationV1Api(api_client)
    rbac.create_namespaced_role(ns, role)
    rbac.create_namespaced_role_binding(ns, binding)
    api = client.ApiClient(api_client.configuration)
    api.set_default_header("Impersonate-User", f"system:serviceaccount:{ns}:{AGENT}")
    as_agent = Agent(api, ns)
    deadline = time.monotonic() + 30
    while True:  # the binding reaches the authorizer's cache
        try:
            as_agent.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "sandboxes")
            break
        except ApiException as exc:
            if exc.status != 403 or time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    with pytest.raises(ApiException) as refused:  # and it is not more than the agent
        client.CustomObjectsApi(api).patch_namespaced_custom_object(
            GROUP, VERSION, ns, "sandboxscopes", "none", {"metadata": {"labels": {"a": "b"}}}
        )
    assert refused.value.status == 403
    try:
        yield as_agent
    finally:
        api.close()


def _released(kit: Kit, name: str, timeout: float = 30) -> dict[str, Any]:
    """Wait until the operator's finalizer is off a deleted Sandbox that a foreign one holds."""
    deadline = time.monotonic() + timeout
    obj: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        obj = kit.get(name)
        meta = (obj or {}).get("metadata") or {}
        if meta.get("deletionTimestamp") and FINALIZER not in (meta.get("finalizers") or []):
            assert obj is not None
            return obj
        time.sleep(0.3)
    raise AssertionError(f"{name}: the operator never let go of it: {obj and obj['metadata']}")


def _drop_foreign_finalizer(kit: Kit, name: str) -> None:
    with contextlib.suppress(ApiException):
        kit.custom.patch_namespaced_custom_object(
            GROUP, VERSION, kit.ns, "sandboxes", name, {"metadata": {"finalizers": None}}
        )


# ---- garbage in the bookkeeping annotations -----------------------------------------------------

GARBAGE = {
    "sandbox-operator.dev/sandbox_changed": "garbage",
    "sandbox-operator.dev/last-handled-configuration": "{not json",
    "kopf.zalando.org/last-handled-configuration": "{not json",
    "kopf.zalando.org/sandbox_changed": "garbage",
    "kopf.zalando.org/sandbox_event": '{"started": 7, "retries": "x"}',
}


def test_garbage_in_kopfs_and_the_operators_annotations_wedges_nothing(
    module_kit: Kit, agent: Agent, module_operator: OperatorProcess
) -> None:
    kit, operator = module_kit, module_operator
    kit.scope()
    for name in ("garbled", "garbled-purged"):
        body = kit.sandbox_body(name)
        body["metadata"]["annotations"] = dict(GARBAGE)
        agent.create(body)
    for name in ("garbled", "garbled-purged"):
        serve(kit, name)
    # Deleted by the agent: gone within the disposal bounds.
    started = time.monotonic()
    agent.delete("garbled")
    kit.wait_gone("garbled", timeout=30)
    # Purged with its scope (deleted by the host): the purge finishes.
    kit.delete("conv", "sandboxscopes")
    kit.wait_gone("garbled-purged", timeout=30)
    kit.wait_gone("conv", "sandboxscopes", timeout=30)
    assert time.monotonic() - started < 45
    assert "JSONDecodeError" not in operator.log(), operator.log()


# ---- a last-activity from the future ------------------------------------------------------------


def test_a_last_activity_from_the_future_neither_breaks_nor_delays_idle_expiry(
    module_kit: Kit, agent: Agent, module_operator: OperatorProcess
) -> None:
    kit, operator = module_kit, module_operator
    kit.scope()
    body = kit.sandbox_body("future", lifetime={"idleTimeoutSeconds": 6, "ttlSeconds": 3600})
    body["metadata"]["annotations"] = {lbl.LAST_ACTIVITY_ANNOTATION: "9999-12-31T23:59:59Z"}
    agent.create(body)
    serve(kit, "future")
    ready_at = time.monotonic()
    # Idle from the moment it became Ready, as if the stamp were not there.
    expired = kit.wait_condition("future", "Ready", reasons=("Expired",), timeout=30)
    assert time.monotonic() - ready_at < 20
    assert "idle" in kit.condition(expired)["message"]  # not the TTL
    assert "OverflowError" not in operator.log(), operator.log()
    agent.delete("future")
    kit.wait_gone("future", timeout=30)


# ---- annotations at the size limit --------------------------------------------------------------


def test_a_sandbox_whose_annotations_fill_the_limit_is_served_and_deleted(
    module_kit: Kit, agent: Agent, module_operator: OperatorProcess
) -> None:
    kit, operator = module_kit, module_operator
    kit.scope()
    body = kit.sandbox_body("stuffed")
    key = "example.com/filler"
    # 16 bytes short of the limit: any annotation the operator added would take it over.
    body["metadata"]["annotations"] = {key: "x" * (ANNOTATIONS_LIMIT - len(key) - 16)}
    agent.create(body)
    ready = serve(kit, "stuffed")
    meta = ready["metadata"]
    assert FINALIZER in meta["finalizers"]
    assert meta["labels"][lbl.KEY_LABEL]  # the key labels landed, the annotations did not fit
    started = time.monotonic()
    agent.delete("stuffed")
    kit.wait_gone("stuffed", timeout=30)
    assert time.monotonic() - started < 30
    assert "Unprocessable" not in operator.log() and "422" not in operator.log(), operator.log()


# ---- a foreign finalizer and another key's labels -----------------------------------------------


def test_a_deleted_sandbox_held_by_a_foreign_finalizer_does_not_hold_a_key(
    module_kit: Kit, agent: Agent
) -> None:
    kit = module_kit
    kit.scope()  # tenant-a / thread-1
    victim_key = SandboxKey(
        scope="tenant-a", thread_id="thread-1", agent_dir="agents/victim", call_id=""
    )
    # Another key's labels, on a Sandbox whose scope does not exist (so the operator never learns
    # its own key and leaves the labels as they are), with a finalizer of someone else's.
    holder = kit.sandbox_body("holder", scope_ref="no-such-scope")
    holder["metadata"]["labels"] = lbl.key_labels(victim_key, "shell")
    holder["metadata"]["finalizers"] = [FOREIGN_FINALIZER]
    agent.create(holder)
    try:
        kit.wait_condition("holder", "Admitted", reasons=("ScopeNotFound",), timeout=30)
        # A refusal puts no finalizer on (nothing was made): only the foreign one holds it.
        assert kit.get("holder")["metadata"]["finalizers"] == [FOREIGN_FINALIZER]  # type: ignore[index]
        agent.delete("holder")
        held = _released(kit, "holder")
        assert held["metadata"]["finalizers"] == [FOREIGN_FINALIZER]
        assert held["metadata"]["labels"][lbl.KEY_LABEL] == lbl.key_value(victim_key)
        # The key's own Sandbox is served: nothing of the holder is left to dispose.
        agent.create(kit.sandbox_body("victim", agent_dir="agents/victim"))
        serve(kit, "victim")
        assert kit.get("holder") is not None  # still held, by its foreign finalizer only
    finally:
        _drop_foreign_finalizer(kit, "holder")


def test_a_sandbox_waiting_on_its_key_goes_ahead_once_a_held_holder_is_let_go(
    module_kit: Kit, agent: Agent
) -> None:
    """The waiting Sandbox is woken when the operator lets go of the holder (no DELETED event
    comes while a foreign finalizer holds it, and no resync runs here)."""
    kit = module_kit
    kit.scope()
    agent.create(kit.sandbox_body("first", agent_dir="agents/shared"))
    serve(kit, "first")
    # A controller of someone else's adds a finalizer to the live Sandbox (the agent's patch
    # could too, unless the metadata policy is on: it refuses only kopf's finalizers).
    kit.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        kit.ns,
        "sandboxes",
        "first",
        {"metadata": {"finalizers": [FINALIZER, FOREIGN_FINALIZER]}},
    )
    try:
        agent.delete("first")
        agent.create(kit.sandbox_body("second", agent_dir="agents/shared"))
        serve(kit, "second")
        held = _released(kit, "first", timeout=5)
        assert held["metadata"]["finalizers"] == [FOREIGN_FINALIZER]
    finally:
        _drop_foreign_finalizer(kit, "first")


# ---- the chart's admission policy ---------------------------------------------------------------


def _whoami(api_client: client.ApiClient) -> str:
    review = client.AuthenticationV1Api(api_client).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    )
    return str(review.status.user_info.username)


@pytest.fixture
def metadata_policy(module_kit: Kit, api_client: client.ApiClient, tmp_path: Path) -> Iterator[str]:
    """The chart's sandboxMetadataPolicy, rendered for the test namespace (the operator under test
    runs as this test's admin identity, so that user is the operator here); its name."""
    values = {
        "watchNamespaces": [module_kit.ns],
        "sandboxMetadataPolicy": {"enabled": True, "operatorUsers": [_whoami(api_client)]},
    }
    release = f"md-{uuid.uuid4().hex[:8]}"
    objs = template(
        values_files=[_write_values(tmp_path, "policy-values.yaml", values)], release=release
    )
    # The metadata policy (serving named namespaces, the chart renders the served-namespaces
    # one too: another test's).
    (policy,) = [
        o
        for o in objs
        if o["kind"] == "ValidatingAdmissionPolicy"
        and o["metadata"]["name"].endswith("-sandbox-metadata")
    ]
    (binding,) = [
        o
        for o in objs
        if o["kind"] == "ValidatingAdmissionPolicyBinding"
        and o["spec"]["policyName"] == policy["metadata"]["name"]
    ]
    admission = client.AdmissionregistrationV1Api(api_client)
    admission.create_validating_admission_policy(policy)
    try:
        admission.create_validating_admission_policy_binding(binding)
        try:
            yield str(policy["metadata"]["name"])
        finally:
            admission.delete_validating_admission_policy_binding(binding["metadata"]["name"])
    finally:
        admission.delete_validating_admission_policy(policy["metadata"]["name"])


def _refusal(call: Any) -> str:
    with pytest.raises(ApiException) as refused:
        call()
    assert refused.value.status == 403, refused.value.body
    return str(refused.value.body)


def test_the_metadata_policy_keeps_the_operators_metadata_out_of_the_agents_reach(
    module_kit: Kit, agent: Agent, metadata_policy: str, api_client: client.ApiClient
) -> None:
    kit = module_kit
    kit.scope()

    def body(name: str, **meta: Any) -> dict[str, Any]:
        out = kit.sandbox_body(name)
        out["metadata"].update(meta)
        return out

    probe = body("probe", annotations={"kopf.zalando.org/last-handled-configuration": "{"})
    deadline = time.monotonic() + 30
    while True:  # the policy takes a moment to be loaded
        try:
            agent.create(probe, dry_run=True)
        except ApiException as exc:
            if exc.status == 403:
                break
            raise
        assert time.monotonic() < deadline, f"policy {metadata_policy} never took effect"
        time.sleep(0.5)

    refused = {
        "progress": body("a1", annotations={"sandbox-operator.dev/sandbox_changed": "garbage"}),
        "diffbase": body("a2", annotations={"kopf.zalando.org/last-handled-configuration": "{"}),
        "activity": body("a3", annotations={lbl.LAST_ACTIVITY_ANNOTATION: "garbage"}),
        "egress": body("a4", annotations={"sandbox-operator.dev/egress-proxy": "10.0.0.1:1"}),
        "label": body("a5", labels={lbl.POOL_LABEL: "somebody-elses"}),
        "finalizer": body("a6", finalizers=["kopf.zalando.org/KopfFinalizerMarker"]),
    }
    for what, obj in refused.items():
        message = _refusal(lambda obj=obj: agent.create(obj))
        if what == "finalizer":
            assert "kopf.zalando.org/KopfFinalizerMarker" in message, message
        else:
            meta = obj["metadata"]
            (name,) = {**meta.get("annotations", {}), **meta.get("labels", {})}
            assert name in message, (what, message)
    assert {o["metadata"]["name"] for o in kit.list()} == set()

    # What the client writes passes, and the operator (exempt) serves it.
    key = SandboxKey(scope="tenant-a", thread_id="thread-1", agent_dir="agents/ok", call_id="")
    stamp = {lbl.LAST_ACTIVITY_ANNOTATION: "2026-01-01T00:00:00Z"}
    ok = body(
        "ok", labels=lbl.key_labels(key, "shell"), annotations={**lbl.key_annotations(key), **stamp}
    )
    ok["spec"]["agentDir"] = "agents/ok"
    agent.create(ok)
    serve(kit, "ok")

    # Anyone else with patch rights (a host, a person) may not change them either, but may
    # stamp activity and remove what is not theirs.
    someone = "someone@example.com"
    rbac = client.RbacAuthorizationV1Api(api_client)
    rbac.create_namespaced_role(
        kit.ns,
        {
            "metadata": {"name": "patcher"},
            "rules": [
                {"apiGroups": [GROUP], "resources": ["sandboxes"], "verbs": ["get", "patch"]}
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        kit.ns,
        {
            "metadata": {"name": "patcher"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "patcher"},
            "subjects": [
                {"kind": "User", "name": someone, "apiGroup": "rbac.authorization.k8s.io"}
            ],
        },
    )
    api = client.ApiClient(api_client.configuration)
    api.set_default_header("Impersonate-User", someone)
    try:
        custom = client.CustomObjectsApi(api)

        def patch(meta: dict[str, Any]) -> Any:
            return custom.patch_namespaced_custom_object(
                GROUP, VERSION, kit.ns, "sandboxes", "ok", {"metadata": meta}
            )

        deadline = time.monotonic() + 30
        while True:
            try:
                patch({"annotations": {lbl.LAST_ACTIVITY_ANNOTATION: "2026-01-02T00:00:00Z"}})
                break
            except ApiException as exc:  # the binding reaches the authorizer's cache
                if exc.status != 403 or "forbidden: User" not in str(exc.body):
                    raise
                assert time.monotonic() < deadline
                time.sleep(0.3)
        assert lbl.KEY_LABEL in _refusal(lambda: patch({"labels": {lbl.KEY_LABEL: "other"}}))
        assert lbl.CALL_ANNOTATION in _refusal(
            lambda: patch({"annotations": {lbl.CALL_ANNOTATION: "other"}})
        )
        patch({"annotations": {lbl.AGENT_DIR_ANNOTATION: None}})  # removing is not writing
    finally:
        api.close()
