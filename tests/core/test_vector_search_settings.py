"""apps.core.vectors.run_search: a search statement's planner and pgvector settings hold for that statement's
transaction only, travel with it in one round trip, and never let a cached generic plan replace per-call planning."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext

from apps.core.vectors import run_search

pytestmark = pytest.mark.django_db(transaction=True)

_SETTINGS = "current_setting('hnsw.ef_search', true), current_setting('enable_indexscan'), current_setting('plan_cache_mode')"
_READ = f"SELECT {_SETTINGS}, %s::int"


def _current() -> tuple:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {_SETTINGS}")
        return cursor.fetchone()


def test_the_settings_apply_to_the_statement_and_end_with_it() -> None:
    before = _current()
    assert before[1:] == ("on", "auto")
    rows = run_search(_READ, [7], {"hnsw.ef_search": "123", "enable_indexscan": "off"})
    assert rows == [("123", "off", "force_custom_plan", 7)]
    assert _current() == before


def test_a_failing_search_leaves_no_setting_behind() -> None:
    before = _current()
    with pytest.raises(DatabaseError):
        run_search("SELECT 1 / %s::int", [0], {"enable_indexscan": "off"})
    assert _current() == before


def test_settings_and_statement_are_logged_with_their_values() -> None:
    with CaptureQueriesContext(connection) as captured:
        run_search(_READ, [5], {"enable_indexscan": "off"})
    logged = [query["sql"] for query in captured.captured_queries]
    assert logged[-2] == "SELECT set_config('enable_indexscan', 'off', true), set_config('plan_cache_mode', 'force_custom_plan', true)"
    assert logged[-1].endswith("5::int")
