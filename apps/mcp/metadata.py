"""OAuth 2.0 Protected Resource Metadata (RFC 9728) for ``/mcp``: what an MCP client reads after a 401 to find the
authorization server that issues the tokens this service accepts.

Served at ``/.well-known/oauth-protected-resource/mcp`` (RFC 9728's location for the resource ``<base>/mcp``) and at
``/.well-known/oauth-protected-resource`` (where clients that ignore the path look). The resource is
``MCP_RESOURCE_URL`` when set (the public URL of ``/mcp`` behind a proxy), otherwise the URL the request came in on;
the authorization server is the configured OIDC issuer (``OIDC_ISSUER_URL``), or the dev IdP's when that is the
issuer in use. The document is public, like the issuer's own discovery document: it holds no secret.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings

from apps.core import errors
from apps.core.logging import request_id_for, reset_request_id, set_request_id
from apps.core.renderers import JSONRenderer
from apps.identity import tokens

WELL_KNOWN = "/.well-known/oauth-protected-resource"
MCP_PATH = "/mcp"
PATHS = (WELL_KNOWN + MCP_PATH, WELL_KNOWN)


def _header(scope: dict, name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return ""


def _origin(scope: dict) -> str:
    host = _header(scope, b"host")
    if not host:
        server = scope.get("server") or ("localhost", None)
        host = server[0] if server[1] in (None, 80, 443) else f"{server[0]}:{server[1]}"
    return f"{scope.get('scheme', 'http')}://{host}{scope.get('root_path', '')}"


def resource_url(scope: dict) -> str:
    """The URL of ``/mcp`` as clients reach it."""
    return settings.MCP_RESOURCE_URL or _origin(scope) + MCP_PATH


def metadata_url(scope: dict) -> str:
    """Where the metadata of the resource lives (RFC 9728 section 3.1: the well-known path, then the resource's)."""
    resource = resource_url(scope)
    scheme, _, rest = resource.partition("://")
    authority, slash, path = rest.partition("/")
    return f"{scheme}://{authority}{WELL_KNOWN}{slash}{path}".rstrip("/")


def document(scope: dict) -> dict[str, Any]:
    body: dict[str, Any] = {
        "resource": resource_url(scope),
        "bearer_methods_supported": ["header"],
        "resource_name": "Memory Service",
    }
    try:
        issuer, _keys = tokens.trusted_issuer()
    except tokens.TokenError:  # no identity provider configured: no token is accepted, there is none to name
        issuer = None
    if issuer:
        body["authorization_servers"] = [issuer]
    return body


async def application(scope: dict, receive: Callable, send: Callable) -> None:
    """The metadata document (GET, HEAD; OPTIONS for browsers' preflight)."""
    if scope["type"] != "http":
        return
    request_id = request_id_for(_header(scope, b"x-request-id"))
    token = set_request_id(request_id)
    try:
        method = scope["method"]
        cors = [
            (b"access-control-allow-origin", b"*"),
            (b"access-control-allow-methods", b"GET, HEAD, OPTIONS"),
            (b"x-request-id", request_id.encode()),
        ]
        if method == "OPTIONS":
            await send({"type": "http.response.start", "status": 204, "headers": cors})
            await send({"type": "http.response.body", "body": b""})
            return
        if method in ("GET", "HEAD"):
            status, body = 200, document(scope)
            # Derived from the request's Host (no MCP_RESOURCE_URL): never cached by anyone else.
            caching = b"public, max-age=3600" if settings.MCP_RESOURCE_URL else b"no-store"
            extra = [(b"cache-control", caching), *cors]
        else:
            error = errors.ApiError(405, f"Method {method} is not allowed.", headers={"Allow": "GET, HEAD, OPTIONS"})
            status, body, extra = 405, errors.body(error), [(b"allow", b"GET, HEAD, OPTIONS"), cors[-1]]
        payload = JSONRenderer().render(body)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            *extra,
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else payload})
    finally:
        reset_request_id(token)
