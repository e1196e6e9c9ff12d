"""D11's entry lists from either end: ``tail=true`` (the newest page), ``beforeCursor`` (walking back), the envelope's
``beforeCursor``, their mutual exclusion, forks and channels, the admin list; and entry keys (``key`` on append, the
``key`` filter). Through HTTP against the real database; one plan check shows that a page from the end reads its own
rows only."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from django.db import connection

from apps.conversations.selectors import _EntryKeyset, _streams, visibility
from apps.identity.api_keys import create_key
from tests.conftest import TEST_API_KEY
from tests.conversations.support import (
    ADMIN,
    AUDITOR_USER,
    OWNER,
    READER,
    WRITER,
    Shared,
    all_pages,
    append,
    append_ok,
    assert_error,
    assert_validation_error,
    conv_path,
    create,
    new_id,
    page,
    url,
)

pytestmark = pytest.mark.django_db


def entries_path(conversation_id: Any) -> str:
    return conv_path(conversation_id, "entries")


def texts(body: dict) -> list[str]:
    return [item["content"][0].get("text") or item["content"][0].get("state") for item in body["data"]]


def walk_back(client, path: str, limit: int, **params: Any) -> list[list[str]]:
    """Every page from the newest (tail) back to the first, following beforeCursor; each page's texts."""
    body = page(client, path, tail="true", limit=limit, **params)
    assert body["afterCursor"] is None  # nothing is newer than the newest page
    pages = [texts(body)]
    while body["beforeCursor"] is not None:
        cursor = body["beforeCursor"]
        body = page(client, path, beforeCursor=cursor, limit=limit, **params)
        assert body["afterCursor"] is not None  # the page just walked back from follows this one
        pages.append(texts(body))
    return pages


@pytest.fixture
def twelve(actor_client) -> tuple[Any, str]:
    owner = actor_client(OWNER)
    conversation = create(owner)["id"]
    for index in range(12):
        append_ok(owner, conversation, f"e{index}")
    return owner, conversation


def test_tail_is_the_newest_page_oldest_first(twelve) -> None:
    owner, conversation = twelve
    body = page(owner, entries_path(conversation), tail="true", limit=5)
    assert texts(body) == ["e7", "e8", "e9", "e10", "e11"]
    assert body["afterCursor"] is None
    assert body["beforeCursor"] is not None
    whole = page(owner, entries_path(conversation), tail="true", limit=12)
    assert texts(whole) == [f"e{i}" for i in range(12)]
    assert whole["beforeCursor"] is None and whole["afterCursor"] is None


def test_walking_back_from_the_tail_reaches_the_first_entry_with_no_gap_or_duplicate(twelve) -> None:
    owner, conversation = twelve
    pages = walk_back(owner, entries_path(conversation), 5)
    assert pages == [["e7", "e8", "e9", "e10", "e11"], ["e2", "e3", "e4", "e5", "e6"], ["e0", "e1"]]
    # A page that ends exactly at the first entry says so: no cursor to an empty page.
    assert walk_back(owner, entries_path(conversation), 6) == [[f"e{i}" for i in range(6, 12)],
                                                               [f"e{i}" for i in range(6)]]


def test_a_page_walked_back_to_leads_forward_again_and_forward_pages_lead_back(twelve) -> None:
    owner, conversation = twelve
    path = entries_path(conversation)
    first = page(owner, path, limit=5)
    assert first["beforeCursor"] is None  # nothing is older than the first page
    second = page(owner, path, afterCursor=first["afterCursor"], limit=5)
    assert texts(second) == ["e5", "e6", "e7", "e8", "e9"]
    assert texts(page(owner, path, beforeCursor=second["beforeCursor"], limit=5)) == texts(first)
    older = page(owner, path, beforeCursor=second["beforeCursor"], limit=3)
    assert texts(older) == ["e2", "e3", "e4"]
    assert texts(page(owner, path, afterCursor=older["afterCursor"], limit=5)) == texts(second)


