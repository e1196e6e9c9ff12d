"""TTL (D4): a record whose expires_at has passed is invisible at once; the sweep then marks it expired and writes
exactly one `expired` event. Time is simulated by moving expires_at into the past, never by sleeping."""

from __future__ import annotations

from datetime import timedelta

import pytest

from apps.memories import services, tasks
from apps.memories.models import Memory, MemoryEvent
from tests.memories.conftest import (
    delete,
    event_kinds,
    events,
    expire_now,
    get,
    namespaces,
    put_ok,
    search_items,
)

pytestmark = pytest.mark.django_db

NS = ["user", "bob", "ttl"]


def test_unexpired_ttl_record_is_visible(bob):
    put_ok(bob, NS, "k", ttl_seconds=60)

    assert get(bob, NS, "k").status_code == 200
    assert [i["key"] for i in search_items(bob, ["user", "bob"])] == ["k"]
    assert namespaces(bob) == [NS]
    assert services.expire_due_memories() == 0


def test_expired_record_is_hidden_before_the_sweep(bob, alice):
    put_ok(bob, NS, "k", ttl_seconds=60)
    put_ok(bob, ["user", "bob", "other"], "k2")

    expire_now(NS, "k")

    response = get(bob, NS, "k")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"
    assert [i["key"] for i in search_items(bob, ["user", "bob"])] == ["k2"]
    assert [i["key"] for i in search_items(alice, [])] == ["k2"]
    assert namespaces(bob) == [["user", "bob", "other"]]
    assert namespaces(alice, prefix=NS) == []
    # Nothing was swept yet: the row is still active and no expired event exists.
    assert Memory.objects.get(key="k").state == "active"
    assert event_kinds(bob, kinds="expired") == []


def test_sweep_marks_expired_and_writes_one_event(bob):
    written = put_ok(bob, NS, "k", {"v": 1}, ttl_seconds=60)
    put_ok(bob, NS, "keep", ttl_seconds=60)
    put_ok(bob, NS, "forever")
    expire_now(NS, "k")

    assert services.expire_due_memories() == 1

    expired = Memory.objects.get(id=written["id"])
    assert expired.state == "expired"
    assert expired.ended_at is not None
    [event] = events(bob, kinds="expired")["events"]
    assert event["kind"] == "expired"
    assert (event["namespace"], event["key"]) == (NS, "k")
    assert event["value"] is None
    assert event["attributes"] is None
    assert Memory.objects.filter(state="active").count() == 2


def test_second_sweep_writes_nothing(bob):
    put_ok(bob, NS, "k", ttl_seconds=60)
    expire_now(NS, "k")
    assert services.expire_due_memories() == 1
    before = MemoryEvent.objects.count()

    assert services.expire_due_memories() == 0
    assert MemoryEvent.objects.count() == before
    assert MemoryEvent.objects.filter(kind="expired").count() == 1


def test_celery_task_runs_the_sweep(bob):
    put_ok(bob, NS, "a", ttl_seconds=60)
    put_ok(bob, NS, "b", ttl_seconds=60)
    expire_now(NS, "a")
    expire_now(NS, "b")

    assert tasks.expire_memories() == 2
    assert tasks.expire_memories() == 0
    assert event_kinds(bob, kinds="expired") == [("expired", "a"), ("expired", "b")]


def test_sweep_handles_more_rows_than_one_batch(bob):
    for index in range(5):
        put_ok(bob, NS, f"k{index}", ttl_seconds=60)
    Memory.objects.filter(state="active").update(expires_at=Memory.objects.get(key="k0").created_at - timedelta(1))

    assert services.expire_due_memories(batch_size=2) == 5
    assert MemoryEvent.objects.filter(kind="expired").count() == 5


def test_expired_record_after_sweep_stays_hidden_and_events_show_the_lifecycle(bob):
    put_ok(bob, NS, "k", ttl_seconds=60)
    expire_now(NS, "k")
    services.expire_due_memories()

    assert get(bob, NS, "k").status_code == 404
    assert search_items(bob, ["user", "bob"]) == []
    assert namespaces(bob) == []
    assert event_kinds(bob) == [("add", "k"), ("expired", "k")]


def test_put_on_expired_unswept_key_is_an_add_after_an_expired_event(bob):
    first = put_ok(bob, NS, "k", {"v": 1}, ttl_seconds=60)
    expire_now(NS, "k")

    second = put_ok(bob, NS, "k", {"v": 2})

    assert second["id"] != first["id"]
    assert event_kinds(bob) == [("add", "k"), ("expired", "k"), ("add", "k")]
    assert Memory.objects.get(id=first["id"]).state == "expired"
    assert get(bob, NS, "k").json()["value"] == {"v": 2}
    # The sweep has nothing left to do for that key.
    assert services.expire_due_memories() == 0
    assert MemoryEvent.objects.filter(kind="expired").count() == 1


def test_delete_on_expired_unswept_key_records_expiry_not_delete(bob):
    put_ok(bob, NS, "k", ttl_seconds=60)
    expire_now(NS, "k")

    assert delete(bob, NS, "k").status_code == 204

    assert event_kinds(bob) == [("add", "k"), ("expired", "k")]
    assert services.expire_due_memories() == 0


def test_expiry_is_per_version(bob):
    put_ok(bob, NS, "k", {"v": 1}, ttl_seconds=60)
    put_ok(bob, NS, "k", {"v": 2})  # update without ttl: the new version never expires

    assert get(bob, NS, "k").json()["expires_at"] is None
    assert services.expire_due_memories() == 0
    assert get(bob, NS, "k").json()["value"] == {"v": 2}
