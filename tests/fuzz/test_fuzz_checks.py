"""The fuzzer's own parts: the D1 check must fail on what it is there to catch, and the schema it reads must
document D1's body for every error of every API operation (apps.core.openapi.document_errors)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.fuzz.cases import SCHEMA_DOCUMENT, d1_error_body


def _response(status: int, body, content_type: str = "application/json", request_id: str | None = "rid-1"):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": [content_type]}
    if request_id is not None:
        headers["x-request-id"] = [request_id]
    return SimpleNamespace(status_code=status, headers=headers, content=content)


GOOD = {"code": "not_found", "error": "Not found.", "requestId": "rid-1"}


@pytest.mark.parametrize(
    "response",
    [
        _response(404, GOOD),
        _response(403, {**GOOD, "code": "forbidden", "reason": "access denied"}),
        _response(400, {**GOOD, "code": "validation_error", "details": {"fields": {"limit": "too big"}}}),
        _response(200, b"<html>fine for a success</html>", "text/html"),
    ],
)
def test_d1_check_passes_d1_errors(response):
    assert d1_error_body(None, response, None) is None


@pytest.mark.parametrize(
    "response",
    [
        _response(403, b"<h1>CSRF verification failed</h1>", "text/html"),  # Django's CSRF page
        _response(500, b"Internal Server Error", "text/plain"),
        _response(404, b"not json", "application/json"),
        _response(404, ["not", "an", "object"]),
        _response(404, {"detail": "Not found."}),  # DRF's default body
        _response(404, {**GOOD, "requestId": "another"}),
        _response(404, GOOD, request_id=None),
        _response(404, {**GOOD, "trace": "Traceback ..."}),
        _response(404, {**GOOD, "details": "text"}),
        _response(400, {**GOOD, "code": "bad_request"}),
    ],
)
def test_d1_check_fails_anything_else(response):
    with pytest.raises(AssertionError):
        d1_error_body(None, response, None)


def test_every_api_error_response_is_documented_with_d1s_body():
    operations = [
        (path, method, operation)
        for path, item in SCHEMA_DOCUMENT["paths"].items()
        if path.startswith("/v1/")
        for method, operation in item.items()
        if method in {"get", "put", "post", "patch", "delete"}
    ]
    assert operations
    error = SCHEMA_DOCUMENT["components"]["schemas"]["Error"]
    assert error["additionalProperties"] is False
    assert set(error["required"]) == {"code", "error", "requestId"}
    for path, method, operation in operations:
        responses = operation["responses"]
        if any(operation.get("security", SCHEMA_DOCUMENT.get("security")) or []):
            assert "401" in responses, (method, path)
        if operation.get("parameters") or operation.get("requestBody"):
            assert "400" in responses, (method, path)
        if operation.get("requestBody"):
            assert "413" in responses, (method, path)
        for status, response in responses.items():
            if int(status) >= 400:
                assert response["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}, (
                    method,
                    path,
                    status,
                )


# --- What the fuzzer shapes and forgives (tests/fuzz/cases.py) -----------------------------------------


def _case(mode, *, path="/v1/memories", method="PUT", query=None, body=None, media_type="application/json"):
    meta = SimpleNamespace(generation=SimpleNamespace(mode=mode))
    return SimpleNamespace(meta=meta, path=path, method=method, query=query or {}, body=body, media_type=media_type)


def test_schema_valid_cases_carry_only_what_a_schema_can_promise():
    from tests.fuzz.cases import shape_positive

    case = _case(
        "positive",
        query={"afterCursor": "x", "limit": 18.0, "ns": ["a\x00"]},
        body={
            "key": "é" * 600,
            "value": {"n": 2**70, "f": 1.5, "s": "a\x00b", "\x00k": [5.0]},
            "content": [{"text": "t", "attachmentId": "00000000-0000-0000-0000-000000000000"}],
            "forkedAtConversationId": "x",
            "forkedAtEntryId": "y",
            "afterCursor": "z",
        },
    )
    shape_positive(case)
    assert case.query == {"limit": 18, "ns": ["a_"]}
    assert set(case.body) == {"key", "value", "content"}
    assert len(case.body["key"].encode()) <= 1024
    assert case.body["value"] == {"n": 2**63 - 1, "f": 1.5, "s": "a_b", "_k": [5]}
    assert case.body["content"] == [{"text": "t"}]

    negative = _case("negative", query={"afterCursor": "x", "limit": 18.0})
    shape_positive(negative)
    assert negative.query == {"afterCursor": "x", "limit": 18.0}  # invalid cases go out as drawn


@pytest.mark.parametrize(
    ("method", "fields", "forgiven"),
    [
        ("DELETE", {"userId": "the primary owner's membership cannot be removed; transfer ownership first"}, True),
        ("DELETE", {"userId": "must be 1 to 256 characters without NUL"}, False),
        ("DELETE", {"userId": "the primary owner's membership cannot be removed", "x": "unknown field"}, False),
        ("PATCH", {"accessLevel": "the primary owner's membership cannot be lowered; transfer ownership instead"}, True),
        ("PATCH", {"accessLevel": "must be one of: manager, owner, reader, writer"}, False),
    ],
)
def test_only_documented_state_rules_are_forgiven_a_400(method, fields, forgiven):
    from tests.fuzz.cases import _state_rule_refusal

    case = _case("positive", path="/v1/conversations/{conversationId}/memberships/{userId}", method=method)
    body = {"code": "validation_error", "error": "Invalid request.", "requestId": "r", "details": {"fields": fields}}
    assert _state_rule_refusal(case, _response(400, body)) is forgiven
    assert _state_rule_refusal(case, _response(409, body)) is False
