"""Pure builders and rules of the operator: pod, NetworkPolicy, pod classification, lifecycle,
conditions. No cluster."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sandbox_operator import labels as lbl
from sandbox_operator.backends.base import EnsureRequest, Observation, ObservedPhase, SandboxRef
from sandbox_operator.backends.runtimeclass import (
    awaits_pod_sandbox,
    build_egress_policy,
    build_pod,
    classify_pod,
    egress_policy_key,
    missing_handler,
    policy_spec_differs,
)
from sandbox_operator.config import PodSettings, RuntimeClassBackendConfig
from sandbox_operator.contract import (
    ConditionReason,
    Egress,
    HostPolicy,
    IsolationScope,
    Lifetime,
    SandboxKey,
    SandboxSpec,
)
from sandbox_operator.policy import resolve_spec
from sandbox_operator.reconcile import conditions as cnd
from sandbox_operator.reconcile.lifecycle import judge
from sandbox_operator.views import EventView, ObjectView, PodView

KEY = SandboxKey(scope="tenant", thread_id="t1", agent_dir="agents/coder")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def request(**spec) -> EnsureRequest:
    base = {"kind": "shell", "image": "sandbox-operator.dev/busybox:1"}
    base.update(spec)
    return EnsureRequest(
        sandbox=SandboxRef("ns", "sbx-coder-1", "uid-1"),
        key=KEY,
        spec=SandboxSpec.model_validate(base),
        isolation_scope=IsolationScope.CONVERSATION,
        labels=lbl.object_labels(KEY, "sbx-coder-1", "gvisor", kind="shell"),
        annotations=lbl.key_annotations(KEY),
    )


def backend(**pod) -> RuntimeClassBackendConfig:
    return RuntimeClassBackendConfig(
        type="runtimeClass",
        name="gvisor",
        runtime_class_name="gvisor",
        isolation="hardened_container",
        pod=PodSettings(**pod),
    )


def test_pod_is_hardened():
    pod = build_pod(request(), backend())
    spec = pod["spec"]
    assert spec["runtimeClassName"] == "gvisor"
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["hostNetwork"] is spec["hostPID"] is spec["hostIPC"] is False
    assert spec["restartPolicy"] == "Never"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 65532
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = spec["containers"]
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["readOnlyRootFilesystem"] is True
    assert c["workingDir"] == "/workspace"
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in vols[mounts["/workspace"]]
    assert "emptyDir" in vols[mounts["/tmp"]]
    assert all(set(v) == {"name", "emptyDir"} for v in spec["volumes"])  # no hostPath
    assert c["resources"] == {
        "requests": {"cpu": "10m", "memory": "32Mi"},
        "limits": {"cpu": "1", "memory": "512Mi"},
    }
    assert c["command"][0] == "/bin/sh"


def _container_resources(req: EnsureRequest) -> dict[str, Any]:
    resources: dict[str, Any] = build_pod(req, backend())["spec"]["containers"][0]["resources"]
    return resources


def test_pod_resources_are_the_resolved_ones() -> None:
    # The reconciler hands the driver the spec resolved under the host policy.
    host = HostPolicy.model_validate(
        {"resources": {"defaultRequests": {"cpu": "50m"}, "defaultLimits": {"memory": "1Gi"}}}
    )
    raw = request(resources={"limits": {"cpu": "2"}})
    resolved = replace(raw, spec=resolve_spec(host, raw.spec))
    assert _container_resources(resolved) == {
        "requests": {"cpu": "50m", "memory": "32Mi"},
        "limits": {"cpu": "2", "memory": "1Gi"},
    }
    # What the spec states is what the pod gets.
    stated = {"requests": {"cpu": "250m", "memory": "128Mi"}, "limits": {"cpu": 1, "memory": "1Gi"}}
    assert _container_resources(request(resources=stated)) == {
        "requests": {"cpu": "250m", "memory": "128Mi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    }


def test_pod_resources_never_lack_limits_or_put_requests_above_them() -> None:
    # An unresolved spec (only limits, below the default requests) still gets a complete,
    # consistent pair: the built-in defaults, the requests capped at the stated limits.
    assert _container_resources(request(resources={"limits": {"cpu": "5m", "memory": "16Mi"}})) == {
        "requests": {"cpu": "5m", "memory": "16Mi"},
        "limits": {"cpu": "5m", "memory": "16Mi"},
    }
    assert _container_resources(request(resources={"requests": {"memory": "1Gi"}})) == {
        "requests": {"cpu": "10m", "memory": "1Gi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    }


def test_pod_identity_labels_and_owner():
    pod = build_pod(request(), backend())
    meta = pod["metadata"]
    assert meta["name"] == "sbx-coder-1"
    assert meta["labels"][lbl.SANDBOX_LABEL] == "sbx-coder-1"
    assert meta["labels"][lbl.KEY_LABEL] == lbl.key_value(KEY)
    assert meta["annotations"][lbl.AGENT_DIR_ANNOTATION] == "agents/coder"
    (owner,) = meta["ownerReferences"]
    assert owner["kind"] == "Sandbox" and owner["uid"] == "uid-1" and owner["controller"]


def test_pod_settings_can_keep_the_image_user():
    pod = build_pod(request(), backend(run_as_user=None, run_as_group=None, fs_group=None))
    assert "runAsUser" not in pod["spec"]["securityContext"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


def policy(req: EnsureRequest, cfg: Any = None, managed: Any = None) -> dict[str, Any]:
    """The namespace's egress policy that confines the pod of ``req``."""
    return build_egress_policy(req.sandbox.namespace, req.spec.egress, cfg or backend(), managed)


