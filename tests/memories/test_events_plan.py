"""The events page's plan after a workload of updates and deletes (issue 23): EXPLAIN, not a clock.

The page for a user's subtree must be an ordered index walk that stops after the page's rows, whatever kinds it
asks for and whether or not the statistics have caught up with the writes: before migration 0004 its plan flipped
after updates and deletes from a 1.4 ms walk to a GIN bitmap reading all of the user's later events (35-64 ms), and
a page of a rare kind (``kinds=delete``) walked the user's whole timeline to find its 50 rows. The rows each plan
reads are counted from EXPLAIN ANALYZE, so "stops after the page" is checked exactly, not timed.

The timeline is generated in SQL in the shape the writes leave it (a user's adds, then updates and deletes of the
same keys, other users' events in between); the statistics are those of ANALYZE after the adds ("stale", as
autovacuum leaves them between runs) and after the whole workload.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from apps.identity.principal import Principal
from apps.memories import selectors

pytestmark = pytest.mark.django_db

LIMIT = 50
ADDS, UPDATES, DELETES = 6000, 7000, 3000  # bob's: 10k updates and deletes after the adds
OTHER_USERS, OTHER_EVENTS = 20, 150  # per other user, in each phase


class Timeline:
    """Generated events, each as if written by its own transaction that has ended: ``tx`` grows with the order of
    insertion and stays below the horizon read first, so a reader that has written nothing sees all of them."""

    TOTAL = ADDS + UPDATES + DELETES + 3 * OTHER_USERS * OTHER_EVENTS

    def __init__(self) -> None:
        with connection.cursor() as cursor:
            # As a reader that has written nothing sees it (the test's own transaction may have written).
            self.horizon = selectors.Horizon(selectors.read_horizon(cursor).oldest_running)
        self.written = 0

    def insert(self, owner: str, kind: str, count: int) -> None:
        """``count`` events of one kind for ``owner``, over 50 namespaces of depth 3-4 under ["user", owner]."""
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO memory_events (id, memory_id, namespace, key, kind, occurred_at, value_ciphertext, "
                "attributes, tx) "
                "SELECT gen_random_uuid(), gen_random_uuid(), "
                "CASE WHEN g %% 10 = 0 THEN ARRAY['user', %(owner)s, 'area-' || g %% 5] "
                "ELSE ARRAY['user', %(owner)s, 'area-' || g %% 5, 'topic-' || g %% 9] END, "
                "'k' || g, %(kind)s, clock_timestamp(), NULL, "
                "jsonb_build_object('namespace', 'user', 'sub', %(owner)s), "
                "1 + (%(written)s + g)::bigint * (%(horizon)s - 2) / %(total)s "
                "FROM generate_series(1, %(count)s) AS g",
                {"owner": owner, "kind": kind, "count": count, "written": self.written,
                 "horizon": self.horizon.oldest_running, "total": self.TOTAL},
            )
        self.written += count

    def others(self, kind: str) -> None:
        for index in range(OTHER_USERS):
            self.insert(f"other{index:02d}", kind, OTHER_EVENTS)


def _analyze() -> None:
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE memory_events")


def _explain(sql: str, params: list[Any]) -> dict:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    return (plan[0] if isinstance(plan, list) else plan)["Plan"]


def _nodes(node: dict, parent: dict | None = None) -> list[tuple[dict, dict | None]]:
    found = [(node, parent)]
    for child in node.get("Plans", []):
        found += _nodes(child, node)
    return found


def _rows(sql: str, params: list[Any]) -> list[tuple[int, int]]:
    """The (tx, seq) position of each row."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [(row[0], row[1]) for row in cursor.fetchall()]


BOB = Principal(user_id="bob", client_id=None, roles=("user",), raw_claims={"sub": "bob"})

PAGES = {
    "first page": {},
    "kinds=add,update": {"kinds": ["add", "update"]},
    "kinds=update": {"kinds": ["update"]},
    "kinds=delete": {"kinds": ["delete"]},
    "kinds=delete,expired": {"kinds": ["delete", "expired"]},
}


def _assert_index_walks(label: str, plan: dict, kinds: list[str] | None) -> None:
    """Only ordered walks on the owner's indexes, each stopped by a Limit after at most one page of rows."""
    walks = [(node, parent) for node, parent in _nodes(plan) if node["Node Type"].startswith("Index")]
    assert walks, (label, plan)
    for node, parent in walks:
        read = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
        assert read <= LIMIT, (label, f"the walk read {read} rows for a page of {LIMIT}")
        # Either owner index: before the first update, a page of adds is one page on either.
        assert node["Index Name"] in ("memory_events_owner_timeline", "memory_events_kind_timeline"), (label, node)
        assert parent is not None and parent["Node Type"] == "Limit", (label, parent)
    for node, _parent in _nodes(plan):
        assert node["Node Type"] not in ("Seq Scan", "Bitmap Heap Scan", "Bitmap Index Scan"), (label, node)
        if node["Node Type"] == "Sort":  # only the merge of the per-kind walks: at most one page from each
            assert kinds and node["Actual Rows"] <= LIMIT * len(kinds), (label, node)


def _check_pages(state: str, timeline: Timeline) -> None:
    scope = selectors.scope_for(BOB, [], None)
    positions = _rows(
        "SELECT tx, seq FROM memory_events WHERE namespace[1:2] = ARRAY['user', 'bob'] ORDER BY tx, seq", []
    )
    cursors = {"no cursor": None, "middle": positions[len(positions) // 2], "near the end": positions[-20]}
    for page, filters in PAGES.items():
        for where, position in cursors.items():
            label = f"{state}, {page}, {where}"
            sql, params = selectors.events_query(
                scope, horizon=timeline.horizon, after_position=position, limit=LIMIT, **filters
            )
            _assert_index_walks(label, _explain(sql, params), filters.get("kinds"))
            # The same page as the plain statement (any plan): the walks must not change what the page holds.
            kinds = filters.get("kinds") or ["add", "update", "delete", "expired"]
            assert _rows(sql, params) == _rows(
                "SELECT tx, seq FROM memory_events WHERE namespace[1:2] = ARRAY['user', 'bob'] "
                "AND kind = ANY(%s) AND (tx, seq) > (%s, %s) ORDER BY tx, seq LIMIT %s",
                [kinds, *(position or (0, 0)), LIMIT],
            ), label


@pytest.mark.slow
def test_events_page_walks_the_owner_index_after_updates_and_deletes() -> None:
    timeline = Timeline()
    timeline.insert("bob", "add", ADDS)
    timeline.others("add")
    _analyze()  # the statistics autovacuum left after the adds
    timeline.insert("bob", "update", UPDATES)
    timeline.others("update")
    timeline.insert("bob", "delete", DELETES)
    timeline.others("delete")
    _check_pages("stale statistics", timeline)
    _analyze()
    _check_pages("fresh statistics", timeline)


def test_the_namespace_gin_index_of_events_keeps_no_pending_list() -> None:
    """A GIN index with fastupdate collects new entries in an unsorted pending list that every scan reads in full
    until VACUUM merges it: after 10k events a deeper prefix's page took 3-13 ms instead of 0.3-1.3 ms. Events are
    appended one per write, so they go straight into the index."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")  # rolled back with the test
    Timeline().insert("bob", "add", 500)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pending_pages, pending_tuples FROM pgstatginindex('memory_events_ns_gin')")
        assert cursor.fetchone() == (0, 0)
