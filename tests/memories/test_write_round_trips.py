"""How many times a memory write (and a semantic search) waits for PostgreSQL, counted from the wire (issue 23: "a PUT
makes 7 round trips and compiles 4 ORM statements"; the goal is at most 3, with precompiled statements as the GET has).

libpq traces every protocol message of the request's connection: a round trip is one ReadyForQuery from the
server (the client sent a Sync or a simple Query and waited for it), a statement planned afresh is a Parse. Counting
is deterministic, unlike timing; bench/memories.py measures what the round trips cost.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections import Counter
from collections.abc import Iterator

import pytest
from django.db import connection
from psycopg import pq

from apps.memories import config
from tests.conftest import TEST_API_KEY
from tests.memories.conftest import MEMORIES, put_ok, url

pytestmark = pytest.mark.django_db

NAMESPACE = ["user", "bob", "round-trips"]


@contextlib.contextmanager
def wire() -> Iterator[Counter]:
    """Counts of the protocol messages on this thread's connection (the test client's) inside the block, by
    direction and type: ``("B", "ReadyForQuery")``, ``("F", "Parse")``, ``("F", "Query")``..."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    counts: Counter = Counter()
    descriptor, path = tempfile.mkstemp(prefix="libpq-trace-")
    try:
        pgconn.trace(descriptor)
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield counts
        finally:
            pgconn.untrace()
        with open(path) as trace:
            for line in trace:
                fields = line.split("\t")
                if len(fields) >= 3:
                    counts[fields[0], fields[2].strip()] += 1
    finally:
        os.close(descriptor)
        os.unlink(path)


def round_trips(counts: Counter) -> int:
    return counts["B", "ReadyForQuery"]


@pytest.fixture
def warm(bob) -> None:
    """Each statement's first use on a connection prepares it, and the settings cache loads once: both before."""
    put_ok(bob, NAMESPACE, "warm", {"n": 0})
    put_ok(bob, NAMESPACE, "warm", {"n": 1})
    assert bob.delete(url(MEMORIES, ns=NAMESPACE, key="warm")).status_code == 204


def test_a_put_or_delete_is_one_prepared_round_trip(bob, warm) -> None:
    def writes(key: str) -> dict:
        return {
            "PUT add": lambda: put_ok(bob, NAMESPACE, key, {"n": 1}),
            "PUT update": lambda: put_ok(bob, NAMESPACE, key, {"n": 2}, ttl_seconds=60),
            "PUT with index text": lambda: put_ok(bob, NAMESPACE, key, {"n": 3}, index={"text": "bob likes tea"}),
            "DELETE": lambda: bob.delete(url(MEMORIES, ns=NAMESPACE, key=key)),
            "DELETE of nothing": lambda: bob.delete(url(MEMORIES, ns=NAMESPACE, key=key)),
        }

    for write in writes("first").values():  # each parameter-type variant is prepared on its first use
        write()
    for label, write in writes("second").items():
        with wire() as counts:
            write()
        assert round_trips(counts) == 1, (label, counts)
        # Prepared: bound and executed by name, never parsed (nor planned) again, no ORM statement as text.
        assert counts["F", "Parse"] == 0 and counts["F", "Query"] == 0, (label, counts)


def test_a_put_with_an_api_key_and_a_cold_settings_cache_takes_at_most_three_round_trips(client_for, warm) -> None:
    """The worst case of a PUT: the API key looked up (D2, once per request) and the operator settings read again
    (max_depth, once per SERVICE_SETTINGS_CACHE_SECONDS per process)."""
    with_key = client_for("bob", api_key=TEST_API_KEY)
    put_ok(with_key, NAMESPACE, "first", {"n": 0})  # the key's last_used_at, recorded at most once a minute
    with wire() as counts:
        put_ok(with_key, NAMESPACE, "k", {"n": 1})
    assert round_trips(counts) == 2, counts
    config.clear_cache()
    with wire() as counts:
        put_ok(with_key, NAMESPACE, "k", {"n": 2})
    assert round_trips(counts) <= 3, counts


@pytest.mark.parametrize("plan", ["exact", "hnsw"])
def test_a_semantic_search_sets_its_planner_settings_in_one_round_trip(bob, warm, settings, plan) -> None:
    """The search's SET LOCALs (parallel workers, join methods, pgvector's ef_search and iterative scan) go in one
    statement: each had been a round trip of its own, three or four per search."""
    from apps.memories import indexer

    settings.MEMORY_VECTOR_EXACT_SCAN_THRESHOLD = 2000 if plan == "exact" else 0
    put_ok(bob, NAMESPACE, "tea", {"n": 1}, index={"text": "bob likes green tea"})
    assert indexer.run_cycle().indexed == 1
    if plan == "hnsw":
        # The HNSW graph still holds the vectors of earlier tests' rolled-back transactions (nothing vacuums a test
        # database), and a walk through thousands of them can end before it reaches this one vector. Counting round
        # trips needs the one vector found: rebuild the graph from the live rows (allowed inside a transaction).
        from apps.memories import vector_index
        from apps.retrieval.embeddings import get_provider

        with connection.cursor() as cursor:
            cursor.execute(f"REINDEX INDEX {vector_index.index_name(int(get_provider().dimension))}")
    body = {"namespace_prefix": NAMESPACE, "query": "green tea", "search_type": "semantic", "limit": 5}

    def search() -> list:
        response = bob.post("/v1/memories/search", body, format="json")
        assert response.status_code == 200, response.content
        return response.json()["items"]

    assert [item["key"] for item in search()] == ["tea"]  # prepares the statements
    with wire() as counts:
        assert [item["key"] for item in search()] == ["tea"]
    # The versions waiting for the indexer (apps.memories.fresh, read your writes); BEGIN, the settings, the ranking
    # query, COMMIT; the fetch of the memories; (exact) the scope-size probe. Before: 8 under either plan.
    assert round_trips(counts) <= {"exact": 7, "hnsw": 6}[plan], counts
