"""The one error model (D1): every failure is ``{"code", "error", "requestId", "details"?}`` with a stable code.

Raise ``ApiError`` (or one of the helpers below) anywhere in a request; DRF views reach ``exception_handler`` and
plain Django views / middleware reach ``error_response``. Nothing else builds error bodies.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from django.core.exceptions import PermissionDenied, RequestDataTooBig, SuspiciousOperation
from django.db import InterfaceError as DbInterfaceError
from django.db import OperationalError as DbOperationalError
from django.http import Http404, JsonResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

from apps.core.logging import current_request_id

logger = logging.getLogger(__name__)

_STATUS_CODES = {
    400: "validation_error",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    408: "request_timeout",
    409: "conflict",
    413: "payload_too_large",
    414: "uri_too_long",
    415: "unsupported_media_type",
    431: "headers_too_large",
    429: "rate_limited",
    500: "internal_error",
    503: "unavailable",
}


class ApiError(Exception):
    """An error that reaches the caller as-is. ``code`` is stable; ``message`` is safe to show."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        details: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code or _STATUS_CODES.get(status, "error")
        self.message = message
        self.details = details
        self.extra = extra or {}
        self.headers = headers or {}


def validation_error(fields: dict[str, str], message: str = "Invalid request.") -> ApiError:
    return ApiError(400, message, details={"fields": fields})


def unauthenticated(message: str = "Authentication credentials were missing or invalid.") -> ApiError:
    return ApiError(401, message, headers={"WWW-Authenticate": 'Bearer realm="memory-service"'})


def forbidden(message: str = "Access denied.", reason: str | None = None) -> ApiError:
    return ApiError(403, message, extra={"reason": reason} if reason else None)


def not_found(message: str = "Not found.") -> ApiError:
    return ApiError(404, message)


def conflict(message: str, details: dict[str, Any] | None = None) -> ApiError:
    return ApiError(409, message, details=details)


def payload_too_large(message: str = "Request body is too large.") -> ApiError:
    return ApiError(413, message)


def unavailable(message: str = "Service temporarily unavailable.") -> ApiError:
    return ApiError(503, message)


def blob_missing(what: str = "The file") -> ApiError:
    """A single item whose row exists but whose stored file is not where the row says (attachment storage not shared
    by every host and process, a lost volume or bucket). 500 like ``undecryptable``: the request is fine, the fault is
    the server's, and retrying cannot help until an operator restores the storage. Its own code tells the caller the
    item exists (a 404 would say it does not)."""
    return ApiError(
        500,
        f"{what}'s stored file is missing from the service's storage; the operator has been alerted.",
        code="blob_missing",
    )


def undecryptable(what: str = "The stored value") -> ApiError:
    """A single item whose stored envelope does not open (apps.core.crypto.decrypt_for_read): its key id is missing
    from MEMORY_ENCRYPTION_KEYS or the row is damaged. A 5xx, since the request is fine and the fault is the
    server's; 500 and not 503 because nothing about it is temporary or load-related: retrying cannot help until an
    operator restores the key (the log line and metric name the row and key id). Its own code, unlike
    ``internal_error``, tells the caller that the item exists and exactly what is wrong with it."""
    return ApiError(
        500,
        f"{what} cannot be decrypted with the service's encryption keys; the operator has been alerted.",
        code="undecryptable",
    )


def body(error: ApiError) -> dict[str, Any]:
    payload: dict[str, Any] = {"code": error.code, "error": error.message, "requestId": current_request_id()}
    payload.update(error.extra)
    if error.details is not None:
        payload["details"] = error.details
    return payload


def error_response(error: ApiError) -> JsonResponse:
    """The error as a plain Django response (middleware, handler404/500, non-DRF views)."""
    response = JsonResponse(body(error), status=error.status)
    for name, value in error.headers.items():
        response[name] = value
    return response


def _flatten_drf_detail(detail: Any, prefix: str = "") -> dict[str, str]:
    """DRF's nested ValidationError detail → {"field.sub": "message"} (first message per field)."""
    if isinstance(detail, dict):
        fields: dict[str, str] = {}
        for key, value in detail.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if key == "non_field_errors" and not prefix:
                name = "body"
            fields.update(_flatten_drf_detail(value, name))
        return fields
    if isinstance(detail, list):
        if detail and all(not isinstance(item, (dict, list)) for item in detail):
            return {prefix or "body": str(detail[0])}
        fields = {}
        for index, value in enumerate(detail):
            if value:
                fields.update(_flatten_drf_detail(value, f"{prefix}[{index}]"))
        return fields
    return {prefix or "body": str(detail)}


# The database is down, frozen, restarting or refusing connections, a connection broke, or a statement ran past
# DB_STATEMENT_TIMEOUT_SECONDS (apps.core.db.base): the request may succeed later, so 503, never a 500.
_DATABASE_UNAVAILABLE = (DbOperationalError, DbInterfaceError, psycopg.OperationalError, psycopg.InterfaceError)


def database_unavailable() -> ApiError:
    return ApiError(503, "The database is unavailable; retry shortly.", headers={"Retry-After": "2"})


def from_exception(exc: Exception) -> ApiError | None:
    """Map a known exception onto the error model; ``None`` means unexpected (a 500)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, _DATABASE_UNAVAILABLE):
        # The class only: a driver message can quote the statement.
        logger.warning("database unavailable", extra={"error": type(exc).__name__, "cause": type(exc.__cause__).__name__})
        return database_unavailable()
    if isinstance(exc, drf_exceptions.ValidationError):
        return validation_error(_flatten_drf_detail(exc.detail))
    if isinstance(exc, drf_exceptions.ParseError):
        return validation_error({"body": f"malformed JSON: {exc.detail}"}, "Request body is not valid JSON.")
    if isinstance(exc, (drf_exceptions.NotAuthenticated, drf_exceptions.AuthenticationFailed)):
        return unauthenticated(str(exc.detail))
    if isinstance(exc, (drf_exceptions.PermissionDenied, PermissionDenied)):
        return forbidden()
    if isinstance(exc, (drf_exceptions.NotFound, Http404)):
        return not_found()
    if isinstance(exc, drf_exceptions.MethodNotAllowed):
        return ApiError(405, str(exc.detail))
    if isinstance(exc, drf_exceptions.UnsupportedMediaType):
        return ApiError(415, str(exc.detail))
    if isinstance(exc, drf_exceptions.NotAcceptable):
        return ApiError(406, str(exc.detail))
    if isinstance(exc, drf_exceptions.Throttled):
        return ApiError(429, "Too many requests.")
    if isinstance(exc, RequestDataTooBig):
        return payload_too_large()
    if isinstance(exc, SuspiciousOperation):
        # Too many query/form fields, malformed multipart and the like: the request is at fault, not us.
        return validation_error({"request": "malformed or too large request"}, "Malformed request.")
    return None


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    """DRF's EXCEPTION_HANDLER: every exception a view raises leaves as the one error body."""
    error = from_exception(exc)
    if error is None:
        logger.exception("unhandled error in %s", type(context.get("view")).__name__)
        error = ApiError(500, "Internal server error.")
    response = Response(body(error), status=error.status)
    for name, value in error.headers.items():
        response[name] = value
    return response
