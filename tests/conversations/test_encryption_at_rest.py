"""D5 encryption at rest, observed from outside: entry content never reaches the database in plaintext (not in the
table, not in a pg_dump), while titles stay plaintext; a ciphertext moved to another entry row does not open."""

from __future__ import annotations

import logging

import pytest

from tests.conftest import TEST_API_KEY
from tests.conversations.support import OWNER, append_ok, conv_path, create, new_id, sql
from tests.database import pg_dump

MARKER = "entry-plaintext-marker-4d1e"
TITLE = "title-plaintext-marker-99a0"


@pytest.mark.django_db(transaction=True)  # pg_dump sees committed data only
def test_pg_dump_holds_no_entry_content_in_plaintext(actor_client, client_for) -> None:
    owner = actor_client(OWNER)
    conversation = create(owner, title=TITLE)["id"]
    # indexedContent is plaintext by design (D5: the search index text); giving it explicitly keeps the service's
    # own indexing from copying the entry text into it, so the dump can only hold the marker if content leaked.
    append_ok(owner, conversation, f"{MARKER}-user", indexedContent="summary one")
    append_ok(owner, conversation, f"{MARKER}-ai", role="AI", indexedContent="summary two")
    app = client_for(OWNER, api_key=TEST_API_KEY)
    response = app.post(conv_path(conversation, "entries"),
                        {"channel": "context", "content": [{"note": f"{MARKER}-context", "deep": {"k": MARKER}}]},
                        format="json")
    assert response.status_code == 201, response.content
    fork = new_id()
    first = owner.get(conv_path(conversation, "entries")).json()["data"][1]["id"]
    # A conversation created by an append is titled from its first text (plaintext): give the fork a title first.
    append_ok(owner, fork, "fork title", forkedAtConversationId=conversation, forkedAtEntryId=first)
    append_ok(owner, fork, f"{MARKER}-fork", indexedContent="summary three")

    dump = pg_dump()
    assert b"COPY public.conversation_entries" in dump  # the dump really holds the table
    assert TITLE.encode() in dump  # titles are plaintext by design (D5): the dump is readable
    assert MARKER.encode() not in dump
    assert MARKER.encode().hex() not in dump.decode(errors="replace")  # bytea is dumped as hex
    assert sql("SELECT count(*) FROM conversation_entries") == [(5,)]
    # And the API still returns every content decrypted.
    texts = [e["content"][0]["text"] for e in owner.get(conv_path(conversation, "entries")).json()["data"]]
    assert texts == [f"{MARKER}-user", f"{MARKER}-ai"]


@pytest.mark.django_db
def test_content_column_holds_only_ciphertext(actor_client) -> None:
    owner = actor_client(OWNER)
    entry = append_ok(owner, new_id(), MARKER)
    (content,) = sql("SELECT content FROM conversation_entries WHERE id = %s", [entry["id"]])[0]
    content = bytes(content)
    assert MARKER.encode() not in content
    assert b'"role"' not in content and b"USER" not in content
    assert len(content) > len(MARKER)
    # Same plaintext, different rows: different ciphertexts (a fresh nonce per write).
    again = append_ok(owner, entry["conversationId"], MARKER)
    (other,) = sql("SELECT content FROM conversation_entries WHERE id = %s", [again["id"]])[0]
    assert bytes(other) != content


@pytest.mark.django_db
def test_ciphertext_moved_to_another_entry_does_not_decrypt(actor_client) -> None:
    owner = actor_client(OWNER)
    secret = append_ok(owner, new_id(), "the secret one")
    public = append_ok(owner, new_id(), "the public one")
    sql("UPDATE conversation_entries SET content = (SELECT content FROM conversation_entries WHERE id = %s) "
        "WHERE id = %s", [secret["id"], public["id"]])
    response = owner.get(conv_path(public["conversationId"], "entries"))
    # The page is served with the entry marked (issue 21 item 11), never with the moved plaintext.
    assert response.status_code == 200
    [entry] = response.json()["data"]
    assert (entry["content"], entry["contentError"]) == (None, "undecryptable")
    assert b"the secret one" not in response.content
    assert owner.get(conv_path(secret["conversationId"], "entries")).json()["data"][0]["content"][0]["text"] == \
        "the secret one"


@pytest.mark.django_db
def test_entry_content_never_reaches_the_logs(actor_client, caplog) -> None:
    owner = actor_client(OWNER)
    with caplog.at_level(logging.DEBUG):
        entry = append_ok(owner, new_id(), f"{MARKER} in an append")
        conversation = entry["conversationId"]
        owner.get(conv_path(conversation, "entries"))
        # Refused appends (bad item, oversized) carry the content in their bodies too.
        owner.post(conv_path(conversation, "entries"), {"content": [{"role": "USER", "text": MARKER, "x": 1}]},
                   format="json")
        owner.post(conv_path(conversation, "entries"), {"content": [{"role": "USER", "text": MARKER * 20_000}]},
                   format="json")
    assert caplog.records, "the requests were logged (access log), so the check below means something"
    for record in caplog.records:
        assert MARKER not in record.getMessage()
        assert MARKER not in repr(record.__dict__)
