"""What an ``egressRules`` entry may say: a host (the ``egressAllow`` rules), the HTTP methods and
paths the egress proxy lets through to it, and the schemes those are judged on.

Its own module because a rule is judged three ways, as the hosts are (``egresshosts``): the
patterns and validators here, the CEL rules of the CRD (``crdrules.py``) and the proxy, which
matches requests against the admitted rules (``sandbox_operator.egress.requestrules``). The
meaning follows maf-sandbox's ``EgressRule``: a method is a verb in one canonical upper-case
spelling, a path is exact or a ``/*`` prefix, and a rule the proxy cannot enforce is refused here,
naming the field, rather than admitted and half-kept. A rule for one exact HTTPS origin may name a
credential (``EgressCredential``) the proxy attaches (docs/egress-credentials.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Final, Required, TypedDict

from pydantic import AfterValidator, Field, model_validator

from .base import ContractModel
from .egresshosts import EgressHost

#: Most rules a spec may hold, methods a rule may name and paths a rule may name.
EGRESS_RULES_MAX_ITEMS: Final = 32
EGRESS_METHODS_MAX_ITEMS: Final = 16
EGRESS_PATHS_MAX_ITEMS: Final = 32
EGRESS_PATH_MAX_LENGTH: Final = 1024
METHOD_MAX_LENGTH: Final = 32

#: An HTTP method token (RFC 9110 tchar) in upper case: a rule names a verb, not a spelling, so
#: a lower-case letter is refused rather than folded (the proxy folds the request's case).
METHOD_PATTERN: Final = r"^[!#$%&'*+.^_`|~0-9A-Z-]+$"
#: Methods a rule cannot name: CONNECT is how a guest opens a tunnel through the proxy, never a
#: request the proxy forwards to the origin, so no rule could be enforced on it.
UNENFORCEABLE_METHODS: Final = ("CONNECT",)

#: A rule path: an absolute path of RFC 3986 path characters (ASCII, no space, no ``?``, ``#``,
#: ``[``, ``]`` or backslash), percent escapes well formed, optionally ending in ``*``. The ``*``
#: is allowed only as the last segment (``/v1/*``), which :data:`WILDCARD_PATTERN` checks.
PATH_PATTERN: Final = r"^/([!$&'()+,;=:@A-Za-z0-9._~/-]|%[0-9A-Fa-f]{2})*\*?$"
#: A ``*`` anywhere but as the whole last segment.
WILDCARD_PATTERN: Final = r"\*.|[^/]\*$"
#: A ``.`` or ``..`` segment (also with ``;`` parameters, as some servers read ``..;``).
DOT_SEGMENT_PATTERN: Final = r"(^|/)\.\.?(/|;|$)"
#: Percent-encoded dots, slashes and backslashes: servers differ on whether they decode these
#: before routing, so a rule naming one would mean different paths upstream and at the proxy.
ENCODED_SEPARATOR_PATTERN: Final = r"%(2[eEfF]|5[cC])"


class EgressScheme(StrEnum):
    """How a guest reaches a ruled host through the proxy, so where a rule is judged."""

    #: Plain ``http://`` requests in absolute form: the proxy reads every request head.
    HTTP = "http"
    #: HTTPS through a CONNECT tunnel: the proxy terminates TLS with its own CA's certificate
    #: (which the guest trusts) to read the request, and re-originates verified TLS upstream.
    #: Admission refuses it on a backend that does not declare ``egressRulesHttps``.
    HTTPS = "https"


def egress_path_problem(path: str) -> str | None:
    """Why ``path`` may not be a rule's path, or None (the shape is the pattern's)."""
    if re.search(WILDCARD_PATTERN, path):
        return f"{path!r} has '*' other than as the whole last segment ('/prefix/*')"
    if re.search(DOT_SEGMENT_PATTERN, path):
        return f"{path!r} has a '.' or '..' segment"
    if re.search(ENCODED_SEPARATOR_PATTERN, path):
        return f"{path!r} has a percent-encoded dot, slash or backslash"
    return None


def _check_path(value: str) -> str:
    problem = egress_path_problem(value)
    if problem is not None:
        raise ValueError(f"egressRules path {problem}")
    return value


def _check_method(value: str) -> str:
    if value in UNENFORCEABLE_METHODS:
        raise ValueError(
            f"egressRules method {value} cannot be enforced: CONNECT opens a tunnel through the "
            "proxy, it is never a request to the host"
        )
    return value


EgressMethod = Annotated[
    str,
    Field(
        min_length=1,
        max_length=METHOD_MAX_LENGTH,
        pattern=METHOD_PATTERN,
        description="An HTTP method in upper case (GET, POST, a WebDAV verb); not CONNECT.",
    ),
    AfterValidator(_check_method),
]

EgressPath = Annotated[
    str,
    Field(
        min_length=1,
        max_length=EGRESS_PATH_MAX_LENGTH,
        pattern=PATH_PATTERN,
        description=(
            "An exact path (/v1/models) or a prefix ending in '/*' (/v1/*: everything below "
            "/v1/). No '.' or '..' segments, no percent-encoded dot, slash or backslash."
        ),
    ),
    AfterValidator(_check_path),
]


#: A Kubernetes Secret's name (DNS-1123 subdomain) and a key of its data.
SECRET_NAME_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SECRET_KEY_PATTERN: Final = r"^[-._a-zA-Z0-9]+$"
#: An HTTP header name (RFC 9110 token).
HEADER_PATTERN: Final = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"
#: Hop-by-hop headers (RFC 9110 7.6.1, and the proxies' own): the egress proxy drops them.
HOP_BY_HOP_HEADERS: Final = (
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
)
#: Headers a credential may not fill: the proxy owns the hop's framing, the host and the
#: connection, so a credential there would change which request is sent, not who sends it.
RESERVED_HEADERS: Final = ("host", *HOP_BY_HOP_HEADERS, "transfer-encoding", "content-length")
#: What may precede the value in the header: printable ASCII (no CR, LF or other control).
PREFIX_PATTERN: Final = r"^[ -~]*$"
PREFIX_MAX_LENGTH: Final = 64


def _check_header(value: str) -> str:
    if value.lower() in RESERVED_HEADERS:
        raise ValueError(f"egressRules credential header {value!r} is the proxy's own")
    return value


class EgressCredential(ContractModel):
    """A credential the egress proxy attaches to the requests of one exact HTTPS origin.

    A reference only: the value stays in the Secret, which the proxy reads; the guest never
    holds it. Who may name a Secret is the host's decision, checked at admission (the chart's
    ValidatingAdmissionPolicy asks whether the Sandbox's creator may ``get`` it).
    """

    secret_name: str = Field(
        min_length=1,
        max_length=253,
        pattern=SECRET_NAME_PATTERN,
        description="A Secret in the Sandbox's namespace; its creator must be able to get it.",
    )
    key: str = Field(
        min_length=1,
        max_length=253,
        pattern=SECRET_KEY_PATTERN,
        description="The key of the Secret's data holding the value.",
    )
    header: Annotated[
        str,
        Field(min_length=1, max_length=64, pattern=HEADER_PATTERN),
        AfterValidator(_check_header),
    ] = Field(
        default="Authorization",
        description="The header the proxy fills (a header of that name the guest sent is "
        "replaced); not a hop-by-hop, framing or Host header.",
    )
    prefix: str = Field(
        default="Bearer ",
        max_length=PREFIX_MAX_LENGTH,
        pattern=PREFIX_PATTERN,
        description="What precedes the value in the header ('Bearer ' by default).",
    )


class EgressRule(ContractModel):
    """One host the allowlist reaches only for the named methods and paths."""

    host: EgressHost = Field(description="The host, as an egressAllow entry names one.")
    schemes: tuple[EgressScheme, ...] = Field(
        min_length=1,
        max_length=len(EgressScheme),
        json_schema_extra={"uniqueItems": True},
        description=(
            "How the guest reaches the host, so where the proxy judges the rule: http (plain "
            "requests), https (inside TLS the proxy terminates; the guest trusts its CA)."
        ),
    )
    methods: tuple[EgressMethod, ...] | None = Field(
        default=None,
        min_length=1,
        max_length=EGRESS_METHODS_MAX_ITEMS,
        json_schema_extra={"uniqueItems": True},
        description="Methods let through; unset: every method.",
    )
    paths: tuple[EgressPath, ...] | None = Field(
        default=None,
        min_length=1,
        max_length=EGRESS_PATHS_MAX_ITEMS,
        json_schema_extra={"uniqueItems": True},
        description="Paths let through (the query is not part of it); unset: every path.",
    )
    credential: EgressCredential | None = Field(
        default=None,
        description=(
            "A credential the egress proxy attaches to this host's requests after the rule let "
            "them through (schemes [https] and an exact host only). The guest never sees it."
        ),
    )

    @model_validator(mode="after")
    def _enforceable(self) -> EgressRule:
        if self.methods is None and self.paths is None and self.credential is None:
            raise ValueError(
                f"egressRules entry for {self.host!r} names neither methods, paths nor a "
                "credential: list the host in egressAllow instead"
            )
        for name, values in (
            ("schemes", self.schemes),
            ("methods", self.methods or ()),
            ("paths", self.paths or ()),
        ):
            if len(set(values)) != len(values):
                raise ValueError(
                    f"egressRules entry for {self.host!r} lists one of its {name} twice"
                )
        if self.credential is not None and (
            self.schemes != (EgressScheme.HTTPS,) or self.host.startswith("*.")
        ):
            raise ValueError(
                f"egressRules entry for {self.host!r} names a credential: it needs schemes "
                "[https] only and an exact host (a credential goes to one HTTPS origin, inside "
                "TLS the proxy terminates)"
            )
        return self


class EgressCredentialFields(TypedDict, total=False):
    """An :class:`EgressCredential` as a caller may write it before validation (the wire
    spelling): the keys are named so a typo is the type checker's error, not a 422."""

    secretName: Required[str]
    key: Required[str]
    header: str
    prefix: str


class EgressRuleFields(TypedDict, total=False):
    """An :class:`EgressRule` as a caller may write it before validation, in the wire spelling
    (``edit_egress(rules=[{"host": ..., "schemes": ["https"], ...}])``); the model still judges
    every value."""

    host: Required[str]
    schemes: Required[Sequence[str]]
    methods: Sequence[str]
    paths: Sequence[str]
    credential: EgressCredentialFields
