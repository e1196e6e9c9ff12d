"""apps.retrieval.vectors: the HNSW index that several processes may try to create at the same moment."""

from __future__ import annotations

from functools import partial

import pytest
from django.db import connection

from apps.retrieval import vectors
from tests.concurrency import run_concurrently

pytestmark = pytest.mark.django_db(transaction=True)

INDEX = "memory_vectors_hnsw_7"  # a dimension no provider uses, so no other test has this index


def _indexes_named(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_indexes WHERE indexname = %s", [name])
        return cursor.fetchone()[0]


def test_32_sessions_creating_the_same_index_at_once_all_succeed_and_one_index_exists() -> None:
    # Each thread has its own database session, as concurrent `manage.py migrate` runs (a rolling deploy) do, so
    # only what PostgreSQL serialises keeps them apart. Five rounds: without
    # the lock, one round of 32 collided about two times in three.
    try:
        for _ in range(5):
            with connection.cursor() as cursor:
                cursor.execute(f"DROP INDEX IF EXISTS {INDEX}")
            # Any failure is re-raised; a session still waiting after 60 s is a TimeoutError.
            run_concurrently([partial(vectors.create_hnsw_index, "memory_vectors", INDEX, 7)] * 32, timeout=60)
            assert _indexes_named(INDEX) == 1
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP INDEX IF EXISTS {INDEX}")
