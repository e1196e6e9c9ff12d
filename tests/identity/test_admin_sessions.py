"""Issue 28 item 11: an operator whose ADMIN_ROLE is withdrawn kept is_staff/is_superuser and an open admin session.
An OIDC login's grant (its roles, until when it holds) is kept in the session and checked on every admin request
(apps.identity.admin_session); a refused login takes the staff flags away (apps.identity.admin_oidc)."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth import get_user_model
from django.test import Client, RequestFactory, override_settings

from apps.identity import admin_session

pytestmark = pytest.mark.django_db

OIDC = admin_session.OIDC_BACKEND
OIDC_LOGIN = override_settings(
    AUTHENTICATION_BACKENDS=[OIDC, "django.contrib.auth.backends.ModelBackend"],
    OIDC_OP_AUTHORIZATION_ENDPOINT="https://idp.example/auth", OIDC_OP_TOKEN_ENDPOINT="https://idp.example/token",
    OIDC_OP_USER_ENDPOINT="https://idp.example/userinfo", OIDC_OP_JWKS_ENDPOINT="https://idp.example/certs",
    OIDC_RP_CLIENT_ID="admin-ui", OIDC_RP_CLIENT_SECRET="s",
)


def admin_session_for(username: str, *, roles: list[str], until: float) -> tuple[Client, object]:
    """A browser logged in to /admin/ through the OIDC backend, with the grant its login stored."""
    user = get_user_model().objects.create_user(username=username, is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(user, backend=OIDC)
    session = client.session
    session[admin_session.GRANT] = {"roles": roles, "until": until}
    session.save()
    return client, user


def in_admin(client: Client) -> bool:
    response = client.get("/admin/")
    return response.status_code == 200


@OIDC_LOGIN
def test_an_admin_session_ends_with_its_grant():
    client, user = admin_session_for("operator", roles=["admin"], until=time.time() + 60)
    assert in_admin(client)
    session = client.session
    session[admin_session.GRANT] = {"roles": ["admin"], "until": time.time() - 1}  # the access token expired
    session.save()
    response = client.get("/admin/")
    assert response.status_code == 302 and "/login/" in response["Location"]  # logged out: log in again
    user.refresh_from_db()
    assert user.is_staff  # the role may still be held: the next login through the provider says


@OIDC_LOGIN
def test_an_admin_session_without_the_admin_role_ends_and_takes_the_staff_flags():
    client, user = admin_session_for("operator", roles=["admin"], until=time.time() + 600)
    assert in_admin(client)
    with override_settings(ADMIN_ROLE="ops"):  # the role the service requires is no longer among the grant's
        response = client.get("/admin/")
    assert response.status_code == 302
    user.refresh_from_db()
    assert (user.is_staff, user.is_superuser) == (False, False)


@OIDC_LOGIN
def test_a_session_without_a_grant_is_no_admin_session():
    client, _user = admin_session_for("operator", roles=["admin"], until=time.time() + 600)
    session = client.session
    del session[admin_session.GRANT]
    session.save()
    assert client.get("/admin/").status_code == 302


def test_a_password_login_is_left_alone(operator):
    assert operator.get("/admin/").status_code == 200


@OIDC_LOGIN
def test_a_refused_login_takes_the_staff_flags_of_a_user_who_lost_the_role():
    from apps.identity.admin_oidc import AdminOIDCBackend

    backend = AdminOIDCBackend()
    user = backend.create_user({"preferred_username": "operator", "sub": "uuid", "roles": ["admin"]})
    assert user.is_staff and user.is_superuser
    assert backend.verify_claims({"preferred_username": "operator", "roles": ["user"]}) is False
    user.refresh_from_db()
    assert (user.is_staff, user.is_superuser) == (False, False)


@override_settings(ADMIN_OIDC_SESSION_MAX_SECONDS=900)
def test_a_logins_grant_lasts_as_its_access_token_at_most_the_cap(mint_token):
    from apps.identity.admin_oidc import grant

    token = mint_token("alice", roles=["admin"])  # the dev IdP's tokens last an hour
    granted = grant(["admin"], token, {"exp": time.time() + 3600})
    assert granted["roles"] == ["admin"] and granted["until"] <= time.time() + 900
    short = grant(["admin"], "not-a-jwt", {"exp": time.time() + 60})
    assert short["until"] <= time.time() + 60


@OIDC_LOGIN
def test_the_grant_goes_into_the_session_at_login():
    request = RequestFactory().get("/oidc/callback/")
    from django.contrib.sessions.backends.db import SessionStore

    request.session = SessionStore()
    setattr(request, admin_session.PENDING_GRANT, {"roles": ["admin"], "until": time.time() + 60})
    user = get_user_model().objects.create_user(username="operator")
    from django.contrib.auth import login

    login(request, user, backend=OIDC)
    assert request.session[admin_session.GRANT]["roles"] == ["admin"]
