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
    """A single item whose stored envelope does not open (apps.encryption.crypto.decrypt_for_read): its key id is missing
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


# What a database failure tells the caller (issue 28 item 5): only a failure of the connection itself is 503.
_DATABASE_ERRORS = (DbOperationalError, DbInterfaceError, psycopg.OperationalError, psycopg.InterfaceError)
# SQLSTATEs, or their two-character classes, a concurrent request caused: the request itself is fine and a retry
# may succeed. Fork trees take locks in one order (apps.conversations.trees), so a deadlock should not happen; if one
# does, it is a conflict with another request, not an outage.
_CONFLICT_STATES = {"40P01", "40001", "55P03"}  # deadlock, serialization failure, lock not available
# The server is there but cannot serve this session now: it is shutting down or restarting (57P01-57P03), out of
# connection slots or memory (53xxx), or a statement ran past DB_STATEMENT_TIMEOUT_SECONDS (57014: busy, not
# broken). Class 08 is a connection failure reported by the server.
_UNAVAILABLE_CLASSES = {"08", "57"}
_UNAVAILABLE_STATES = {"53000", "53200", "53300", "53400"}
# The server refuses the work for a reason a retry cannot fix until an operator acts: a 500 with its own code.
_SERVER_LIMIT_STATES = {"53100": "disk_full"}
_SERVER_LIMIT_CLASSES = {"54": "program_limit_exceeded"}  # statement too complex, too many columns or arguments


def database_unavailable() -> ApiError:
    return ApiError(503, "The database is unavailable; retry shortly.", headers={"Retry-After": "2"})


def database_error(exc: BaseException) -> ApiError | None:
    """The answer to a failure raised by the database driver (Django's wrapper or psycopg's own), by its SQLSTATE;
    None for anything else.

    - no SQLSTATE (the connection broke, was refused, or the server stayed silent: apps.core.db.base), class 08,
      class 57 (shutdown, restart, statement timeout) and 53000/53200/53300/53400 (out of connections or memory):
      503 ``unavailable`` with Retry-After;
    - 40P01 (deadlock), 40001 (serialization failure), 55P03 (lock not available): 409 ``conflict``, retryable;
    - 53100 (disk full): 500 ``disk_full``; class 54 (a program limit): 500 ``program_limit_exceeded``;
    - any other SQLSTATE: None (an unexpected error: 500 ``internal_error``).
    Logged with the SQLSTATE and the class names only: a driver message can quote the statement."""
    if not isinstance(exc, _DATABASE_ERRORS):
        return None
    cause = exc if isinstance(exc, psycopg.Error) else exc.__cause__
    sqlstate = getattr(cause, "sqlstate", None)
    log = {"error": type(exc).__name__, "cause": type(cause).__name__, "sqlstate": sqlstate}
    if sqlstate is None or sqlstate[:2] in _UNAVAILABLE_CLASSES or sqlstate in _UNAVAILABLE_STATES:
        logger.warning("database unavailable", extra=log)
        return database_unavailable()
    if sqlstate in _CONFLICT_STATES:
        logger.warning("database conflict with a concurrent request", extra=log)
        return conflict("The request conflicted with a concurrent one and was not applied; retry it.")
    code = _SERVER_LIMIT_STATES.get(sqlstate) or _SERVER_LIMIT_CLASSES.get(sqlstate[:2])
    if code is not None:
        logger.error("database refused the work", extra={**log, "code": code})
        return ApiError(500, "The database cannot do this now; the operator has been alerted.", code=code)
    return None


def from_exception(exc: Exception) -> ApiError | None:
    """Map a known exception onto the error model; ``None`` means unexpected (a 500)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, _DATABASE_ERRORS):
        return database_error(exc)
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
