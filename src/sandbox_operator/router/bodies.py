"""The objects the router sends to the API server: its TokenReview and SubjectAccessReview, and
the merge patches of a Sandbox it writes (a resume, an activity stamp).

Why its own module: each key here is the Kubernetes API's (authentication.k8s.io/v1,
authorization.k8s.io/v1, a Sandbox's spec and metadata); naming them once as ``TypedDict``s makes
a typo in a key the type checker's error, while ``reviews.py`` and ``kube.py`` keep what is asked
and when. They are plain dicts at run time: what is sent is what the literals always built.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict


class TokenReviewSpecBody(TypedDict):
    token: str
    #: The audiences the token must be for (absent: the API server's own).
    audiences: NotRequired[list[str]]


class TokenReviewBody(TypedDict):
    apiVersion: str
    kind: str
    spec: TokenReviewSpecBody


class ResourceAttributesBody(TypedDict):
    """What is asked: a verb on a (sub)resource of one named object."""

    group: str
    resource: str
    subresource: str
    verb: str
    namespace: str
    name: str


class AccessReviewSpecBody(TypedDict):
    """Who asks (as TokenReview named them) and what for."""

    user: str
    groups: list[str]
    resourceAttributes: ResourceAttributesBody
    uid: NotRequired[str]
    extra: NotRequired[dict[str, list[str]]]


class AccessReviewBody(TypedDict):
    apiVersion: str
    kind: str
    spec: AccessReviewSpecBody


class SuspendedSpecBody(TypedDict):
    suspended: bool


class AnnotationsBody(TypedDict):
    annotations: dict[str, str]


class SandboxPatchBody(TypedDict, total=False):
    """A merge patch of a Sandbox: its ``spec.suspended`` (a resume) or an annotation (the
    activity stamp)."""

    spec: SuspendedSpecBody
    metadata: AnnotationsBody
