"""What confines a pod, as one digest: how a pod found in the cluster is told from one the
operator would make.

A warm pool's idle pod is claimed, and a pod already at a Sandbox's pod name is adopted, only when
it is the pod this backend would make for that spec. Labels, annotations and owner references say
nothing about that: anyone who may create pods in the namespace can copy them (a pod carrying a
pool's labels and an owner reference to it, running runc as root with a service-account token, was
once claimed as a gVisor sandbox). The digest covers the fields that decide what the sandbox's code
can reach: the runtime class, the service account and its token, the host namespaces, the pod's
and every container's security context, the volumes and mounts, every container (image, command,
arguments, working directory, environment), and that there are no init or ephemeral containers.
Resources and scheduling are left out: they bound cost, not reach, and the API server rewrites
their spelling.

The API server's defaults are folded the way it folds them: a false ``hostNetwork`` is omitted, an
unset service account is ``default``, an absent list is empty.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final, TypedDict

from sandbox_operator.views import PodView
from sandbox_operator.views.pod import ContainerSpecView, PodSpecView

#: The key a slim pod in the operator's views keeps its digest under (in ``spec``).
CONFINEMENT: Final = PodView.confinement.key


class ContainerConfinement(TypedDict):
    """The fields of a container that decide what it can reach, as the pod spec holds them
    (an empty one as None): compared and digested, never interpreted."""

    name: Any
    image: Any
    command: Any
    args: Any
    workingDir: Any
    env: Any
    envFrom: Any
    securityContext: Any
    volumeMounts: Any
    volumeDevices: Any


class Confinement(TypedDict):
    """What confines a pod, with the API server's defaults folded (in the order a difference is
    named in)."""

    runtimeClassName: Any
    serviceAccountName: Any
    automountServiceAccountToken: bool
    hostNetwork: bool
    hostPID: bool
    hostIPC: bool
    shareProcessNamespace: bool
    hostUsers: bool
    securityContext: Any
    volumes: Any
    containers: list[ContainerConfinement]
    initContainers: list[ContainerConfinement]
    ephemeralContainers: list[ContainerConfinement]


def _container(container: ContainerSpecView) -> ContainerConfinement:
    c = container
    return {
        "name": c.name or None,
        "image": c.image or None,
        "command": c.command or None,
        "args": c.args or None,
        "workingDir": c.working_dir or None,
        "env": c.env or None,
        "envFrom": c.env_from or None,
        "securityContext": c.security_context or None,
        "volumeMounts": c.volume_mounts or None,
        "volumeDevices": c.volume_devices or None,
    }


def confinement_projection(pod_spec: PodSpecView) -> Confinement:
    """The fields of a pod spec that confine it, with the API server's defaults folded (a false
    host flag omitted, an unset service account ``default``, an absent list empty)."""
    spec = pod_spec
    return {
        "runtimeClassName": spec.runtime_class_name,
        "serviceAccountName": spec.service_account_name or "default",
        # Unset means the token is mounted (the service account's default).
        "automountServiceAccountToken": spec.automount_service_account_token is not False,
        "hostNetwork": bool(spec.host_network),
        "hostPID": bool(spec.host_pid),
        "hostIPC": bool(spec.host_ipc),
        "shareProcessNamespace": bool(spec.share_process_namespace),
        # hostUsers defaults to true (no user namespace); only an explicit false is a difference.
        "hostUsers": spec.host_users is not False,
        "securityContext": spec.security_context or None,
        "volumes": spec.volumes or [],
        "containers": [_container(c) for c in spec.containers],
        "initContainers": [_container(c) for c in spec.init_containers],
        "ephemeralContainers": [_container(c) for c in spec.ephemeral_containers],
    }


def confinement_digest(pod_spec: Mapping[str, Any]) -> str:
    """A short, stable digest of :func:`confinement_projection`: equal for two pod specs exactly
    when they confine their code alike (what the views keep of every pod). ``pod_spec``: as the
    API server sent it or as a builder made it, the JSON this digests."""
    projection = confinement_projection(PodSpecView.of(pod_spec))
    text = json.dumps(projection, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def confinement_difference(actual: PodSpecView, expected: PodSpecView) -> str | None:
    """The first confining field (``spec.<field>``) where pod spec ``actual`` differs from
    ``expected``, or None: for a message that names what is wrong with a pod found in the
    cluster."""
    have = dict(confinement_projection(actual).items())
    for key, want in confinement_projection(expected).items():
        if have[key] != want:
            return f"spec.{key}"
    return None
