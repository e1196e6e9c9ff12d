"""D2 authentication through HTTP: Bearer JWT verification, API keys, roles and user ids, JWKS from an external issuer."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import override_settings
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from apps.identity import api_keys, tokens
from apps.identity.dev_idp import keys as dev_keys
from apps.identity.models import ApiKey
from apps.identity.principal import Principal
from tests.concurrency import run_concurrently
from tests.conftest import TEST_API_CLIENT, TEST_API_KEY, service_env
from tests.local_http import LocalHTTPServer

CHALLENGE = 'Bearer realm="memory-service"'


def assert_401(response, message: str | None = None) -> dict:
    assert response.status_code == 401, response.content
    body = response.json()
    assert set(body) == {"code", "error", "requestId"}
    assert body["code"] == "unauthenticated"
    assert body["requestId"] == response["X-Request-ID"]
    assert response["WWW-Authenticate"] == CHALLENGE
    if message is not None:
        assert body["error"] == message
    # Whatever went wrong, the answer never echoes the credential.
    assert "eyJ" not in response.content.decode()
    return body


def bearer(api, token: str, **extra: str):
    return api.get("/v1/me", HTTP_AUTHORIZATION=f"Bearer {token}", **extra)


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned_token(header: dict, claims: dict, signature: bytes = b"") -> str:
    return ".".join([b64url(json.dumps(header).encode()), b64url(json.dumps(claims).encode()), b64url(signature)])


@pytest.fixture(autouse=True)
def _fresh_key_caches() -> Iterator[None]:
    tokens.clear_key_caches()
    yield
    tokens.clear_key_caches()


# --- Happy path --------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_token_from_dev_idp_authenticates_me(api, token):
    access_token = token("alice")
    response = bearer(api, access_token)
    assert response.status_code == 200, response.content
    assert response.json() == {
        "userId": "alice",
        "clientId": None,
        "roles": ["user", "admin"],
        "isAdmin": True,
        "isAuditor": True,
        "isIndexer": True,
    }


@pytest.mark.django_db
def test_client_for_fixture_gives_plain_user(client_for):
    response = client_for("bob").get("/v1/me")
    assert response.status_code == 200
    assert response.json() == {
        "userId": "bob",
        "clientId": None,
        "roles": ["user"],
        "isAdmin": False,
        "isAuditor": False,
        "isIndexer": False,
    }


@pytest.mark.django_db
def test_bearer_scheme_is_case_insensitive(api, mint_token):
    response = api.get("/v1/me", HTTP_AUTHORIZATION=f"bearer {mint_token('bob')}")
    assert response.status_code == 200
    assert response.json()["userId"] == "bob"


@pytest.mark.django_db
def test_leeway_accepts_just_expired_token(api, mint_token):
    now = int(time.time())
    response = bearer(api, mint_token("bob", claims={"iat": now - 3600, "exp": now - 10}))
    assert response.status_code == 200


@pytest.mark.django_db
@override_settings(OIDC_AUDIENCE=["other-service", "memory-service"])
def test_matching_audience_is_accepted(api, mint_token):
    assert bearer(api, mint_token("bob")).status_code == 200
    assert bearer(api, mint_token("bob", claims={"aud": ["account", "memory-service"]})).status_code == 200


# --- 401 cases -----------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_missing_header_is_401(api):
    assert_401(api.get("/v1/me"))


@pytest.mark.django_db
@pytest.mark.parametrize(
    "header",
    ["Basic YWxpY2U6YWxpY2U=", "Token abc", "Bearer", "Bearer ", "Bearer a b", "Bearer\ttoken"],
)
def test_non_bearer_or_malformed_header_is_401(api, header):
    assert_401(api.get("/v1/me", HTTP_AUTHORIZATION=header))


@pytest.mark.django_db
@pytest.mark.parametrize("garbage", ["not-a-jwt", "a.b.c", "eyJhbGciOiJSUzI1NiJ9.e30.", "x" * 20000])
def test_garbage_token_is_401(api, garbage):
    assert_401(bearer(api, garbage))


@pytest.mark.django_db
def test_expired_token_is_401(api, mint_token):
    now = int(time.time())
    assert_401(bearer(api, mint_token(claims={"iat": now - 7200, "exp": now - 3600})), "The access token has expired.")


@pytest.mark.django_db
def test_token_without_exp_is_401(api, mint_token):
    assert_401(bearer(api, mint_token(drop=["exp"])), "The access token lacks the 'exp' claim.")


@pytest.mark.django_db
@pytest.mark.parametrize("claim", ["nbf", "iat"])
def test_token_from_the_future_is_401(api, mint_token, claim):
    now = int(time.time())
    assert_401(bearer(api, mint_token(claims={claim: now + 600})), "The access token is not valid yet.")


@pytest.mark.django_db
@pytest.mark.parametrize("iss", ["https://evil.example/dev-idp", "http://localhost:8080/dev-idp/x", ""])
def test_wrong_issuer_is_401(api, mint_token, iss):
    assert_401(bearer(api, mint_token(claims={"iss": iss})))


@pytest.mark.django_db
def test_wrong_issuer_message(api, mint_token):
    assert_401(
        bearer(api, mint_token(claims={"iss": "https://evil.example"})),
        "The access token was issued by an untrusted issuer.",
    )


@pytest.mark.django_db
@override_settings(OIDC_AUDIENCE=["memory-service"])
@pytest.mark.parametrize("aud", ["account", ["account", "other"]])
def test_wrong_audience_is_401(api, mint_token, aud):
    assert_401(bearer(api, mint_token(claims={"aud": aud})), "The access token is not meant for this service.")


@pytest.mark.django_db
@override_settings(OIDC_AUDIENCE=["memory-service"])
def test_missing_audience_is_401_when_audience_is_configured(api, mint_token):
    assert_401(bearer(api, mint_token(drop=["aud"])), "The access token is not meant for this service.")


@pytest.mark.django_db
def test_dev_idp_tokens_for_another_audience_are_401_by_default(api, mint_token):
    """Item 21.4: with the dev IdP as issuer, its audience is checked without any OIDC_AUDIENCE setting."""
    assert bearer(api, mint_token("bob")).status_code == 200
    assert_401(bearer(api, mint_token("bob", claims={"aud": "another-app"})), "The access token is not meant for this service.")
    assert_401(bearer(api, mint_token("bob", drop=["aud"])), "The access token is not meant for this service.")


@pytest.mark.django_db
@override_settings(OIDC_AUDIENCE=["memory-service"], OIDC_AUDIENCE_CHECK=False)
def test_audience_check_can_be_turned_off(api, mint_token):
    assert bearer(api, mint_token("bob", claims={"aud": "another-app"})).status_code == 200


def _import_production_settings(**env: str) -> subprocess.CompletedProcess:
    """A fresh interpreter importing the production settings with only ``env`` (plus the essentials) set."""
    essentials = {
        "DATABASE_URL": "postgresql://user@db.invalid/memory",
        "REDIS_URL": "redis://redis.invalid:6379/0",
        "SECRET_KEY": "s" * 50,
        "MEMORY_ENCRYPTION_KEYS": "k1:" + base64.b64encode(b"k" * 32).decode(),
    }
    return subprocess.run(
        [sys.executable, "-c", "import config.settings.production"],
        env=service_env(**{**essentials, **env}), cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=60,
    )


@pytest.mark.slow
def test_production_refuses_to_start_without_an_audience():
    refused = _import_production_settings(OIDC_ISSUER_URL="https://idp.example/realms/x")
    assert refused.returncode != 0
    assert "ImproperlyConfigured: OIDC_AUDIENCE must be set in production" in refused.stderr
    assert "OIDC_AUDIENCE_CHECK=false" in refused.stderr
    assert _import_production_settings(OIDC_AUDIENCE="memory-service").returncode == 0
    assert _import_production_settings(OIDC_AUDIENCE_CHECK="false").returncode == 0


@pytest.mark.django_db
def test_alg_none_is_401(api):
    claims = jwt.decode(_dev_token(), options={"verify_signature": False})
    for alg in ("none", "None", "NONE"):
        forged = unsigned_token({"alg": alg, "typ": "JWT", "kid": dev_keys.signing_key().kid}, claims)
        assert_401(bearer(api, forged), "The token's signing algorithm is not accepted.")


@pytest.mark.django_db
@override_settings(OIDC_ALGORITHMS=["RS256", "HS256", "none"])
def test_hs256_signed_with_public_key_is_401_even_if_configured(api):
    """The classic algorithm-confusion attack: the JWKS public key used as an HMAC secret."""
    claims = jwt.decode(_dev_token(), options={"verify_signature": False})
    public_pem = dev_keys.signing_key().private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    header = {"alg": "HS256", "typ": "JWT", "kid": dev_keys.signing_key().kid}
    signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
    for secret in (public_pem, json.dumps(dev_keys.signing_key().public_jwk).encode()):
        signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
        assert_401(bearer(api, f"{signing_input}.{b64url(signature)}"), "The token's signing algorithm is not accepted.")


@pytest.mark.django_db
def test_token_signed_by_unknown_key_is_401(api, mint_token):
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    # Unknown kid...
    assert_401(
        bearer(api, mint_token(key=stranger, headers={"kid": "someone-else"})),
        "The token was signed by an unknown key.",
    )
    # ...and the dev IdP's kid on a signature by another key.
    assert_401(bearer(api, mint_token(key=stranger)), "The access token's signature or claims are invalid.")


@pytest.mark.django_db
def test_tampered_payload_is_401(api, mint_token):
    header, _, signature = mint_token("bob").split(".")
    claims = jwt.decode(mint_token("bob"), options={"verify_signature": False})
    claims["roles"] = ["admin"]
    assert_401(bearer(api, f"{header}.{b64url(json.dumps(claims).encode())}.{signature}"))


@pytest.mark.django_db
def test_token_naming_no_user_is_401(api, mint_token):
    assert_401(
        bearer(api, mint_token(drop=["preferred_username", "sub"])),
        "The access token names no user.",
    )


@pytest.mark.django_db
@override_settings(DEV_IDP_ENABLED=False, OIDC_ISSUER_URL="")
def test_no_issuer_configured_is_401(api, mint_token):
    assert_401(bearer(api, mint_token()), "No identity provider is configured.")


# --- API keys ------------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_seeded_api_key_sets_client_id(client_for):
    response = client_for("bob", api_key=TEST_API_KEY).get("/v1/me")
    assert response.status_code == 200, response.content
    assert response.json()["clientId"] == TEST_API_CLIENT
    assert response.json()["userId"] == "bob"
    assert ApiKey.objects.get(client=TEST_API_CLIENT).last_used_at is not None


@pytest.mark.django_db
def test_api_key_is_seeded_by_migrate():
    record = ApiKey.objects.get(client=TEST_API_CLIENT)
    assert record.prefix == "test-api-ke"  # half of a 23-character key
    assert record.key_hash == hashlib.sha256(TEST_API_KEY.encode()).hexdigest()
    assert record.revoked_at is None


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["wrong-key", TEST_API_KEY + "x", TEST_API_KEY[:-1], "k" * 600, " x "])
def test_unknown_api_key_is_401(client_for, key):
    assert_401(client_for("bob", api_key=key).get("/v1/me"), "The API key is not valid.")


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["", " ", "\t "])
def test_an_empty_or_blank_api_key_is_no_api_key(client_for, api, key):
    """D10: the upstream project's clients send ``X-API-Key`` empty when no key is configured."""
    response = client_for("bob", api_key=key).get("/v1/me")
    assert response.status_code == 200, response.content
    assert response.json()["clientId"] is None
    # Still no credential at all without a token.
    assert_401(api.get("/v1/me", HTTP_X_API_KEY=key))


