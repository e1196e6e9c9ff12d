"""Attribute search, namespaces and the events page send their parameters apart from the SQL text (server-side
binding, apps.core.db.prepared.bound_cursor), unprepared, and still show in the query log with their values.

What PostgreSQL received is read back from pg_stat_activity, which shows each backend's last statement as sent:
``$1``, ``$2``... for a statement bound server-side, the values themselves for one quoted client-side."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.memories.conftest import EVENTS, NAMESPACES, prepared_statements, put_ok, search_items, url

pytestmark = pytest.mark.django_db

SECRET_SEGMENT = "segment-that-must-not-be-inlined"


def _last_statement_received() -> str:
    """The last statement PostgreSQL received on this thread's connection (the one the test client's requests
    use), read from another connection: a backend's own pg_stat_activity row shows the query reading it."""
    pid = connection.connection.info.backend_pid
    observer = connection.copy()
    try:
        with observer.cursor() as cursor:
            cursor.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid])
            return cursor.fetchone()[0]
    finally:
        observer.close()


def _assert_bound_server_side(statement: str, starts: str, *values: str) -> None:
    assert statement.lstrip().startswith(starts), statement
    assert "$1" in statement and "%s" not in statement, statement
    for value in values:
        assert value not in statement, (value, statement)
    assert statement not in prepared_statements()


@pytest.fixture
def stored(bob) -> None:
    put_ok(bob, ["user", "bob", SECRET_SEGMENT, "deep"], "k1", {"n": 1})
    put_ok(bob, ["user", "bob", "other"], "k2", {"n": 2})
    put_ok(bob, ["user", "bob", "other"], "k2", {"n": 3})


def test_attribute_search_is_bound_server_side(bob, stored) -> None:
    for _ in range(3):  # repeated: still never prepared (each call planned for its own prefix and filter)
        items = search_items(
            bob, ["user", "bob", SECRET_SEGMENT], filter={"sub": "bob", "namespace": {"in": ["user", "team"]}}
        )
        assert [(item["key"], item["value"]) for item in items] == [("k1", {"n": 1})]
    _assert_bound_server_side(_last_statement_received(), "SELECT m.id,", SECRET_SEGMENT, "bob", "team")


def test_namespaces_are_bound_server_side(bob, stored) -> None:
    response = bob.get(url(NAMESPACES, prefix=["user", "bob"], suffix=["deep"], max_depth=4))
    assert response.status_code == 200, response.content
    assert response.json() == {"namespaces": [["user", "bob", SECRET_SEGMENT, "deep"]]}
    _assert_bound_server_side(_last_statement_received(), "WITH RECURSIVE walk", "bob", "deep")


def test_events_page_is_bound_server_side(bob, stored) -> None:
    first = bob.get(url(EVENTS, limit=1)).json()
    now = timezone.now()
    response = bob.get(
        url(
            EVENTS,
            ns=["user", "bob", "other"],
            kinds="add,update",
            after=(now - timedelta(hours=1)).isoformat(),
            before=(now + timedelta(hours=1)).isoformat(),
            after_cursor=first["after_cursor"],
        )
    )
    assert response.status_code == 200, response.content
    assert [(event["kind"], event["value"]) for event in response.json()["events"]] == [
        ("add", {"n": 2}),
        ("update", {"n": 3}),
    ]
    _assert_bound_server_side(_last_statement_received(), "SELECT e.tx,", "bob", "other", "'add'")


def test_bound_statements_show_in_the_query_log_with_their_values(bob, stored) -> None:
    with CaptureQueriesContext(connection) as captured:
        assert search_items(bob, ["user", "bob", SECRET_SEGMENT])
    logged = [query["sql"] for query in captured.captured_queries if query["sql"].startswith("SELECT m.id,")]
    assert len(logged) == 1 and SECRET_SEGMENT in logged[0] and "%s" not in logged[0]
