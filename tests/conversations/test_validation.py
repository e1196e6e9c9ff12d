"""Bad input (issue 8, D1): every malformed body, unknown field, bad UUID in a path, bad enum, oversized title or
content is a JSON 400 (413 for an oversized entry) in D1's shape, and nothing is written."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings

from tests.conversations.support import (
    ADMIN,
    ADMIN_USER,
    CONVERSATIONS,
    OWNER,
    Shared,
    assert_error,
    assert_validation_error,
    conv_path,
    history,
    new_id,
    snapshot,
    url,
)

pytestmark = pytest.mark.django_db

USER = [{"role": "USER", "text": "x"}]

CREATE_BODIES: dict[str, Any] = {
    "unknown field": {"title": "t", "color": "red"},
    "title not a string": {"title": 5},
    "title a list": {"title": ["t"]},
    "title too long": {"title": "x" * 501},
    "metadata a list": {"metadata": [1, 2]},
    "metadata a string": {"metadata": "{}"},
    "id not a uuid": {"id": "conversation-1"},
    "id a number": {"id": 12},
    "id empty": {"id": ""},
    "array body": [{"title": "t"}],
    "string body": "title",
    "null body": None,
}


@pytest.mark.parametrize("body", list(CREATE_BODIES.values()), ids=list(CREATE_BODIES))
def test_bad_create_bodies(actor_client, body) -> None:
    client = actor_client(OWNER)
    before = snapshot()
    response = client.post(CONVERSATIONS, body, format="json") if body is not None else \
        client.post(CONVERSATIONS, "null", content_type="application/json")
    assert_validation_error(response)
    assert snapshot() == before


def test_title_length_counts_characters(actor_client) -> None:
    client = actor_client(OWNER)
    assert client.post(CONVERSATIONS, {"title": "ü" * 500}, format="json").status_code == 201
    assert_validation_error(client.post(CONVERSATIONS, {"title": "ü" * 501}, format="json"), "title")


@pytest.mark.parametrize(
    "raw",
    ['{"title": "t"', "{'title': 't'}", "\x00", '{"title": "\\ud800"}', "[1, 2"],
    ids=["truncated", "single quotes", "nul byte", "lone surrogate", "unclosed array"],
)
def test_malformed_json_is_400(actor_client, raw: str) -> None:
    before = snapshot()
    response = actor_client(OWNER).post(CONVERSATIONS, raw, content_type="application/json")
    assert_validation_error(response)
    assert snapshot() == before


PATCH_BODIES: dict[str, Any] = {
    "unknown field": {"title": "t", "ownerUserId": "mallory"},
    "title not a string": {"title": 1},
    "title too long": {"title": "x" * 501},
    "metadata a list": {"metadata": []},
    "id in body": {"id": new_id()},
    "array body": [],
}


@pytest.mark.parametrize("body", list(PATCH_BODIES.values()), ids=list(PATCH_BODIES))
def test_bad_patch_bodies(shared: Shared, body) -> None:
    before = snapshot()
    assert_validation_error(shared[OWNER].patch(conv_path(shared.id), body, format="json"))
    assert snapshot() == before


def _indexed(size: int) -> str:
    return "i" * size


ENTRY_BODIES: dict[str, Any] = {
    "empty body": {},
    "content missing": {"channel": "history"},
    "content empty": {"content": []},
    "content an object": {"content": {"role": "USER", "text": "x"}},
    "content a string": {"content": "hello"},
    "content item a string": {"content": ["hello"]},
    "content item null": {"content": [None]},
    "role missing": {"content": [{"text": "x"}]},
    "role unknown": {"content": [{"role": "SYSTEM", "text": "x"}]},
    "role lower case": {"content": [{"role": "user", "text": "x"}]},
    "text not a string": {"content": [{"role": "USER", "text": 5}]},
    "attachmentId malformed": {"content": [{"role": "USER", "attachmentId": "abc"}]},
    "attachments not an array": {"content": [{"role": "USER", "attachments": {"attachmentId": new_id()}}]},
    "attachments item not an object": {"content": [{"role": "USER", "attachments": [new_id()]}]},
    "attachments attachmentId malformed": {"content": [{"role": "AI", "attachments": [{"attachmentId": "abc"}]}]},
    "channel unknown": {"channel": "system", "content": USER},
    "channel wrong type": {"channel": 1, "content": USER},
    "contentType not history on history": {"contentType": "text/plain", "content": USER},
    "contentType empty": {"channel": "history", "contentType": "", "content": USER},
    "contentType history/ without a flavour": {"contentType": "history/", "content": USER},
    "contentType history prefix only": {"contentType": "historyx", "content": USER},
    "contentType flavour with a space": {"contentType": "history/vercel ai", "content": USER},
    "unknown field": {"content": USER, "priority": "high"},
    "indexedContent not a string": {"content": USER, "indexedContent": 5},
    "indexedContent too large": {"content": USER, "indexedContent": _indexed(65_537)},
    "too many items": {"content": [{"role": "USER", "text": "x"}] * 1001},
    "forked entry without conversation": {"content": USER, "forkedAtEntryId": new_id()},
}


@pytest.mark.parametrize("body", list(ENTRY_BODIES.values()), ids=list(ENTRY_BODIES))
@pytest.mark.parametrize("target", ["existing", "new"])
def test_bad_entry_bodies(shared: Shared, body, target: str) -> None:
    conversation_id = shared.id if target == "existing" else new_id()
    before = snapshot()
    response = shared[OWNER].post(conv_path(conversation_id, "entries"), body, format="json")
    assert_validation_error(response)
    assert snapshot() == before


def test_item_and_size_limits_themselves_are_accepted(shared: Shared) -> None:
    body = {"content": [{"role": "USER", "text": "x"}] * settings.CONVERSATION_ENTRY_MAX_ITEMS,
            "indexedContent": _indexed(settings.CONVERSATION_INDEXED_CONTENT_MAX_BYTES)}
    assert shared[OWNER].post(conv_path(shared.id, "entries"), body, format="json").status_code == 201


@pytest.mark.parametrize("target", ["existing", "new"])
def test_oversized_content_is_413_and_writes_nothing(shared: Shared, target: str) -> None:
    conversation_id = shared.id if target == "existing" else new_id()
    before = snapshot()
    text = "x" * (settings.CONVERSATION_ENTRY_MAX_CONTENT_BYTES + 1)
    response = shared[OWNER].post(conv_path(conversation_id, "entries"), {"content": history(text)}, format="json")
    assert_error(response, 413, "payload_too_large")
    assert snapshot() == before


def test_content_just_under_the_byte_limit_is_accepted(shared: Shared) -> None:
    # Serialized as compact JSON: [{"role":"USER","text":"..."}] is 29 bytes around the text.
    text = "x" * (settings.CONVERSATION_ENTRY_MAX_CONTENT_BYTES - 64)
    response = shared[OWNER].post(conv_path(shared.id, "entries"), {"content": history(text)}, format="json")
    assert response.status_code == 201, response.content[:300]


BAD_UUID = "not-a-uuid"
PATH_CALLS = [
    ("get", f"{CONVERSATIONS}/{BAD_UUID}", None),
    ("patch", f"{CONVERSATIONS}/{BAD_UUID}", {"title": "t"}),
    ("delete", f"{CONVERSATIONS}/{BAD_UUID}", None),
    ("get", f"{CONVERSATIONS}/{BAD_UUID}/entries", None),
    ("post", f"{CONVERSATIONS}/{BAD_UUID}/entries", {"content": USER}),
    ("get", f"{CONVERSATIONS}/{BAD_UUID}/forks", None),
    ("get", f"{CONVERSATIONS}/{BAD_UUID}/memberships", None),
    ("post", f"{CONVERSATIONS}/{BAD_UUID}/memberships", {"userId": "u", "accessLevel": "reader"}),
    ("patch", f"{CONVERSATIONS}/{BAD_UUID}/memberships/u", {"accessLevel": "reader"}),
    ("delete", f"{CONVERSATIONS}/{BAD_UUID}/memberships/u", None),
    ("get", f"{CONVERSATIONS}/12345/entries", None),
    ("get", f"{CONVERSATIONS}/1c50b383-49ca-4c74-abd5-667033cbe353x/entries", None),  # a UUID and one more
    ("get", f"{ADMIN}/{BAD_UUID}", None),
    ("get", f"{ADMIN}/{BAD_UUID}/entries", None),
    ("get", f"{ADMIN}/{BAD_UUID}/memberships", None),
    ("get", f"{ADMIN}/{BAD_UUID}/forks", None),
]


@pytest.mark.parametrize(("method", "path", "body"), PATH_CALLS, ids=[f"{m} {p}" for m, p, _ in PATH_CALLS])
def test_malformed_uuid_in_a_path_is_400(actor_client, method: str, path: str, body) -> None:
    client = actor_client(ADMIN_USER if path.startswith(ADMIN) else OWNER)
    before = snapshot()
    kwargs = {"data": body, "format": "json"} if body is not None else {}
    response = getattr(client, method)(path, **kwargs)
    assert_validation_error(response)
    assert snapshot() == before


@pytest.mark.parametrize("mode", ["newest", "ALL", "latest_fork", "", "roots,all"])
def test_unknown_list_mode_is_400(actor_client, mode: str) -> None:
    response = actor_client(OWNER).get(f"{CONVERSATIONS}?mode={mode}")
    if mode == "":
        # An empty parameter is the parameter left out: the default mode.
        assert response.status_code == 200
        return
    assert_validation_error(response, "mode")


def test_overlong_title_query_is_400(actor_client) -> None:
    response = actor_client(OWNER).get(url(CONVERSATIONS, query="q" * 10_000))
    assert_validation_error(response, "query")


@pytest.mark.parametrize("value", ["yes", "2", "maybe"])
def test_admin_include_deleted_must_be_a_boolean(actor_client, value: str) -> None:
    assert_validation_error(actor_client(ADMIN_USER).get(url(ADMIN, includeDeleted=value)), "includeDeleted")


def test_errors_are_json_for_unknown_conversation_routes(actor_client) -> None:
    response = actor_client(OWNER).get(f"{CONVERSATIONS}/{new_id()}/nonsense")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
