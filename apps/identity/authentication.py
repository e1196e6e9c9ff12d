"""DRF authentication for the API (D2): a Bearer JWT names the user, an optional X-API-Key names the client."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request

from apps.core import errors
from apps.identity import api_keys, tokens
from apps.identity.principal import Principal

API_KEY_HEADER = "X-API-Key"
_API_KEY_META = "HTTP_X_API_KEY"


class ServiceAuthentication(BaseAuthentication):
    """``Authorization: Bearer <jwt>`` authenticates the user; ``X-API-Key`` optionally adds the calling client.

    - No Authorization header and no API key: anonymous (DRF's permission check then answers 401 on protected
      endpoints, while endpoints that allow anonymous callers keep working).
    - An Authorization header that is not ``Bearer <token>``, or a token that fails verification: 401.
    - An ``X-API-Key`` header is optional, but when present it must name an active key, else 401; its client
      becomes ``request.user.client_id``. An empty or blank one counts as absent (D10: the upstream project's
      clients send the header empty when no key is configured).
    - An API key **without** a Bearer token is 401: the key identifies an application, never a user, and every
      call needs a user.

    ``request.user`` is a :class:`Principal`; ``request.auth`` the :class:`tokens.VerifiedToken`.
    """

    def authenticate(self, request: Request) -> tuple[Principal, tokens.VerifiedToken] | None:
        return authenticate_credentials(request.META.get("HTTP_AUTHORIZATION", ""), request.META.get(_API_KEY_META))

    def authenticate_header(self, request: Request) -> str:
        # Non-None keeps DRF answering 401 (not 403) when credentials are missing.
        return 'Bearer realm="memory-service"'


def authenticate_credentials(authorization: str, api_key: str | None) -> tuple[Principal, tokens.VerifiedToken] | None:
    """The rules of :class:`ServiceAuthentication` on raw header values, for callers outside DRF (the ASGI event
    stream). None = anonymous; raises ``ApiError`` (401) for bad credentials. Synchronous: it may read the API-key
    table and fetch the issuer's keys."""
    if api_key is not None and not api_key.strip():
        api_key = None
    if not authorization:
        if api_key is not None:
            raise errors.unauthenticated("An API key must be sent together with a Bearer token.")
        return None

    scheme, _, credentials = authorization.partition(" ")
    credentials = credentials.strip()
    if scheme.lower() != "bearer" or not credentials or " " in credentials:
        raise errors.unauthenticated("The Authorization header must be 'Bearer <token>'.")
    try:
        verified = tokens.verify_token(credentials)
    except tokens.TokenError as exc:
        raise errors.unauthenticated(str(exc)) from None

    client_id = None
    if api_key is not None:
        client_id = api_keys.authenticate_key(api_key.strip())
        if client_id is None:
            raise errors.unauthenticated("The API key is not valid.")

    return _principal(verified, client_id), verified


def authenticate_cached(authorization: str, api_key: str | None) -> tuple[Principal, tokens.VerifiedToken] | None:
    """``authenticate_credentials``' answer where it needs no I/O, for an event loop: a well-formed Bearer token that
    was verified moments ago (tokens.cached_verification) and no API key (keys are looked up in the database).
    None means undecided: ask ``authenticate_credentials`` (in a thread), which decides every other case."""
    if api_key is not None and api_key.strip():
        return None
    scheme, _, credentials = authorization.partition(" ")
    credentials = credentials.strip()
    if scheme.lower() != "bearer" or not credentials or " " in credentials:
        return None
    verified = tokens.cached_verification(credentials)
    return None if verified is None else (_principal(verified, None), verified)


def _principal(verified: tokens.VerifiedToken, client_id: str | None) -> Principal:
    return Principal(user_id=verified.user_id, client_id=client_id, roles=verified.roles, raw_claims=verified.claims)


class ServiceAuthenticationScheme(OpenApiAuthenticationExtension):
    """Documents ServiceAuthentication as bearerAuth, optionally combined with apiKey (the security schemes declared
    in SPECTACULAR_SETTINGS). While AUTHENTICATION_WHITELIST is empty the global SECURITY setting is used instead
    and this extension only keeps drf-spectacular from warning about an unknown authenticator."""

    target_class = "apps.identity.authentication.ServiceAuthentication"
    name = ["bearerAuth", "apiKey"]

    def get_security_requirement(self, auto_schema: Any) -> list[dict[str, list[Any]]]:
        return [{"bearerAuth": []}, {"bearerAuth": [], "apiKey": []}]

    def get_security_definition(self, auto_schema: Any) -> list[dict[str, Any]]:
        return [
            {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"},
            {"type": "apiKey", "in": "header", "name": API_KEY_HEADER},
        ]