def test_afterCursor_beforeCursor_and_tail_exclude_each_other(twelve) -> None:
    owner, conversation = twelve
    path = entries_path(conversation)
    body = page(owner, path, limit=5)
    after = body["afterCursor"]
    before = page(owner, path, afterCursor=after, limit=5)["beforeCursor"]
    for params, fields in (
        ({"tail": "true", "afterCursor": after}, {"tail", "afterCursor"}),
        ({"tail": "true", "beforeCursor": before}, {"tail", "beforeCursor"}),
        ({"afterCursor": after, "beforeCursor": before}, {"afterCursor", "beforeCursor"}),
        ({"tail": "1", "afterCursor": after, "beforeCursor": before}, {"tail", "afterCursor", "beforeCursor"}),
    ):
        refused = assert_validation_error(owner.get(url(path, **params)))
        assert set(refused["details"]["fields"]) == fields
    # tail=false and empty cursors are absent, not a second mode.
    assert texts(page(owner, path, tail="false", afterCursor=after, limit=5)) == ["e5", "e6", "e7", "e8", "e9"]
    assert texts(page(owner, path, tail="true", afterCursor="", beforeCursor="", limit=2)) == ["e10", "e11"]
    assert_validation_error(owner.get(url(path, tail="yes")), "tail")


def test_a_cursor_of_the_other_direction_or_a_malformed_one_is_400(twelve) -> None:
    owner, conversation = twelve
    path = entries_path(conversation)
    tail = page(owner, path, tail="true", limit=5)
    assert_validation_error(owner.get(url(path, afterCursor=tail["beforeCursor"])), "afterCursor")
    first = page(owner, path, limit=5)
    assert_validation_error(owner.get(url(path, beforeCursor=first["afterCursor"])), "beforeCursor")
    for cursor in ("not a cursor", "A" * 5000, "eyJ4Ijp9"):
        assert_validation_error(owner.get(url(path, beforeCursor=cursor)), "beforeCursor")


def test_an_empty_conversation_has_an_empty_tail(actor_client) -> None:
    owner = actor_client(OWNER)
    conversation = create(owner)["id"]
    assert page(owner, entries_path(conversation), tail="true") == {"data": [], "afterCursor": None,
                                                                     "beforeCursor": None}


def test_a_forks_tail_walks_back_into_its_parents_entries_before_the_fork_point(actor_client) -> None:
    owner = actor_client(OWNER)
    parent = create(owner)["id"]
    parent_entries = [append_ok(owner, parent, f"p{i}")["id"] for i in range(6)]
    fork = append_ok(owner, new_id(), "f0", forkedAtConversationId=parent,
                     forkedAtEntryId=parent_entries[4])["conversationId"]
    append_ok(owner, parent, "p6 after the fork")
    grandchild = append_ok(owner, new_id(), "g0", forkedAtConversationId=fork,
                           forkedAtEntryId=page(owner, entries_path(fork), tail="true", limit=1)["data"][0]["id"])[
        "conversationId"]
    for index in range(1, 4):
        append_ok(owner, fork, f"f{index}")
        append_ok(owner, grandchild, f"g{index}")
    assert walk_back(owner, entries_path(fork), 3) == [["f1", "f2", "f3"], ["p2", "p3", "f0"], ["p0", "p1"]]
    assert walk_back(owner, entries_path(grandchild), 4) == [["g0", "g1", "g2", "g3"], ["p0", "p1", "p2", "p3"]]
    forward = [item["content"][0]["text"] for item in all_pages(owner, entries_path(fork), limit=3)]
    assert forward == ["p0", "p1", "p2", "p3", "f0", "f1", "f2", "f3"]


def test_tail_merges_history_with_the_callers_own_context_and_nothing_else(shared: Shared, client_for) -> None:
    mine = client_for(WRITER, api_key=TEST_API_KEY)
    theirs = client_for(WRITER, api_key=create_key("tail-other-app").key)
    for index in range(4):
        append_ok(shared[WRITER], shared.id, f"h{index}")
        for client, who in ((mine, "mine"), (theirs, "theirs")):
            response = client.post(entries_path(shared.id), {"channel": "context", "content": [
                {"state": f"{who}{index}"}]}, format="json")
            assert response.status_code == 201, response.content
    assert walk_back(mine, entries_path(shared.id), 3, channel="context") == [["mine1", "mine2", "mine3"], ["mine0"]]
    assert walk_back(theirs, entries_path(shared.id), 10, channel="context") == [
        ["theirs0", "theirs1", "theirs2", "theirs3"]]
    merged = walk_back(mine, entries_path(shared.id), 4)
    assert merged == [["h2", "mine2", "h3", "mine3"], ["h0", "mine0", "h1", "mine1"],
                      ["first words", "second words"]]
    # Without an API-key client: history only; context is 403 as it always was.
    assert walk_back(shared[READER], entries_path(shared.id), 50) == [
        ["first words", "second words", "h0", "h1", "h2", "h3"]]
    assert_error(shared[READER].get(url(entries_path(shared.id), channel="context", tail="true")), 403, "forbidden")


