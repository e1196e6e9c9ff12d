"""Entries through HTTP (D5): append, list, the conversation an append to an unknown id creates, and the context
channel that only the API-key client who wrote it can see."""

from __future__ import annotations

import re
import time

import pytest

from apps.identity.api_keys import create_key
from tests.conftest import TEST_API_KEY
from tests.conversations.support import (
    ENTRY_FIELDS,
    ISO_Z,
    OWNER,
    READER,
    WRITER,
    Shared,
    all_pages,
    append_ok,
    assert_error,
    conv_path,
    levels,
    new_id,
    sql,
    url,
)

pytestmark = pytest.mark.django_db


def _entries(client, conversation_id: str, **params) -> list[dict]:
    return all_pages(client, conv_path(conversation_id, "entries"), **params)


def _texts(client, conversation_id: str, **params) -> list[str]:
    return [item["content"][0].get("text") for item in _entries(client, conversation_id, **params)]


def test_append_answers_201_with_the_entry(shared: Shared) -> None:
    content = [{"role": "USER", "text": "What is 2+2?"}, {"role": "AI", "text": "4 ✓ — ünïcode"}]
    response = shared[WRITER].post(conv_path(shared.id, "entries"), {"content": content}, format="json")
    assert response.status_code == 201, response.content
    entry = response.json()
    assert set(entry) == ENTRY_FIELDS
    assert entry["conversationId"] == shared.id
    assert entry["userId"] == WRITER
    assert (entry["channel"], entry["contentType"]) == ("history", "history")
    assert entry["content"] == content
    assert ISO_Z.match(entry["createdAt"])
    assert _entries(shared[READER], shared.id)[-1] == entry


def test_explicit_history_channel_and_content_type_are_accepted(shared: Shared) -> None:
    entry = append_ok(shared[OWNER], shared.id, "explicit", channel="history", contentType="history")
    assert (entry["channel"], entry["contentType"]) == ("history", "history")


def test_history_item_with_a_malformed_attachment_id_is_400(shared: Shared) -> None:
    # Whether an attachment exists is the attachments app's business (a later issue); its id's shape is checked here.
    response = shared[OWNER].post(conv_path(shared.id, "entries"),
                                  {"content": [{"role": "USER", "attachmentId": "not-a-uuid"}]}, format="json")
    assert response.status_code == 400


@pytest.mark.parametrize("content_type", ["history/vercelai", "history/lc4j", "history"])
def test_history_items_are_client_data_returned_exactly_as_sent(shared: Shared, content_type: str) -> None:
    """D10: every field a client puts in a history item is stored and returned as sent (only ``role`` is
    required), under ``history`` or a ``history/<flavour>`` content type."""
    content = [
        {"role": "USER", "text": "What's the weather?", "type": "message", "attachments": [
            {"href": "https://example.com/map.png", "contentType": "image/png", "name": "map"}]},
        {"role": "AI", "events": [
            {"eventType": "BeforeToolExecution", "toolName": "weather", "input": {"city": "Lisbon", "days": 2}},
            {"eventType": "PartialResponse", "chunk": "Sunny, "},
            {"type": "text-delta", "delta": "22 °C", "nested": [1, 2.5, None, True, {"deep": ["x"]}]},
        ]},
        {"role": "AI", "text": "Sunny, 22 °C", "metadata": {"model": "fake", "tokens": 12}},
    ]
    response = shared[WRITER].post(
        conv_path(shared.id, "entries"), {"contentType": content_type, "content": content}, format="json"
    )
    assert response.status_code == 201, response.content
    entry = response.json()
    assert (entry["channel"], entry["contentType"], entry["content"]) == ("history", content_type, content)
    assert _entries(shared[READER], shared.id)[-1] == entry


def test_openapi_says_history_items_are_client_data(api) -> None:
    schema = api.get("/openapi.json").json()
    history = next(
        shape for shape in schema["components"]["schemas"]["EntryAppendRequest"]["oneOf"]
        if shape["title"] == "HistoryEntryAppend"
    )
    item = history["properties"]["content"]["items"]
    assert item["required"] == ["role"] and item["additionalProperties"] is True
    assert item["properties"]["attachments"]["items"]["properties"]["attachmentId"]["format"] == "uuid"
    pattern = re.compile(history["properties"]["contentType"]["pattern"])
    assert all(pattern.search(value) for value in ("history", "history/vercelai", "history/lc4j"))
    assert not any(pattern.search(value) for value in ("historyx", "history/", "history/a b", "text/plain"))


def test_a_conversation_created_by_a_rich_item_is_titled_from_its_text(actor_client) -> None:
    owner = actor_client(OWNER)
    conversation_id = new_id()
    content = [{"role": "AI", "events": [{"chunk": "no text here"}]}, {"role": "AI", "text": "the title"}]
    assert owner.post(conv_path(conversation_id, "entries"), {"content": content}, format="json").status_code == 201
    assert owner.get(conv_path(conversation_id)).json()["title"] == "the title"


def test_entries_list_oldest_first_with_every_field(shared: Shared) -> None:
    for index in range(3):
        append_ok(shared[WRITER], shared.id, f"n{index}")
    listed = _entries(shared[READER], shared.id)
    assert [item["content"][0]["text"] for item in listed] == ["first words", "second words", "n0", "n1", "n2"]
    assert [item["userId"] for item in listed] == [OWNER, WRITER, WRITER, WRITER, WRITER]
    assert [item["createdAt"] for item in listed] == sorted(item["createdAt"] for item in listed)
    assert all(set(item) == ENTRY_FIELDS for item in listed)


