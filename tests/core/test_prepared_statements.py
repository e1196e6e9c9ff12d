"""Hot statements run prepared (apps.core.db.prepared): what a caller gets is unchanged, PostgreSQL keeps the
statement, the switch turns it off, and query logging and error translation still apply."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext

from apps.core.db.prepared import prepared_cursor
from apps.memories.selectors import GET_MEMORY_SQL
from tests.memories.conftest import get, put_ok

pytestmark = pytest.mark.django_db


def _prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def _get_statement_prepared() -> bool:
    return any(statement.startswith(GET_MEMORY_SQL.split(" WHERE")[0]) for statement in _prepared_statements())


def test_a_memory_get_runs_its_statement_prepared_and_answers_as_before(client_for) -> None:
    alice = client_for("alice")
    put_ok(alice, ["user", "alice", "p"], "k", {"n": 1})
    for _ in range(2):  # the second GET reuses the statement prepared by the first
        response = get(alice, ["user", "alice", "p"], "k")
        assert response.status_code == 200
        assert response.json()["value"] == {"n": 1}
    assert get(alice, ["user", "alice", "p"], "missing").status_code == 404
    assert _get_statement_prepared()


def test_the_switch_runs_the_same_statement_unprepared(client_for, settings) -> None:
    settings.DB_PREPARED_STATEMENTS = False
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # whatever an earlier test prepared on this connection (psycopg forgets it too)
    assert not _get_statement_prepared()
    alice = client_for("alice")
    put_ok(alice, ["user", "alice", "p"], "k", {"n": 2})
    assert get(alice, ["user", "alice", "p"], "k").json()["value"] == {"n": 2}
    assert not _get_statement_prepared()


def test_prepared_statements_show_in_the_query_log() -> None:
    with CaptureQueriesContext(connection) as captured, prepared_cursor() as cursor:
        cursor.execute("SELECT %s::int + 1", [41])
        assert cursor.fetchone() == (42,)
    assert captured.captured_queries[-1]["sql"] == "SELECT 41::int + 1"


def test_database_errors_are_django_errors() -> None:
    with pytest.raises(DatabaseError), prepared_cursor() as cursor:
        cursor.execute("SELECT 1 / %s::int", [0])
