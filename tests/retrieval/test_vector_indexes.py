"""The HNSW indexes are made by ``manage.py migrate``, never on the request path (issue 21.23): the service may run
as a database role with DML rights only, and semantic search (memories and conversations) and both indexers must
work under it, index or no index."""

from __future__ import annotations

import re

import pytest
from django.core.management.sql import emit_post_migrate_signal
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.conversations import indexer as conversation_indexer
from apps.conversations import vector_index as conversation_vectors
from apps.memories import indexer as memory_indexer
from apps.memories import vector_index as memory_vectors
from apps.retrieval import vectors
from apps.retrieval.embeddings import get_provider
from tests.conversations.support import append_ok, new_id

pytestmark = pytest.mark.django_db

ROLE = "memory_service_dml_only"
DDL = re.compile(r"^\s*(CREATE|ALTER|DROP|GRANT|REVOKE|TRUNCATE|COMMENT)\b", re.IGNORECASE)


def _index_names() -> list[str]:
    dimension = get_provider().dimension
    return [memory_vectors.index_name(dimension), conversation_vectors.index_name(dimension)]


def _existing(names: list[str]) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE indexname = ANY(%s) ORDER BY indexname", [names])
        return [row[0] for row in cursor.fetchall()]


def _drop_indexes() -> None:
    with connection.cursor() as cursor:
        for name in _index_names():
            cursor.execute(f"DROP INDEX IF EXISTS {name}")  # undone with the test's transaction
    vectors.forget_checked()


def _act_as_dml_only_role() -> None:
    """From here to the end of the test's transaction, this connection is a role that may read and write rows but
    owns nothing: any CREATE INDEX fails with "must be owner of table" (the role, too, goes with the rollback)."""
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {ROLE} NOLOGIN")
        cursor.execute(f"GRANT USAGE ON SCHEMA public TO {ROLE}")
        cursor.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {ROLE}")
        cursor.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {ROLE}")
        cursor.execute(f"SET LOCAL ROLE {ROLE}")


@pytest.mark.parametrize("threshold", [2000, 0], ids=["exact", "hnsw"])
def test_search_and_indexing_run_under_a_role_without_ddl_rights(client_for, settings, threshold):
    settings.MEMORY_VECTOR_EXACT_SCAN_THRESHOLD = threshold
    bob = client_for("bob")
    _drop_indexes()
    _act_as_dml_only_role()
    with CaptureQueriesContext(connection) as queries:
        response = bob.put(
            "/v1/memories",
            {"namespace": ["user", "bob"], "key": "k", "value": {}, "index": {"text": "granite quarry"}},
            format="json",
        )
        assert response.status_code == 200, response.content
        conversation = new_id()
        append_ok(bob, conversation, "granite quarry by the lake")
        assert memory_indexer.run_cycle().indexed == 1
        assert conversation_indexer.run_cycle().indexed >= 1

        response = bob.post("/v1/memories/search", {"namespace_prefix": [], "query": "granite quarry"}, format="json")
        assert response.status_code == 200, response.content
        assert [item["key"] for item in response.json()["items"]] == ["k"]
        response = bob.post(
            "/v1/conversations/search", {"query": "granite quarry", "searchType": "semantic"}, format="json"
        )
        assert response.status_code == 200, response.content
        assert [item["conversationId"] for item in response.json()["data"]] == [str(conversation)]
    assert [q["sql"] for q in queries.captured_queries if DDL.match(q["sql"])] == []


def test_migrate_creates_the_indexes_of_the_configured_provider():
    _drop_indexes()
    assert _existing(_index_names()) == []
    emit_post_migrate_signal(verbosity=0, interactive=False, db="default")
    assert _existing(_index_names()) == sorted(_index_names())
    emit_post_migrate_signal(verbosity=0, interactive=False, db="default")  # again: nothing to do
    assert memory_vectors.check_index(get_provider().dimension)
