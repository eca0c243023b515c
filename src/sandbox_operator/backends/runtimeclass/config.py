"""Configuration of one ``runtimeClass`` backend (pods on a Kubernetes RuntimeClass).

It sits beside the driver that reads it; ``sandbox_operator.config.OperatorConfig`` takes it into
its backends union, discriminated by ``type``. It imports nothing of the driver, so the operator
configuration can be validated (``sandbox-operator check-config``) without a cluster.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final, Literal

from pydantic import ConfigDict, Field, model_validator

from sandbox_operator.contract import BackendDeclarations, Capability, Egress, OsFamily
from sandbox_operator.contract.base import ContractModel

#: A DNS-1123 label: backend names and RuntimeClass names.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"

#: Default keep-alive: a POSIX shell that sleeps until told to stop, and stops at once on SIGTERM.
#: The workload itself runs through pods/exec.
DEFAULT_KEEP_ALIVE: tuple[str, ...] = (
    "/bin/sh",
    "-c",
    "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done",
)

#: The unprivileged uid/gid sandbox containers run as unless a backend says otherwise
#: (the conventional "nonroot" id of distroless images; any uid works for the shipped images).
DEFAULT_SANDBOX_UID = 65532


#: The config warning of a backend whose disposals delete pods with no grace period (format with
#: the backend's index and name). docs/disposal.md says why it is a warning and not a refusal.
EGRESS_WINDOW_WARNING = (
    "backends[{index}] ({name}): pod.disposalGracePeriodSeconds 0 deletes a disposed sandbox's "
    "pod from the API server before its node has stopped it; a NetworkPolicy engine that "
    "selects pods by their objects (kube-router among them) stops confining that pod's egress "
    "while its processes may still run for up to about 2 s (SIGTERM, then SIGKILL). Use it only "
    "where the cluster's policy engine is known to keep confining a pod until its network is "
    "torn down (docs/disposal.md)"
)


class PodSettings(ContractModel):
    """How a runtime-class backend shapes the pods it creates (all fields optional)."""

    model_config = ContractModel.model_config | ConfigDict(use_attribute_docstrings=True)

    run_as_user: int | None = Field(
        default=DEFAULT_SANDBOX_UID,
        ge=0,
        description="uid of the sandbox container; null keeps the image's own user.",
    )
    run_as_group: int | None = Field(default=DEFAULT_SANDBOX_UID, ge=0)
    fs_group: int | None = Field(default=DEFAULT_SANDBOX_UID, ge=0)
    run_as_non_root: bool = True
    """Ask the kubelet to refuse a container that would run as root. Only false for images that
    cannot run unprivileged (then runAsUser must be null or 0)."""
    read_only_root_filesystem: bool = True
    """Mount the image read-only; the work dir and /tmp are writable emptyDirs."""
    image_pull_policy: Literal["Never", "IfNotPresent", "Always"] = "IfNotPresent"
    keep_alive_command: tuple[str, ...] = Field(default=DEFAULT_KEEP_ALIVE, min_length=1)
    termination_grace_period_seconds: int = Field(default=5, ge=0, le=300)
    disposal_grace_period_seconds: int | None = Field(default=None, ge=0, le=300)
    """The grace a disposal's pod delete gives. null (the default): the pod's own
    terminationGracePeriodSeconds, and the disposal waits until the kubelet has stopped the pod.
    0: the pod goes from the API server with the answer and the disposal returns at once, while
    the node stops it in the background; a NetworkPolicy engine that selects pods by their
    objects (kube-router) stops confining its egress for that time (docs/disposal.md), so a
    config warning names the window. Any other number: that grace, waited for as with null."""
    tmp_size_limit: str = Field(default="64Mi", description="Size limit of the /tmp emptyDir.")
    work_dir_size_limit: str | None = Field(
        default=None, description="Size limit of the work dir emptyDir (none by default)."
    )
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()

    @model_validator(mode="after")
    def _non_root_consistent(self) -> PodSettings:
        if self.run_as_non_root and self.run_as_user == 0:
            raise ValueError("runAsUser 0 (root) contradicts runAsNonRoot true")
        return self


#: The fields an external proxy is described by, with their wire spelling (refused when managed).
_EXTERNAL_FIELDS = (
    ("url", "url"),
    ("port", "port"),
    ("pod_selector", "podSelector"),
    ("namespace_selector", "namespaceSelector"),
    ("no_proxy", "noProxy"),
)


class EgressProxySettings(ContractModel):
    """Where a backend's allowlisted sandboxes send their traffic (the proxy enforces the list).

    Two modes, and a backend says which one explicitly:

    * ``managed: true``: the operator runs the proxy itself, one per namespace, as described by
      the operator-level ``egressProxy`` section
      (:class:`~sandbox_operator.egress.config.ManagedEgressProxySettings`); the sandbox gets the
      proxy Service's address. Nothing else may be set here (the operator chooses address, port
      and selectors), so a half-managed entry cannot exist.
    * external (default): somebody else runs the proxy. A sandbox with ``egress: allowlist``
      gets ``HTTPS_PROXY``/``HTTP_PROXY`` set to ``url`` and a NetworkPolicy that allows egress
      only to pods matching the selectors on ``port``.
    """

    managed: bool = Field(
        default=False,
        description="true: use the proxy the operator runs per namespace (operator-level "
        "egressProxy); url, port and the selectors then come from the operator.",
    )
    url: str | None = Field(
        default=None, min_length=1, description="Proxy URL given to the sandbox, e.g. http://p:3128"
    )
    port: int | None = Field(default=None, ge=1, le=65535)
    pod_selector: dict[str, str] = Field(default_factory=dict)
    namespace_selector: dict[str, str] | None = Field(
        default=None, description="null: the sandbox's own namespace; {}: any namespace."
    )
    no_proxy: str = Field(default="", description="NO_PROXY value, if any.")

    @model_validator(mode="after")
    def _one_mode(self) -> EgressProxySettings:
        if self.managed:
            given = [alias for name, alias in _EXTERNAL_FIELDS if name in self.model_fields_set]
            if given:
                raise ValueError(
                    f"managed: true takes the proxy's address from the operator; remove "
                    f"{', '.join(given)}"
                )
            return self
        missing = [a for n, a in _EXTERNAL_FIELDS[:2] if getattr(self, n) is None]
        if missing:
            raise ValueError(
                f"an external egress proxy needs {' and '.join(missing)} "
                "(or managed: true for the proxy the operator runs)"
            )
        return self


class RuntimeClassBackendConfig(ContractModel):
    """A backend served by pods on a Kubernetes RuntimeClass (runc, gVisor, Kata, ...)."""

    #: Its driver resets a Sandbox onto a never-used pod (``spec.resets``; published).
    resets: ClassVar[bool] = True

    type: Literal["runtimeClass"]
    name: str = Field(pattern=NAME_PATTERN, description="Backend name used in status and policy.")
    runtime_class_name: str = Field(pattern=NAME_PATTERN)
    isolation: str = Field(
        description="The isolation rung this runtime truly provides (validated against the "
        "ladder; an unknown rung is refused, never guessed)."
    )
    declarations: BackendDeclarations = Field(default_factory=BackendDeclarations)
    pod: PodSettings = Field(default_factory=PodSettings)
    egress_proxy: EgressProxySettings | None = Field(
        default=None,
        description="Required for serving egress allowlist (declare allowlist only with it).",
    )

    @model_validator(mode="after")
    def _declares_only_what_it_serves(self) -> RuntimeClassBackendConfig:
        """A declaration is what the policy trusts, so one this backend cannot keep is a
        configuration error naming the field, never a promise made on its behalf: allowlist
        egress without a proxy would admit allowlist workloads onto a deny-all policy (confining
        more than asked, which the contract refuses as firmly as confining less)."""
        declared = self.declarations
        extra = declared.capabilities - RUNTIMECLASS_CAPABILITIES
        if extra:
            raise ValueError(
                "declarations.capabilities names what a runtimeClass backend does not serve: "
                + ", ".join(sorted(c.value for c in extra))
            )
        if OsFamily.WINDOWS in declared.os_families:
            raise ValueError(
                "declarations.osFamilies: a runtimeClass backend's pods are posix guests (its "
                "keep-alive and every exec run sh)"
            )
        if Egress.ALLOWLIST in declared.egress_modes and self.egress_proxy is None:
            raise ValueError(
                "declarations.egressModes declares allowlist without egressProxy: nothing "
                "would enforce the allowlist, and the NetworkPolicy would deny everything"
            )
        if declared.observes_egress and not (
            self.egress_proxy is not None and self.egress_proxy.managed
        ):
            raise ValueError(
                "declarations.observesEgress needs egressProxy {managed: true}: only the "
                "operator's proxy records egress decisions"
            )
        if (
            declared.egress_rules or declared.egress_rules_https or declared.egress_credentials
        ) and not (self.egress_proxy is not None and self.egress_proxy.managed):
            raise ValueError(
                "declarations.egressRules, egressRulesHttps and egressCredentials need "
                "egressProxy {managed: true}: only the operator's proxy judges methods and paths "
                "and attaches credentials"
            )
        return self


#: What a runtimeClass backend can serve: exec and the file calls over it, run_code, and the
#: host-tool channel (which needs no more than exec and files). Not snapshot, not an attached
#: identity: nothing here implements either.
RUNTIMECLASS_CAPABILITIES: Final = frozenset(
    {
        Capability.EXEC,
        Capability.RUN_CODE,
        Capability.HOST_TOOLS,
        Capability.FILES_IN,
        Capability.FILES_OUT,
        Capability.FILES_LIST,
        Capability.FILES_DELETE,
    }
)

__all__ = [
    "DEFAULT_KEEP_ALIVE",
    "DEFAULT_SANDBOX_UID",
    "EGRESS_WINDOW_WARNING",
    "NAME_PATTERN",
    "RUNTIMECLASS_CAPABILITIES",
    "EgressProxySettings",
    "PodSettings",
    "RuntimeClassBackendConfig",
]
