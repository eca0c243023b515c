"""The Kubernetes objects the backends build and send, as TypedDicts: a sandbox's pod, its work
volume's claim and NetworkPolicy, a warm pool's pod and policy, the claim's metadata patch, and
the managed egress proxy's ServiceAccount, Role, RoleBindings, ConfigMap, Secret, Deployment and
Service.

Why TypedDicts and not models: the builders' dicts are what kubernetes_asyncio serializes as
they are (no model, no copy, the same bytes on the wire), and a TypedDict names the keys each
shape may have, so a misspelt key in a builder is a type error rather than a field the API server
drops. Only the keys the backends write are declared; a key that is not always written is
optional (``total=False`` or ``NotRequired``). What the backends read back from the API server is
read through ``sandbox_operator.views``, never through these.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, Required, TypedDict

# ---- metadata ------------------------------------------------------------------------------


class OwnerReference(TypedDict):
    """One entry of ``metadata.ownerReferences`` (a controller's, or a plain owner's)."""

    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: NotRequired[bool]
    blockOwnerDeletion: NotRequired[bool]


class ObjectMeta(TypedDict, total=False):
    """``metadata`` as written: a name or a ``generateName`` (a pool's pods, Events), the labels
    and annotations, the owners, finalizers (a merge patch replaces them), and a
    ``resourceVersion`` where a write is conditional on it."""

    name: str
    generateName: str
    namespace: str
    labels: dict[str, str]
    annotations: dict[str, str]
    finalizers: list[str]
    ownerReferences: list[OwnerReference]
    resourceVersion: str


class MetadataPatch(TypedDict):
    """A merge patch of an object's metadata alone (a warm pool pod's claim, the reconciler's
    labels, annotations and finalizers)."""

    metadata: ObjectMeta


class LabelSelector(TypedDict):
    matchLabels: dict[str, str]


# ---- pods ----------------------------------------------------------------------------------


class EnvVar(TypedDict):
    name: str
    value: str


class ContainerPort(TypedDict):
    name: str
    containerPort: int
    protocol: Literal["TCP"]


class ResourceRequirements(TypedDict, total=False):
    requests: dict[str, str]
    limits: dict[str, str]


class Capabilities(TypedDict):
    drop: list[str]


class SeccompProfile(TypedDict):
    type: Literal["RuntimeDefault"]


class RunAs(TypedDict, total=False):
    """Who a container's processes run as: what a container's and a pod's security context
    share."""

    runAsNonRoot: bool
    runAsUser: int
    runAsGroup: int
    seccompProfile: SeccompProfile


class SecurityContext(RunAs, total=False):
    """A container's security context."""

    allowPrivilegeEscalation: bool
    privileged: bool
    capabilities: Capabilities
    readOnlyRootFilesystem: bool


class PodSecurityContext(RunAs, total=False):
    fsGroup: int


class VolumeMount(TypedDict):
    name: str
    mountPath: str
    readOnly: NotRequired[bool]


class TCPSocketAction(TypedDict):
    port: int


class Probe(TypedDict):
    tcpSocket: TCPSocketAction
    periodSeconds: int
    failureThreshold: int


class Container(TypedDict, total=False):
    name: Required[str]
    image: Required[str]
    imagePullPolicy: str
    command: list[str]
    workingDir: str
    env: list[EnvVar]
    ports: list[ContainerPort]
    readinessProbe: Probe
    resources: ResourceRequirements
    securityContext: SecurityContext
    volumeMounts: list[VolumeMount]
    stdin: bool
    tty: bool


class EmptyDirVolumeSource(TypedDict, total=False):
    medium: str
    sizeLimit: str


class PersistentVolumeClaimVolumeSource(TypedDict):
    claimName: str


class KeyToPath(TypedDict):
    key: str
    path: str


class ConfigMapVolumeSource(TypedDict, total=False):
    name: Required[str]
    items: list[KeyToPath]
    optional: bool


class SecretVolumeSource(TypedDict):
    secretName: str
    defaultMode: int


class Volume(TypedDict, total=False):
    """A pod's volume: its name and one source."""

    name: Required[str]
    emptyDir: EmptyDirVolumeSource
    persistentVolumeClaim: PersistentVolumeClaimVolumeSource
    configMap: ConfigMapVolumeSource
    secret: SecretVolumeSource


class PodDNSConfigOption(TypedDict):
    name: str
    value: NotRequired[str]


class PodDNSConfig(TypedDict):
    nameservers: list[str]
    options: list[PodDNSConfigOption]


class HostAlias(TypedDict):
    ip: str
    hostnames: list[str]


class PodSpec(TypedDict, total=False):
    """The pod spec of a sandbox pod and of the egress proxy's pod template (not total: its
    name-lookup part is built on its own, :func:`~.runtimeclass.pods.dns_settings`)."""

    serviceAccountName: str
    runtimeClassName: str
    restartPolicy: Literal["Never"]
    automountServiceAccountToken: bool
    enableServiceLinks: bool
    hostNetwork: bool
    hostPID: bool
    hostIPC: bool
    shareProcessNamespace: bool
    terminationGracePeriodSeconds: int
    securityContext: PodSecurityContext
    containers: list[Container]
    volumes: list[Volume]
    dnsPolicy: Literal["ClusterFirst", "None"]
    dnsConfig: PodDNSConfig
    nodeSelector: dict[str, str]
    #: The backend's (or the proxy's) configured tolerations, passed through as the operator's
    #: configuration holds them (arbitrary JSON the API server judges): not re-validated here,
    #: which would reorder their keys and refuse what the API server takes (a null value).
    tolerations: list[dict[str, Any]]
    hostAliases: list[HostAlias]


