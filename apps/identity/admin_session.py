"""Admin sessions that came from an OIDC login are checked on every request (issue 28 item 11).

A Django session outlives what it was granted for: an operator whose ADMIN_ROLE was withdrawn at the provider kept
an open admin session (and their staff flags) for as long as the cookie lived. A login through
apps.identity.admin_oidc stores its grant in the session (``GRANT``: the roles, and until when it holds); on every
request to the cookie pages (/admin/, /oidc/) a session logged in that way is checked against it: past its time,
it ends (the operator logs in again, and the provider says again whether they hold the role); without ADMIN_ROLE
among its roles (the setting changed, or the grant names no roles), it ends and the user's staff flags go. Sessions of
Django's own password login are left alone.

Kept apart from admin_oidc, which imports the OIDC library: this runs on every admin request, enabled or not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, SESSION_KEY, get_user_model, logout
from django.contrib.auth.signals import user_logged_in
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse

from apps.core.middleware import is_api_path

logger = logging.getLogger(__name__)

GRANT = "admin_oidc_grant"
PENDING_GRANT = "_admin_oidc_grant"  # set on the request by the OIDC backend, stored by on_login
OIDC_BACKEND = "apps.identity.admin_oidc.AdminOIDCBackend"


@receiver(user_logged_in)
def on_login(sender, request: HttpRequest | None, **_kwargs) -> None:
    granted = getattr(request, PENDING_GRANT, None)
    if request is not None and granted is not None:
        request.session[GRANT] = granted


def grant_holds(request: HttpRequest) -> bool:
    """Whether the session's OIDC grant still holds for an admin (False for a session without one)."""
    granted = request.session.get(GRANT)
    if not isinstance(granted, dict):
        return False
    until = granted.get("until")
    return (
        isinstance(until, int | float) and time.time() < until and settings.ADMIN_ROLE in (granted.get("roles") or [])
    )


class AdminSessionMiddleware:
    """After the session user is known (Django's AuthenticationMiddleware): ends an OIDC admin session whose grant
    no longer holds. The admin then sees its login page, as any logged-out visitor."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not is_api_path(request.path_info) and request.session.get(BACKEND_SESSION_KEY) == OIDC_BACKEND:
            if not grant_holds(request):
                self._end(request)
        return self.get_response(request)

    def _end(self, request: HttpRequest) -> None:
        granted = request.session.get(GRANT)
        roles = granted.get("roles") if isinstance(granted, dict) else None
        user_id = request.session.get(SESSION_KEY)
        if settings.ADMIN_ROLE not in (roles or []) and user_id is not None:
            withdrawn = get_user_model().objects.filter(pk=user_id, is_staff=True).update(is_staff=False, is_superuser=False)
            if withdrawn:
                logger.warning("admin rights withdrawn: the session's grant lacks the %s role", settings.ADMIN_ROLE)
        else:
            logger.info("admin session ended: its OIDC grant expired")
        logout(request)
