"""Context entries are private to the API-key client that wrote them (D5, issue 21 item 2): they are never indexed,
so no search path (a member's full-text, semantic or auto search, the admin search, the unindexed list, the
indexer's POST) ever returns their content, and their text never becomes the conversation's plaintext title."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from apps.conversations import indexer
from tests.conftest import TEST_API_KEY
from tests.conversations.support import (
    ADMIN,
    CONVERSATIONS,
    add_member,
    append_ok,
    assert_validation_error,
    conv_path,
    count,
    new_id,
    search,
    snapshot,
    sql,
)

pytestmark = pytest.mark.django_db

SECRET = "zanzibar marmalade"


@pytest.fixture
def tree(client_for):
    """bob's conversation (through the test client) with a history entry, charlie a reader: returns (id, clients)."""
    clients = {
        "bob": client_for("bob", api_key=TEST_API_KEY),
        "charlie": client_for("charlie"),
        "charlie_same_client": client_for("charlie", api_key=TEST_API_KEY),
        "auditor": client_for("aude", roles=("user", "auditor")),
        "indexer": client_for("ivan", roles=("user", "indexer")),
    }
    cid = new_id()
    append_ok(clients["bob"], cid, "a shared history entry about the harbour")
    add_member(clients["bob"], cid, "charlie", "reader")
    return cid, clients


def _context(client, cid: str, **extra):
    body = {"channel": "context", "content": [{"text": SECRET, "note": SECRET}], **extra}
    return client.post(conv_path(cid, "entries"), body, format="json")


@pytest.mark.parametrize("search_type", ["fulltext", "semantic", "auto"])
@pytest.mark.parametrize("who", ["member", "same client member", "writer", "admin"])
def test_no_search_returns_a_context_entry(tree, who: str, search_type: str) -> None:
    """Whatever an append does with indexedContent on a context entry (refused now; stored and embedded before),
    no search, by any member or by the admin search, ever returns the entry or its text."""
    cid, clients = tree
    _context(clients["bob"], cid, indexedContent=SECRET)
    assert _context(clients["bob"], cid).status_code == 201
    indexer.run_cycle()
    client, path = {
        "member": (clients["charlie"], f"{CONVERSATIONS}/search"),
        "same client member": (clients["charlie_same_client"], f"{CONVERSATIONS}/search"),
        "writer": (clients["bob"], f"{CONVERSATIONS}/search"),
        "admin": (clients["auditor"], f"{ADMIN}/search"),
    }[who]
    body = search(client, SECRET, path, searchType=search_type)
    assert all(item["entry"]["channel"] == "history" for item in body["data"]), body
    assert "zanzibar" not in str(body) and "marmalade" not in str(body)


def test_indexed_content_on_a_context_entry_is_400_and_writes_nothing(tree) -> None:
    cid, clients = tree
    before = snapshot()
    for value in (SECRET, "", None):
        assert_validation_error(_context(clients["bob"], cid, indexedContent=value), "indexedContent")
    assert snapshot() == before


def test_context_entries_are_never_indexed_in_the_database(tree) -> None:
    cid, clients = tree
    entry = _context(clients["bob"], cid).json()
    indexer.run_cycle()
    assert sql("SELECT indexed_content, embedding_pending FROM conversation_entries WHERE id = %s",
               [entry["id"]]) == [(None, False)]
    assert count("conversation_entry_vectors", "entry_id = %s", [entry["id"]]) == 0
    with pytest.raises(IntegrityError), transaction.atomic():
        sql("UPDATE conversation_entries SET indexed_content = 'x', embedding_pending = true WHERE id = %s",
            [entry["id"]])


def test_unindexed_list_and_index_endpoint_leave_context_entries_alone(tree, settings) -> None:
    settings.CONVERSATION_AUTO_INDEX = False
    cid, clients = tree
    entry = _context(clients["bob"], cid).json()
    listed = clients["indexer"].get(f"{CONVERSATIONS}/unindexed").json()["data"]
    assert entry["id"] not in {item["entry"]["id"] for item in listed}
    assert all(item["entry"]["channel"] == "history" for item in listed)
    assert "zanzibar" not in str(listed)
    response = clients["indexer"].post(
        f"{CONVERSATIONS}/index", [{"conversationId": cid, "entryId": entry["id"], "indexedContent": SECRET}],
        format="json",
    )
    assert response.status_code == 404, response.content
    assert response.json()["details"]["entryIds"] == [entry["id"]]
    assert sql("SELECT indexed_content FROM conversation_entries WHERE id = %s", [entry["id"]]) == [(None,)]


def test_a_conversation_created_by_a_context_append_is_untitled(client_for) -> None:
    bob = client_for("bob", api_key=TEST_API_KEY)
    cid = new_id()
    assert _context(bob, cid).status_code == 201
    add_member(bob, cid, "charlie", "reader")
    charlie = client_for("charlie")
    assert charlie.get(conv_path(cid)).json()["title"] == ""
    listed = charlie.get(CONVERSATIONS, {"mode": "all"}).json()["data"]
    assert [item["title"] for item in listed if item["id"] == cid] == [""]
    assert charlie.get(CONVERSATIONS, {"query": "zanzibar"}).json()["data"] == []
    assert sql("SELECT title FROM conversations WHERE id = %s", [cid]) == [("",)]
    # A later history entry does not retitle it (the title is set at creation, D5); the owner may set one.
    append_ok(bob, cid, "history words")
    assert charlie.get(conv_path(cid)).json()["title"] == ""


def test_a_fork_created_by_a_context_append_is_untitled(client_for) -> None:
    bob = client_for("bob", api_key=TEST_API_KEY)
    parent = new_id()
    first = append_ok(bob, parent, "the parent's words")
    fork = new_id()
    response = _context(bob, fork, forkedAtConversationId=parent, forkedAtEntryId=first["id"])
    assert response.status_code == 201, response.content
    assert bob.get(conv_path(fork)).json()["title"] == ""


def test_a_history_append_still_titles_a_new_conversation(client_for) -> None:
    bob = client_for("bob", api_key=TEST_API_KEY)
    cid = new_id()
    append_ok(bob, cid, "Plan a trip to Lisbon in the spring with friends")
    assert bob.get(conv_path(cid)).json()["title"] == "Plan a trip to Lisbon in the spring with"

