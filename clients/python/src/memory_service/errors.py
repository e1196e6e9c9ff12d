"""One exception hierarchy for everything the client raises.

Every error answer of the service carries the same JSON body (D1): ``{"code", "error", "requestId", "details"?,
"reason"?}``. :func:`error_from_response` turns it into the :class:`APIError` subclass of its status, so callers catch
what they mean (``except NotFoundError``) and still see the stable ``code``, the ``request_id`` to quote in a bug
report, and, for validation errors, the offending ``fields``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class MemoryServiceError(Exception):
    """Base class of every exception this package raises."""


class APIConnectionError(MemoryServiceError):
    """The service could not be reached, or the connection broke, after the retries the call was allowed."""


class APITimeoutError(APIConnectionError):
    """The service did not answer within the timeout."""


class OAuthError(MemoryServiceError):
    """The token endpoint refused a grant (``error`` is the OAuth error code, e.g. ``invalid_grant``)."""

    def __init__(self, error: str, description: str | None, status: int) -> None:
        super().__init__(f"{error}: {description}" if description else error)
        self.error = error
        self.description = description
        self.status = status


class APIError(MemoryServiceError):
    """An error answer of the service (4xx or 5xx)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        request_id: str | None = None,
        details: Mapping[str, Any] | None = None,
        reason: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}" + (f" (request {request_id})" if request_id else ""))
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        self.details: dict[str, Any] = dict(details or {})
        self.reason = reason
        self.headers: dict[str, str] = dict(headers or {})

    @property
    def fields(self) -> dict[str, str]:
        """For validation errors: the offending fields and what is wrong with each (``details.fields``)."""
        fields = self.details.get("fields")
        return dict(fields) if isinstance(fields, Mapping) else {}


class BadRequestError(APIError):
    """400: the request was malformed (``code`` ``validation_error``; see :attr:`APIError.fields`)."""


ValidationError = BadRequestError


class AuthenticationError(APIError):
    """401: missing, invalid or expired credentials."""


class PermissionDeniedError(APIError):
    """403: authenticated, but not allowed (a policy deny carries its ``reason``)."""


class NotFoundError(APIError):
    """404."""


class ConflictError(APIError):
    """409: e.g. a conversation id that exists, a membership that exists, a pending transfer."""


class PayloadTooLargeError(APIError):
    """413: a memory value, entry content or upload beyond its limit."""


class RateLimitedError(APIError):
    """429."""


class ServerError(APIError):
    """5xx."""


class UnavailableError(ServerError):
    """503: the service or one of its dependencies is unavailable; idempotent calls were retried first."""


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    429: RateLimitedError,
    503: UnavailableError,
}


def error_from_response(status: int, headers: Mapping[str, str], body: bytes) -> APIError:
    """The exception for an error answer. A body that is not the service's JSON error (a proxy's HTML page) still
    gives an error of the right class, with code ``http_<status>``."""
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else APIError)
    request_id = headers.get("x-request-id")
    try:
        payload = json.loads(body) if body else None
    except ValueError:
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("code"), str):
        details = payload.get("details")
        reason = payload.get("reason")
        return cls(
            status,
            payload["code"],
            str(payload.get("error") or ""),
            request_id=payload.get("requestId") or request_id,
            details=details if isinstance(details, dict) else None,
            reason=reason if isinstance(reason, str) else None,
            headers=headers,
        )
    text = body[:200].decode("utf-8", "replace").strip() if body else ""
    return cls(status, f"http_{status}", text or "no error body", request_id=request_id, headers=headers)
