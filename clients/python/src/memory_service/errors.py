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


class ConfigurationError(MemoryServiceError, ValueError):
    """The client is set up wrong (a base URL without http:// or https://, a malformed timeout): raised at once,
    never retried."""


class ConversationTakenError(MemoryServiceError):
    """A thread's (or chat session's) conversation exists and is not the caller's: another user created it (a
    derived id is predictable) or shared it with the caller. The adapters neither read nor write it unless told
    to use shared conversations (``allow_shared=True``)."""

    def __init__(self, thread_id: str, conversation_id: str, user_id: str, owner_user_id: str | None) -> None:
        whose = f"belongs to {owner_user_id!r}" if owner_user_id else "belongs to another user (you cannot see it)"
        super().__init__(
            f"thread {thread_id!r} maps to conversation {conversation_id}, which {whose}, not to you ({user_id!r}): "
            "refusing to use it. Use another thread id, or pass allow_shared=True to use a conversation shared "
            "with you."
        )
        self.thread_id = thread_id
        self.conversation_id = conversation_id
        self.user_id = user_id
        self.owner_user_id = owner_user_id


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
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        self.details: dict[str, Any] = dict(details or {})
        self.reason = reason
        self.headers: dict[str, str] = dict(headers or {})
        text = f"{status} {code}: {message}"
        if self.fields:  # which fields, and what is wrong with each: the part of a 400 a caller acts on
            text += " [" + "; ".join(f"{name}: {problem}" for name, problem in self.fields.items()) + "]"
        if reason:
            text += f" (reason: {reason})"
        super().__init__(text + (f" (request {request_id})" if request_id else ""))

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
    """429: over the caller's request rate. Retried after ``Retry-After`` first (RetryPolicy), unless the wait
    asked for is longer than the policy allows."""

    @property
    def retry_after(self) -> float | None:
        """The seconds the service asked to wait (its ``Retry-After``), if it said."""
        value = {k.lower(): v for k, v in self.headers.items()}.get("retry-after")
        try:
            return max(0.0, float(value)) if value is not None else None
        except ValueError:
            return None


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