@pytest.mark.django_db
def test_api_key_without_bearer_is_401(api):
    assert_401(api.get("/v1/me", HTTP_X_API_KEY=TEST_API_KEY), "An API key must be sent together with a Bearer token.")


@pytest.mark.django_db
def test_valid_api_key_does_not_rescue_invalid_token(api):
    assert_401(bearer(api, "garbage", HTTP_X_API_KEY=TEST_API_KEY))


@pytest.mark.django_db
def test_revoked_api_key_is_401_and_stays_revoked(client_for):
    record = ApiKey.objects.get(client=TEST_API_CLIENT)
    assert api_keys.revoke(record)
    assert_401(client_for("bob", api_key=TEST_API_KEY).get("/v1/me"), "The API key is not valid.")
    # Re-seeding from API_KEYS must not resurrect a key an operator revoked.
    assert api_keys.seed_from_settings() == 0
    assert_401(client_for("bob", api_key=TEST_API_KEY).get("/v1/me"))


@pytest.mark.django_db
def test_configured_key_missing_from_table_is_seeded_on_demand(client_for):
    ApiKey.objects.all().delete()
    response = client_for("bob", api_key=TEST_API_KEY).get("/v1/me")
    assert response.status_code == 200
    assert response.json()["clientId"] == TEST_API_CLIENT
    assert ApiKey.objects.filter(client=TEST_API_CLIENT).count() == 1


