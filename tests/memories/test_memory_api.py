"""The memory endpoints' success shapes and the add/update/delete lifecycle with its event timeline."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from apps.memories.models import Memory, MemoryEvent
from tests.memories.conftest import (
    EVENT_FIELDS,
    ISO_Z,
    READ_FIELDS,
    SEARCH_FIELDS,
    WRITE_FIELDS,
    delete,
    event_kinds,
    events,
    get,
    namespaces,
    put,
    put_ok,
    search,
    search_items,
)

pytestmark = pytest.mark.django_db

NS = ["user", "bob", "notes"]
BOB_ATTRS = {"namespace": "user", "sub": "bob"}


def parse(timestamp: str) -> datetime:
    assert ISO_Z.match(timestamp), timestamp
    return datetime.fromisoformat(timestamp)


# --- PUT / GET / DELETE --------------------------------------------------------------------------------------------


def test_put_answers_200_with_the_record_but_not_the_value(bob):
    response = put(bob, NS, "k1", {"text": "hello", "n": 1})

    assert response.status_code == 200
    body = response.json()
    assert set(body) == WRITE_FIELDS
    uuid.UUID(body["id"])
    assert body["namespace"] == NS
    assert body["key"] == "k1"
    assert body["attributes"] == BOB_ATTRS
    assert body["expires_at"] is None
    parse(body["created_at"])
    assert "hello" not in response.content.decode()


def test_get_returns_the_record_with_its_value(bob):
    written = put_ok(bob, NS, "k1", {"text": "hello", "nested": {"a": [1, 2, None]}})

    response = get(bob, NS, "k1")

    assert response.status_code == 200
    body = response.json()
    assert set(body) == READ_FIELDS
    assert body == {**written, "value": {"text": "hello", "nested": {"a": [1, 2, None]}}}


def test_value_is_not_stored_in_plaintext(bob):
    put_ok(bob, NS, "k1", {"secret": "plaintext-marker-123"})

    stored = Memory.objects.get(key="k1")
    assert b"plaintext-marker-123" not in bytes(stored.value_ciphertext)
    assert b"plaintext-marker-123" not in bytes(MemoryEvent.objects.get(key="k1").value_ciphertext)


def test_every_write_assigns_a_new_id_and_replaces_the_value(bob):
    first = put_ok(bob, NS, "k1", {"v": 1})
    second = put_ok(bob, NS, "k1", {"v": 2})

    assert first["id"] != second["id"]
    assert parse(second["created_at"]) >= parse(first["created_at"])
    body = get(bob, NS, "k1").json()
    assert body["id"] == second["id"]
    assert body["value"] == {"v": 2}
    assert Memory.objects.filter(key="k1").count() == 2
    assert Memory.objects.filter(key="k1", state="active").count() == 1


def test_same_key_in_different_namespaces_are_different_records(bob):
    put_ok(bob, ["user", "bob", "a"], "k", {"v": "a"})
    put_ok(bob, ["user", "bob", "b"], "k", {"v": "b"})

    assert get(bob, ["user", "bob", "a"], "k").json()["value"] == {"v": "a"}
    assert get(bob, ["user", "bob", "b"], "k").json()["value"] == {"v": "b"}
    assert get(bob, ["user", "bob"], "k").status_code == 404


def test_ttl_seconds_sets_expires_at(bob):
    body = put_ok(bob, NS, "k1", ttl_seconds=3600)

    assert parse(body["expires_at"]) - parse(body["created_at"]) == timedelta(seconds=3600)
    assert get(bob, NS, "k1").json()["expires_at"] == body["expires_at"]


def test_ttl_seconds_zero_means_no_expiry(bob):
    assert put_ok(bob, NS, "k1", ttl_seconds=0)["expires_at"] is None


def test_update_without_ttl_clears_the_previous_expiry(bob):
    put_ok(bob, NS, "k1", ttl_seconds=60)
    assert put_ok(bob, NS, "k1")["expires_at"] is None


def test_get_unknown_key_is_404(bob):
    response = get(bob, NS, "missing")

    assert response.status_code == 404
    body = response.json()
    assert body["code"] == "not_found"
    assert set(body) == {"code", "error", "requestId"}


def test_delete_answers_204_without_body_and_hides_the_record(bob):
    put_ok(bob, NS, "k1")

    response = delete(bob, NS, "k1")

    assert response.status_code == 204
    assert response.content == b""
    assert get(bob, NS, "k1").status_code == 404
    assert search_items(bob, ["user", "bob"]) == []


def test_delete_is_idempotent_with_a_single_delete_event(bob):
    put_ok(bob, NS, "k1")

    assert delete(bob, NS, "k1").status_code == 204
    second = delete(bob, NS, "k1")

    assert second.status_code == 204
    assert second.content == b""
    assert event_kinds(bob) == [("add", "k1"), ("delete", "k1")]


def test_delete_of_a_key_that_never_existed_is_204_and_writes_nothing(bob):
    response = delete(bob, NS, "never")

    assert response.status_code == 204
    assert MemoryEvent.objects.count() == 0


def test_put_after_delete_is_an_add_with_a_new_id(bob):
    first = put_ok(bob, NS, "k1", {"v": 1})
    delete(bob, NS, "k1")
    again = put_ok(bob, NS, "k1", {"v": 2})

    assert again["id"] != first["id"]
    assert event_kinds(bob) == [("add", "k1"), ("delete", "k1"), ("add", "k1")]
    assert get(bob, NS, "k1").json()["value"] == {"v": 2}


def test_unauthenticated_calls_are_401(api):
    assert api.get("/v1/memories?ns=user&ns=bob&key=k").status_code == 401
    assert api.post("/v1/memories/search", {"namespace_prefix": []}, format="json").status_code == 401
    assert api.get("/v1/memories/namespaces").status_code == 401
    assert api.get("/v1/memories/events").status_code == 401
    assert Memory.objects.count() == 0


# --- search (attribute mode) -------------------------------------------------------------------------------------


def test_search_returns_items_with_exact_fields_and_null_score(bob):
    written = put_ok(bob, NS, "k1", {"text": "hello"})

    response = search(bob, ["user", "bob"])

    assert response.status_code == 200
    assert set(response.json()) == {"items"}
    [item] = response.json()["items"]
    assert set(item) == SEARCH_FIELDS
    assert item == {
        "id": written["id"],
        "namespace": NS,
        "key": "k1",
        "value": {"text": "hello"},
        "attributes": BOB_ATTRS,
        "score": None,
        "created_at": written["created_at"],
    }


def test_search_lists_newest_first_and_only_the_current_version(bob):
    for key in ["a", "b", "c"]:
        put_ok(bob, NS, key)
    put_ok(bob, NS, "a", {"v": "a2"})

    items = search_items(bob, ["user", "bob"])

    assert [item["key"] for item in items] == ["a", "c", "b"]
    assert items[0]["value"] == {"v": "a2"}


def test_search_pages_by_offset_and_limit(bob):
    for index in range(5):
        put_ok(bob, NS, f"k{index}")

    pages = [[i["key"] for i in search_items(bob, ["user", "bob"], limit=2, offset=offset)] for offset in (0, 2, 4, 6)]

    assert pages == [["k4", "k3"], ["k2", "k1"], ["k0"], []]


def test_search_default_limit_is_10(bob):
    for index in range(12):
        put_ok(bob, NS, f"k{index:02}")

    assert len(search_items(bob, ["user", "bob"])) == 10
    assert len(search_items(bob, ["user", "bob"], limit=100)) == 12


def test_search_restricts_to_the_prefix_subtree(bob):
    put_ok(bob, ["user", "bob", "a"], "k1")
    put_ok(bob, ["user", "bob", "a", "deep"], "k2")
    put_ok(bob, ["user", "bob", "b"], "k3")

    assert sorted(i["key"] for i in search_items(bob, ["user", "bob", "a"])) == ["k1", "k2"]
    assert [i["key"] for i in search_items(bob, ["user", "bob", "a", "deep"])] == ["k2"]
    assert search_items(bob, ["user", "bob", "c"]) == []


def test_search_by_built_in_attribute(alice, bob, charlie):
    put_ok(bob, NS, "kb")
    put_ok(charlie, ["user", "charlie"], "kc")

    items = search_items(alice, [], filter={"sub": "charlie"})

    assert [(i["key"], i["attributes"]) for i in items] == [("kc", {"namespace": "user", "sub": "charlie"})]


# --- namespaces ----------------------------------------------------------------------------------------------------


@pytest.fixture
def bob_tree(bob):
    for namespace in (
        ["user", "bob"],
        ["user", "bob", "notes"],
        ["user", "bob", "notes", "2024"],
        ["user", "bob", "todo", "2024"],
        ["user", "bob", "todo", "2025"],
    ):
        put_ok(bob, namespace, "k")
    return bob


def test_namespaces_lists_every_namespace_with_an_active_record_sorted(bob_tree):
    assert namespaces(bob_tree) == [
        ["user", "bob"],
        ["user", "bob", "notes"],
        ["user", "bob", "notes", "2024"],
        ["user", "bob", "todo", "2024"],
        ["user", "bob", "todo", "2025"],
    ]


def test_namespaces_prefix_is_repeated_per_segment(bob_tree):
    assert namespaces(bob_tree, prefix=["user", "bob", "todo"]) == [
        ["user", "bob", "todo", "2024"],
        ["user", "bob", "todo", "2025"],
    ]
    assert namespaces(bob_tree, prefix=["user", "bob", "nothing"]) == []


def test_namespaces_suffix_is_repeated_per_segment(bob_tree):
    assert namespaces(bob_tree, suffix=["2024"]) == [
        ["user", "bob", "notes", "2024"],
        ["user", "bob", "todo", "2024"],
    ]
    assert namespaces(bob_tree, suffix=["todo", "2024"]) == [["user", "bob", "todo", "2024"]]
    assert namespaces(bob_tree, suffix=["bob"]) == [["user", "bob"]]


def test_namespaces_max_depth_truncates_then_dedups(bob_tree):
    assert namespaces(bob_tree, max_depth=3) == [
        ["user", "bob"],
        ["user", "bob", "notes"],
        ["user", "bob", "todo"],
    ]
    assert namespaces(bob_tree, max_depth=1) == [["user"]]


def test_namespaces_max_depth_applies_after_suffix_matching(bob_tree):
    assert namespaces(bob_tree, suffix=["2025"], max_depth=3) == [["user", "bob", "todo"]]


def test_namespaces_omit_namespaces_without_an_active_record(bob):
    put_ok(bob, ["user", "bob", "kept"], "k")
    put_ok(bob, ["user", "bob", "gone"], "k")
    delete(bob, ["user", "bob", "gone"], "k")

    assert namespaces(bob) == [["user", "bob", "kept"]]


# --- events --------------------------------------------------------------------------------------------------------


def test_lifecycle_events_carry_value_and_attributes_only_for_add_and_update(bob):
    first = put_ok(bob, NS, "k1", {"v": 1})
    put_ok(bob, NS, "k1", {"v": 2})
    delete(bob, NS, "k1")

    body = events(bob)

    assert body["after_cursor"]
    evs = body["events"]
    assert [e["kind"] for e in evs] == ["add", "update", "delete"]
    for event in evs:
        assert set(event) == EVENT_FIELDS
        uuid.UUID(event["id"])
        assert event["namespace"] == NS
        assert event["key"] == "k1"
        parse(event["occurred_at"])
    assert [e["value"] for e in evs] == [{"v": 1}, {"v": 2}, None]
    assert [e["attributes"] for e in evs] == [BOB_ATTRS, BOB_ATTRS, None]
    assert len({e["id"] for e in evs}) == 3
    assert first["id"] not in {e["id"] for e in evs}
    times = [parse(e["occurred_at"]) for e in evs]
    assert times == sorted(times)


def test_an_empty_events_page_still_hands_out_a_cursor_to_poll_from(bob, charlie):
    # Issue 21.17: a poller that found nothing yet got after_cursor null, so it had nothing to continue from.
    empty = events(bob)
    assert empty["events"] == [] and isinstance(empty["after_cursor"], str) and empty["after_cursor"]
    put_ok(charlie, ["user", "charlie"], "theirs")  # another owner's event: not bob's to see
    again = events(bob, after_cursor=empty["after_cursor"])
    assert again["events"] == [] and again["after_cursor"]
    put_ok(bob, NS, "k1")
    page = events(bob, after_cursor=again["after_cursor"])
    assert [(e["kind"], e["key"]) for e in page["events"]] == [("add", "k1")]
    assert events(bob, after_cursor=page["after_cursor"])["events"] == []


def test_events_filter_by_namespace_prefix(bob):
    put_ok(bob, ["user", "bob", "a"], "k1")
    put_ok(bob, ["user", "bob", "b"], "k2")

    assert event_kinds(bob, ns=["user", "bob", "a"]) == [("add", "k1")]
    assert event_kinds(bob, ns=["user", "bob", "b"]) == [("add", "k2")]


def test_events_prefix_matches_whole_segments_in_commit_order(bob):
    # Interleaved writes under sibling namespaces whose names share leading characters, and one a level deeper:
    # a prefix selects whole segments, at any depth, and keeps the timeline's order.
    put_ok(bob, ["user", "bob", "a"], "k1")
    put_ok(bob, ["user", "bob", "ab"], "k2")
    put_ok(bob, ["user", "bob", "a", "x"], "k3")
    put_ok(bob, ["user", "bob", "b", "a"], "k4")
    put_ok(bob, ["user", "bob", "a"], "k5")

    assert event_kinds(bob, ns=["user", "bob", "a"]) == [("add", "k1"), ("add", "k3"), ("add", "k5")]
    assert event_kinds(bob, ns=["user", "bob", "a", "x"]) == [("add", "k3")]
    assert event_kinds(bob, ns=["user", "bob", "ab"]) == [("add", "k2")]
    assert event_kinds(bob, ns=["user", "bob", "b"]) == [("add", "k4")]
    assert event_kinds(bob, ns=["user", "bob", "a", "x", "y"]) == []
    # Paging a deeper prefix one event at a time with the cursor visits the same events in the same order.
    seen, cursor = [], None
    while True:
        page = events(bob, ns=["user", "bob", "a"], limit=1, **({"after_cursor": cursor} if cursor else {}))
        if not page["events"]:
            break
        seen.append(page["events"][0]["key"])
        cursor = page["after_cursor"]
    assert seen == ["k1", "k3", "k5"]


@pytest.fixture
def bob_lifecycle(bob):
    put_ok(bob, NS, "k1")
    put_ok(bob, NS, "k1")
    put_ok(bob, NS, "k2")
    delete(bob, NS, "k1")
    return bob


def test_events_kinds_filter_repeated(bob_lifecycle):
    assert event_kinds(bob_lifecycle, kinds=["add", "delete"]) == [("add", "k1"), ("add", "k2"), ("delete", "k1")]


def test_events_kinds_filter_comma_separated(bob_lifecycle):
    assert event_kinds(bob_lifecycle, kinds="update,delete") == [("update", "k1"), ("delete", "k1")]
    assert event_kinds(bob_lifecycle, kinds="expired") == []


def test_events_after_and_before_are_strict_bounds(bob_lifecycle):
    times = [e["occurred_at"] for e in events(bob_lifecycle)["events"]]
    assert len(set(times)) == 4

    assert len(events(bob_lifecycle, after=times[0])["events"]) == 3
    assert len(events(bob_lifecycle, before=times[3])["events"]) == 3
    between = events(bob_lifecycle, after=times[0], before=times[3])["events"]
    assert [e["occurred_at"] for e in between] == times[1:3]
    assert events(bob_lifecycle, after=times[3])["events"] == []


def test_events_after_accepts_an_offset_timestamp(bob_lifecycle):
    first = parse(events(bob_lifecycle)["events"][0]["occurred_at"])
    shifted = first.astimezone(timezone(timedelta(hours=2))).isoformat()

    assert len(events(bob_lifecycle, after=shifted)["events"]) == 3


def test_events_page_by_after_cursor(bob_lifecycle):
    all_ids = [e["id"] for e in events(bob_lifecycle)["events"]]

    page1 = events(bob_lifecycle, limit=3)
    page2 = events(bob_lifecycle, limit=3, after_cursor=page1["after_cursor"])

    assert [e["id"] for e in page1["events"]] == all_ids[:3]
    assert [e["id"] for e in page2["events"]] == all_ids[3:]
    assert page2["after_cursor"] and page2["after_cursor"] != page1["after_cursor"]
    # Polling past the end returns nothing new and keeps the position; a later change then appears.
    page3 = events(bob_lifecycle, after_cursor=page2["after_cursor"])
    assert page3 == {"events": [], "after_cursor": page2["after_cursor"]}
    put_ok(bob_lifecycle, NS, "k3")
    assert [(e["kind"], e["key"]) for e in events(bob_lifecycle, after_cursor=page2["after_cursor"])["events"]] == [
        ("add", "k3")
    ]


def test_a_poll_past_the_end_keeps_the_position_while_other_transactions_commit(bob):
    """The full suite once saw the cursor of a poll past the end jump from ``[36914, "107"]`` to ``[36916, "0"]``: an
    empty page moved the cursor to the horizon, the oldest running transaction or, with none, the next id to be
    assigned, and a transaction that committed meanwhile (any database of the server: ids are the server's) put that
    past the reader's own running transaction. A reader inside a transaction that writes (the tests; a service call
    composed in one transaction) then never saw its own later writes. An empty page never moves the cursor past the
    reader's own transaction."""
    import psycopg
    from django.db import connection

    put_ok(bob, NS, "k1")
    cursor = events(bob)["after_cursor"]
    params = connection.get_connection_params()
    conninfo = {key: params[key] for key in ("dbname", "user", "password", "host", "port") if params.get(key)}
    with psycopg.connect(**conninfo, autocommit=True) as other:
        for _ in range(3):  # transactions that take an id and commit while the reader's runs
            other.execute("BEGIN")
            other.execute("SELECT pg_current_xact_id()")
            other.execute("COMMIT")
    assert events(bob, after_cursor=cursor) == {"events": [], "after_cursor": cursor}
    put_ok(bob, NS, "k2")
    assert [(e["kind"], e["key"]) for e in events(bob, after_cursor=cursor)["events"]] == [("add", "k2")]


def test_events_cursor_is_opaque(bob_lifecycle):
    cursor = events(bob_lifecycle, limit=1)["after_cursor"]
    assert isinstance(cursor, str)
    assert not cursor.isdigit()


def test_events_limit_bounds(bob):
    for index in range(3):
        put_ok(bob, NS, f"k{index}")

    assert len(events(bob, limit=1)["events"]) == 1
    assert len(events(bob, limit=200)["events"]) == 3


def test_events_default_limit_is_50(bob):
    for index in range(26):
        put_ok(bob, NS, f"k{index}")
        delete(bob, NS, f"k{index}")

    assert len(events(bob)["events"]) == 50