def test_network_policy_closed_denies_all_egress_and_ingress():
    np = policy(request())
    assert np["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert np["spec"]["egress"] == [] and np["spec"]["ingress"] == []
    open_np = policy(request(egress=Egress.UNRESTRICTED))
    assert open_np["spec"]["policyTypes"] == ["Ingress"]


def test_one_egress_policy_per_backend_and_mode_selects_its_pods_by_label():
    """The policy names no Sandbox: it selects every pod of its backend and egress mode in the
    namespace, which the pod carries from its creation; it has no owner (it outlives any one
    Sandbox) and says which backend and mode it is for."""
    cfg = backend()
    closed, other = request(), _named_request("other")
    assert policy(closed) == policy(other)  # two Sandboxes, one policy
    np = policy(closed)
    assert np["metadata"]["name"] == f"sandbox-egress-{cfg.name}-closed"
    assert "ownerReferences" not in np["metadata"]
    selector = np["spec"]["podSelector"]["matchLabels"]
    assert selector == lbl.egress_policy_labels(cfg.name, "closed")
    pod_labels = build_pod(closed, cfg)["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    assert egress_policy_key(ObjectView(np)) == (cfg.name, Egress.CLOSED)
    # An unrestricted pod is not selected by the closed policy, nor the other way round.
    open_pod = build_pod(request(egress=Egress.UNRESTRICTED), cfg)["metadata"]["labels"]
    assert not selector.items() <= open_pod.items()
    assert policy(request(egress=Egress.UNRESTRICTED))["metadata"]["name"].endswith("-unrestricted")
    # Other policies (a pool's deny-all, a per-Sandbox one of an older version) are not these.
    no_mode = ObjectView({"metadata": {"labels": {lbl.BACKEND_LABEL: cfg.name}}})
    assert egress_policy_key(no_mode) is None


def test_a_policy_as_the_api_server_returns_it_is_not_taken_for_a_changed_one():
    """The server drops empty lists (``ingress: []``): that is no difference; a changed rule,
    a changed selector or a changed mode is."""
    want = policy(request())["spec"]
    returned = {k: v for k, v in want.items() if v != []}
    assert not policy_spec_differs(returned, want)
    assert policy_spec_differs(policy(request(egress=Egress.UNRESTRICTED))["spec"], want)
    wider = {**want, "podSelector": {"matchLabels": {lbl.BACKEND_LABEL: "runc"}}}
    assert policy_spec_differs(wider, want)
    assert policy_spec_differs(
        {**want, "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]}, want
    )
    assert policy_spec_differs(None, want)


def _pod(phase="Pending", state=None, ready=False, conditions=()):
    cs = {"name": "sandbox", "ready": ready, "state": state or {}}
    return PodView(
        {
            "metadata": {
                "name": "p",
                "namespace": "ns",
                "creationTimestamp": "2026-01-01T00:00:00Z",
            },
            "status": {"phase": phase, "containerStatuses": [cs], "conditions": list(conditions)},
        }
    )


def test_classify_pod():
    assert classify_pod(None).phase is ObservedPhase.ABSENT
    assert classify_pod(_pod()).phase is ObservedPhase.STARTING
    pulled = classify_pod(_pod(state={"waiting": {"reason": "ErrImageNeverPull"}}))
    assert pulled.phase is ObservedPhase.STARTUP_FAILED
    assert pulled.detail_reason == "ErrImageNeverPull"
    assert (
        classify_pod(_pod(state={"waiting": {"reason": "ImagePullBackOff"}})).phase
        is ObservedPhase.STARTUP_FAILED
    )
    assert (
        classify_pod(_pod(state={"waiting": {"reason": "ContainerCreating"}})).phase
        is ObservedPhase.STARTING
    )
    ready = classify_pod(_pod("Running", {"running": {}}, True))
    assert ready.phase is ObservedPhase.READY
    dead = classify_pod(_pod("Failed", {"terminated": {"reason": "Error", "exitCode": 1}}))
    assert dead.phase is ObservedPhase.FAILED
    assert "exit code 1" in dead.message


LIFE = Lifetime(startup_timeout_seconds=30, ttl_seconds=600, idle_timeout_seconds=120)


def j(phase, *, was_ready=False, now=T0 + timedelta(seconds=5), **kw):
    obs = Observation(phase, created_at=T0)
    args = {
        "lifetime": LIFE,
        "was_ready": was_ready,
        "ready_since": T0 if was_ready else None,
        "sandbox_created": T0,
        "admitted_at": T0,
        "last_activity": None,
        "now": now,
    }
    args.update(kw)
    return judge(obs, **args)


def test_lifecycle_reasons():
    R = ConditionReason
    assert j(ObservedPhase.READY).reason is R.READY and j(ObservedPhase.READY).ready
    assert j(ObservedPhase.STARTING).reason is R.CREATING
    assert j(ObservedPhase.ABSENT).create
    late = T0 + timedelta(seconds=31)
    assert j(ObservedPhase.STARTING, now=late).reason is R.STARTUP_TIMEOUT
    assert j(ObservedPhase.STARTUP_FAILED).reason is R.STARTUP_FAILED
    assert j(ObservedPhase.FAILED).reason is R.STARTUP_FAILED
    assert j(ObservedPhase.FAILED, was_ready=True).reason is R.FAILED
    assert j(ObservedPhase.ABSENT, was_ready=True).reason is R.FAILED
    idle = T0 + timedelta(seconds=121)
    assert j(ObservedPhase.READY, was_ready=True, now=idle).reason is R.EXPIRED
    busy = j(
        ObservedPhase.READY, was_ready=True, now=idle, last_activity=idle - timedelta(seconds=10)
    )
    assert busy.reason is R.READY
    old = T0 + timedelta(seconds=601)
    ttl = j(ObservedPhase.READY, was_ready=True, now=old, last_activity=old)
    assert ttl.reason is R.EXPIRED and ttl.dispose and ttl.terminal


def test_conditions_transition_time_moves_only_on_status_flip():
    c1 = cnd.set_condition([], "Ready", "False", "Creating", "m", 1, T0)
    c2 = cnd.set_condition(
        c1, "Ready", "False", "StartupTimeout", "x", 2, T0 + timedelta(seconds=60)
    )
    assert c2[0]["lastTransitionTime"] == c1[0]["lastTransitionTime"]
    assert c2[0]["reason"] == "StartupTimeout" and c2[0]["observedGeneration"] == 2
    c3 = cnd.set_condition(c2, "Ready", "True", "Ready", "ok", 2, T0 + timedelta(seconds=90))
    assert c3[0]["lastTransitionTime"] == "2026-01-01T00:01:30Z"
    c4 = cnd.set_condition(c3, "Admitted", "True", "Admitted", "a", 2, T0)
    assert [c["type"] for c in c4] == ["Admitted", "Ready"]


def test_status_patch_only_when_changed():
    conds = cnd.set_condition([], "Ready", "True", "Ready", "ok", 1, T0)
    old = {"conditions": conds, "observedGeneration": 1, "backend": "gvisor"}
    assert cnd.status_patch(old, {"conditions": conds, "observedGeneration": 1}) is None
    assert cnd.status_patch(old, {"backend": "runc"}) == {"backend": "runc"}
    assert cnd.status_patch(old, {"backend": None}) == {"backend": None}
    assert cnd.status_patch({}, {"backend": None}) is None


def test_allowlist_goes_through_the_backends_egress_proxy_only():
    from sandbox_operator.config import EgressProxySettings

    proxied = backend().model_copy(
        update={
            "egress_proxy": EgressProxySettings(
                url="http://egress-proxy:3128", port=3128, pod_selector={"app": "egress-proxy"}
            )
        }
    )
    req = request(egress=Egress.ALLOWLIST, egress_allow=("example.com",))
    env = {e["name"]: e["value"] for e in build_pod(req, proxied)["spec"]["containers"][0]["env"]}
    assert env["HTTPS_PROXY"] == "http://egress-proxy:3128"
    np = policy(req, proxied)
    (rule,) = np["spec"]["egress"]
    assert rule["to"] == [{"podSelector": {"matchLabels": {"app": "egress-proxy"}}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 3128}]
    # without a proxy: no egress at all
    assert policy(req, backend())["spec"]["egress"] == []
    closed_env = build_pod(request(), proxied)["spec"]["containers"][0]["env"]
    assert "HTTPS_PROXY" not in {e["name"] for e in closed_env}


def test_an_intercepting_proxy_s_ca_is_mounted_read_only_and_trusted_never_its_key():
    """#38 item 1: under a proxy that terminates TLS, an allowlisted pod mounts the CA's
    certificate and the bundle (only those keys of the proxy's ConfigMap), read-only, and the
    common TLS stacks are pointed at them; the Secret with the key is never mounted."""
    from sandbox_operator.backends.egress_proxy import ProxyAddress
    from sandbox_operator.config import EgressProxySettings

    managed = backend().model_copy(update={"egress_proxy": EgressProxySettings(managed=True)})
    req = request(egress=Egress.ALLOWLIST, egress_allow=("example.com",))
    pod = build_pod(req, managed, ProxyAddress("10.96.12.34", 3129, intercepting=True))
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    for var in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"):
        assert env[var] == "/etc/sandbox-egress-ca/bundle.crt"
    assert env["NODE_EXTRA_CA_CERTS"] == "/etc/sandbox-egress-ca/ca.crt"
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/sandbox-egress-ca"]
    assert mount["readOnly"] is True
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume == {
        "name": mount["name"],
        "configMap": {
            "name": "sandbox-egress-proxy",
            "items": [
                {"key": "ca.crt", "path": "ca.crt"},
                {"key": "bundle.crt", "path": "bundle.crt"},
            ],
            "optional": True,
        },
    }
    assert not any("secret" in v for v in pod["spec"]["volumes"])
    # Without interception (and for a closed pod) nothing of it.
    plain = build_pod(req, managed, ProxyAddress("10.96.12.34", 3129))
    assert "SSL_CERT_FILE" not in {e["name"] for e in plain["spec"]["containers"][0]["env"]}
    closed = build_pod(request(), managed, ProxyAddress("10.96.12.34", 3129, intercepting=True))
    assert "SSL_CERT_FILE" not in {e["name"] for e in closed["spec"]["containers"][0]["env"]}


def test_allowlist_with_the_managed_proxy_gets_its_service_address_as_a_number():
    """An allowlisted sandbox resolves no names: it is given the proxy Service's cluster IP, the
    address is recorded on the pod (recovery), and its only egress is the proxy pods' port."""
    from sandbox_operator.backends.egress_proxy import (
        PROXY_ADDRESS_ANNOTATION,
        ProxyAddress,
        proxy_labels,
    )
    from sandbox_operator.config import EgressProxySettings, ManagedEgressProxySettings

    managed = backend().model_copy(update={"egress_proxy": EgressProxySettings(managed=True)})
    settings = ManagedEgressProxySettings(image="sandbox-operator.dev/operator:0.1.0", port=3129)
    address = ProxyAddress("10.96.12.34", 3129)
    req = request(egress=Egress.ALLOWLIST, egress_allow=("example.com",))
    pod = build_pod(req, managed, address)
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    for var in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        assert env[var] == "http://10.96.12.34:3129"
    assert "NO_PROXY" not in env
    assert pod["metadata"]["annotations"][PROXY_ADDRESS_ANNOTATION] == "10.96.12.34:3129"
    # The key annotations are still there.
    assert set(lbl.key_annotations(KEY).items()) <= set(pod["metadata"]["annotations"].items())

    np = policy(req, managed, settings)
    (rule,) = np["spec"]["egress"]
    assert rule == {
        "to": [{"podSelector": {"matchLabels": proxy_labels()}}],
        "ports": [{"protocol": "TCP", "port": 3129}],
    }
    assert np["spec"]["ingress"] == []
    # No address (never happens in the driver): no proxy variables, and no egress rule without
    # the settings, rather than a guess.
    bare = build_pod(req, managed)
    assert "HTTPS_PROXY" not in {e["name"] for e in bare["spec"]["containers"][0]["env"]}
    assert PROXY_ADDRESS_ANNOTATION not in bare["metadata"]["annotations"]
    assert policy(req, managed)["spec"]["egress"] == []
    # A closed sandbox on the same backend gets neither.
    closed = build_pod(request(), managed, address)
    assert "HTTPS_PROXY" not in {e["name"] for e in closed["spec"]["containers"][0]["env"]}
    assert PROXY_ADDRESS_ANNOTATION not in closed["metadata"]["annotations"]
    assert policy(request(), managed, settings)["spec"]["egress"] == []
    # IPv6 cluster IPs are bracketed in the URL.
    v6 = build_pod(req, managed, ProxyAddress("fd00:10:96::7", 3129))
    env6 = {e["name"]: e["value"] for e in v6["spec"]["containers"][0]["env"]}
    assert env6["HTTPS_PROXY"] == "http://[fd00:10:96::7]:3129"


def _named_request(name: str) -> EnsureRequest:
    base = request()
    return EnsureRequest(
        sandbox=SandboxRef("ns", name, "uid-1"),
        key=base.key,
        spec=base.spec,
        isolation_scope=base.isolation_scope,
        labels=lbl.object_labels(KEY, name, "gvisor", kind="shell"),
        annotations=base.annotations,
    )


def test_every_sandbox_pod_name_starts_with_the_agent_exec_prefix():
    """The example agent policy lets agents exec only into pods named `sbx-...` (RBAC and the
    admission policy's CEL cannot see a pod's labels on pods/exec), so every pod is so named:
    hand-named Sandboxes too, deterministically, within 63 characters, distinct per name."""
    import yaml

    from sandbox_operator import naming
    from tests.fixtures.chart import CHART

    prefix = yaml.safe_load((CHART / "values.yaml").read_text())["agentRole"]["sandboxPodPrefix"]
    assert prefix == naming.SANDBOX_OBJECT_PREFIX
    names = ["box", "my-sandbox", "a" * 63, "My.Dotted.Name", "sbx", "sbxfoo", "x" * 200]
    names.append(naming.sandbox_name(KEY, "shell"))
    pod_names = [naming.pod_name(n) for n in names]
    for name, pod_name in zip(names, pod_names, strict=True):
        assert pod_name.startswith(prefix), (name, pod_name)
        assert naming.is_dns1123_label(pod_name), pod_name
        assert naming.pod_name(name) == pod_name  # deterministic
        pod = build_pod(_named_request(name), backend())
        assert pod["metadata"]["name"] == pod_name
        assert pod["metadata"]["labels"][lbl.SANDBOX_LABEL] == lbl.sandbox_label_value(name)
    assert len(set(pod_names)) == len(names)
    # names the client gives (sbx-...) and other sbx- names are kept as they are
    assert naming.pod_name(naming.sandbox_name(KEY, "shell")) == naming.sandbox_name(KEY, "shell")
    assert naming.pod_name("sbx-coder-1") == "sbx-coder-1"
    assert naming.pod_name("box").startswith("sbx-box-")


async def test_observe_follows_a_pod_recorded_under_an_older_name():
    """A Sandbox whose pod was created before pods were always `sbx-...` keeps being observed
    through the name its status recorded (servedBy), instead of being judged vanished."""
    from sandbox_operator.backends.base import ServedBy
    from sandbox_operator.backends.runtimeclass import RuntimeClassDriver

    pods = {
        "box": {
            "metadata": {"name": "box", "ownerReferences": [{"uid": "uid-1"}]},
            "status": {"phase": "Running", "containerStatuses": [{"ready": True}]},
        }
    }

    class Driver(RuntimeClassDriver):
        def __init__(self) -> None:
            pass

        async def _read_pod(self, namespace, name):
            found = pods.get(name)
            return None if found is None else PodView(found)

    driver = Driver()
    plain = await driver.observe(SandboxRef("ns", "box", "uid-1"))
    assert plain.phase is ObservedPhase.ABSENT
    recorded = SandboxRef("ns", "box", "uid-1", ServedBy("Pod", "box", "ns"))
    seen = await driver.observe(recorded)
    assert seen.phase is not ObservedPhase.ABSENT
    assert seen.served_by is not None and seen.served_by.name == "box"


def test_a_missing_runtime_handler_is_read_from_the_kubelets_events():
    def event(message: str, reason: str = "FailedCreatePodSandBox") -> EventView:
        return EventView({"reason": reason, "message": message})

    containerd = (
        "Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox "
        'runtime: no runtime for "kata" is configured'
    )
    crio = "Failed to create pod sandbox: rpc error: failed to find runtime handler kata from list"
    assert missing_handler([event(containerd)]) == "kata"
    assert missing_handler([event(crio)]) == "kata"
    # Other sandbox failures (CNI, a slow runtime) are not a missing handler: they may pass.
    assert missing_handler([event("failed to setup network for sandbox: plugin timed out")]) is None
    assert missing_handler([event(containerd, reason="FailedMount")]) is None
    assert missing_handler([]) is None


def test_only_a_pod_waiting_for_its_sandbox_for_a_while_has_its_events_read():
    now = datetime(2026, 1, 1, tzinfo=UTC)

    def pod(age: float, node: str = "n1", phase: str = "Pending", waiting: str | None = None):
        statuses = []
        if waiting is not None:
            statuses = [{"name": "sandbox", "state": {"waiting": {"reason": waiting}}}]
        created = (now - timedelta(seconds=age)).isoformat().replace("+00:00", "Z")
        return PodView(
            {
                "metadata": {"creationTimestamp": created},
                "spec": {"nodeName": node},
                "status": {"phase": phase, "containerStatuses": statuses},
            }
        )

    assert awaits_pod_sandbox(pod(10), now)
    assert awaits_pod_sandbox(pod(10, waiting="ContainerCreating"), now)
    assert not awaits_pod_sandbox(pod(1), now)  # the normal path: no list call
    assert not awaits_pod_sandbox(pod(10, node=""), now)  # not scheduled: nothing to ask
    assert not awaits_pod_sandbox(pod(10, phase="Running"), now)
    assert not awaits_pod_sandbox(pod(10, waiting="ImagePullBackOff"), now)


NO_DNS = {
    "dnsPolicy": "None",
    "dnsConfig": {
        "nameservers": ["127.0.0.1"],
        "options": [
            {"name": "use-vc"},
            {"name": "timeout", "value": "1"},
            {"name": "attempts", "value": "1"},
        ],
    },
}


def _dns(pod: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in pod["spec"].items() if k in ("dnsPolicy", "dnsConfig")}


def test_a_sandbox_that_may_reach_no_resolver_fails_lookups_inside_the_pod() -> None:
    """Closed sandboxes (and allowlisted ones given the proxy as a number) ask only the pod's own
    loopback, over TCP: refused at once by a RST, never an ICMP error the node rate-limits (which
    made every other lookup under the deny-all policy wait 5 s). Warm pool pods are built by the
    same function, so a pool with a closed template gets the same."""
    from sandbox_operator.backends.base import PoolRef
    from sandbox_operator.backends.egress_proxy import ProxyAddress
    from sandbox_operator.backends.warmpool import build_pool_pod
    from sandbox_operator.config import EgressProxySettings

    assert _dns(build_pod(request(), backend())) == NO_DNS
    pool_pod = build_pool_pod(PoolRef("ns", "p", "u"), request().spec, backend(), "s" * 32)
    assert _dns(pool_pod) == NO_DNS
    allow = request(egress=Egress.ALLOWLIST, egress_allow=("example.com",))
    managed = backend().model_copy(update={"egress_proxy": EgressProxySettings(managed=True)})
    assert _dns(build_pod(allow, managed, ProxyAddress("10.96.12.34", 3129))) == NO_DNS
    assert _dns(build_pod(allow, managed)) == NO_DNS  # no proxy yet: nothing to resolve either
    for url in ("http://10.96.0.9:3128", "http://[fd00::9]:3128"):
        by_number = backend().model_copy(
            update={"egress_proxy": EgressProxySettings(url=url, port=3128)}
        )
        assert _dns(build_pod(allow, by_number)) == NO_DNS, url
    assert _dns(build_pod(allow, backend())) == NO_DNS  # allowlist without a proxy: closed
    # The manifest is built fresh each time (no shared lists a caller could mutate).
    first = build_pod(request(), backend())
    first["spec"]["dnsConfig"]["options"].clear()
    assert _dns(build_pod(request(), backend())) == NO_DNS


def test_sandboxes_that_need_a_resolver_keep_the_clusters() -> None:
    """Unrestricted sandboxes, and allowlisted ones whose (external) proxy is given by name,
    which they must resolve themselves, keep the cluster's resolver."""
    from sandbox_operator.config import EgressProxySettings

    unrestricted = request(egress=Egress.UNRESTRICTED)
    assert _dns(build_pod(unrestricted, backend())) == {"dnsPolicy": "ClusterFirst"}
    by_name = backend().model_copy(
        update={"egress_proxy": EgressProxySettings(url="http://egress-proxy:3128", port=3128)}
    )
    allow = request(egress=Egress.ALLOWLIST, egress_allow=("example.com",))
    assert _dns(build_pod(allow, by_name)) == {"dnsPolicy": "ClusterFirst"}
    # The same backend's closed sandboxes still fail lookups inside the pod.
    assert _dns(build_pod(request(), by_name)) == NO_DNS


def test_spec_labels_reach_no_pod_or_network_policy():
    """#25 item 9: a spec's labels are the host's words, handed to its observers only; the
    operator's objects carry none of them (keys or values), whatever they say."""
    words = {"tenant-marker-key": "tenant-marker-value"}
    req = request(labels=words)
    assert req.spec.labels == words
    for obj in (build_pod(req, backend()), policy(req)):
        text = repr(obj)
        assert "tenant-marker" not in text
