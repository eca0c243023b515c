"""Who the caller is (TokenReview) and whether it may reach a Sandbox's ports
(SubjectAccessReview), asked of the Kubernetes API and remembered briefly.

Its own module because authorization is Kubernetes' own, not the router's: the router holds no
list of who may do what. The question asked is verb ``connect`` on the subresource
``sandboxes/ports`` of the named Sandbox (:data:`PORTS_VERB`, :data:`PORTS_SUBRESOURCE`): a
subresource, so no rule on ``sandboxes`` (not even ``verbs: ["*"]``) grants it by accident; named,
so the per-conversation Role the operator writes for a SandboxScope's agents can grant it on its
own Sandboxes only (the conversation boundary). Answers are cached by a digest of the token
(never the token) and by (identity, Sandbox), for a few seconds, in bounded maps.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, TypeVar

from sandbox_operator.contract.resources import GROUP, SANDBOX_PLURAL
from sandbox_operator.router.bodies import (
    AccessReviewBody,
    AccessReviewSpecBody,
    TokenReviewBody,
    TokenReviewSpecBody,
)

#: The verb and subresource a caller needs on a Sandbox to reach its ports.
PORTS_VERB: Final = "connect"
PORTS_SUBRESOURCE: Final = "ports"
#: Most answers each cache holds (the oldest go first).
CACHE_MAX_ENTRIES: Final = 4096


@dataclass(frozen=True)
class Identity:
    """An authenticated caller, as TokenReview names it (what a SubjectAccessReview asks about)."""

    user: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


class Reviewer(Protocol):
    async def authenticate(self, token: str) -> Identity | None:
        """The token's identity; None when the API server does not authenticate it."""

    async def authorize(self, who: Identity, namespace: str, sandbox: str) -> bool:
        """Whether ``who`` may reach the ports of Sandbox ``namespace/sandbox``."""


K = TypeVar("K")
V = TypeVar("V")


class _Expiring(Generic[K, V]):
    def __init__(self, ttl: float, max_entries: int) -> None:
        self._ttl = ttl
        self._max = max_entries
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K) -> tuple[bool, V | None]:
        hit = self._items.get(key)
        if hit is None or hit[0] < time.monotonic():
            self._items.pop(key, None)
            return False, None
        return True, hit[1]

    def put(self, key: K, value: V) -> None:
        self._items[key] = (time.monotonic() + self._ttl, value)
        self._items.move_to_end(key)
        while len(self._items) > self._max:
            self._items.popitem(last=False)


class CachedReviewer:
    """A :class:`Reviewer` whose answers (allowances and refusals alike) are kept ``ttl``
    seconds: a flood of requests costs the API server one review per caller and Sandbox."""

    def __init__(self, inner: Reviewer, ttl: float, max_entries: int = CACHE_MAX_ENTRIES) -> None:
        self._inner = inner
        self._tokens: _Expiring[str, Identity | None] = _Expiring(ttl, max_entries)
        self._access: _Expiring[tuple[Identity, str, str], bool] = _Expiring(ttl, max_entries)

    async def authenticate(self, token: str) -> Identity | None:
        digest = hashlib.sha256(token.encode()).hexdigest()
        found, identity = self._tokens.get(digest)
        if not found:
            identity = await self._inner.authenticate(token)
            self._tokens.put(digest, identity)
        return identity

    async def authorize(self, who: Identity, namespace: str, sandbox: str) -> bool:
        key = (who, namespace, sandbox)
        found, allowed = self._access.get(key)
        if not found:
            allowed = await self._inner.authorize(who, namespace, sandbox)
            self._access.put(key, allowed)
        return bool(allowed)


class KubeReviewer:
    """:class:`Reviewer` over the Kubernetes API (the router's identity needs ``create`` on
    tokenreviews and subjectaccessreviews; the chart grants it)."""

    def __init__(self, api: Any, audiences: tuple[str, ...] = ()) -> None:
        self._api = api
        self._audiences = audiences

    async def authenticate(self, token: str) -> Identity | None:
        from kubernetes_asyncio import client as k8s

        spec: TokenReviewSpecBody = {"token": token}
        if self._audiences:
            spec["audiences"] = list(self._audiences)
        body: TokenReviewBody = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": spec,
        }
        answer = await k8s.AuthenticationV1Api(self._api).create_token_review(body)  # type: ignore[arg-type]
        status = answer.status
        if status is None or not status.authenticated or status.user is None:
            return None
        user = status.user
        extra = tuple(sorted((k, tuple(v)) for k, v in (user.extra or {}).items()))
        return Identity(user.username or "", user.uid or "", tuple(user.groups or ()), extra)

    async def authorize(self, who: Identity, namespace: str, sandbox: str) -> bool:
        from kubernetes_asyncio import client as k8s

        body: AccessReviewBody = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": access_review_spec(who, namespace, sandbox),
        }
        answer = await k8s.AuthorizationV1Api(self._api).create_subject_access_review(
            body  # type: ignore[arg-type]
        )
        return bool(answer.status is not None and answer.status.allowed)


def access_review_spec(who: Identity, namespace: str, sandbox: str) -> AccessReviewSpecBody:
    """The SubjectAccessReview's spec: verb connect on sandboxes/ports of this Sandbox."""
    spec: AccessReviewSpecBody = {
        "user": who.user,
        "groups": list(who.groups),
        "resourceAttributes": {
            "group": GROUP,
            "resource": SANDBOX_PLURAL,
            "subresource": PORTS_SUBRESOURCE,
            "verb": PORTS_VERB,
            "namespace": namespace,
            "name": sandbox,
        },
    }
    if who.uid:
        spec["uid"] = who.uid
    if who.extra:
        spec["extra"] = {k: list(v) for k, v in who.extra}
    return spec