@pytest.mark.django_db
@override_settings(API_KEYS="app-one:key-one-0123456789abcdef, app-two:k2 ,broken-entry,:nokey")
def test_api_keys_setting_parsing_and_short_keys(client_for):
    assert api_keys.configured_keys() == [("app-one", "key-one-0123456789abcdef"), ("app-two", "k2")]
    assert client_for("bob", api_key="key-one-0123456789abcdef").get("/v1/me").json()["clientId"] == "app-one"
    assert client_for("bob", api_key="k2").get("/v1/me").json()["clientId"] == "app-two"
    # A short key reveals at most half of itself as its prefix.
    assert ApiKey.objects.get(client="app-two").prefix == "k"


@pytest.mark.django_db
def test_apikeys_command_create_list_revoke(client_for):
    out, err = io.StringIO(), io.StringIO()
    call_command("apikeys", "create", "--client", "billing-app", stdout=out, stderr=err)
    key = out.getvalue().strip()
    assert key.startswith("msk_") and len(key) > 40
    record = ApiKey.objects.get(client="billing-app")
    assert record.key_hash == hashlib.sha256(key.encode()).hexdigest()
    assert f"prefix={record.prefix}" in err.getvalue()
    assert key not in err.getvalue()

    response = client_for("carol", api_key=key).get("/v1/me")
    assert response.status_code == 200
    assert response.json()["clientId"] == "billing-app"

    listing = io.StringIO()
    call_command("apikeys", "list", stdout=listing)
    assert "billing-app" in listing.getvalue() and record.prefix in listing.getvalue()
    assert TEST_API_CLIENT in listing.getvalue()
    assert key not in listing.getvalue() and record.key_hash not in listing.getvalue()

    revoked = io.StringIO()
    call_command("apikeys", "revoke", record.prefix, stdout=revoked)
    assert f"Revoked API key id={record.pk}" in revoked.getvalue()
    assert_401(client_for("carol", api_key=key).get("/v1/me"))

    listing = io.StringIO()
    call_command("apikeys", "list", stdout=listing)
    assert "billing-app" not in listing.getvalue()
    listing = io.StringIO()
    call_command("apikeys", "list", "--all", stdout=listing)
    assert "billing-app" in listing.getvalue()

    with pytest.raises(CommandError, match="already revoked"):
        call_command("apikeys", "revoke", str(record.pk), stdout=io.StringIO())
    with pytest.raises(CommandError, match="No active API key"):
        call_command("apikeys", "revoke", "msk_nope", stdout=io.StringIO())


