"""Signed tokens with odd claims (issue 21.6): the issuer signs whatever its mappers put in a token, so a claim the
service cannot use is a 401 at authentication, on every endpoint, never a 500 or a policy_error further in."""

from __future__ import annotations

import time
import uuid

import pytest

from apps.core.serializers import MAX_USER_ID_CHARS
from apps.identity import tokens


def deep(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


# Each case: the claims a token carries on top of the dev IdP's usual ones (bob).
HOSTILE_CLAIMS = {
    "exp_overflows_a_float": {"exp": 10**400},
    "exp_past_year_9999": {"exp": 10**15},
    "nbf_not_a_number": {"nbf": "soon"},
    "iat_nan": {"iat": float("nan")},
    "integer_over_64_bits": {"tenant": 2**64},
    "nan_in_a_claim": {"score": float("nan")},
    "infinity_in_a_claim": {"score": float("inf")},
    "nesting_of_200": {"nested": deep(200)},
    "nul_in_user_id": {"preferred_username": "bob\x00admin"},
    "newline_in_user_id": {"preferred_username": "bob\nadmin"},
    "lone_surrogate_in_user_id": {"preferred_username": "bob\ud800"},
    "lone_surrogate_in_another_claim": {"name": "\udfff"},
    "nul_in_another_claim": {"name": "a\x00b"},
    "user_id_too_long": {"preferred_username": "b" * (MAX_USER_ID_CHARS + 1)},
    "nul_in_a_role": {"roles": ["user", "ad\x00min"]},
    "role_too_long": {"roles": ["r" * (tokens.MAX_ROLE_CHARS + 1)]},
}


def representative_calls() -> list[tuple[str, str, dict | None]]:
    conversation = str(uuid.uuid4())
    return [
        ("get", "/v1/me", None),
        ("get", "/v1/memories?ns=user&ns=bob&key=k", None),
        ("put", "/v1/memories", {"namespace": ["user", "bob"], "key": "k", "value": {"a": 1}}),
        ("post", "/v1/memories/search", {"namespace_prefix": ["user", "bob"]}),
        ("get", "/v1/memories/events", None),
        ("get", "/v1/conversations", None),
        ("post", "/v1/conversations", {"title": "t"}),
        ("post", f"/v1/conversations/{conversation}/entries", {"content": [{"role": "USER", "text": "hi"}]}),
        ("get", "/v1/ownership-transfers", None),
        ("get", f"/v1/attachments/{uuid.uuid4()}", None),
    ]


@pytest.mark.django_db
@pytest.mark.parametrize("claims", HOSTILE_CLAIMS.values(), ids=HOSTILE_CLAIMS.keys())
def test_a_token_with_unusable_claims_is_401_everywhere(api, mint_token, claims):
    token = mint_token("bob", claims=claims)
    for method, path, body in representative_calls():
        response = getattr(api, method)(path, body, format="json", HTTP_AUTHORIZATION=f"Bearer {token}")
        assert response.status_code == 401, (method, path, response.status_code, response.content[:300])
        assert response.json()["code"] == "unauthenticated"
        assert "eyJ" not in response.content.decode()
    # Nothing was poisoned: an ordinary token still works on the same endpoints.
    good = mint_token("bob")
    assert api.get("/v1/me", HTTP_AUTHORIZATION=f"Bearer {good}").status_code == 200
    assert api.get("/v1/conversations", HTTP_AUTHORIZATION=f"Bearer {good}").status_code == 200


@pytest.mark.django_db
def test_ordinary_claims_of_real_identity_providers_are_accepted(api, mint_token):
    """What Keycloak, Entra ID and Auth0 put in tokens stays accepted: floats, nested objects, unicode names."""
    now = time.time()
    claims = {
        "iat": now,
        "exp": now + 600,
        "preferred_username": "zoë.o'brien@example.com",
        "resource_access": {"memory-service": {"roles": ["user"]}, "account": {"roles": ["view-profile"]}},
        "https://example.com/claims": {"tenant": {"id": 2**63 - 1, "tier": 1.5}},
        "groups": ["/org/team-a", "/org/team-b"],
        "name": "Zoë 😀",
    }
    response = api.get("/v1/me", HTTP_AUTHORIZATION=f"Bearer {mint_token('bob', claims=claims)}")
    assert response.status_code == 200, response.content
    assert response.json()["userId"] == "zoë.o'brien@example.com"
