"""Access tokens as the dev IdP issues them, shaped like Keycloak's so the same role and user-id settings work."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from django.conf import settings

from apps.identity.dev_idp import keys


def access_token_claims(
    username: str, roles: Sequence[str], *, client_id: str | None = None, now: int | None = None
) -> dict[str, Any]:
    issued_at = int(time.time()) if now is None else now
    return {
        "iss": settings.DEV_IDP_ISSUER,
        "sub": username,
        "preferred_username": username,
        "aud": settings.DEV_IDP_AUDIENCE,
        "azp": client_id or settings.DEV_IDP_CLIENT_ID,
        "realm_access": {"roles": list(roles)},
        "roles": list(roles),
        "iat": issued_at,
        "exp": issued_at + settings.DEV_IDP_TOKEN_LIFETIME_SECONDS,
        "jti": uuid.uuid4().hex,
        "typ": "Bearer",
    }


def issue_access_token(username: str, roles: Sequence[str], *, client_id: str | None = None) -> str:
    return keys.sign(access_token_claims(username, roles, client_id=client_id))
