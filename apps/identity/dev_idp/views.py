"""The development identity provider's endpoints (D2): discovery, JWKS and a password-grant token endpoint.

Only the token endpoint speaks OAuth (RFC 6749 error objects such as ``{"error": "invalid_grant"}``), because OAuth
clients parse those. With ``DEV_IDP_ENABLED`` off every endpoint is the service's ordinary JSON 404.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Callable
from functools import wraps
from urllib.parse import unquote_plus

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from apps.core import errors
from apps.identity.dev_idp import issuer, keys, users

_DUMMY_PASSWORD = "dev-idp-no-such-user"  # compared against when the user is unknown, to keep timing uniform


def _enabled_only(view: Callable[[HttpRequest], HttpResponse]) -> Callable[[HttpRequest], HttpResponse]:
    @wraps(view)
    def wrapper(request: HttpRequest) -> HttpResponse:
        if not settings.DEV_IDP_ENABLED:
            return errors.error_response(errors.not_found(f"No endpoint at {request.path}."))
        return view(request)

    return wrapper


def _method_not_allowed(allowed: str) -> HttpResponse:
    return errors.error_response(errors.ApiError(405, "Method not allowed.", headers={"Allow": allowed}))


@_enabled_only
def openid_configuration(request: HttpRequest) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        return _method_not_allowed("GET, HEAD")
    base = settings.DEV_IDP_ISSUER.rstrip("/")
    return JsonResponse(
        {
            "issuer": settings.DEV_IDP_ISSUER,
            "jwks_uri": f"{base}/jwks",
            "token_endpoint": f"{base}/token",
            "grant_types_supported": ["password"],
            "response_types_supported": ["token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": [keys.ALGORITHM],
            "token_endpoint_auth_methods_supported": ["client_secret_post", "client_secret_basic"],
            "claims_supported": ["iss", "sub", "aud", "exp", "iat", "preferred_username", "roles", "realm_access"],
        }
    )


@_enabled_only
def jwks(request: HttpRequest) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        return _method_not_allowed("GET, HEAD")
    return JsonResponse(keys.public_jwks())


def _oauth_error(error: str, description: str, status: int = 400, *, basic_challenge: bool = False) -> JsonResponse:
    response = JsonResponse({"error": error, "error_description": description}, status=status)
    response["Cache-Control"] = "no-store"
    if basic_challenge:
        response["WWW-Authenticate"] = 'Basic realm="dev-idp"'
    return response


def _equal(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def _client_credentials(request: HttpRequest) -> tuple[str, str, bool]:
    """client_id/secret from HTTP Basic (client_secret_basic) or the form (client_secret_post)."""
    scheme, _, encoded = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "basic" and encoded:
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return "", "", True
        client_id, _, secret = decoded.partition(":")
        return unquote_plus(client_id), unquote_plus(secret), True
    return request.POST.get("client_id", ""), request.POST.get("client_secret", ""), False


@csrf_exempt  # an OAuth token endpoint: the client secret is the proof, not a browser cookie
@_enabled_only
def token(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _method_not_allowed("POST")
    if request.content_type != "application/x-www-form-urlencoded":
        return _oauth_error("invalid_request", "The body must be application/x-www-form-urlencoded.")

    client_id, client_secret, used_basic = _client_credentials(request)
    client_ok = _equal(client_id, settings.DEV_IDP_CLIENT_ID) & _equal(client_secret, settings.DEV_IDP_CLIENT_SECRET)
    if not client_ok:
        return _oauth_error("invalid_client", "Client authentication failed.", 401, basic_challenge=used_basic)

    grant_type = request.POST.get("grant_type", "")
    if not grant_type:
        return _oauth_error("invalid_request", "grant_type is required.")
    if grant_type != "password":
        return _oauth_error("unsupported_grant_type", "Only the password grant is supported.")
    username = request.POST.get("username", "")
    password = request.POST.get("password", "")
    if not username or not password:
        return _oauth_error("invalid_request", "username and password are required.")

    user = users.load_users().get(username)
    password_ok = _equal(password, user.password if user else _DUMMY_PASSWORD)
    if user is None or not password_ok:
        return _oauth_error("invalid_grant", "Invalid user credentials.")

    access_token = issuer.issue_access_token(user.username, user.roles, client_id=client_id)
    response = JsonResponse(
        {
            "access_token": access_token,
            "token_type": "Bearer",
            "expires_in": settings.DEV_IDP_TOKEN_LIFETIME_SECONDS,
            "scope": "openid profile",
        }
    )
    response["Cache-Control"] = "no-store"
    response["Pragma"] = "no-cache"
    return response
