"""Operator login to Django admin through the OIDC provider (used when ADMIN_OIDC_ENABLED).

Only users whose roles (the same role claims as the API, D2) include ADMIN_ROLE get in; they are created or updated
as staff superusers. Everybody else is refused, however valid their login, and a refused user who was staff before
(the role was withdrawn at the provider) is staff no more. The login's grant is kept in the session (its roles, and
until when it holds: the access token's expiry, at most ADMIN_OIDC_SESSION_MAX_SECONDS), and
apps.identity.admin_session checks it on every admin request: an admin session ends when its grant does, and at once
when ADMIN_ROLE is not among its roles (issue 28 item 11).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from apps.identity import admin_session, tokens

logger = logging.getLogger(__name__)


class AdminOIDCBackend(OIDCAuthenticationBackend):
    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Userinfo merged with the verified ID token, with roles gathered from both and from the access token:
        Keycloak, for one, puts realm roles only in the access token by default."""
        userinfo = super().get_userinfo(access_token, id_token, payload)
        claims: dict[str, Any] = {**payload, **userinfo}
        roles = set(tokens.roles_from_claims(claims, settings.OIDC_ROLE_CLAIMS))
        try:
            # The admin client's access token may be issued to another audience than the API's.
            roles.update(tokens.verify_token(access_token, check_audience=False).roles)
        except tokens.TokenError:
            pass
        claims["roles"] = sorted(roles)
        self._roles = claims["roles"]
        return claims

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        allowed = settings.ADMIN_ROLE in claims.get("roles", [])
        if not allowed:
            logger.warning("admin login refused: user lacks the %s role", settings.ADMIN_ROLE)
            # Whoever held the role before keeps no staff rights (another backend, e.g. a password, would honour them).
            demoted = self.filter_users_by_claims(claims).filter(is_staff=True).update(is_staff=False, is_superuser=False)
            if demoted:
                logger.warning("admin rights withdrawn from a user who lost the %s role", settings.ADMIN_ROLE)
        return allowed

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> Any:
        user = super().get_or_create_user(access_token, id_token, payload)
        if user is not None:
            # Into the session once logged in (Django's login may start a new session: admin_session.on_login).
            setattr(self.request, admin_session.PENDING_GRANT, grant(self._roles, access_token, payload))
        return user

    def filter_users_by_claims(self, claims: dict[str, Any]) -> QuerySet:
        username = tokens.user_id_from_claims(claims, settings.OIDC_USER_ID_CLAIMS)
        if not username:
            return self.UserModel.objects.none()
        return self.UserModel.objects.filter(username=username)

    def create_user(self, claims: dict[str, Any]) -> Any:
        username = tokens.user_id_from_claims(claims, settings.OIDC_USER_ID_CLAIMS)
        user = get_user_model().objects.create_user(username=username, email=claims.get("email", ""))
        return self.update_user(user, claims)

    def update_user(self, user: Any, claims: dict[str, Any]) -> Any:
        user.is_staff = True
        user.is_superuser = True
        user.email = claims.get("email", user.email)
        user.save(update_fields=["is_staff", "is_superuser", "email"])
        return user


def grant(roles: list[str], access_token: str, id_token_claims: dict[str, Any]) -> dict[str, Any]:
    """What a login grants an admin session: its roles, until the access token expires (the ID token's expiry where
    the access token is not a JWT this service can verify), and never longer than ADMIN_OIDC_SESSION_MAX_SECONDS."""
    expires = id_token_claims.get("exp")
    try:
        expires = tokens.verify_token(access_token, check_audience=False).claims.get("exp", expires)
    except tokens.TokenError:
        pass
    cap = time.time() + settings.ADMIN_OIDC_SESSION_MAX_SECONDS
    until = min(float(expires), cap) if isinstance(expires, int | float) and not isinstance(expires, bool) else cap
    return {"roles": list(roles), "until": until}
