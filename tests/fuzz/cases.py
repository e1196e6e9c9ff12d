"""The fuzzer's parts that are not Schemathesis's (tests/fuzz/test_api_fuzz.py runs them): the D1 check, the schema
document it fuzzes, how schema-valid cases are shaped, the state rules forgiven. Importing this module loads neither
Schemathesis nor Hypothesis, so their own tests (test_fuzz_checks.py) run without them."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any

# Schemathesis's GenerationMode.POSITIVE, a str enum: compared by value so that this module need not import it.
POSITIVE = "positive"

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


SCHEMA_DOCUMENT = _own_schema_document()

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
    from hypothesis import strategies as st

    positive = case.meta is not None and case.meta.generation.mode == POSITIVE
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
    if case.meta is None or case.meta.generation.mode != POSITIVE:
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