def test_append_bumps_the_conversations_updated_at(shared: Shared) -> None:
    before = shared[OWNER].get(conv_path(shared.id)).json()["updatedAt"]
    time.sleep(0.01)
    entry = append_ok(shared[WRITER], shared.id, "later")
    after = shared[OWNER].get(conv_path(shared.id)).json()["updatedAt"]
    assert after > before
    assert after >= entry["createdAt"]


def test_append_to_an_unknown_id_creates_a_conversation_owned_by_the_caller(actor_client) -> None:
    client = actor_client(WRITER)
    conversation_id = new_id()
    text = "Plan a three-day trip to Lisbon with a small budget please"
    entry = append_ok(client, conversation_id, text)
    assert entry["conversationId"] == conversation_id
    conversation = client.get(conv_path(conversation_id)).json()
    assert conversation["ownerUserId"] == WRITER
    assert conversation["accessLevel"] == "owner"
    assert conversation["title"] == text[:40]
    assert conversation["forkedAtConversationId"] is None
    assert levels(conversation_id) == {WRITER: "owner"}
    # Only the first text names it.
    append_ok(client, conversation_id, "something else entirely")
    assert client.get(conv_path(conversation_id)).json()["title"] == text[:40]


def test_title_from_the_first_text_counts_characters_not_bytes(actor_client) -> None:
    client = actor_client(WRITER)
    conversation_id = new_id()
    text = "日本語のテキスト" * 10
    append_ok(client, conversation_id, text)
    assert client.get(conv_path(conversation_id)).json()["title"] == text[:40]


def test_title_comes_from_the_first_item_that_has_text(actor_client) -> None:
    client = actor_client(WRITER)
    conversation_id = new_id()
    response = client.post(conv_path(conversation_id, "entries"),
                           {"content": [{"role": "AI", "text": "short"}, {"role": "USER", "text": "ignored"}]},
                           format="json")
    assert response.status_code == 201, response.content
    assert client.get(conv_path(conversation_id)).json()["title"] == "short"


def test_entries_of_one_conversation_never_appear_in_another(shared: Shared) -> None:
    other = append_ok(shared[OWNER], new_id(), "elsewhere")["conversationId"]
    assert _texts(shared[OWNER], other) == ["elsewhere"]
    assert "elsewhere" not in _texts(shared[OWNER], shared.id)


# --- The context channel --------------------------------------------------------------------------------------------


@pytest.fixture
def apps(client_for):
    """(client of TEST_API_CLIENT, client of a second API-key client), both for user WRITER, plus the plain user."""
    other = create_key("other-app")
    return (client_for(WRITER, api_key=TEST_API_KEY), client_for(WRITER, api_key=other.key), client_for(WRITER))


def _context(client, conversation_id: str, state: dict):
    return client.post(conv_path(conversation_id, "entries"), {"channel": "context", "content": [state]},
                       format="json")


def test_context_entries_are_private_to_the_api_key_client_that_wrote_them(shared: Shared, apps) -> None:
    mine, theirs, plain = apps
    response = _context(mine, shared.id, {"memory": "mine"})
    assert response.status_code == 201, response.content
    entry = response.json()
    assert (entry["channel"], entry["contentType"], entry["content"]) == ("context", "context", [{"memory": "mine"}])
    assert _context(theirs, shared.id, {"memory": "theirs"}).status_code == 201

    assert [e["content"] for e in _entries(mine, shared.id, channel="context")] == [[{"memory": "mine"}]]
    assert [e["content"] for e in _entries(theirs, shared.id, channel="context")] == [[{"memory": "theirs"}]]
    # The history channel never holds context entries, whoever asks.
    for client in (mine, theirs, plain, shared[OWNER]):
        assert all(e["channel"] == "history" for e in _entries(client, shared.id, channel="history"))
        assert len(_entries(client, shared.id, channel="history")) == 2
    # Without a client, only history is listed.
    assert all(e["channel"] == "history" for e in _entries(plain, shared.id))


def test_context_without_an_api_key_client_is_403(shared: Shared) -> None:
    before = sql("SELECT count(*) FROM conversation_entries")
    assert_error(_context(shared[WRITER], shared.id, {"x": 1}), 403, "forbidden")
    assert_error(shared[WRITER].get(url(conv_path(shared.id, "entries"), channel="context")), 403, "forbidden")
    assert sql("SELECT count(*) FROM conversation_entries") == before


def test_context_append_still_needs_writer_level(shared: Shared, client_for) -> None:
    reader_app = client_for(READER, api_key=TEST_API_KEY)
    assert_error(_context(reader_app, shared.id, {"x": 1}), 403, "forbidden")
    assert reader_app.get(url(conv_path(shared.id, "entries"), channel="context")).status_code == 200


def test_context_content_type_may_be_chosen(shared: Shared, apps) -> None:
    mine, _, _ = apps
    response = mine.post(conv_path(shared.id, "entries"),
                         {"channel": "context", "contentType": "application/vnd.agent-state+json",
                          "content": [{"step": 3}]}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["contentType"] == "application/vnd.agent-state+json"


def test_unknown_channel_in_the_list_is_400(shared: Shared) -> None:
    response = shared[OWNER].get(url(conv_path(shared.id, "entries"), channel="everything"))
    assert response.status_code == 400
    assert response.json()["code"] == "validation_error"
