"""Judging one HTTP request against a sandbox's method and path rules (``egressRules``).

Its own module because it is the part of the proxy that reads what the guest asks for beyond a
host, and where a bypass would live: the method's case, dot segments, percent-encoded dots and
separators, backslashes. Pure functions over a request line's method and origin-form target; the
proxy (``proxy.py``) calls them before it resolves or connects anything.

Meaning (docs/egress-proxy.md, "Method and path rules"): a request to a host that a rule names is
judged by the rules that name it and by nothing else (an ``egressAllow`` wildcard that also
covers the host does not widen them); it passes when one of those rules lets its method and its
path through. The method is compared in upper case, and forwarded so; a path with a ``.`` or
``..`` segment, a percent-encoded dot, slash or backslash, a backslash, or a control character is
refused whatever the rules say, because servers read such paths in different ways.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from sandbox_operator.egress.credentials import CredentialRef
from sandbox_operator.egress.decisions import DecisionReason
from sandbox_operator.egress.hostmatch import HostPattern

#: Request paths the proxy will not judge: a dot segment (also ``..;``, read as ``..`` by some
#: servers), a percent-encoded dot, slash, backslash or NUL, a raw backslash.
_AMBIGUOUS_PATH = re.compile(r"(^|/)\.\.?(/|;|$)|%(2[eEfF]|5[cC]|00)|\\")


@dataclass(frozen=True, slots=True)
class RequestRule:
    """One admitted ``egressRules`` entry as the proxy matches it."""

    host: HostPattern
    methods: frozenset[str] | None  # upper case; None: every method
    paths: tuple[str, ...] | None  # exact, or a "/*" prefix; None: every path
    schemes: frozenset[str] = frozenset({"http"})  # "http": plain requests; "https": intercepted
    credential: CredentialRef | None = None  # attached to the https requests this rule lets through

    def allows_method(self, method: str) -> bool:
        return self.methods is None or method in self.methods

    def allows_path(self, path: str) -> bool:
        if self.paths is None:
            return True
        for pattern in self.paths:
            if pattern.endswith("/*"):
                if path.startswith(pattern[:-1]):
                    return True
            elif path == pattern:
                return True
        return False


def canonical_method(method: str) -> str:
    """The verb a request names, in the one spelling rules use (RFC 9110 tokens are ASCII)."""
    return method.upper()


def request_path(origin_form: str) -> str:
    """The path of an origin-form target (``/a/b?q``): the query is not part of it."""
    return origin_form.split("?", 1)[0]


def ambiguous_path(path: str) -> bool:
    """Whether servers could read ``path`` as another path than the proxy would judge."""
    return _AMBIGUOUS_PATH.search(path) is not None or any(ord(c) < 0x21 for c in path)


def rules_for(rules: Iterable[RequestRule], host: str) -> tuple[RequestRule, ...]:
    """The rules naming ``host`` (normalised); empty when the host is not ruled."""
    return tuple(r for r in rules if r.host.matches_host(host))


def for_scheme(rules: Iterable[RequestRule], scheme: str) -> tuple[RequestRule, ...]:
    """Those of a ruled host's rules that let ``scheme`` (``http`` or ``https``) through at all."""
    return tuple(r for r in rules if scheme in r.schemes)


def judge(rules: tuple[RequestRule, ...], method: str, origin_form: str) -> DecisionReason:
    """ALLOWED, METHOD_NOT_ALLOWED or PATH_NOT_ALLOWED for one request to a ruled host.

    ``method`` must already be canonical. A path no server reads one way is refused before any
    rule is looked at; otherwise the request passes if one rule lets both through, and is
    refused for its method when no rule lets the method through at all.
    """
    path = request_path(origin_form)
    if not path.startswith("/") or ambiguous_path(path):
        return DecisionReason.PATH_NOT_ALLOWED
    if not any(r.allows_method(method) for r in rules):
        return DecisionReason.METHOD_NOT_ALLOWED
    if any(r.allows_method(method) and r.allows_path(path) for r in rules):
        return DecisionReason.ALLOWED
    return DecisionReason.PATH_NOT_ALLOWED


def credential_for(
    rules: tuple[RequestRule, ...], method: str, origin_form: str
) -> CredentialRef | None:
    """The credential of a rule that lets this (allowed) request through, or None: a credential
    goes only with the requests its own rule admits, never with one another rule let through."""
    path = request_path(origin_form)
    for rule in rules:
        if rule.credential is not None and rule.allows_method(method) and rule.allows_path(path):
            return rule.credential
    return None