@pytest.mark.django_db
def test_apikeys_command_revoke_by_id():
    out = io.StringIO()
    call_command("apikeys", "create", "--client", "x", stdout=out, stderr=io.StringIO())
    record = ApiKey.objects.get(client="x")
    call_command("apikeys", "revoke", str(record.pk), stdout=io.StringIO())
    record.refresh_from_db()
    assert record.revoked_at is not None
    assert api_keys.authenticate_key(out.getvalue().strip()) is None


@pytest.mark.django_db
def test_admin_creates_key_shown_once_and_revokes(admin_client, client_for):
    response = admin_client.post("/admin/identity/apikey/add/", {"client": "admin-made"}, follow=True)
    assert response.status_code == 200
    shown = [str(message) for message in response.context["messages"]]
    key = next(text.split(": ", 1)[1].split(" ")[0] for text in shown if "admin-made" in text)
    assert client_for("bob", api_key=key).get("/v1/me").json()["clientId"] == "admin-made"

    record = ApiKey.objects.get(client="admin-made")
    page = admin_client.get(f"/admin/identity/apikey/{record.pk}/change/").content.decode()
    assert record.prefix in page and key not in page and record.key_hash not in page

    admin_client.post(
        "/admin/identity/apikey/", {"action": "revoke_keys", "_selected_action": [record.pk]}, follow=True
    )
    record.refresh_from_db()
    assert record.revoked_at is not None
    assert_401(client_for("bob", api_key=key).get("/v1/me"))


