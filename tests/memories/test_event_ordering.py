"""Events paginate without duplicates or gaps while writers commit concurrently (D3, D4)."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from apps.memories.models import MemoryEvent

WRITERS = 4
WRITES_PER_WRITER = 15


@pytest.mark.django_db(transaction=True)
def test_polling_reader_sees_every_event_once_under_concurrent_writes(client_for):
    writers_done = threading.Event()
    errors: list[str] = []

    def write(worker: int) -> None:
        client = client_for("bob")
        try:
            for index in range(WRITES_PER_WRITER):
                key = f"w{worker}-k{index % 5}"  # mixes adds and updates
                response = client.put(
                    "/v1/memories", {"namespace": ["user", "bob", "t"], "key": key, "value": {"i": index}}, format="json"
                )
                if response.status_code != 200:
                    errors.append(response.content.decode())
                if index % 4 == 3:
                    client.delete(f"/v1/memories?ns=user&ns=bob&ns=t&key={key}")
        finally:
            connections.close_all()

    seen: list[str] = []

    def read() -> None:
        client = client_for("bob")
        cursor = None
        try:
            while True:
                finished = writers_done.is_set()
                params = {"limit": 7, **({"after_cursor": cursor} if cursor else {})}
                response = client.get("/v1/memories/events", params)
                assert response.status_code == 200
                body = response.json()
                seen.extend(event["id"] for event in body["events"])
                cursor = body["after_cursor"]
                if finished and not body["events"]:
                    return
        finally:
            connections.close_all()

    reader = threading.Thread(target=read)
    reader.start()
    threads = [threading.Thread(target=write, args=(worker,)) for worker in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    writers_done.set()
    reader.join(timeout=60)

    assert not errors
    expected = [str(event_id) for event_id in MemoryEvent.objects.order_by("seq").values_list("id", flat=True)]
    assert len(expected) >= WRITERS * WRITES_PER_WRITER
    assert len(seen) == len(set(seen)), "an event was returned twice"
    assert seen == expected, "the reader missed events or saw them out of order"


@pytest.mark.django_db
def test_occurred_at_follows_sequence(client_for):
    bob = client_for("bob")
    for index in range(5):
        bob.put("/v1/memories", {"namespace": ["user", "bob"], "key": f"k{index}", "value": {}}, format="json")
    times = list(MemoryEvent.objects.order_by("seq").values_list("occurred_at", flat=True))
    assert times == sorted(times)
