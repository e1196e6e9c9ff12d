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

import json
import os
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.config import SchemathesisConfig
from schemathesis.generation import GenerationMode

from tests.database import empty_tables
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

D1_KEYS = {"code", "error", "requestId", "details", "reason"}

# Responses seen per operation and status, printed at the end of the session (tests/fuzz/conftest.py).
STATS: defaultdict[str, Counter] = defaultdict(Counter)


def d1_error_body(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every error is D1's JSON: {"code", "error", "requestId", "details"?, "reason"?}, requestId = X-Request-ID."""
    if response.status_code < 400:
        return None
    content_type = response.headers.get("content-type", [""])[0]
    assert content_type.split(";")[0].strip() == "application/json", f"error body is {content_type!r}, not JSON"
    try:
        body = json.loads(response.content)
    except ValueError:
        raise AssertionError(f"error body is not JSON: {response.content[:200]!r}") from None
    assert isinstance(body, dict), f"error body is not an object: {body!r}"
    assert isinstance(body.get("code"), str) and body["code"], f"no string `code`: {body!r}"
    assert isinstance(body.get("error"), str) and body["error"], f"no string `error`: {body!r}"
    request_id = response.headers.get("x-request-id", [None])[0]
    assert body.get("requestId") == request_id, f"requestId {body.get('requestId')!r} != X-Request-ID {request_id!r}"
    assert set(body) <= D1_KEYS, f"keys outside D1: {sorted(set(body) - D1_KEYS)}"
    assert "details" not in body or isinstance(body["details"], dict), f"details is not an object: {body!r}"
    if response.status_code == 400:
        assert body["code"] == "validation_error", body
    return None


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


def _own_schema_document() -> dict:
    """The service's /openapi.json, served by its own view in-process (the live server serves the same document:
    ``test_live_server_serves_the_fuzzed_schema``). Loaded at collection so each operation is its own test item."""
    from unittest import mock

    from django.conf import settings as django_settings
    from django.test import Client

    # The namespace depth in the schema is the admin setting in force (apps.memories.openapi); at collection there is
    # no test database yet, and the live server, on an empty one, serves the environment's default: say that here.
    depth = django_settings.MEMORY_EPISODIC_NAMESPACE_MAX_DEPTH
    with mock.patch("apps.memories.config.namespace_max_depth", return_value=depth):
        response = Client().get("/openapi.json")
    assert response.status_code == 200, response.content[:500]
    return response.json()


def _fuzzed_operations(document: dict) -> int:
    return sum(
        1
        for path, item in document["paths"].items()
        if path not in EXCLUDED_PATHS
        for method in item
        if method in {"get", "put", "post", "patch", "delete", "head", "options"}
    )


SCHEMA_DOCUMENT = _own_schema_document()
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "0")) or max(
    MIN_EXAMPLES, min(MAX_EXAMPLES, FUZZ_BUDGET // max(_fuzzed_operations(SCHEMA_DOCUMENT), 1))
)
# The built-in policy lets a user write, read and delete only under ["user", <user id>, ...]. Random namespaces
# would make every memory call a 403 and leave the code behind authorization unfuzzed, so in about half of the
# schema-valid cases any namespace-shaped field (the memory endpoints' names for it) is moved into the caller's own
# subtree. Invalid cases are left alone: moving could make them valid and then wrongly expect a 4xx.
OWN_NAMESPACE_FIELDS = ("namespace", "namespace_prefix", "ns", "prefix")
MAX_OWN_DEPTH = 5  # the default memory.episodic.namespace.max_depth
CURRENT_USER = {"name": "bob"}  # set by each test before it draws (Hypothesis draws inside the test)


def _in_own_subtree(container: Any) -> Any:
    if not isinstance(container, dict):
        return container
    moved = dict(container)
    for field in OWN_NAMESPACE_FIELDS:
        value = moved.get(field)
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list):
            moved[field] = ["user", CURRENT_USER["name"], *value[2:MAX_OWN_DEPTH]]
    return moved


def _has_namespace(container: Any) -> bool:
    return isinstance(container, dict) and any(field in container for field in OWN_NAMESPACE_FIELDS)


def flatmap_case(context: Any, case: Any):
    positive = case.meta is not None and case.meta.generation.mode == GenerationMode.POSITIVE
    if not positive or not (_has_namespace(case.body) or _has_namespace(case.query)):
        return st.just(case)

    def place(own: bool) -> Any:
        if own:
            case.body = _in_own_subtree(case.body)
            case.query = _in_own_subtree(case.query)
        return case

    return st.booleans().map(place)