# --- Roles and user ids ---------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_roles_union_of_claim_paths_never_scope(api, mint_token):
    token = mint_token(
        "dora",
        claims={
            "roles": [],
            "realm_access": {"roles": ["r1"]},
            "resource_access": {"app1": {"roles": ["indexer"]}, "app2": {"roles": ["r2", "r1"]}, "app3": {}},
            "groups": ["auditor"],
            "scope": "openid admin",
            "scp": ["admin"],
        },
    )
    response = bearer(api, token)
    assert response.status_code == 200
    assert response.json() == {
        "userId": "dora",
        "clientId": None,
        "roles": ["r1", "indexer", "r2", "auditor"],
        "isAdmin": False,
        "isAuditor": True,
        "isIndexer": True,
    }


@pytest.mark.django_db
@override_settings(OIDC_ROLE_CLAIMS=["https://example.com/roles", "scope", "app.*.perms"])
def test_role_claims_are_configurable(api, mint_token):
    token = mint_token(
        "dora",
        claims={"https://example.com/roles": "admin", "scope": "superuser", "app": {"x": {"perms": ["p"]}}},
    )
    assert bearer(api, token).json()["roles"] == ["admin", "p"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("drop", "extra", "expected"),
    [
        ([], {"upn": "dora@corp", "sub": "1b9e-uuid"}, "dora"),
        (["preferred_username"], {"upn": "dora@corp", "sub": "1b9e-uuid"}, "dora@corp"),
        (["preferred_username"], {"sub": "1b9e-uuid"}, "1b9e-uuid"),
        ([], {"preferred_username": "", "upn": "dora@corp"}, "dora@corp"),
    ],
)
def test_user_id_claim_chain(api, mint_token, drop, extra, expected):
    response = bearer(api, mint_token("dora", claims=extra, drop=drop))
    assert response.status_code == 200
    assert response.json()["userId"] == expected


@pytest.mark.django_db
@override_settings(OIDC_USER_ID_CLAIMS=["email"])
def test_user_id_claims_are_configurable(api, mint_token):
    assert bearer(api, mint_token("dora", claims={"email": "dora@example.com"})).json()["userId"] == "dora@example.com"


def test_resolve_claim_path():
    claims = {
        "roles": ["a"],
        "realm_access": {"roles": ["b", "c"]},
        "resource_access": {"x": {"roles": ["d"]}, "y": {"roles": ["e"]}, "z": "not-an-object", "w": {}},
        "https://example.com/roles": ["f"],
        "scalar": 3,
    }
    resolve = tokens.resolve_claim_path
    assert resolve(claims, "roles") == [["a"]]
    assert resolve(claims, "realm_access.roles") == [["b", "c"]]
    assert resolve(claims, "resource_access.*.roles") == [["d"], ["e"]]
    assert resolve(claims, "resource_access.x.roles") == [["d"]]
    assert resolve(claims, "resource_access.*") == [{"roles": ["d"]}, {"roles": ["e"]}, "not-an-object", {}]
    assert resolve(claims, "https://example.com/roles") == [["f"]]
    assert resolve(claims, "missing") == []
    assert resolve(claims, "realm_access.missing") == []
    assert resolve(claims, "scalar.roles") == []
    assert resolve(claims, "roles.0") == []  # lists are not indexed
    assert resolve(claims, "") == []
    assert resolve(claims, "realm_access..roles") == []
    assert resolve(claims, "*.roles") == [["b", "c"]]