def test_the_admin_list_reads_every_channel_from_either_end(shared: Shared, client_for, actor_client) -> None:
    app = client_for(WRITER, api_key=TEST_API_KEY)
    for index in range(3):
        assert app.post(entries_path(shared.id), {"channel": "context", "content": [{"state": f"c{index}"}]},
                        format="json").status_code == 201
    auditor = actor_client(AUDITOR_USER)
    path = f"{ADMIN}/{shared.id}/entries"
    assert walk_back(auditor, path, 2) == [["c1", "c2"], ["second words", "c0"], ["first words"]]
    assert walk_back(auditor, path, 5, channel="context") == [["c0", "c1", "c2"]]
    refused = assert_validation_error(auditor.get(url(path, tail="true", afterCursor="x")))
    assert set(refused["details"]["fields"]) == {"tail", "afterCursor"}


def test_entries_appended_with_a_key_are_listed_by_it(actor_client) -> None:
    owner = actor_client(OWNER)
    conversation = create(owner)["id"]
    for index in range(6):
        entry = append_ok(owner, conversation, f"e{index}", key=f"step-{index % 2}")
        assert entry["key"] == f"step-{index % 2}"
    plain = append_ok(owner, conversation, "no key")
    assert "key" not in plain
    odd = page(owner, entries_path(conversation), key="step-1")
    assert texts(odd) == ["e1", "e3", "e5"]
    assert all(item["key"] == "step-1" for item in odd["data"])
    assert walk_back(owner, entries_path(conversation), 2, key="step-0") == [["e2", "e4"], ["e0"]]
    assert page(owner, entries_path(conversation), key="unused")["data"] == []
    assert len(page(owner, entries_path(conversation), key="")["data"]) == 7  # empty: no filter


def test_a_key_lookup_sees_what_the_reader_sees(actor_client, client_for) -> None:
    """Through a fork only the parent's entries before the fork point; context only for its own client."""
    owner = actor_client(OWNER)
    parent = create(owner)["id"]
    before = append_ok(owner, parent, "before", key="k")
    point = append_ok(owner, parent, "point")
    append_ok(owner, parent, "after", key="k")
    fork = append_ok(owner, new_id(), "fork's own", key="k", forkedAtConversationId=parent,
                     forkedAtEntryId=point["id"])["conversationId"]
    assert texts(page(owner, entries_path(fork), key="k")) == ["before", "fork's own"]
    app = client_for(OWNER, api_key=TEST_API_KEY)
    other = client_for(OWNER, api_key=create_key("key-other-app").key)
    assert app.post(entries_path(parent), {"channel": "context", "content": [{"state": "mine"}], "key": "k"},
                    format="json").status_code == 201
    assert texts(page(app, entries_path(parent), key="k")) == ["before", "after", "mine"]
    assert texts(page(other, entries_path(parent), key="k")) == ["before", "after"]
    assert texts(page(owner, entries_path(parent), key="k")) == ["before", "after"]
    assert before["key"] == "k"


@pytest.mark.parametrize("key", ["", "with space", "é", "x" * 257, 12, None, ["k"]])
def test_a_malformed_key_on_append_is_400(actor_client, key) -> None:
    owner = actor_client(OWNER)
    conversation = create(owner)["id"]
    assert_validation_error(append(owner, conversation, "x", key=key), "key")


@pytest.mark.parametrize("key", ["with space", "é", "x" * 257, "a\tb"])
def test_a_malformed_key_filter_is_400(actor_client, key) -> None:
    owner = actor_client(OWNER)
    conversation = create(owner)["id"]
    assert_validation_error(owner.get(url(entries_path(conversation), key=key)), "key")


