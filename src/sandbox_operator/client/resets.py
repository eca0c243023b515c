"""Reset: a sandbox's pod replaced by a never-used one, the Sandbox kept.

A reset raises ``spec.resets`` by one (a merge patch of its own field manager, so the acquirer's
apply never owns or undoes it) and waits until the operator reports Ready for a pod that answers
that count (``status.resets``). The operator deletes the old pod with no grace period (every
process and file of it goes) and claims a matching warm pool's idle pod, or creates a new one, in
the same pass: the key, name, conversation and NetworkPolicy stay; the instance (the pod) is new.
A handle is pointed at the new pod. docs/reset.md says what a reset keeps and what it does not.

:class:`Resets` holds what that needs: the namespace's
:class:`~sandbox_operator.client.kube.SandboxObjects` (to patch) and the client's
:class:`~sandbox_operator.client.watching.Watches` (to wait).
"""

from __future__ import annotations

import asyncio

from sandbox_operator.client.errors import (
    SandboxAcquireError,
    SandboxNotReadyInTime,
    SandboxNotResettable,
)
from sandbox_operator.client.kube import SandboxObjects
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.client.served import plane_of
from sandbox_operator.client.status import RESET_REFUSED, ResetTo, read_status
from sandbox_operator.client.suspension import serve_again
from sandbox_operator.client.watching import WaitNotes, Watches
from sandbox_operator.views import SandboxView

#: The CRD's refusal of a lower ``spec.resets`` (crdrules.SANDBOX_RESETS_RULE).
RESETS_ONLY_GROW = "resets may only increase"


def next_reset(obj: SandboxView) -> int:
    """The ``spec.resets`` that asks for one more reset than any asked for or served (``obj``:
    the Sandbox's view)."""
    asked = SandboxView.of(obj).wanted_resets
    asked_count = asked if isinstance(asked, int) else 0
    return max(asked_count, read_status(obj).resets) + 1


class Resets:
    """Reset Sandboxes of one namespace (see the module)."""

    def __init__(self, objects: SandboxObjects, watches: Watches) -> None:
        self.objects = objects
        self.watches = watches

    async def reset(self, sandbox: Sandbox | str, *, timeout: float) -> None:  # noqa: ASYNC109
        """:meth:`SandboxClient.reset <sandbox_operator.client.SandboxClient.reset>`, with
        ``timeout`` in seconds."""
        handle = sandbox if isinstance(sandbox, Sandbox) else None
        name = sandbox if isinstance(sandbox, str) else sandbox.name
        # The handle's object names the count it has seen; the patch's answer is the newest.
        known = handle.view if handle is not None and handle.resource else None
        obj = known if known is not None else await self.objects.get_sandbox(name)
        if obj.storage:
            raise SandboxNotResettable(sandbox=name, namespace=self.objects.namespace)
        try:
            count = next_reset(obj)
            obj = await self.objects.patch_resets(name, count)
        except SandboxNotResettable as exc:
            if known is None or RESETS_ONLY_GROW not in exc.message:
                raise
            # The handle's object was older than the Sandbox (another process reset it since):
            # ask again from what the API server holds now.
            obj = await self.objects.get_sandbox(name)
            count = next_reset(obj)
            obj = await self.objects.patch_resets(name, count)
        asked = obj.wanted_resets
        if not isinstance(asked, int) or asked < count:
            # The API server dropped the field: its Sandbox CRD predates reset. Nothing was asked
            # of the operator, and a wait would only run out.
            raise SandboxNotResettable(
                sandbox=name,
                namespace=self.objects.namespace,
                message="the cluster's Sandbox CRD has no spec.resets (it predates reset): "
                "upgrade the CRDs (the chart's, or crds/) to reset sandboxes",
            )
        plane = plane_of(sandbox)
        if plane is not None:
            await plane.drop()  # the old pod is gone: no use may reach for it
        last = WaitNotes()
        try:
            async with asyncio.timeout(timeout):
                obj = await self.watches.until_goal(name, obj, last, goal=ResetTo(count))
        except TimeoutError:
            raise SandboxNotReadyInTime(
                sandbox=name,
                namespace=self.objects.namespace,
                timeout=timeout,
                last_reason=last.reason,
            ) from None
        except SandboxAcquireError as exc:
            if exc.reason != RESET_REFUSED:
                raise
            raise SandboxNotResettable(
                sandbox=name, namespace=self.objects.namespace, message=exc.message
            ) from None
        if handle is not None:
            handle.resource = obj
            if plane is not None:
                await serve_again(handle, plane, obj)
