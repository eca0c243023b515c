"""The runtime-class backend: one hardened pod (plus a NetworkPolicy) per sandbox.

The pod runs the spec's image on the backend's RuntimeClass (runc, gVisor, Kata, ...) with a
keep-alive command; the workload runs through ``pods/exec``. Builders are pure functions over the
request (:mod:`.pods`), so what gets created is testable without a cluster, and so is what a pod's
status means (:mod:`.observe`); the driver (:mod:`.driver`, with :mod:`.objects` for disposal)
only creates, reads and deletes.

Security profile of every sandbox pod (see docs/security.md):

* no service-account token (``automountServiceAccountToken: false``), ``enableServiceLinks: false``;
* no host namespaces (hostNetwork/hostPID/hostIPC false), no host paths: only emptyDirs
  (the work dir and ``/tmp``), or for a spec with ``storage`` the sandbox's own
  PersistentVolumeClaim as the work dir (it outlives the pod: suspend deletes the pod only);
* ``allowPrivilegeEscalation: false``, every capability dropped, seccomp ``RuntimeDefault``,
  ``privileged: false``, read-only root filesystem (default);
* non-root: uid/gid 65532 unless the backend's ``pod`` settings say otherwise, and
  ``runAsNonRoot: true`` so the kubelet refuses an image that would run as root;
* ``restartPolicy: Never``: a sandbox whose keep-alive dies has lost its state, so it is reported
  as failed rather than silently restarted empty;
* owned by its Sandbox (garbage-collected with it as a last resort) and labelled with the hashed
  key parts, so a whole conversation is found by a label selector.
"""

from sandbox_operator.backends.runtimeclass.driver import RuntimeClassDriver
from sandbox_operator.backends.runtimeclass.objects import RuntimeClassObjects
from sandbox_operator.backends.runtimeclass.observe import (
    EGRESS_PENDING,
    FATAL_WAITING_REASONS,
    MISSING_HANDLER_PATTERNS,
    PULL_REASONS,
    RUNTIME_HANDLER_MISSING,
    SANDBOX_EVENTS_AFTER_SECONDS,
    SANDBOX_EVENTS_EVERY_SECONDS,
    awaits_pod_sandbox,
    backend_object,
    classify_pod,
    foreign_claim,
    missing_handler,
)
from sandbox_operator.backends.runtimeclass.pods import (
    CLAIM,
    CONTAINER_NAME,
    NETWORK_POLICY,
    NO_DNS_NAMESERVER,
    NO_DNS_OPTIONS,
    POD,
    POD_TEMPLATE_VERSION,
    TMP_VOLUME,
    WORK_VOLUME,
    build_egress_policy,
    build_pod,
    build_work_volume_claim,
    container_security_context,
    dns_settings,
    egress_policy_key,
    pod_manifest,
    policy_spec_differs,
    proxy_by_name,
)

__all__ = [
    "CLAIM",
    "CONTAINER_NAME",
    "EGRESS_PENDING",
    "FATAL_WAITING_REASONS",
    "MISSING_HANDLER_PATTERNS",
    "NETWORK_POLICY",
    "NO_DNS_NAMESERVER",
    "NO_DNS_OPTIONS",
    "POD",
    "POD_TEMPLATE_VERSION",
    "PULL_REASONS",
    "RUNTIME_HANDLER_MISSING",
    "SANDBOX_EVENTS_AFTER_SECONDS",
    "SANDBOX_EVENTS_EVERY_SECONDS",
    "TMP_VOLUME",
    "WORK_VOLUME",
    "RuntimeClassDriver",
    "RuntimeClassObjects",
    "awaits_pod_sandbox",
    "backend_object",
    "build_egress_policy",
    "build_pod",
    "build_work_volume_claim",
    "classify_pod",
    "container_security_context",
    "dns_settings",
    "egress_policy_key",
    "foreign_claim",
    "missing_handler",
    "pod_manifest",
    "policy_spec_differs",
    "proxy_by_name",
]
