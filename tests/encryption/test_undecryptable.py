"""Issue 21 item 11 (read side): a stored value the key ring cannot open (its key id missing after a botched rotation,
or a damaged row) never takes a page down. Lists answer 200 with the item's metadata and ``content: null,
contentError: "undecryptable"`` (entries) or ``value: null, value_error: "undecryptable"`` (memories), the other
items intact; a single-item read answers 500 ``undecryptable``. Operators get a log line and a metric naming the row
and key id, and /readyz names the key ids in use that the ring lacks.

The rows are spoiled in SQL, as an operator's mistake or a disk would: re-sealed under a key id the ring does not
hold (``gone-1``), or with one ciphertext byte flipped.
"""

from __future__ import annotations

import base64
import logging
from typing import Any

import pytest
from django.db import connection

from apps.encryption import crypto
from apps.memories.services import EVENT_VALUE_PURPOSE, VALUE_PURPOSE
from tests.conversations.support import ADMIN, OWNER, actor_client, append_ok, conv_path, create, new_id

__all__ = ["actor_client"]  # the fixture

MISSING_KID = "gone-1"
MISSING_KEY = base64.b64encode(b"\x07" * 32).decode()
ENTRY_PURPOSE = "conversation_entry.content"


def _sealed_under_missing_key(settings, plaintext: bytes, *, purpose: str, row_id: str) -> bytes:
    ring = settings.MEMORY_ENCRYPTION_KEYS
    settings.MEMORY_ENCRYPTION_KEYS = f"{MISSING_KID}:{MISSING_KEY}"
    try:
        return crypto.encrypt(plaintext, purpose=purpose, row_id=row_id)
    finally:
        settings.MEMORY_ENCRYPTION_KEYS = ring


def _flipped(blob: bytes) -> bytes:
    return blob[:-1] + bytes([blob[-1] ^ 1])


