"""The operator's metadata on a Sandbox: its finalizer, and the key and kind labels and key
annotations that tie the objects made for it to its key.

Its own module because it is the one metadata write of a Sandbox pass, with its own rule apart
from the pass's flow: everything missing goes on in one patch, before anything is made for the
Sandbox, and the key annotations (for people) are left off when the object's annotations leave no
room for them, rather than every patch being refused.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from sandbox_operator import labels as lbl
from sandbox_operator.contract import SANDBOX_PLURAL, SandboxKey
from sandbox_operator.reconcile import compute
from sandbox_operator.reconcile.runtime import FINALIZER, Runtime
from sandbox_operator.views import MetaView, ObjectView, SandboxView

log = logging.getLogger(__name__)


async def ensure_metadata(
    rt: Runtime,
    obj: SandboxView,
    scope: compute.ScopeResolution,
    key: SandboxKey | None,
    kind: str,
) -> SandboxView | None:
    """The finalizer, and (once the scope gives the key) the key and kind labels and the key
    annotations, in one patch and only when something is missing. Returns the object as it is
    now."""
    meta = obj.metadata
    name = meta.name
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    if key is not None and scope.spec is not None:
        want_labels = lbl.key_labels(key, kind)
        want_labels[lbl.SANDBOX_LABEL] = lbl.sandbox_label_value(name)
        have_labels = meta.labels
        labels = {k: v for k, v in want_labels.items() if have_labels.get(k) != v}
        have_ann = meta.annotations
        annotations = {k: v for k, v in lbl.key_annotations(key).items() if have_ann.get(k) != v}
    finalizers = list(meta.finalizers)
    need_finalizer = FINALIZER not in finalizers
    if annotations and not annotations_fit(meta, annotations):
        # The key annotations are for people; an object whose annotations (anyone who may create
        # it may fill them) leave no room for them goes without, rather than every patch of
        # ours being refused (422) and the Sandbox never served nor let go.
        annotations = {}
    if not labels and not annotations and not need_finalizer:
        return obj

    async def patch(annotations: dict[str, str]) -> ObjectView | None:
        return await rt.kube.patch_metadata(
            SANDBOX_PLURAL,
            meta.namespace,
            name,
            labels,
            annotations,
            finalizers=[*finalizers, FINALIZER] if need_finalizer else None,
            resource_version=meta.resource_version or None,
        )

    try:
        patched = await patch(annotations)
    except Exception as exc:
        if not annotations or getattr(exc, "status", None) != 422:
            raise
        if not labels and not need_finalizer:
            return obj
        log.warning(
            "sandbox %s/%s: its annotations leave no room for the key annotations; "
            "labelled without them",
            meta.namespace,
            name,
        )
        patched = await patch({})
    if patched is None:
        return None
    return rt.views.put_sandbox(patched)


def annotations_fit(meta: MetaView, adding: Mapping[str, str]) -> bool:
    """Whether merging ``adding`` into the object's annotations keeps them within the API server's
    limit (the views keep the annotations' size when it is large: ``slim.ANNOTATIONS_SIZE``)."""
    size = meta.annotations_size
    if not size:
        return True
    have = meta.annotations
    replaced = {k: have[k] for k in adding if k in have}
    growth = lbl.annotations_size(adding) - lbl.annotations_size(replaced)
    return size + growth <= lbl.ANNOTATIONS_LIMIT_BYTES
