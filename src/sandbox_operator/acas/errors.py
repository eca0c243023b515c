"""Typed errors for the ACA sandboxes backend, and their mapping onto `DisposalCode`.

Every error carries what a caller branches on as fields: the operationId, the HTTP status (None
when no response arrived), the service's error code (from the Azure-Core envelope `error.code` or
the ProblemDetails `title`/`type`), and whether the call was retried. Messages are built only
from those fields: never from the endpoint, the URL, a header or a token. The service's own
free-text message is kept in `service_message`, scrubbed of anything that looks like a URL or a
bearer token, and is not part of `str(error)`.
"""

from __future__ import annotations

import json
import re
from dataclasses import InitVar, dataclass, field
from typing import ClassVar

from sandbox_operator.contract import DisposalCode, DisposalFailure
from sandbox_operator.views import AcasErrorBodyView

_URL_RE = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://\S+")
_BEARER_RE = re.compile(r"(?i)bearer\s+\S+")
_JWT_RE = re.compile(r"eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
_MAX_SERVICE_TEXT = 300


def scrub(text: str, *secrets: str) -> str:
    """Remove URLs, bearer tokens, JWT-shaped strings and the given secrets from free text."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    text = _BEARER_RE.sub("Bearer [redacted]", text)
    text = _JWT_RE.sub("[redacted]", text)
    text = _URL_RE.sub("[url]", text)
    return text[:_MAX_SERVICE_TEXT]


@dataclass(eq=False, repr=False, kw_only=True)
class AcasError(Exception):
    """Base of every error this backend raises.

    A dataclass for its typed fields; `str()` is built from them alone (see the module
    docstring) and `repr()` stays the exception's own (class and message).
    """

    disposal_code: ClassVar[DisposalCode] = DisposalCode.UNKNOWN

    operation: str = field(kw_only=False)
    status: int | None = None
    code: str | None = None
    service_message: str = ""
    attempts: int = 1
    #: The service's `Retry-After` hint in seconds, when its answer carried one.
    retry_after: float | None = None
    what: InitVar[str] = ""

    def __post_init__(self, what: str) -> None:
        parts: list[str] = []
        if what:
            parts.append(what)
        if self.status is not None:
            parts.append(f"HTTP {self.status}")
        if self.code:
            parts.append(f"service code {self.code}")
        if self.attempts > 1:
            parts.append(f"after {self.attempts} attempts")
        details = f" ({', '.join(parts)})" if parts else ""
        super().__init__(f"{self.operation} failed{details}")

    @property
    def detail(self) -> str:
        """Short machine-friendly detail for conditions and DisposalFailure: code and status."""
        bits = [self.operation]
        if self.status is not None:
            bits.append(f"status={self.status}")
        if self.code:
            bits.append(f"code={self.code}")
        return " ".join(bits)


class AcasUnreachable(AcasError):
    """No HTTP response: DNS, connect, TLS or the connection dropped."""

    disposal_code = DisposalCode.UNREACHABLE


class AcasTimeout(AcasError):
    """A per-call timeout or an overall deadline (e.g. waiting for a delete) passed."""

    disposal_code = DisposalCode.TIMEOUT


class AcasHttpError(AcasError):
    """The service answered with a non-success status."""


class AcasBadRequest(AcasHttpError):
    """400: the service rejected the request's content."""


class AcasAuthError(AcasHttpError):
    """401/403: the token was missing, expired, for the wrong scope, or lacks the role."""

    disposal_code = DisposalCode.REFUSED


class AcasNotFound(AcasHttpError):
    """404: unknown sandbox, policy or path."""


class AcasConflict(AcasHttpError):
    """409: state conflict (most often: the sandbox is not running)."""


class AcasPayloadTooLarge(AcasHttpError):
    """413: the file is larger than the service accepts."""


class AcasThrottled(AcasHttpError):
    """429: throttled or over quota (after the retries an idempotent call was allowed)."""


class AcasServerError(AcasHttpError):
    """5xx from the service."""


class AcasProtocolError(AcasError):
    """A success status with a body this client cannot read."""


class AcasNotListed(AcasError):
    """A sandbox the caller expected (by remote id) is missing from a label listing."""

    disposal_code = DisposalCode.UNLISTED


class AcasStillPresent(AcasTimeout):
    """Delete was accepted but the sandbox was still there when the deadline passed."""


_BY_STATUS: dict[int, type[AcasHttpError]] = {
    400: AcasBadRequest,
    401: AcasAuthError,
    403: AcasAuthError,
    404: AcasNotFound,
    409: AcasConflict,
    413: AcasPayloadTooLarge,
    429: AcasThrottled,
}


def parse_error_body(body: bytes) -> tuple[str | None, str]:
    """(service code, service message) from either published error shape, else (None, text).

    Azure-Core envelope `{"error": {"code", "message", ...}}` wins; then ProblemDetails
    (`type`, `title`, `status`, `detail`): the code is `title` (or `type`), the message `detail`.
    """
    if not body:
        return None, ""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None, body[:_MAX_SERVICE_TEXT].decode("utf-8", "replace")
    if isinstance(data, dict):
        answer = AcasErrorBodyView(data)
        err = answer.error
        if err is not None:
            code, message = err.code, err.message
            return (str(code) if code else None), (str(message) if message else "")
        title = answer.title or answer.type
        detail = answer.detail
        if title or detail:
            return (str(title) if title else None), (str(detail) if detail else "")
    return None, json.dumps(data)[:_MAX_SERVICE_TEXT]


def error_for_status(
    operation: str,
    status: int,
    body: bytes,
    *,
    attempts: int = 1,
    retry_after: float | None = None,
    secrets: tuple[str, ...] = (),
) -> AcasHttpError:
    """The typed error for a non-success response."""
    code, message = parse_error_body(body)
    message = scrub(message, *secrets)
    if code is not None:
        code = scrub(code, *secrets)
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = AcasServerError if status >= 500 else AcasHttpError
    return cls(
        operation,
        status=status,
        code=code,
        service_message=message,
        attempts=attempts,
        retry_after=retry_after,
    )


def disposal_code(error: BaseException) -> DisposalCode:
    """Connection failure -> unreachable, deadline -> timeout, 401/403 -> refused,
    missing from a listing that should hold it -> unlisted, anything else -> unknown."""
    if isinstance(error, AcasError):
        return error.disposal_code
    return DisposalCode.UNKNOWN


def disposal_failure(error: BaseException, backend: str) -> DisposalFailure:
    """A `DisposalFailure` whose detail names the operation, HTTP status and service code."""
    detail = error.detail if isinstance(error, AcasError) else type(error).__name__
    return DisposalFailure(code=disposal_code(error), detail=detail, backend=backend)
