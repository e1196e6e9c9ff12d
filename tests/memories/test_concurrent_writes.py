"""Any number of concurrent writers and deleters on one (namespace, key) all succeed (issue 7, item 1).

Real HTTP clients on their own threads race against the live server, each server thread on its own PostgreSQL
connection. Afterwards the address holds exactly one active version (none after a final delete), the last
committed write wins, and the event timeline reads as one consistent history.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
import requests
from django.utils import timezone

from apps.memories import services
from apps.memories.models import Memory
from tests.concurrency import run_concurrently

pytestmark = pytest.mark.django_db(transaction=True)

CLIENTS = 40
NAMESPACE = ["user", "bob", "race"]
KEY = "contended"
ADDRESS = {"ns": NAMESPACE, "key": KEY}


@pytest.fixture
def sessions() -> Iterator[list[requests.Session]]:
    """One HTTP client (its own connection) per racer."""
    made = [requests.Session() for _ in range(CLIENTS)]
    yield made
    for session in made:
        session.close()


def _put(session: requests.Session, bob_http, value: dict) -> requests.Response:
    base, headers = bob_http
    body = {"namespace": NAMESPACE, "key": KEY, "value": value}
    return session.put(f"{base}/v1/memories", json=body, headers=headers, timeout=60)


def _delete(session: requests.Session, bob_http) -> requests.Response:
    base, headers = bob_http
    return session.delete(f"{base}/v1/memories", params=ADDRESS, headers=headers, timeout=60)


def _timeline(bob_http) -> list[dict]:
    """Every event under the test namespace, in timeline order, paged through the API."""
    base, headers = bob_http
    events: list[dict] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"ns": NAMESPACE, "limit": 200, **({"after_cursor": cursor} if cursor else {})}
        response = requests.get(f"{base}/v1/memories/events", params=params, headers=headers, timeout=60)
        assert response.status_code == 200, response.text
        body = response.json()
        if not body["events"]:
            return events
        events.extend(body["events"])
        cursor = body["after_cursor"]


def _replay(events: list[dict]) -> tuple[bool, dict | None]:
    """Walk the timeline as a state machine; fails on any event that cannot follow the one before it.
    Returns (active at the end, the value of the last add/update)."""
    active, value = False, None
    for position, event in enumerate(events):
        kind = event["kind"]
        assert event["key"] == KEY
        if kind == "add":
            assert not active, f"event {position}: add while a record is active"
            active, value = True, event["value"]
        elif kind == "update":
            assert active, f"event {position}: update with no active record"
            value = event["value"]
        elif kind in ("delete", "expired"):
            assert active, f"event {position}: {kind} with no active record"
            active = False
        else:
            pytest.fail(f"event {position}: unexpected {kind}")
    return active, value


def _assert_final_state(bob_http, active: bool, value: dict | None) -> None:
    base, headers = bob_http
    response = requests.get(f"{base}/v1/memories", params=ADDRESS, headers=headers, timeout=60)
    stored = Memory.objects.filter(namespace=NAMESPACE, key=KEY, state="active")
    if active:
        assert response.status_code == 200, response.text
        assert response.json()["value"] == value, "the last committed write did not win"
        assert list(stored.values_list("id", flat=True)) == [uuid.UUID(response.json()["id"])]
    else:
        assert response.status_code == 404, response.text
        assert not stored.exists()


def test_racing_writers_on_a_new_address_all_succeed(bob_http, sessions):
    def write(index: int, session: requests.Session) -> tuple[int, str]:
        response = _put(session, bob_http, {"writer": index})
        return response.status_code, response.json().get("id", response.text)

    results = run_concurrently([partial(write, index, session) for index, session in enumerate(sessions)])

    assert Counter(status for status, _ in results) == {200: CLIENTS}, results
    events = _timeline(bob_http)
    assert [event["kind"] for event in events] == ["add"] + ["update"] * (CLIENTS - 1)
    assert sorted(event["value"]["writer"] for event in events) == list(range(CLIENTS)), "a write was lost"
    active, value = _replay(events)
    assert active
    _assert_final_state(bob_http, active, value)
    # Every write made its own version; each version but the last was superseded, in timeline order.
    versions = Memory.objects.filter(namespace=NAMESPACE, key=KEY).order_by("created_at")
    assert {str(version.id) for version in versions} == {version_id for _, version_id in results}
    assert [version.state for version in versions] == ["superseded"] * (CLIENTS - 1) + ["active"]
    # ...and the history is continuous: each version ends at the moment its successor begins, later than it began.
    for earlier, later in itertools.pairwise(versions):
        assert earlier.created_at < later.created_at
        assert earlier.ended_at == later.created_at


@pytest.mark.parametrize("final", ["put", "delete"])
def test_racing_writers_and_deleters_on_an_existing_address_keep_one_history(bob_http, sessions, final):
    with requests.Session() as session:
        assert _put(session, bob_http, {"writer": "initial"}).status_code == 200
    rounds = 3

    def write_or_delete(index: int, session: requests.Session) -> list[tuple[str, int]]:
        outcomes = []
        for round_ in range(rounds):
            if (index + round_) % 3 == 0:
                outcomes.append(("delete", _delete(session, bob_http).status_code))
            else:
                outcomes.append(("put", _put(session, bob_http, {"writer": index, "round": round_}).status_code))
        return outcomes

    racers = [partial(write_or_delete, index, session) for index, session in enumerate(sessions)]
    outcomes = [outcome for client in run_concurrently(racers) for outcome in client]
    # One last operation after the race decides the expected end state either way.
    with requests.Session() as session:
        last = _put(session, bob_http, {"writer": "final"}) if final == "put" else _delete(session, bob_http)
    outcomes.append((final, last.status_code))

    assert Counter(outcomes) == {
        ("put", 200): sum(op == "put" for op, _ in outcomes),
        ("delete", 204): sum(op == "delete" for op, _ in outcomes),
    }, Counter(outcomes)
    events = _timeline(bob_http)
    assert events[0]["kind"] == "add" and events[0]["value"] == {"writer": "initial"}
    puts = sum(op == "put" for op, _ in outcomes)
    # Each PUT is exactly one add or update; deletes of an already deleted record write nothing (D4).
    assert sum(event["kind"] in ("add", "update") for event in events) == puts + 1
    assert sum(event["kind"] == "delete" for event in events) <= sum(op == "delete" for op, _ in outcomes)
    active, value = _replay(events)
    assert active == (final == "put")
    if active:
        assert value == {"writer": "final"}
    _assert_final_state(bob_http, active, value)
    assert Memory.objects.filter(namespace=NAMESPACE, key=KEY).count() == puts + 1


def test_racing_deleters_delete_once(bob_http, sessions):
    with requests.Session() as session:
        assert _put(session, bob_http, {"writer": "initial"}).status_code == 200

    statuses = run_concurrently([lambda session=session: _delete(session, bob_http).status_code for session in sessions])

    assert Counter(statuses) == {204: CLIENTS}
    assert [event["kind"] for event in _timeline(bob_http)] == ["add", "delete"]
    _assert_final_state(bob_http, False, None)


def test_racing_writers_and_the_expiry_sweep_record_one_expiry(bob_http, sessions):
    """A record whose TTL has passed: writers and the sweep race to close it. Exactly one of them records the
    expiry, and the writers' first version starts a new life (an add), the rest update it."""
    with requests.Session() as session:
        assert _put(session, bob_http, {"writer": "initial"}).status_code == 200
    Memory.objects.filter(namespace=NAMESPACE, key=KEY, state="active").update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )

    def write_or_sweep(index: int, session: requests.Session) -> int | None:
        if index % 8 == 0:
            services.expire_due_memories()  # on this thread's own connection (closed by run_concurrently)
            return None
        return _put(session, bob_http, {"writer": index}).status_code

    racers = [partial(write_or_sweep, index, session) for index, session in enumerate(sessions)]
    statuses = [status for status in run_concurrently(racers) if status is not None]

    assert Counter(statuses) == {200: len(statuses)}
    events = _timeline(bob_http)
    kinds = [event["kind"] for event in events]
    assert kinds == ["add", "expired", "add"] + ["update"] * (len(statuses) - 1), kinds
    active, value = _replay(events)
    _assert_final_state(bob_http, active, value)


