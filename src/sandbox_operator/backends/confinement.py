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
from typing import Any, Final

from sandbox_operator.views import PodView

#: The key a slim pod in the operator's views keeps its digest under (in ``spec``).
CONFINEMENT: Final = PodView.confinement.key
#: The container fields that decide what the container can reach.
CONTAINER_FIELDS: Final = (
    "name",
    "image",
    "command",
    "args",
    "workingDir",
    "env",
    "envFrom",
    "securityContext",
    "volumeMounts",
    "volumeDevices",
)
#: Pod booleans the API server omits when false.
_HOST_FLAGS: Final = ("hostNetwork", "hostPID", "hostIPC", "hostUsers", "shareProcessNamespace")


def _container(container: Mapping[str, Any]) -> dict[str, Any]:
    return {key: container.get(key) or None for key in CONTAINER_FIELDS}


def confinement_projection(pod_spec: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a pod spec that confine it, with the API server's defaults folded."""
    flags = {key: bool(pod_spec.get(key)) for key in _HOST_FLAGS if key != "hostUsers"}
    # hostUsers defaults to true (no user namespace); only an explicit false is a difference.
    flags["hostUsers"] = pod_spec.get("hostUsers") is not False
    return {
        "runtimeClassName": pod_spec.get("runtimeClassName"),
        "serviceAccountName": pod_spec.get("serviceAccountName") or "default",
        # Unset means the token is mounted (the service account's default).
        "automountServiceAccountToken": pod_spec.get("automountServiceAccountToken") is not False,
        **flags,
        "securityContext": pod_spec.get("securityContext") or None,
        "volumes": pod_spec.get("volumes") or [],
        "containers": [_container(c) for c in pod_spec.get("containers") or []],
        "initContainers": [_container(c) for c in pod_spec.get("initContainers") or []],
        "ephemeralContainers": [_container(c) for c in pod_spec.get("ephemeralContainers") or []],
    }


def confinement_digest(pod_spec: Mapping[str, Any]) -> str:
    """A short, stable digest of :func:`confinement_projection`: equal for two pod specs exactly
    when they confine their code alike (what the views keep of every pod)."""
    text = json.dumps(confinement_projection(pod_spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def confinement_difference(actual: Mapping[str, Any], expected: Mapping[str, Any]) -> str | None:
    """The first confining field (``spec.<field>``) where pod spec ``actual`` differs from
    ``expected``, or None: for a message that names what is wrong with a pod found in the
    cluster."""
    have, want = confinement_projection(actual), confinement_projection(expected)
    for key in want:
        if have[key] != want[key]:
            return f"spec.{key}"
    return None
