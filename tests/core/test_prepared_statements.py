"""Hot statements run prepared (apps.core.db.prepared): what a caller gets is unchanged, PostgreSQL keeps the
statement, the switch turns it off, and query logging and error translation still apply."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from apps.core.db.prepared import bound_cursor, prepared_cursor, run_pipelined
from apps.memories.selectors import GET_MEMORY_SQL
from tests.memories.conftest import get, prepared_statements, put_ok

pytestmark = pytest.mark.django_db


def _get_statement_prepared() -> bool:
    return any(statement.startswith(GET_MEMORY_SQL.split(" WHERE")[0]) for statement in prepared_statements())


def _forget_prepared_statements() -> None:
    """Whatever an earlier test prepared on this connection (psycopg forgets it too)."""
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    assert not _get_statement_prepared()


def test_a_memory_get_runs_its_statement_prepared_and_answers_as_before(client_for) -> None:
    _forget_prepared_statements()  # so only these GETs can have prepared it
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
    _forget_prepared_statements()
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


# --- bound_cursor: server-side binding, never prepared ---------------------------------------------------------------


def test_bound_statements_are_never_prepared_and_show_in_the_query_log() -> None:
    with CaptureQueriesContext(connection) as captured:
        for _ in range(3):
            with bound_cursor() as cursor:
                cursor.execute("SELECT %s::int + 2, %s::text[]", [40, ["a", "b'c"]])
                assert cursor.fetchall() == [(42, ["a", "b'c"])]
    assert captured.captured_queries[-1]["sql"] == "SELECT 40::int + 2, '{a,b''c}'::text[]"
    assert not any(statement.startswith("SELECT $1::int + 2") for statement in prepared_statements())


def test_bound_statement_errors_are_django_errors() -> None:
    with pytest.raises(DatabaseError), bound_cursor() as cursor:
        cursor.execute("SELECT 1 / %s::int", [0])


def test_after_a_failed_statement_in_atomic_django_refuses_the_next_one() -> None:
    with transaction.atomic():
        # An inner block without a savepoint (as Model.save() uses) leaves the outer one failed.
        with pytest.raises(DatabaseError), transaction.atomic(savepoint=False), bound_cursor() as cursor:
            cursor.execute("SELECT 1 / %s::int", [0])
        for cursor_of in (bound_cursor, prepared_cursor):
            with pytest.raises(TransactionManagementError), cursor_of() as cursor:
                cursor.execute("SELECT %s::int", [1])
        transaction.set_rollback(True)


# --- run_pipelined: several statements, one round trip, one transaction --------------------------------------------

_MARK = "SELECT set_config('test.pipeline_mark', %(mark)s, true)"  # true: only until the transaction ends
_READ_MARK = "SELECT current_setting('test.pipeline_mark', true)"


@pytest.mark.django_db(transaction=True)
def test_pipelined_statements_are_one_transaction_outside_atomic() -> None:
    assert connection.get_autocommit()
    assert run_pipelined([_MARK, _READ_MARK], {"mark": "same transaction"}) == [("same transaction",)]
    assert run_pipelined([_READ_MARK], {}) in ([("",)], [(None,)])  # ended with the pipeline


@pytest.mark.django_db(transaction=True)
def test_a_failing_statement_rolls_back_the_ones_before_it() -> None:
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE pipeline_probe (n int)")
    try:
        with pytest.raises(DatabaseError):
            run_pipelined(["INSERT INTO pipeline_probe VALUES (%(n)s)", "SELECT 1 / (%(n)s - 1)"], {"n": 1})
        run_pipelined(["INSERT INTO pipeline_probe VALUES (%(n)s)", "SELECT 1 / (%(n)s - 1)"], {"n": 2})
        with connection.cursor() as cursor:
            cursor.execute("SELECT n FROM pipeline_probe")
            assert cursor.fetchall() == [(2,)]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE pipeline_probe")


def test_inside_atomic_they_join_the_callers_transaction() -> None:
    assert connection.in_atomic_block
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('test.pipeline_mark', 'outer', true)")
    assert run_pipelined([_READ_MARK], {}) == [("outer",)]


def test_pipelined_statements_run_prepared_and_logged(settings) -> None:
    with CaptureQueriesContext(connection) as captured:
        assert run_pipelined(["SELECT %(n)s::int + 1", "SELECT %(n)s::int + 2"], {"n": 40}) == [(42,)]
    assert [query["sql"] for query in captured.captured_queries[-2:]] == ["SELECT 40::int + 1", "SELECT 40::int + 2"]
    prepared = prepared_statements()
    assert "SELECT $1::int + 1" in prepared
    assert "SELECT $1::int + 2" in prepared
    settings.DB_PREPARED_STATEMENTS = False
    assert run_pipelined(["SELECT %(n)s::int + 3"], {"n": 40}) == [(43,)]
    assert "SELECT $1::int + 3" not in prepared_statements()
