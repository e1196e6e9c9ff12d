"""Request-wide concerns that run before any view: request id, access log, latency metrics, body size."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from http import HTTPStatus

from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import CsrfViewMiddleware

from apps.core import errors, metrics
from apps.core.logging import request_id_for, reset_request_id, set_request_id

access_log = logging.getLogger("apps.access")


# The operational endpoints (D9) answer JSON like the API, and authenticate no one by cookie either.
_OPERATIONAL_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json"})


def is_api_path(path: str) -> bool:
    """The REST API and the operational endpoints: every response JSON, credentials never a cookie."""
    return path.startswith("/v1/") or path == "/v1" or path in _OPERATIONAL_PATHS


class RequestContextMiddleware:
    """Assigns the request id (echoing a well-formed caller one), logs one line per request, records latency.

    The access log carries method, route, status and duration: never headers, query strings or bodies, which can
    hold tokens, API keys and memory values.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # From META directly: request.headers would build a dict of every header on each request just for this.
        request_id = request_id_for(request.META.get("HTTP_X_REQUEST_ID", ""))
        request.request_id = request_id
        token = set_request_id(request_id)
        started = time.perf_counter()
        try:
            response = self.get_response(request)
            if response.status_code >= 400 and is_api_path(request.path_info):
                response = _as_api_error(response)
            response["X-Request-ID"] = request_id
            elapsed = time.perf_counter() - started
            route = _route_of(request)
            metrics.observe_request(request.method, route, response.status_code, elapsed)
            access_log.info(
                "request",
                extra={
                    "method": request.method,
                    "route": route,
                    "status": response.status_code,
                    "duration_ms": round(elapsed * 1000, 2),
                },
            )
            return response
        finally:
            reset_request_id(token)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        """Exceptions outside DRF views: JSON too, even with DEBUG on (never Django's HTML debug page)."""
        error = errors.from_exception(exception)
        if error is None:
            access_log.exception("unhandled error")
            error = errors.ApiError(500, "Internal server error.")
        return errors.error_response(error)


def _as_api_error(response: HttpResponse) -> HttpResponse:
    """The last line of defence for D1 under the API: a failure that reached here as anything but JSON (Django's
    own pages: a DEBUG traceback, a bare 405, an error page from a middleware) leaves in the one error shape."""
    if response.get("Content-Type", "").startswith("application/json"):
        return response
    status = response.status_code
    try:
        message = f"{HTTPStatus(status).phrase}."
    except ValueError:
        message = "Request failed."
    if status == 400:
        error = errors.validation_error({"request": "malformed request"}, message)
    else:
        error = errors.ApiError(status, message)
    replacement = errors.error_response(error)
    for header in ("Allow", "WWW-Authenticate", "Retry-After"):
        if header in response:
            replacement[header] = response[header]
    return replacement


class _CookiePagesOnly:
    """Mixin for Django's cookie-session middlewares: under the API they pass the request straight through.

    The API authenticates by bearer token or API key only; DRF replaces ``request.user`` with the caller's Principal
    and nothing under it reads a session, a CSRF cookie or flash messages. Run there, these middlewares did only
    work whose result no API response uses (a lazy session store, a lazy user, the CSRF cookie read, their
    response hooks): about 115 us of a web worker's CPU on every request (issue 12). Their names stay subclasses
    of Django's, so the admin's system checks still find them in MIDDLEWARE.
    """

    get_response: Callable[[HttpRequest], HttpResponse]

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if is_api_path(request.path_info):
            return self.get_response(request)
        return super().__call__(request)  # type: ignore[misc]


class ApiSessionMiddleware(_CookiePagesOnly, SessionMiddleware):
    """Sessions for the admin's cookie-session pages only."""


class ApiAuthenticationMiddleware(_CookiePagesOnly, AuthenticationMiddleware):
    """Django's session user for the admin's cookie-session pages only (DRF sets the API's ``request.user``)."""


class ApiCsrfViewMiddleware(_CookiePagesOnly, CsrfViewMiddleware):
    """CSRF protects what a browser's cookies authenticate: the Django admin and its OIDC login. The API never
    reads a session cookie (bearer tokens and API keys only), so a forged cross-site request gains nothing there,
    and Django's HTML failure page must not answer an API client: API paths skip the check."""

    def process_view(self, request: HttpRequest, callback, callback_args, callback_kwargs):
        # The handler calls every middleware's process_view itself, whatever __call__ skipped.
        if is_api_path(request.path_info):
            return None
        return super().process_view(request, callback, callback_args, callback_kwargs)


class ApiMessageMiddleware(_CookiePagesOnly, MessageMiddleware):
    """Django's flash messages belong to the admin's cookie-session pages; building their cookie/session storage
    (a cookie signer per request) is skipped under the API, which never renders or sets them."""


def _route_of(request: HttpRequest) -> str:
    """The URL pattern, not the path: bounded metric cardinality, and no ids or names in logs."""
    match = getattr(request, "resolver_match", None)
    if match is None or not match.route or match.url_name == "unmatched":
        return "unmatched"
    return "/" + _named_groups_as_placeholders(match.route.replace("^", "").replace("$", ""))


@functools.lru_cache(maxsize=1024)  # one entry per URL pattern: the input is a route, never a path
def _named_groups_as_placeholders(route: str) -> str:
    """``conversations/(?P<conversationId>(?!search$)[^/]+)/entries`` (a DRF router's regex) →
    ``conversations/{conversationId}/entries``, like the OpenAPI paths."""
    out: list[str] = []
    index = 0
    while (start := route.find("(?P<", index)) != -1:
        name_end = route.find(">", start)
        depth, position = 0, start
        while position < len(route):
            char = route[position]
            if char == "\\":
                position += 2
                continue
            if char == "(":
                depth += 1
            elif char == ")":
                depth -= 1
                if depth == 0:
                    break
            position += 1
        out.append(route[index:start] + "{" + route[start + 4 : name_end] + "}")
        index = position + 1
    out.append(route[index:])
    return "".join(out)


class BodySizeLimitMiddleware:
    """Refuses bodies larger than REQUEST_MAX_BODY_BYTES with 413 before anything reads them.

    DRF's parsers read the raw stream (Django's DATA_UPLOAD_MAX_MEMORY_SIZE only guards ``request.body``), so the
    limit is enforced here from Content-Length; a chunked body without one is capped by a bounded read.
    Paths in ``exempt_prefixes`` (uploads) enforce their own limit while streaming.
    """

    exempt_prefixes = ("/v1/attachments",)

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method in ("POST", "PUT", "PATCH", "DELETE") and not request.path.startswith(self.exempt_prefixes):
            limit = settings.REQUEST_MAX_BODY_BYTES
            length = request.META.get("CONTENT_LENGTH")
            if length:
                try:
                    too_big = int(length) > limit
                except ValueError:
                    return errors.error_response(errors.validation_error({"Content-Length": "must be an integer"}))
                if too_big:
                    return errors.error_response(errors.payload_too_large(f"Request body exceeds {limit} bytes."))
            elif request.META.get("HTTP_TRANSFER_ENCODING", "").lower() == "chunked":
                data = request.read(limit + 1)
                if len(data) > limit:
                    return errors.error_response(errors.payload_too_large(f"Request body exceeds {limit} bytes."))
                request._body = data  # parsers read the already-consumed body from here
        return self.get_response(request)
