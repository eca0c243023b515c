"""Views of the Azure Container Apps sandboxes service's JSON answers that no response model
reads: its two error shapes, a list page, a count, a stop's snapshot, and the egress policy and
decisions it echoes.

Why its own module: the ACA API client (``sandbox_operator.acas``) validates sandboxes, command
results and file entries into its pydantic models, but these answers are read a field or two at
a time (an error's code for the typed error, a page's ``value``) or handed back to the caller;
each key is named here once so the client reads them by field. They are Azure's shapes, not the
operator's: nothing here is a Kubernetes object.
"""

from __future__ import annotations

from sandbox_operator.views.fields import (
    Field,
    mapping_field,
    raw_field,
    sequence,
    text_field,
)
from sandbox_operator.views.objects import Raw, nested


class AcasErrorView(Raw):
    """The Azure-Core envelope's ``error``: its ``code`` and ``message`` as sent."""

    __slots__ = ()
    code = raw_field()
    message = raw_field()


class AcasErrorBodyView(Raw):
    """An error answer: the Azure-Core envelope (``error``) or ProblemDetails (``type``,
    ``title``, ``detail``), each value as sent (the caller judges its type)."""

    __slots__ = ()
    error: Field[AcasErrorView | None] = Field(
        lambda v: AcasErrorView(v) if isinstance(v, dict) else None
    )
    type = raw_field()
    title = raw_field()
    detail = raw_field()


class AcasPageView(Raw):
    """A list answer in the ``{"value": [...]}`` shape (``value`` as sent)."""

    __slots__ = ()
    value = raw_field()


class AcasCountView(Raw):
    """A count answer in the ``{"count": n}`` shape (``count`` as sent)."""

    __slots__ = ()
    count = raw_field()


class AcasSnapshotView(Raw):
    """The snapshot a blocking stop answers with."""

    __slots__ = ()
    id = text_field()
    sandbox_id = text_field()
    labels = mapping_field()
    created_at_utc = text_field()
    resources = mapping_field()
    size_in_mb = text_field("sizeInMB")


class AcasHttpPolicyView(Raw):
    """An egress policy's ``http`` part: the default action and the host rules."""

    __slots__ = ()
    default_action = text_field()
    host_rules = Field(sequence)


class AcasEgressPolicyView(Raw):
    """A sandbox's egress policy as the service echoes it."""

    __slots__ = ()
    http: Field[AcasHttpPolicyView] = Field(nested(AcasHttpPolicyView))


class AcasHttpDecisionsView(Raw):
    """The egress decisions' ``http`` part: the hosts allowed and denied."""

    __slots__ = ()
    allowed = Field(sequence)
    denied = Field(sequence)


class AcasEgressDecisionsView(Raw):
    """A sandbox's egress decisions as the service reports them."""

    __slots__ = ()
    http: Field[AcasHttpDecisionsView] = Field(nested(AcasHttpDecisionsView))