def test_roles_from_claims_normalizes():
    claims = {"roles": "solo", "groups": ["g", 7, None, "", "g", {"x": 1}], "realm_access": {"roles": ["solo"]}}
    assert tokens.roles_from_claims(claims, ["roles", "groups", "realm_access.roles", "scope"]) == ("solo", "g")
    assert tokens.roles_from_claims({"scope": "admin"}, [" scope "]) == ()


def test_user_id_from_claims():
    assert tokens.user_id_from_claims({"sub": "s", "upn": "u"}, ["preferred_username", "upn", "sub"]) == "u"
    assert tokens.user_id_from_claims({"preferred_username": 5, "sub": "s"}, ["preferred_username", "sub"]) == "s"
    assert tokens.user_id_from_claims({}, ["sub"]) is None


@override_settings(ADMIN_ROLE="boss", AUDITOR_ROLE="viewer", INDEXER_ROLE="idx")
def test_principal_roles_and_policy_claims():
    raw = {"sub": "u1", "roles": "admin", "realm_access": {"roles": ["viewer"]}}
    viewer = Principal(user_id="u1", client_id="c", roles=("viewer",), raw_claims=raw)
    assert (viewer.is_admin, viewer.is_auditor, viewer.is_indexer) == (False, True, False)
    boss = Principal(user_id="u2", client_id=None, roles=("boss",), raw_claims={})
    assert (boss.is_admin, boss.is_auditor, boss.is_indexer) == (True, True, True)
    assert viewer.policy_claims() == {"sub": "u1", "roles": ["viewer"], "realm_access": {"roles": ["viewer"]}}
    assert raw["roles"] == "admin"  # the raw claims are not modified
    assert viewer.is_authenticated is True


