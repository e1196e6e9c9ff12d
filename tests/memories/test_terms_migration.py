"""Migration 0013 (the keyword index keyed by owner) on a store written before it: every active version's terms are
rebuilt with their owner key, and the words still find them."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from apps.memories import keyword_index
from tests.memories.conftest import put_ok, search

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE, AFTER = [("memories", "0012_memory_terms_rehash")], [("memories", "0013_memory_terms_owner")]


def migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def test_0013_gives_every_row_its_owner_key_and_the_words_still_match(client_for):
    bob, alice = client_for("bob"), client_for("alice")
    put_ok(bob, ["user", "bob", "notes"], "k1", {"t": 1}, index={"text": "the spare key is under the blue flowerpot"})
    put_ok(alice, ["user", "alice", "notes"], "k2", {"t": 2}, index={"text": "blue flowerpot on the balcony"})
    migrate(BEFORE)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM memory_terms")
        assert cursor.fetchone()[0] == 7  # bob: spare, key, blue, flowerpot; alice: blue, flowerpot, balcony
        cursor.execute("SELECT column_name FROM information_schema.columns WHERE table_name = 'memory_terms'")
        assert "owner_key" not in {row[0] for row in cursor.fetchall()}
    migrate(AFTER)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*), count(*) FILTER (WHERE t.owner_key = {keyword_index.owner_key_sql('m.namespace')}) "
            "FROM memory_terms t JOIN memories m ON m.id = t.memory_id"
        )
        assert cursor.fetchone() == (7, 7)
    for client, owner, key in ((bob, "bob", "k1"), (alice, "alice", "k2")):
        response = search(client, ["user", owner], query="blue flowerpot", search_type="fulltext")
        assert [item["key"] for item in response.json()["items"]] == [key]


def test_a_put_of_the_code_before_0013_still_writes_its_terms_with_their_owner_key(client_for):
    """During a deploy, a process still on the old code writes terms without the owner key, in the PUT's own
    statement (a CTE beside the version's INSERT); the trigger fills it from the version's namespace."""
    bob = client_for("bob")
    put_ok(bob, ["user", "bob", "notes"], "k1", {"t": 1}, index={"text": "marmalade"})
    with connection.cursor() as cursor:
        cursor.execute(
            "WITH version AS (INSERT INTO memories (id, namespace, key, value_ciphertext, attributes, indexed_content, "
            "created_at, state, index_status, index_attempts) SELECT gen_random_uuid(), ARRAY['user', 'bob', 'old'], "
            "'k2', value_ciphertext, attributes, indexed_content, now(), 'active', 'pending', 0 FROM memories "
            "WHERE key = 'k1' RETURNING id) "
            "INSERT INTO memory_terms (term, memory_id, tf, dl, key_id) SELECT t.term, version.id, t.tf, t.dl, t.key_id "
            "FROM version, memory_terms t JOIN memories m ON m.id = t.memory_id AND m.key = 'k1'"
        )
        cursor.execute(
            f"SELECT count(*), count(*) FILTER (WHERE t.owner_key = {keyword_index.owner_key_sql('m.namespace')}) "
            "FROM memory_terms t JOIN memories m ON m.id = t.memory_id"
        )
        assert cursor.fetchone() == (2, 2)
    response = search(bob, ["user", "bob"], query="marmalade", search_type="fulltext")
    assert sorted(item["key"] for item in response.json()["items"]) == ["k1", "k2"]
