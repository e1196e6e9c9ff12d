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