@pytest.mark.django_db
def test_openapi_documents_me_with_bearer_auth(api):
    # Asking for JSON explicitly: the schema view's default rendering is not this module's concern.
    schema = json.loads(api.get("/openapi.json", HTTP_ACCEPT="application/vnd.oai.openapi+json").content)
    operation = schema["paths"]["/v1/me"]["get"]
    assert {"bearerAuth": []} in operation["security"]
    assert schema["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    me_schema = schema["components"]["schemas"]["Me"]
    assert set(me_schema["properties"]) == {"userId", "clientId", "roles", "isAdmin", "isAuditor", "isIndexer"}


def _dev_token() -> str:
    from apps.identity.dev_idp import issuer

    return issuer.issue_access_token("alice", ["user", "admin"])


# --- External issuer: discovery, JWKS cache, rotation, rate limit ---------------------------------------------------


class FakeIssuer:
    """A tiny OIDC provider on 127.0.0.1: discovery and JWKS, with counters and key rotation."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.keys: list[tuple[str, Any, str]] = []  # (kid, private key, alg)
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                issuer.hits[self.path] += 1
                if self.path == "/realms/test/.well-known/openid-configuration":
                    body = {"issuer": issuer.url, "jwks_uri": f"{issuer.url}/protocol/openid-connect/certs"}
                elif self.path == "/realms/test/protocol/openid-connect/certs":
                    body = {"keys": [issuer.jwk(kid, key, alg) for kid, key, alg in issuer.keys]}
                else:
                    self.send_error(404)
                    return
                payload = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = LocalHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/realms/test"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.rotate()

    @property
    def jwks_hits(self) -> int:
        return self.hits["/realms/test/protocol/openid-connect/certs"]

    @staticmethod
    def jwk(kid: str, key: Any, alg: str) -> dict:
        if alg.startswith("ES"):
            data = ECAlgorithm.to_jwk(key.public_key(), as_dict=True)
        else:
            data = RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
        # Like Keycloak: "alg" only on some keys, so both forms are covered.
        return {**data, "kid": kid, "use": "sig", **({"alg": alg} if alg != "RS256" else {})}

    def rotate(self, alg: str = "RS256", keep_old: bool = False) -> str:
        key = ec.generate_private_key(ec.SECP256R1()) if alg == "ES256" else rsa.generate_private_key(65537, 2048)
        kid = f"kid-{len(self.keys) + 1}-{alg}"
        self.keys = [*(self.keys if keep_old else []), (kid, key, alg)]
        return kid

    def mint(self, claims: dict | None = None, *, kid: str | None = None, key: Any = None) -> str:
        current_kid, current_key, alg = self.keys[-1]
        now = int(time.time())
        payload = {
            "iss": self.url,
            "sub": "4f1c-uuid",
            "preferred_username": "dora",
            "aud": ["memory-service", "account"],
            "iat": now,
            "exp": now + 300,
            "realm_access": {"roles": ["offline_access", "auditor"]},
            "resource_access": {"memory-service": {"roles": ["indexer"]}},
            "groups": ["/staff"],
            "scope": "openid profile admin",
            **(claims or {}),
        }
        return jwt.encode(payload, key or current_key, algorithm=alg, headers={"kid": kid or current_kid})

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def idp() -> Iterator[FakeIssuer]:
    server = FakeIssuer()
    # These tests count key fetches; the verified-token cache would answer repeated tokens without a key lookup.
    with override_settings(
        OIDC_ISSUER_URL=server.url, OIDC_JWKS_URL="", OIDC_AUDIENCE=["memory-service"], VERIFIED_TOKEN_CACHE_SECONDS=0
    ):
        yield server
    server.stop()


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(tokens, "_monotonic", fake)
    return fake


@pytest.mark.django_db
def test_external_issuer_discovery_and_claims(api, idp, clock):
    response = bearer(api, idp.mint())
    assert response.status_code == 200, response.content
    assert response.json() == {
        "userId": "dora",
        "clientId": None,
        "roles": ["offline_access", "auditor", "indexer", "/staff"],
        "isAdmin": False,
        "isAuditor": True,
        "isIndexer": True,
    }
    assert idp.hits["/realms/test/.well-known/openid-configuration"] == 1
    assert idp.jwks_hits == 1
    # Cached: more requests, no more fetches.
    for _ in range(3):
        assert bearer(api, idp.mint()).status_code == 200
    assert idp.jwks_hits == 1
    # The dev IdP is not trusted while an external issuer is configured.
    assert_401(bearer(api, _dev_token()))


@pytest.mark.django_db
def test_external_issuer_rejects_foreign_issuer_and_audience(api, idp, clock):
    assert_401(bearer(api, idp.mint({"iss": idp.url + "/other"})), "The access token was issued by an untrusted issuer.")
    assert_401(bearer(api, idp.mint({"aud": "account"})), "The access token is not meant for this service.")
    # A trailing slash does not make a different issuer.
    assert bearer(api, idp.mint({"iss": idp.url + "/"})).status_code == 200


@pytest.mark.django_db
def test_key_rotation_refreshes_on_unknown_kid_within_rate_limit(api, idp, clock):
    assert bearer(api, idp.mint()).status_code == 200
    assert idp.jwks_hits == 1

    new_kid = idp.rotate()
    # Within OIDC_JWKS_MIN_REFRESH_SECONDS of the last fetch the new kid cannot be fetched yet...
    assert_401(bearer(api, idp.mint()), "The token was signed by an unknown key.")
    assert idp.jwks_hits == 1
    # ...after it, the first token with the new kid triggers exactly one refresh.
    clock.now += 31
    token = idp.mint()
    assert jwt.get_unverified_header(token)["kid"] == new_kid
    assert bearer(api, token).status_code == 200
    assert idp.jwks_hits == 2

    # A burst of made-up kids (an attacker, or a misconfigured client) causes no fetch inside the interval...
    for index in range(25):
        assert_401(bearer(api, idp.mint(kid=f"made-up-{index}")))
    assert idp.jwks_hits == 2
    # ...and at most one per interval after it.
    clock.now += 31
    for index in range(25):
        assert_401(bearer(api, idp.mint(kid=f"made-up-again-{index}")))
    assert idp.jwks_hits == 3
    # Known keys keep working throughout.
    assert bearer(api, idp.mint()).status_code == 200
    assert idp.jwks_hits == 3


@pytest.mark.django_db
def test_concurrent_unknown_kid_fetches_once(idp, clock):
    assert tokens.verify_token(idp.mint()).user_id == "dora"
    idp.rotate(alg="ES256", keep_old=True)
    clock.now += 31
    token = idp.mint()
    principals = run_concurrently([partial(tokens.verify_token, token)] * 16)
    assert [principal.user_id for principal in principals] == ["dora"] * 16
    assert idp.jwks_hits == 2


@pytest.mark.django_db
def test_cache_expiry_refetches_known_keys(api, idp, clock):
    with override_settings(OIDC_JWKS_CACHE_SECONDS=600):
        assert bearer(api, idp.mint()).status_code == 200
        clock.now += 601
        assert bearer(api, idp.mint()).status_code == 200
        assert idp.jwks_hits == 2


@pytest.mark.django_db
def test_issuer_outage_keeps_cached_keys(api, idp, clock):
    with override_settings(OIDC_JWKS_CACHE_SECONDS=600):
        assert bearer(api, idp.mint()).status_code == 200
        token = idp.mint()
        idp.stop()
        clock.now += 601
        assert bearer(api, token).status_code == 200


@pytest.mark.django_db
def test_jwks_url_setting_skips_discovery(api, idp, clock):
    with override_settings(OIDC_JWKS_URL=f"{idp.url}/protocol/openid-connect/certs"):
        assert bearer(api, idp.mint()).status_code == 200
    assert idp.hits["/realms/test/.well-known/openid-configuration"] == 0
    assert idp.jwks_hits == 1


@pytest.mark.django_db
def test_unreachable_issuer_is_401(api, mint_token):
    with override_settings(OIDC_ISSUER_URL="http://127.0.0.1:9/realms/none", OIDC_HTTP_TIMEOUT_SECONDS=1):
        assert_401(bearer(api, mint_token()), "The identity provider's keys are unavailable.")


@pytest.mark.django_db
@override_settings(OIDC_ALGORITHMS=["ES256"])
def test_algorithm_allow_list_is_enforced(api, idp, clock):
    assert_401(bearer(api, idp.mint()), "The token's signing algorithm is not accepted.")  # RS256 now refused
    idp.rotate(alg="ES256")
    assert bearer(api, idp.mint()).status_code == 200


@pytest.mark.django_db
@override_settings(
    OIDC_OP_TOKEN_ENDPOINT="https://idp.example/token",
    OIDC_OP_USER_ENDPOINT="https://idp.example/userinfo",
    OIDC_OP_JWKS_ENDPOINT="https://idp.example/certs",
    OIDC_RP_CLIENT_ID="admin-ui",
    OIDC_RP_CLIENT_SECRET="s",
)
def test_admin_oidc_backend_admits_only_admins():
    from apps.identity.admin_oidc import AdminOIDCBackend

    backend = AdminOIDCBackend()
    assert backend.verify_claims({"roles": ["user", "admin"]}) is True
    assert backend.verify_claims({"roles": ["user"]}) is False
    user = backend.create_user({"preferred_username": "operator", "sub": "uuid", "roles": ["admin"]})
    assert (user.username, user.is_staff, user.is_superuser) == ("operator", True, True)
    assert list(backend.filter_users_by_claims({"preferred_username": "operator"})) == [user]


@pytest.mark.django_db
def test_verified_token_cache_answers_repeats_without_key_lookups(api, idp, clock):
    with override_settings(VERIFIED_TOKEN_CACHE_SECONDS=30, OIDC_JWKS_CACHE_SECONDS=600):
        token = idp.mint()
        assert bearer(api, token).status_code == 200
        clock.now += 601  # the key set is stale: a real verification would fetch it again
        assert bearer(api, token).status_code == 200
        assert idp.jwks_hits == 1
        assert bearer(api, idp.mint({"jti": "other"})).status_code == 200  # another token is verified for real
        assert idp.jwks_hits == 2


@pytest.mark.django_db
def test_settings_change_empties_the_verified_token_cache(api, idp):
    with override_settings(VERIFIED_TOKEN_CACHE_SECONDS=30):
        token = idp.mint()
        assert bearer(api, token).status_code == 200
        with override_settings(OIDC_AUDIENCE=["another-service"]):
            assert bearer(api, token).status_code == 401