def test_openapi_declares_both_ways_and_keys(api) -> None:
    schema = api.get("/openapi.json").json()
    for path in ("/v1/conversations/{conversationId}/entries", "/v1/admin/conversations/{conversationId}/entries"):
        operation = schema["paths"][path]["get"]
        names = {parameter["name"] for parameter in operation["parameters"]}
        assert {"afterCursor", "beforeCursor", "tail", "key", "limit", "channel"} <= names
        envelope = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].split("/")[-1]
        assert set(schema["components"]["schemas"][envelope]["properties"]) == {"data", "afterCursor", "beforeCursor"}
    append_body = json.dumps(schema["paths"]["/v1/conversations/{conversationId}/entries"]["post"])
    assert "EntryAppend" in append_body
    shapes = schema["components"]["schemas"]["EntryAppendRequest"]["oneOf"]
    assert all(shape["properties"]["key"]["maxLength"] == 256 for shape in shapes)


# --- The plan: a page costs its own rows ----------------------------------------------------------------------------


def _bulk_entries(conversation_id: str, count: int, *, channel: str, client_id: str | None, key: str | None = None,
                  start_second: int = 0) -> None:
    """``count`` rows straight into the table (their content is never decrypted here: the plan is what is tested)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO conversation_entries (id, conversation_id, user_id, client_id, channel, content_type, content, "
            "embedding_pending, key, created_at) "
            "SELECT gen_random_uuid(), %s, 'olivia', %s, %s, %s, '\\x00'::bytea, false, %s, "
            "now() + make_interval(secs => %s + n) FROM generate_series(1, %s) n",
            [conversation_id, client_id, channel, channel, key, start_second, count],
        )
        cursor.execute("ANALYZE conversation_entries")


def _rows_read(plan: dict) -> int:
    """The largest number of rows any node of an EXPLAIN ANALYZE plan produced or removed by a filter."""
    node_rows = plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)
    return max([node_rows, *(_rows_read(child) for child in plan.get("Plans", []))])


def _explain(keyset: _EntryKeyset, position, *, backward: bool) -> int:
    sql, params = keyset.query(position, 51, backward=backward)
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    plan = plan if isinstance(plan, list) else json.loads(plan)
    return _rows_read(plan[0]["Plan"])


def test_a_page_from_either_end_reads_its_own_rows_not_the_conversation(actor_client) -> None:
    """5,000 context entries of one client, 3,000 of another and 2,000 history entries, in a fork of a conversation
    with 2,000 more: the newest page, a page walked back to, the first page and a key lookup each read about
    ``limit`` rows (the merge of index range scans), never thousands."""
    owner = actor_client(OWNER)
    parent = create(owner)["id"]
    point = append_ok(owner, parent, "fork point")
    fork = append_ok(owner, new_id(), "f", forkedAtConversationId=parent,
                     forkedAtEntryId=point["id"])["conversationId"]
    with connection.cursor() as cursor:  # the parent's rows below go before the fork point
        cursor.execute("UPDATE conversation_entries SET created_at = now() - interval '1 day' WHERE id = %s",
                       [point["id"]])
    _bulk_entries(parent, 2000, channel="history", client_id=None, start_second=-100_000)
    _bulk_entries(fork, 5000, channel="context", client_id="test-client", key=None, start_second=10)
    _bulk_entries(fork, 3000, channel="context", client_id="other", start_second=10)
    _bulk_entries(fork, 2000, channel="history", client_id=None, start_second=10)
    _bulk_entries(fork, 20, channel="context", client_id="test-client", key="checkpoint-7", start_second=6000)
    vis = visibility(OWNER, uuid.UUID(fork))
    assert vis is not None and len(vis.segments) == 2
    merged = _EntryKeyset(vis, _streams(None, "test-client", admin=False))
    assert _explain(merged, None, backward=True) <= 120
    rows = merged.fetch_before(None, 3000)
    assert _explain(merged, merged.key(rows[-1]), backward=True) <= 120  # deep in the conversation
    assert _explain(merged, None, backward=False) <= 120
    history = _EntryKeyset(vis, _streams("history", None, admin=False))
    assert _explain(history, None, backward=True) <= 120
    keyed = _EntryKeyset(vis, _streams("context", "test-client", admin=False), "checkpoint-7")
    assert _explain(keyed, None, backward=True) <= 120
    assert len(keyed.fetch_before(None, 100)) == 20
    # The same lists through the API (the pages are the keyset's): the newest history, the oldest of the parent.
    body = page(owner, entries_path(fork), tail="true", limit=3, channel="history")
    assert len(body["data"]) == 3 and body["beforeCursor"] is not None
    assert page(owner, entries_path(fork), limit=1)["data"][0]["conversationId"] == parent