@pytest.fixture
def another_database() -> dict[str, Any]:
    """psycopg's connection parameters for another database of the same PostgreSQL server."""
    from django.db import connection

    params = dict(connection.get_connection_params())
    params["dbname"] = "postgres"
    for option in ("cursor_factory", "context", "prepare_threshold", "options"):
        params.pop(option, None)
    return params


@pytest.fixture
def open_write_in_another_database(another_database):
    """A transaction that has written (holds a transaction id) in another database of the same PostgreSQL server and
    stays open: a batch job of another application sharing the server, a pg_dump-era migration, a stuck session."""
    import psycopg

    with psycopg.connect(**another_database) as other:
        other.execute("SELECT pg_current_xact_id()")  # takes a transaction id, as any write does
        yield
        other.rollback()


def test_an_open_write_in_another_database_holds_up_no_event(bob_http, open_write_in_another_database):
    with requests.Session() as session:
        assert _put(session, bob_http, {"writer": "after the other database's transaction began"}).status_code == 200

    assert [event["kind"] for event in _timeline(bob_http)] == ["add"]


def test_a_transaction_of_another_database_ending_as_the_horizon_is_read_never_holds_it(another_database):
    """Each round, a transaction of another database takes its id; one here takes a later id and commits; then the
    other commits while this database's horizon is read over and over. The other never is the horizon: it used to
    count as running here when it ended between the horizon's snapshot and its look at pg_locks (one read in 60
    overlapping its commit), and the events page hid what was written here after it began, until the next poll.
    (A transaction of this database, such as the live server's, may still hold the horizon: it could write events.)"""
    import psycopg
    from django.db import connection

    from apps.memories import selectors

    reads, held = 0, []
    with psycopg.connect(**another_database) as other, connection.cursor() as cursor:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            (other_id,) = other.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
            cursor.execute("SELECT pg_current_xact_id()::text::bigint")  # autocommit: committed at once
            (written,) = cursor.fetchone()
            ending = threading.Thread(target=other.commit)
            ending.start()
            while ending.is_alive():
                reads += 1
                horizon = selectors.read_horizon(cursor).oldest_running
                if horizon == other_id:  # below ``written``: its event would be hidden
                    held.append((horizon, written))
            ending.join()
    assert reads > 300, reads  # enough reads overlapped a commit for the race to show
    assert held == [], f"{len(held)} of {reads} reads, e.g. {held[:3]}"