# Schema-valid cases carry only what a schema can promise. What JSON Schema cannot state is shaped here, in every
# phase, each rule with its reason; the schema's descriptions say the same to people:
# - values that are valid only as the server issued them or as rows it holds are left out: page cursors (opaque),
#   the fork point of a new conversation (an existing conversation and entry), an attachment an entry links;
# - JSON written in free-form values (a memory value, conversation metadata, filter operands): strings without NUL
#   (PostgreSQL text and jsonb hold none), integers within 64 bits (the policies' input), integral numbers at
#   integer fields written as integers (OpenAPI 3.0's integer has no fraction: 5.0 is a number);
# - a memory key of at most 1024 bytes in UTF-8 (the schema's maxLength counts 1024 characters).
SERVER_ISSUED = frozenset({"afterCursor", "after_cursor", "beforeCursor", "forkedAtConversationId", "forkedAtEntryId", "attachmentId"})
KEY_MAX_BYTES = 1024


def _plain_json(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, int):
        return max(-(2**63), min(value, 2**63 - 1))
    if isinstance(value, str):
        return value.replace("\x00", "_")
    if isinstance(value, list):
        return [_plain_json(item) for item in value]
    if isinstance(value, dict):
        return {_plain_json(key): _plain_json(item) for key, item in value.items() if key not in SERVER_ISSUED}
    return value


def _shaped(container: Any, path: str) -> Any:
    shaped = _plain_json(container)
    if not isinstance(shaped, dict):
        return shaped
    key = shaped.get("key")
    if path == "/v1/memories" and isinstance(key, str) and len(key.encode()) > KEY_MAX_BYTES:
        shaped["key"] = key.encode()[:KEY_MAX_BYTES].decode(errors="ignore") or "k"
    return shaped


def shape_positive(case: Any) -> None:
    """Shape a schema-valid case as above (in place); schema-invalid cases go out as drawn."""
    if case.meta is None or case.meta.generation.mode != GenerationMode.POSITIVE:
        return
    case.query = _shaped(case.query, case.path) if case.query else case.query
    if isinstance(case.body, dict | list) and case.media_type == "application/json":
        case.body = _shaped(case.body, case.path)


# 400s a schema cannot foresee: rules on the state of a conversation, documented in each operation's description.
STATE_RULES = {
    ("DELETE", "/v1/conversations/{conversationId}/memberships/{userId}"): ("userId", "the primary owner's membership"),
    ("PATCH", "/v1/conversations/{conversationId}/memberships/{userId}"): ("accessLevel", "the primary owner's membership"),
    ("POST", "/v1/ownership-transfers"): ("newOwnerUserId", "must "),
}


def _state_rule_refusal(case: Any, response: Any) -> bool:
    rule = STATE_RULES.get((case.method.upper(), case.path))
    if rule is None or response.status_code != 400:
        return False
    try:
        fields = json.loads(response.content).get("details", {}).get("fields", {})
    except (ValueError, AttributeError):
        return False
    field, message = rule
    return set(fields) == {field} and str(fields[field]).startswith(message)


def schema_valid_data_accepted(ctx: Any, response: Any, case: Any) -> bool | None:
    """Schemathesis's positive_data_acceptance, except for the documented state rules above."""
    from schemathesis.openapi.checks import RejectedPositiveData
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    try:
        return positive_data_acceptance(ctx, response, case)
    except RejectedPositiveData:
        if _state_rule_refusal(case, response):
            return None
        raise


def _schema(*, coverage: bool):
    schema = schemathesis.openapi.from_dict(SCHEMA_DOCUMENT, config=_config(EXAMPLES, coverage=coverage))
    schema.hook(flatmap_case)
    return schema.exclude(path=sorted(EXCLUDED_PATHS))


# alice (roles user, admin) gets every phase: as an admin her valid cases get past authorization on every endpoint,
# admin ones included, so the boundary cases reach the most code. bob (role user) gets the fuzzing phase: random
# valid and invalid cases as a plain user, where policies and memberships deny.
as_admin = _schema(coverage=True)
as_user = _schema(coverage=False)


@pytest.fixture(scope="module", autouse=True)
def _empty_tables_afterwards(live_service: LiveService, django_db_blocker) -> Iterator[None]:
    """The live server commits what the fuzzer writes; later tests expect empty tables. Once per module, not per
    operation as ``django_db(transaction=True)`` would (times ~70 test items)."""
    yield
    with django_db_blocker.unblock():
        empty_tables()


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
# What the live server commits is flushed once after the module (_empty_tables_afterwards). The django_db mark is
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
