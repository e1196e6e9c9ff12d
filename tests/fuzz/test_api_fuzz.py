"""Property-based fuzzing of the whole HTTP API from its own /openapi.json (Schemathesis), against the live service.

Every operation in the schema is fuzzed (new endpoints join without touching this file), as a normal user (bob)
and as an admin (alice), each with a token from the live service's dev IdP. Each response must:

- not be a 5xx (``not_a_server_error``);
- have a status code, content type, headers and body the schema documents (``status_code_conformance``,
  ``content_type_conformance``, ``response_headers_conformance``, ``response_schema_conformance``);
- be refused with a 4xx when Schemathesis sent data the schema forbids (``negative_data_rejection``), and be refused
  with 401 without credentials (``ignored_auth``);
- if an error, be D1's JSON body with the request id of the ``X-Request-ID`` header (``d1_error_body`` below).

The run is deterministic (fixed seed, derandomized Hypothesis, no example database) and bounded: the examples per
operation shrink as the schema grows so the whole run stays near ``FUZZ_BUDGET`` examples per user. Set
``FUZZ_EXAMPLES`` to force a number per operation (e.g. 500 for a long local hunt) and ``FUZZ_SEED`` to draw
different cases.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

from tests.fuzz.cases import (
    CURRENT_USER,
    SCHEMA_DOCUMENT,
    STATS,
    d1_error_body,
    flatmap_case,
    schema_valid_data_accepted,
    shape_positive,
)
from tests.live_service import LiveService

# Fuzzing-phase examples per user across all operations (each gets 5..100); the coverage phase adds its own
# deterministic boundary cases on top. Measured with the conversation, attachment and event branches merged in
# (35 operations): 1,595 requests in 38 s on this 2-core machine when idle (236 s while ~7 other runs shared it).
FUZZ_BUDGET = int(os.environ.get("FUZZ_BUDGET", "200"))
MIN_EXAMPLES, MAX_EXAMPLES = 5, 100
SEED = int(os.environ.get("FUZZ_SEED", "20261123"))

# Operations not fuzzed, each with why. Everything else in the schema is.
EXCLUDED_PATHS = {
    # A server-sent-event stream never ends: a request to it cannot complete within an example. Its errors
    # (401, 400 on bad `kinds`) are tested in tests/events.
    "/v1/events",
}


def _config(examples: int, *, coverage: bool) -> SchemathesisConfig:
    return SchemathesisConfig.from_dict(
        {
            "seed": SEED,
            "generation": {
                "mode": "all",  # valid and invalid data: invalid data must be a 4xx, never a 500
                "deterministic": True,
                "database": "none",  # no .hypothesis directory replaying old failures: every run is the same run
                "max-examples": examples,
                # The credentials are the real ones passed per call; generated X-API-Key values would only
                # turn every example into a 401.
                "with-security-parameters": False,
            },
            # Coverage: every boundary and type violation the schema implies, deterministic, about 70 requests
            # per operation; the bulk of the run, so it runs for one user (see the two tests below).
            "phases": {"coverage": {"enabled": coverage}, "stateful": {"enabled": False}},
            "checks": {
                # Both directions: whatever the schema allows must be accepted (ST202 "schema-valid request
                # rejected": any 4xx but 401/403/404/409), whatever it forbids refused with a 4xx
                # (negative_data_rejection). The built-in acceptance check runs inside schema_valid_data_accepted.
                "positive_data_acceptance": {"enabled": False},
            },
        }
    )


def _fuzzed_operations(document: dict) -> int:
    return sum(
        1
        for path, item in document["paths"].items()
        if path not in EXCLUDED_PATHS
        for method in item
        if method in {"get", "put", "post", "patch", "delete", "head", "options"}
    )


EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "0")) or max(
    MIN_EXAMPLES, min(MAX_EXAMPLES, FUZZ_BUDGET // max(_fuzzed_operations(SCHEMA_DOCUMENT), 1))
)


def _schema(*, coverage: bool):
    schema = schemathesis.openapi.from_dict(SCHEMA_DOCUMENT, config=_config(EXAMPLES, coverage=coverage))
    schema.hook(flatmap_case)
    return schema.exclude(path=sorted(EXCLUDED_PATHS))


# alice (roles user, admin) gets every phase: as an admin her valid cases get past authorization on every endpoint,
# admin ones included, so the boundary cases reach the most code. bob (role user) gets the fuzzing phase: random
# valid and invalid cases as a plain user, where policies and memberships deny.
as_admin = _schema(coverage=True)
as_user = _schema(coverage=False)


# The live server commits what the fuzzer writes; later tests expect empty tables: emptied once after the module,
# not per operation as ``django_db(transaction=True)`` would (times ~70 test items).
pytestmark = pytest.mark.usefixtures("empty_tables_after_module")


@pytest.fixture(scope="session")
def fuzz_tokens(live_service: LiveService) -> dict[str, str]:
    """Tokens from the live service's dev IdP (D2): the real password grant."""
    return {user: live_service.token(user) for user in ("alice", "bob")}


def _headers(tokens: dict[str, str], user: str) -> dict[str, str]:
    CURRENT_USER["name"] = user
    return {"Authorization": f"Bearer {tokens[user]}"}


@pytest.fixture(scope="session")
def fuzz_session() -> Iterator[requests.Session]:
    """One keep-alive connection for the whole run: a TCP handshake per example is time not spent fuzzing."""
    with requests.Session() as session:
        yield session


@pytest.mark.django_db
def test_live_server_serves_the_fuzzed_schema(live_service: LiveService) -> None:
    response = requests.get(f"{live_service.base_url}/openapi.json", timeout=30)
    assert response.status_code == 200
    assert response.json() == SCHEMA_DOCUMENT


def _call_and_validate(case, live_service: LiveService, session: requests.Session, headers: dict[str, str]) -> None:
    shape_positive(case)
    response = case.call_and_validate(
        base_url=live_service.base_url,
        session=session,
        headers=headers,
        additional_checks=[d1_error_body, schema_valid_data_accepted],
        timeout=30,
    )
    STATS[f"{case.method.upper()} {case.path}"][response.status_code] += 1


# The fixtures are the live server, a session and tokens: nothing an example changes, so reusing them is right.
# What the live server commits is emptied once after the module (empty_tables_after_module). The django_db mark is
# what makes pytest-django create the test database at all (it only sets up databases that marked tests use).


@as_admin.parametrize()
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@pytest.mark.django_db
def test_api_as_admin(case, live_service: LiveService, fuzz_session: requests.Session, fuzz_tokens) -> None:
    _call_and_validate(case, live_service, fuzz_session, _headers(fuzz_tokens, "alice"))


@as_user.parametrize()
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@pytest.mark.django_db
def test_api_as_user(case, live_service: LiveService, fuzz_session: requests.Session, fuzz_tokens) -> None:
    _call_and_validate(case, live_service, fuzz_session, _headers(fuzz_tokens, "bob"))