class Pod(TypedDict):
    apiVersion: Literal["v1"]
    kind: str
    metadata: ObjectMeta
    spec: PodSpec


# ---- a sandbox's other objects -------------------------------------------------------------


class StorageRequest(TypedDict):
    requests: dict[str, str]


class PersistentVolumeClaimSpec(TypedDict):
    accessModes: list[str]
    resources: StorageRequest
    storageClassName: NotRequired[str]


class PersistentVolumeClaim(TypedDict):
    apiVersion: Literal["v1"]
    kind: str
    metadata: ObjectMeta
    spec: PersistentVolumeClaimSpec


class NetworkPolicyPeer(TypedDict, total=False):
    podSelector: LabelSelector
    namespaceSelector: LabelSelector


class NetworkPolicyPort(TypedDict):
    protocol: Literal["TCP"]
    port: int


class NetworkPolicyEgressRule(TypedDict):
    to: list[NetworkPolicyPeer]
    ports: list[NetworkPolicyPort]


#: ``from`` is a Python keyword: the functional form. The backends write no ingress rule (every
#: policy they make denies all ingress), so the list is always empty.
NetworkPolicyIngressRule = TypedDict(
    "NetworkPolicyIngressRule",
    {"from": list[NetworkPolicyPeer], "ports": list[NetworkPolicyPort]},
    total=False,
)


class NetworkPolicySpec(TypedDict, total=False):
    podSelector: Required[LabelSelector]
    policyTypes: list[Literal["Ingress", "Egress"]]
    ingress: list[NetworkPolicyIngressRule]
    egress: list[NetworkPolicyEgressRule]


class NetworkPolicy(TypedDict):
    apiVersion: Literal["networking.k8s.io/v1"]
    kind: str
    metadata: ObjectMeta
    spec: NetworkPolicySpec


# ---- the managed egress proxy --------------------------------------------------------------


class ServiceAccount(TypedDict):
    apiVersion: Literal["v1"]
    kind: str
    metadata: ObjectMeta


class PolicyRule(TypedDict):
    apiGroups: list[str]
    resources: list[str]
    verbs: list[str]
    resourceNames: NotRequired[list[str]]


class Role(TypedDict):
    apiVersion: Literal["rbac.authorization.k8s.io/v1"]
    kind: str
    metadata: ObjectMeta
    rules: list[PolicyRule]


class ClusterRoleRef(TypedDict):
    """A RoleBinding's ``roleRef`` (a Role or a ClusterRole)."""

    apiGroup: Literal["rbac.authorization.k8s.io"]
    kind: str
    name: str


class Subject(TypedDict):
    kind: str
    name: str
    namespace: str


class RoleBinding(TypedDict):
    apiVersion: Literal["rbac.authorization.k8s.io/v1"]
    kind: str
    metadata: ObjectMeta
    roleRef: ClusterRoleRef
    subjects: list[Subject]


class ConfigMap(TypedDict):
    apiVersion: Literal["v1"]
    kind: Literal["ConfigMap"]
    metadata: ObjectMeta
    data: dict[str, str]


class Secret(TypedDict):
    apiVersion: Literal["v1"]
    kind: Literal["Secret"]
    metadata: ObjectMeta
    type: Literal["Opaque"]
    data: dict[str, str]


class PodTemplateMeta(TypedDict):
    labels: dict[str, str]
    annotations: dict[str, str]


class PodTemplate(TypedDict):
    metadata: PodTemplateMeta
    spec: PodSpec


class DeploymentSpec(TypedDict):
    replicas: int
    selector: LabelSelector
    template: PodTemplate


class Deployment(TypedDict):
    apiVersion: Literal["apps/v1"]
    kind: Literal["Deployment"]
    metadata: ObjectMeta
    spec: DeploymentSpec


class ServicePort(TypedDict):
    name: str
    port: int
    targetPort: int
    protocol: Literal["TCP"]


class ServiceSpec(TypedDict):
    type: Literal["ClusterIP"]
    selector: dict[str, str]
    ports: list[ServicePort]
    clusterIP: NotRequired[str]


class Service(TypedDict):
    apiVersion: Literal["v1"]
    kind: Literal["Service"]
    metadata: ObjectMeta
    spec: ServiceSpec


#: Every object of a namespace's egress proxy (what is applied, in ``APPLIED`` order).
ProxyObject = ServiceAccount | Role | RoleBinding | ConfigMap | Secret | Deployment | Service


class OwnerReferencesOnly(TypedDict):
    """An object named by kind, name and namespace with only owner references: what one
    Sandbox's own field manager applies to a proxy object."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
