"""Views of what the client reads that is not a status: a Sandbox's spec read without
validating it, a kubeconfig context, and a host-tool request from the guest.

Why its own module: these are the client's own reads of documents it did not make (the
Sandbox's spec as the API holds it, the user's kubeconfig, a guest's JSON request), each read a
field or two at a time where a model's validation would refuse what the client only needs a
part of; the keys are named here once.
"""

from __future__ import annotations

from typing import Any

from sandbox_operator.views.fields import Field, raw_field, text_field
from sandbox_operator.views.objects import Raw, nested


class SandboxSpecView(Raw):
    """A Sandbox's ``spec`` as the API holds it (a terminal reads its work directory)."""

    __slots__ = ()
    work_dir = text_field()


class KubeconfigContextDetailsView(Raw):
    """A kubeconfig context's ``context``: the namespace it names."""

    __slots__ = ()
    namespace = text_field()


class KubeconfigContextView(Raw):
    """One entry of a kubeconfig's ``contexts``."""

    __slots__ = ()
    name = text_field()
    context: Field[KubeconfigContextDetailsView] = Field(nested(KubeconfigContextDetailsView))


class HostToolRequestView(Raw):
    """A guest's host-tool request (``{"tool": ..., "arguments": {...}}``), each value as sent:
    the registry refuses what is not a tool name or an object of arguments."""

    __slots__ = ()
    tool = raw_field()

    @property
    def arguments(self) -> Any:
        """``arguments`` as sent; an absent one is no arguments (``{}``), a null one stays
        None (and is refused)."""
        return self._raw.get("arguments", {})
