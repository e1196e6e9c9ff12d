"""The event timeline under concurrent writers (D3, D4, issue 21.24): writers of different addresses and the expiry
sweep share no lock, yet a polling reader sees every event once, in the timeline's order, and each address's
events read as its history."""

from __future__ import annotations

import threading
import uuid
from collections import defaultdict
from datetime import timedelta
from functools import partial

import pytest
import requests
from django.db import connection, connections, transaction
from django.utils import timezone

from apps.identity.principal import Principal
from apps.memories import services
from apps.memories.models import Memory, MemoryEvent
from tests.concurrency import run_concurrently

WRITERS = 32
WRITES_PER_WRITER = 6
NS = ["user", "bob", "t"]


def _page(bob_http, cursor: str | None, limit: int = 7) -> dict:
    base, headers = bob_http
    params = {"limit": limit, **({"after_cursor": cursor} if cursor else {})}
    response = requests.get(f"{base}/v1/memories/events", params=params, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _timeline_order() -> list[str]:
    return [str(i) for i in MemoryEvent.objects.order_by("tx", "seq").values_list("id", flat=True)]


def _assert_each_address_reads_as_a_history(events: list[dict]) -> None:
    """Each address's events, in timeline order, are a possible history: add only when nothing is active, update,
    delete and expiry only when something is."""
    active: dict[tuple, bool] = defaultdict(bool)
    for position, event in enumerate(events):
        address = (tuple(event["namespace"]), event["key"])
        assert active[address] == (event["kind"] != "add"), f"event {position}: {event['kind']} of {address}"
        active[address] = event["kind"] in ("add", "update")


@pytest.mark.django_db(transaction=True)
def test_polling_reader_sees_every_event_once_under_concurrent_writers(bob_http):
    base, headers = bob_http
    writers_done = threading.Event()
    seen: list[dict] = []
    failures: list[BaseException] = []

    def read() -> None:
        cursor = None
        try:
            while True:
                finished = writers_done.is_set()
                body = _page(bob_http, cursor)
                seen.extend(body["events"])
                assert body["after_cursor"]  # never null, even on an empty page (issue 21.17)
                cursor = body["after_cursor"]
                if finished and not body["events"]:
                    return
        except BaseException as error:  # reported by the main thread
            failures.append(error)

    def write(index: int) -> list[int]:
        statuses = []
        with requests.Session() as session:  # one client, one connection
            for round_ in range(WRITES_PER_WRITER):
                # Own keys (adds and updates) and one key every writer contends for.
                key = "shared" if round_ % 3 == 0 else f"w{index}-k{round_ % 2}"
                body = {"namespace": NS, "key": key, "value": {"writer": index, "round": round_}}
                statuses.append(session.put(f"{base}/v1/memories", json=body, headers=headers, timeout=60).status_code)
                if round_ % 4 == 3:
                    params = {"ns": NS, "key": key}
                    response = session.delete(f"{base}/v1/memories", params=params, headers=headers, timeout=60)
                    statuses.append(response.status_code)
        return statuses

    reader = threading.Thread(target=read)
    reader.start()
    try:
        statuses = [status for client in run_concurrently([partial(write, index) for index in range(WRITERS)])
                    for status in client]
    finally:
        writers_done.set()
        reader.join(timeout=120)
    assert not reader.is_alive() and not failures, failures
    assert set(statuses) <= {200, 204}, statuses

    ids = [event["id"] for event in seen]
    assert len(ids) == len(set(ids)), "an event was returned twice"
    expected = _timeline_order()
    assert len(expected) >= WRITERS * WRITES_PER_WRITER
    assert ids == expected, "the reader missed events or saw them out of order"
    _assert_each_address_reads_as_a_history(seen)


@pytest.mark.django_db(transaction=True)
def test_an_open_write_holds_up_neither_other_addresses_nor_the_sweep_and_is_never_skipped(bob_http):
    """Before issue 21.24 one lock, held by every memory write to its commit, ordered the timeline: a write still
    open held up every other write and the sweep. Now they commit, but a reader does not pass the open write: its
    event, committing last with the oldest transaction id, is read before theirs.

    The open write replaces a value of the same size: a write that changes bob's stored totals (a new memory, a
    size change) holds bob's quota rows (apps.limits) until it commits, and bob's next such write waits for it, by
    design (no concurrent writer may overshoot a quota). One that leaves them as they are takes no lock but its
    address's."""
    base, headers = bob_http
    bob = Principal(user_id="bob", client_id=None, roles=("user",))
    services.put_memory(bob, namespace=NS, key="due", value={"v": 0})
    services.put_memory(bob, namespace=NS, key="slow", value={"v": 0})
    Memory.objects.filter(key="due").update(expires_at=timezone.now() - timedelta(seconds=1))
    start = _page(bob_http, None, limit=200)
    assert [e["key"] for e in start["events"]] == ["due", "slow"]

    written, release = threading.Event(), threading.Event()

    def open_write() -> None:
        try:
            with transaction.atomic():
                services.put_memory(bob, namespace=NS, key="slow", value={"v": 1})
                written.set()
                release.wait(timeout=60)
        finally:
            connections.close_all()

    writer = threading.Thread(target=open_write)
    writer.start()
    try:
        assert written.wait(timeout=30)
        # Another address commits at once (it waited for the open write's commit before) ...
        body = {"namespace": NS, "key": "quick", "value": {"v": 2}}
        response = requests.put(f"{base}/v1/memories", json=body, headers=headers, timeout=10)
        assert response.status_code == 200, response.text
        # ... and so does the sweep (it too took the timeline's lock); it must not wait a moment.
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '5s'")
        assert services.expire_due_memories() == 1
        # Both have committed, after the open write began: a reader waits for it rather than pass it.
        held = _page(bob_http, start["after_cursor"], limit=200)
        assert held["events"] == [] and held["after_cursor"]
    finally:
        release.set()
        writer.join(timeout=60)
    page = _page(bob_http, held["after_cursor"], limit=200)
    assert [(e["kind"], e["key"]) for e in page["events"]] == [("update", "slow"), ("add", "quick"), ("expired", "due")]
    assert [e["id"] for e in start["events"] + page["events"]] == _timeline_order()
    assert _page(bob_http, page["after_cursor"])["events"] == []


@pytest.mark.django_db
def test_occurred_at_follows_the_timeline_for_sequential_writes(client_for):
    bob = client_for("bob")
    for index in range(5):
        bob.put("/v1/memories", {"namespace": ["user", "bob"], "key": f"k{index}", "value": {}}, format="json")
    times = list(MemoryEvent.objects.order_by("tx", "seq").values_list("occurred_at", flat=True))
    assert times == sorted(times)


def test_event_cursors_carry_the_position_and_nothing_else_decodes():
    from apps.core import errors, pagination
    from apps.memories import selectors

    assert selectors.decode_event_cursor(selectors.encode_event_cursor((7, 3))) == (7, 3)
    for forged in (
        pagination.encode_cursor(selectors.EVENTS_CURSOR, 7, uuid.uuid4()),  # an id that is no sequence number
        pagination.encode_cursor(selectors.EVENTS_CURSOR, 7, "-3"),
        pagination.encode_cursor(selectors.EVENTS_CURSOR, 7, "1" * 20),
        pagination.encode_cursor("conversations", 7, 3),
    ):
        with pytest.raises(errors.ApiError):
            selectors.decode_event_cursor(forged)