def _spoil(settings, how: str, table: str, column: str, row_id_sql: str, row_id: str, purpose: str, aad_row: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {table} WHERE {row_id_sql} = %s", [row_id])
        (blob,) = cursor.fetchone()
        if how == "missing_key":
            spoiled = _sealed_under_missing_key(settings, b'{"any": "thing"}', purpose=purpose, row_id=aad_row)
        else:
            spoiled = _flipped(bytes(blob))
        cursor.execute(f"UPDATE {table} SET {column} = %s WHERE {row_id_sql} = %s", [spoiled, row_id])


def spoil_entry(settings, entry: dict, how: str = "missing_key") -> None:
    _spoil(settings, how, "conversation_entries", "content", "id", entry["id"], ENTRY_PURPOSE,
           f"{entry['conversationId']}/{entry['id']}")


def spoil_memory(settings, memory_id: str, how: str = "missing_key") -> None:
    _spoil(settings, how, "memories", "value_ciphertext", "id", memory_id, VALUE_PURPOSE, memory_id)


def spoil_events(settings, memory_id: str, how: str = "missing_key") -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM memory_events WHERE memory_id = %s", [memory_id])
        event_ids = [str(row[0]) for row in cursor.fetchall()]
    assert event_ids
    for event_id in event_ids:
        _spoil(settings, how, "memory_events", "value_ciphertext", "id", event_id, EVENT_VALUE_PURPOSE, event_id)


def assert_marked(entry: dict) -> None:
    assert entry["content"] is None and entry["contentError"] == "undecryptable", entry
    assert entry["id"] and entry["createdAt"] and entry["userId"]  # the metadata is all there


def assert_intact(entry: dict, text: str) -> None:
    assert entry["content"] == [{"role": "USER", "text": text}], entry
    assert "contentError" not in entry


HOW = pytest.mark.parametrize("how", ["missing_key", "damaged"])


# --- Conversations --------------------------------------------------------------------------------------------


@pytest.mark.django_db
@HOW
def test_entries_pages_serve_the_other_entries_and_mark_the_undecryptable_one(actor_client, settings, how, caplog):
    owner, admin = actor_client(OWNER), actor_client("adam")
    conversation = create(owner, title="poison")["id"]
    entries = [append_ok(owner, conversation, text) for text in ("one", "two", "three")]
    spoil_entry(settings, entries[1], how)

    caplog.set_level(logging.ERROR, logger="apps.encryption.crypto")
    for client, path in ((owner, conv_path(conversation, "entries")), (admin, f"{ADMIN}/{conversation}/entries")):
        response = client.get(path)
        assert response.status_code == 200, response.content
        data = response.json()["data"]
        assert [entry["id"] for entry in data] == [entry["id"] for entry in entries]
        assert_intact(data[0], "one")
        assert_marked(data[1])
        assert_intact(data[2], "three")
        # Pages of one walk across the poisoned entry too.
        first = client.get(f"{path}?limit=1").json()
        second = client.get(f"{path}?limit=1&afterCursor={first['afterCursor']}")
        assert second.status_code == 200 and second.json()["data"][0]["contentError"] == "undecryptable"

    records = [r for r in caplog.records if r.getMessage() == "stored value cannot be decrypted"]
    assert records and {r.row_id for r in records} == {f"{conversation}/{entries[1]['id']}"}
    assert {r.key_id for r in records} == ({MISSING_KID} if how == "missing_key" else {crypto.primary_key_id()})
    assert {r.purpose for r in records} == {ENTRY_PURPOSE}
    assert all("USER" not in str(vars(r)) for r in records)  # never content


@pytest.mark.django_db
@HOW
def test_search_pages_serve_the_other_results(actor_client, settings, how):
    owner = actor_client(OWNER)
    first, second = create(owner, title="a")["id"], create(owner, title="b")["id"]
    good = append_ok(owner, first, "lisbon trip", indexedContent="lisbon trip planning")
    bad = append_ok(owner, second, "lisbon again", indexedContent="lisbon trip notes")
    spoil_entry(settings, bad, how)
    for path in ("/v1/conversations/search", "/v1/admin/conversations/search"):
        client = owner if path.startswith("/v1/conversations") else actor_client("adam")
        response = client.post(path, {"query": "lisbon", "searchType": "fulltext"}, format="json")
        assert response.status_code == 200, response.content
        results = {result["entryId"]: result for result in response.json()["data"]}
        assert set(results) == {good["id"], bad["id"]}
        assert_intact(results[good["id"]]["entry"], "lisbon trip")
        assert_marked(results[bad["id"]]["entry"])
        assert results[bad["id"]]["highlights"]  # the plaintext index text still serves the hit


@pytest.mark.django_db
@HOW
def test_unindexed_page_serves_the_other_entries(client_for, actor_client, settings, how):
    owner = actor_client(OWNER)
    conversation = new_id()
    entries = [append_ok(owner, conversation, text) for text in ("u-one", "u-two")]
    spoil_entry(settings, entries[0], how)
    indexer = client_for("idx", roles=("indexer",))
    response = indexer.get("/v1/conversations/unindexed?limit=200")
    assert response.status_code == 200, response.content
    data = response.json()["data"]
    mine = {item["entry"]["id"]: item["entry"] for item in data if item["conversationId"] == conversation}
    assert set(mine) == {entries[0]["id"], entries[1]["id"]}
    assert_marked(mine[entries[0]["id"]])
    assert_intact(mine[entries[1]["id"]], "u-two")


# --- Memories -------------------------------------------------------------------------------------------------


def _put(client, key: str, text: str) -> dict:
    body = {"namespace": ["user", "bob", "poison"], "key": key, "value": {"text": text}, "index": {"text": text}}
    response = client.put("/v1/memories", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()


@pytest.mark.django_db
@HOW
def test_memory_get_is_500_undecryptable_and_lists_mark_the_value(client_for, settings, how):
    from apps.memories import indexer

    bob = client_for("bob")
    good = _put(bob, "good", "coffee in the morning")
    bad = _put(bob, "bad", "coffee at night")
    indexer.run_cycle()
    spoil_memory(settings, bad["id"], how)
    spoil_events(settings, bad["id"], how)

    response = bob.get("/v1/memories?ns=user&ns=bob&ns=poison&key=bad")
    assert response.status_code == 500, response.content
    body = response.json()
    assert body["code"] == "undecryptable" and body["requestId"] == response["X-Request-ID"]
    assert bob.get("/v1/memories?ns=user&ns=bob&ns=poison&key=good").json()["value"] == {"text": "coffee in the morning"}

    def check(items: list[dict]) -> None:
        by_key = {item["key"]: item for item in items}
        assert set(by_key) == {"good", "bad"}
        assert by_key["good"]["value"] == {"text": "coffee in the morning"} and "value_error" not in by_key["good"]
        assert by_key["bad"]["value"] is None and by_key["bad"]["value_error"] == "undecryptable"

    for extra in ({}, {"query": "coffee"}):
        body = {"namespace_prefix": ["user", "bob", "poison"], **extra}
        response = bob.post("/v1/memories/search", body, format="json")
        assert response.status_code == 200, response.content
        check(response.json()["items"])
        assert {item["id"] for item in response.json()["items"]} == {good["id"], bad["id"]}
    response = bob.get("/v1/memories/events?ns=user&ns=bob&ns=poison&kinds=add")
    assert response.status_code == 200, response.content
    check(response.json()["events"])


# --- Attachments ----------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_attachment_under_a_missing_key_is_500_undecryptable_before_any_byte(client_for, settings, tmp_path):
    from django.core.files.uploadedfile import SimpleUploadedFile

    settings.ATTACHMENT_DIR = str(tmp_path / "attachments")
    settings.ATTACHMENT_STORAGE = "filesystem"
    bob = client_for("bob")
    response = bob.post(
        "/v1/attachments", {"file": SimpleUploadedFile("a.txt", b"attached words", content_type="text/plain")},
        format="multipart",
    )
    assert response.status_code == 201, response.content
    attachment = response.json()
    [blob] = [path for path in (tmp_path / "attachments").rglob("*") if path.is_file()]
    ring = settings.MEMORY_ENCRYPTION_KEYS
    settings.MEMORY_ENCRYPTION_KEYS = f"{MISSING_KID}:{MISSING_KEY}"
    try:
        sealed = crypto.seal_stream([b"attached words"], purpose="attachment.blob", row_id=attachment["id"])
        blob.write_bytes(b"".join(sealed))
    finally:
        settings.MEMORY_ENCRYPTION_KEYS = ring
    response = bob.get(attachment["href"])
    assert response.status_code == 500
    assert response.json()["code"] == "undecryptable"


# --- Operators: the metric and /readyz ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # the key id scan runs on its own connection: it sees committed rows
def test_readyz_names_the_missing_key_id_and_the_metric_counts_by_key(actor_client, api, settings):
    settings.ENCRYPTION_KEY_SCAN_INTERVAL_SECONDS = 0
    owner = actor_client(OWNER)
    conversation = create(owner, title="readyz")["id"]
    entry = append_ok(owner, conversation, "hello")
    before = api.get("/readyz").json()
    assert before["encryption_keys"]["missing"] == [], before
    assert crypto.primary_key_id() in before["encryption_keys"]["in_use"]

    spoil_entry(settings, entry)
    assert owner.get(conv_path(conversation, "entries")).status_code == 200
    body: dict[str, Any] = {}
    for _ in range(50):  # each probe starts a fresh scan (interval 0) and waits for it up to a second
        response = api.get("/readyz")
        body = response.json()
        info = body.get("encryption_keys") or body.get("details", {}).get("encryption_keys", {})
        if info.get("missing") == [MISSING_KID]:
            break
    else:
        pytest.fail(f"/readyz never named {MISSING_KID}: {body}")
    assert response.status_code == 200  # informational: the rows the ring opens are still served

    metrics = api.get("/metrics").content.decode()
    assert f'undecryptable_values_total{{key_id="{MISSING_KID}",purpose="{ENTRY_PURPOSE}"}}' in metrics
