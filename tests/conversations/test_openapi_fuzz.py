"""A schema-driven robustness run over every conversation-half operation (in the spirit of a Schemathesis run): the
OpenAPI document must describe each operation, and for each one every documented query parameter and body property
gets values of the wrong type, out of range, empty, huge or with NUL / lone-surrogate characters, and each path
parameter gets malformed and unknown ids. Nothing may answer 5xx or a non-JSON error."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conversations.support import ADMIN_USER, MANAGER, TRANSFERS, add_member, append_ok, create, new_id

pytestmark = pytest.mark.django_db

OPERATIONS = [
    ("get", "/v1/conversations"),
    ("post", "/v1/conversations"),
    ("get", "/v1/conversations/{id}"),
    ("patch", "/v1/conversations/{id}"),
    ("delete", "/v1/conversations/{id}"),
    ("get", "/v1/conversations/{id}/entries"),
    ("post", "/v1/conversations/{id}/entries"),
    ("get", "/v1/conversations/{id}/forks"),
    ("get", "/v1/conversations/{id}/memberships"),
    ("post", "/v1/conversations/{id}/memberships"),
    ("patch", "/v1/conversations/{id}/memberships/{userId}"),
    ("delete", "/v1/conversations/{id}/memberships/{userId}"),
    ("get", "/v1/ownership-transfers"),
    ("post", "/v1/ownership-transfers"),
    ("get", "/v1/ownership-transfers/{id}"),
    ("delete", "/v1/ownership-transfers/{id}"),
    ("post", "/v1/ownership-transfers/{id}/accept"),
    ("get", "/v1/admin/conversations"),
    ("get", "/v1/admin/conversations/{id}"),
    ("get", "/v1/admin/conversations/{id}/entries"),
    ("get", "/v1/admin/conversations/{id}/memberships"),
    ("get", "/v1/admin/conversations/{id}/forks"),
]

BAD_VALUES: list[Any] = [None, 0, -1, 2**63, 1e308, True, "", " ", "x" * 5000, "\x00", "a\x00b", "\ud800", [], {},
                         ["a"], {"a": 1}, "../../etc", "' OR 1=1 --", "00000000-0000-0000-0000-000000000000"]
BAD_QUERY: list[str] = ["", "-1", "0", "99999999999999999999", "x" * 3000, "%00", "a%00b", "%ED%A0%80", "true",
                        "[]", "null", "%FF"]
BAD_PATH_IDS = ["x", "0", "%00", "x" * 300, "00000000-0000-0000-0000-000000000000", "%ED%A0%80", "..", "null"]


@pytest.fixture(scope="module")
def schema(django_db_blocker) -> dict:
    from rest_framework.test import APIClient

    with django_db_blocker.unblock():
        response = APIClient().get("/openapi.json")
    assert response.status_code == 200
    return response.json()


def _resolve(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        name = node["$ref"].split("/")[-1]
        node = schema["components"]["schemas"][name]
    return node


def _operation(schema: dict, method: str, path: str) -> dict:
    templated = path.replace("{id}", "{conversationId}") if "conversations" in path else path
    for candidate in (path, templated, path.replace("{id}", "{transferId}")):
        found = schema["paths"].get(candidate, {}).get(method)
        if found:
            return found
    documented = sorted(p for p in schema["paths"] if p.startswith(path.split("{")[0].rstrip("/")))
    raise AssertionError(f"{method.upper()} {path} is not in the OpenAPI document (near: {documented})")


def _body_properties(schema: dict, operation: dict) -> dict:
    content = operation.get("requestBody", {}).get("content", {}).get("application/json")
    if not content:
        return {}
    return _resolve(schema, content["schema"]).get("properties", {})


def _assert_sane(response, what: str) -> None:
    assert response.status_code < 500, (what, response.status_code, response.content[:300])
    if response.status_code != 204:
        assert response["Content-Type"].startswith("application/json"), (what, response["Content-Type"])


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m.upper()} {p}" for m, p in OPERATIONS])
def test_operation_survives_malformed_input(schema: dict, client_for, method: str, path: str) -> None:
    operation = _operation(schema, method, path)
    assert operation.get("responses"), f"{method} {path} documents no responses"
    client = client_for(ADMIN_USER, roles=("user", "admin"))  # owner of the target and admin: every branch runs
    conversation = create(client, title="fuzz")["id"]
    append_ok(client, conversation, "fuzz entry")
    add_member(client, conversation, MANAGER, "manager")
    transfer = client.post(TRANSFERS, {"conversationId": conversation, "newOwnerUserId": MANAGER}, format="json")
    target_id = transfer.json()["id"] if "ownership-transfers/{id}" in path else conversation

    def call(concrete: str, *, query: str = "", body: Any = ..., raw: str | None = None):
        url = concrete + (f"?{query}" if query else "")
        if raw is not None:
            return getattr(client, method)(url, raw, content_type="application/json")
        if body is ...:
            return getattr(client, method)(url)
        return getattr(client, method)(url, json.dumps(body), content_type="application/json")

    valid_path = path.replace("{id}", target_id).replace("{userId}", MANAGER)
    # Path parameters: malformed and unknown ids.
    for bad in BAD_PATH_IDS:
        for name in ("{id}", "{userId}"):
            if name in path:
                concrete = path.replace("{id}", target_id).replace("{userId}", MANAGER).replace(
                    target_id if name == "{id}" else MANAGER, bad, 1)
                _assert_sane(call(concrete), f"path {name}={bad!r}")
    # Query parameters the document names (plus limit/afterCursor on every list).
    names = {p["name"] for p in operation.get("parameters", []) if p.get("in") == "query"}
    if method == "get" and "{" not in path.split("/")[-1]:
        names |= {"limit", "afterCursor"}
    for name in sorted(names):
        for value in BAD_QUERY:
            _assert_sane(call(valid_path, query=f"{name}={value}"), f"query {name}={value!r}")
    # Body: whole-body shapes, then each documented property with every bad value.
    if method in ("post", "patch"):
        for raw in ("[]", '"text"', "0", "null", "{", '{"a": "\\u0000"}', "\x00", "{}" + " " * 10):
            _assert_sane(call(valid_path, raw=raw), f"raw body {raw!r}")
        for name in _body_properties(schema, operation):
            for value in BAD_VALUES:
                _assert_sane(call(valid_path, body={name: value}), f"body {name}={value!r}")
    # And the operation still works for a well-formed call on a fresh target (nothing above broke state).
    _assert_sane(call(path.replace("{id}", new_id()).replace("{userId}", MANAGER)), "unknown id")
