"""The development identity provider (D2): discovery, JWKS, the password-grant token endpoint, and its switch."""

from __future__ import annotations

import base64
import json
import os
import stat
import time
from urllib.parse import urlencode

import jwt
import pytest
from django.conf import settings
from django.test import override_settings
from rest_framework.test import APIClient

from apps.identity import tokens
from apps.identity.dev_idp import keys

FORM = "application/x-www-form-urlencoded"


def form(**overrides: str) -> dict[str, str]:
    data = {
        "grant_type": "password",
        "client_id": "memory-service-client",
        "client_secret": "dev-client-secret",
        "username": "alice",
        "password": "alice",
    }
    data.update(overrides)
    return {name: value for name, value in data.items() if value is not None}


def post_token(api, data: dict[str, str], **extra):
    return api.post("/dev-idp/token", urlencode(data), content_type=FORM, **extra)


@pytest.fixture(autouse=True)
def _fresh_key_caches():
    tokens.clear_key_caches()
    yield
    tokens.clear_key_caches()


def test_discovery_document(api):
    response = api.get("/dev-idp/.well-known/openid-configuration")
    assert response.status_code == 200
    document = response.json()
    assert document["issuer"] == settings.DEV_IDP_ISSUER
    assert document["jwks_uri"] == settings.DEV_IDP_ISSUER + "/jwks"
    assert document["token_endpoint"] == settings.DEV_IDP_ISSUER + "/token"
    assert document["grant_types_supported"] == ["password"]


def test_jwks_publishes_only_the_public_key(api):
    response = api.get("/dev-idp/jwks")
    assert response.status_code == 200
    (jwk,) = response.json()["keys"]
    assert jwk["kid"] == keys.signing_key().kid
    assert (jwk["kty"], jwk["alg"], jwk["use"]) == ("RSA", "RS256", "sig")
    assert not {"d", "p", "q", "dp", "dq", "qi"} & set(jwk)


@pytest.mark.django_db
def test_password_grant_issues_verifiable_token(api):
    response = post_token(api, form(username="bob", password="bob"))
    assert response.status_code == 200, response.content
    assert response["Cache-Control"] == "no-store"
    body = response.json()
    assert body["token_type"] == "Bearer"
    assert body["expires_in"] == 3600

    access_token = body["access_token"]
    header = jwt.get_unverified_header(access_token)
    assert header["alg"] == "RS256" and header["kid"] == keys.signing_key().kid
    claims = jwt.decode(
        access_token,
        jwt.PyJWK(keys.signing_key().public_jwk).key,
        algorithms=["RS256"],
        audience="memory-service",
        issuer=settings.DEV_IDP_ISSUER,
    )
    assert claims["sub"] == claims["preferred_username"] == "bob"
    assert claims["aud"] == "memory-service"
    assert claims["azp"] == "memory-service-client"
    assert claims["roles"] == claims["realm_access"]["roles"] == ["user"]
    assert claims["exp"] - claims["iat"] == 3600
    assert abs(claims["iat"] - time.time()) < 60

    me = api.get("/v1/me", HTTP_AUTHORIZATION=f"Bearer {access_token}")
    assert me.status_code == 200
    assert me.json()["userId"] == "bob"


@pytest.mark.django_db
def test_token_endpoint_needs_no_csrf_token_and_accepts_basic_client_auth():
    api = APIClient(enforce_csrf_checks=True)
    basic = base64.b64encode(b"memory-service-client:dev-client-secret").decode()
    data = form(username="charlie", password="charlie", client_id=None, client_secret=None)
    response = post_token(api, data, HTTP_AUTHORIZATION=f"Basic {basic}")
    assert response.status_code == 200, response.content
    me = api.get("/v1/me", HTTP_AUTHORIZATION=f"Bearer {response.json()['access_token']}")
    assert me.json()["roles"] == ["user"]


@pytest.mark.parametrize(
    ("data", "status", "error"),
    [
        (form(client_secret="wrong"), 401, "invalid_client"),
        (form(client_id="other-client"), 401, "invalid_client"),
        (form(client_secret=None), 401, "invalid_client"),
        (form(password="wrong"), 400, "invalid_grant"),
        (form(password="bob"), 400, "invalid_grant"),  # another user's password
        (form(username="mallory", password="mallory"), 400, "invalid_grant"),
        (form(password="ünïcode"), 400, "invalid_grant"),
        (form(grant_type="client_credentials"), 400, "unsupported_grant_type"),
        (form(grant_type=None), 400, "invalid_request"),
        (form(password=None), 400, "invalid_request"),
    ],
)
def test_token_errors_are_oauth_shaped(api, data, status, error):
    response = post_token(api, data)
    assert response.status_code == status, response.content
    assert response.json()["error"] == error
    assert "access_token" not in response.json()


def test_token_endpoint_requires_form_body(api):
    response = api.post("/dev-idp/token", json.dumps(form()), content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"


def test_token_endpoint_rejects_get(api):
    response = api.get("/dev-idp/token")
    assert response.status_code == 405
    assert response.json()["code"] == "method_not_allowed"


@pytest.mark.django_db
@override_settings(DEV_IDP_ENABLED=False)
@pytest.mark.parametrize("path", ["/dev-idp/.well-known/openid-configuration", "/dev-idp/jwks", "/dev-idp/token"])
def test_disabled_dev_idp_is_json_404(api, path):
    response = api.post(path, urlencode(form()), content_type=FORM) if path.endswith("token") else api.get(path)
    assert response.status_code == 404
    body = response.json()
    assert body["code"] == "not_found"
    assert body["requestId"] == response["X-Request-ID"]


@pytest.mark.django_db
def test_users_file_overrides_defaults(api, tmp_path):
    users_file = tmp_path / "users.json"
    users_file.write_text(json.dumps({"erin": {"password": "s3cret", "roles": ["user", "indexer"]}}))
    with override_settings(DEV_IDP_USERS=str(users_file)):
        assert post_token(api, form()).status_code == 400  # alice is gone
        response = post_token(api, form(username="erin", password="s3cret"))
        assert response.status_code == 200
        me = api.get("/v1/me", HTTP_AUTHORIZATION=f"Bearer {response.json()['access_token']}").json()
        assert (me["userId"], me["roles"], me["isIndexer"], me["isAdmin"]) == ("erin", ["user", "indexer"], True, False)

        users_file.write_text(json.dumps([{"username": "finn", "password": "pw", "roles": []}]))
        # mtime resolution can be coarse; make the change visible regardless.
        stamp = users_file.stat().st_mtime + 5
        os.utime(users_file, (stamp, stamp))
        assert post_token(api, form(username="finn", password="pw")).status_code == 200


@pytest.mark.django_db
def test_signing_key_is_generated_once_per_data_dir(api, tmp_path):
    old_token = post_token(api, form()).json()["access_token"]
    with override_settings(DATA_DIR=tmp_path):
        path = tmp_path / "dev-idp" / "signing-key.pem"
        assert not path.exists()
        first = keys.signing_key()
        assert path.exists()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert first.kid != jwt.get_unverified_header(old_token)["kid"]
        # A token signed by another installation's key is refused.
        response = api.get("/v1/me", HTTP_AUTHORIZATION=f"Bearer {old_token}")
        assert response.status_code == 401
        # Reloading from disk (a restart) yields the same key.
        keys._loaded.clear()
        assert keys.signing_key().kid == first.kid
    keys._loaded.clear()
