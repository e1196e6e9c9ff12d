"""Every conversation write path under 32 real concurrent HTTP clients against the live server: appends keep a total
order and lose nothing, a reader paging while they commit sees every entry once, creating one new id from 32
clients makes one conversation, and races on the same client id or a deletion end without 5xx."""

# ruff: noqa: B008 - each call binds its own client (own connection) as a default argument, on purpose

from __future__ import annotations

import threading
from collections import defaultdict

import pytest
from django.db import connections

from tests.concurrency import run_concurrently
from tests.conversations.support import (
    CONVERSATIONS,
    assert_no_5xx,
    conv_path,
    count,
    history,
    new_id,
    sql,
    statuses,
    url,
)

pytestmark = pytest.mark.django_db(transaction=True)

CLIENTS = 32
APPENDS_PER_CLIENT = 4


def _all_entries(client, conversation_id: str, limit: int = 200) -> list[dict]:
    items, cursor = [], None
    while True:
        response = client.get(url(conv_path(conversation_id, "entries"), limit=limit, afterCursor=cursor))
        assert response.status_code == 200, response.text
        body = response.json()
        items.extend(body["data"])
        cursor = body["afterCursor"]
        if cursor is None:
            return items


@pytest.fixture
def conversation(http):
    """A conversation owned by ``olivia`` where ``walt`` writes; returns its id."""
    owner = http("olivia")
    conversation_id = owner.post(CONVERSATIONS, {"title": "busy"}).json()["id"]
    response = owner.post(conv_path(conversation_id, "memberships"), {"userId": "walt", "accessLevel": "writer"})
    assert response.status_code == 201, response.text
    return conversation_id


def test_32_writers_appending_to_one_conversation_lose_nothing_and_keep_a_total_order(conversation, http) -> None:
    def writer(index: int):
        client = http("walt" if index % 2 else "olivia")
        responses = []
        for n in range(APPENDS_PER_CLIENT):
            responses.append(client.post(conv_path(conversation, "entries"),
                                         {"content": history(f"w{index}-n{n}")}))
        return responses

    results = run_concurrently([lambda i=i: writer(i) for i in range(CLIENTS)])
    responses = [r for batch in results for r in batch]
    assert_no_5xx(responses)
    assert statuses(responses) == [201] * (CLIENTS * APPENDS_PER_CLIENT)

    listed = _all_entries(http("olivia"), conversation)
    assert len(listed) == CLIENTS * APPENDS_PER_CLIENT
    assert len({entry["id"] for entry in listed}) == len(listed)
    assert {entry["id"] for entry in listed} == {r.json()["id"] for r in responses}
    # The list is ordered by creation time, and each writer's entries appear in the order it sent them.
    assert [entry["createdAt"] for entry in listed] == sorted(entry["createdAt"] for entry in listed)
    per_writer: dict[str, list[int]] = defaultdict(list)
    for entry in listed:
        writer_name, n = entry["content"][0]["text"].split("-n")
        per_writer[writer_name].append(int(n))
    assert all(ns == list(range(APPENDS_PER_CLIENT)) for ns in per_writer.values())
    # The stored order is the commit order: timestamps never go backwards along the list, the conversation's
    # updatedAt is at least its last entry's createdAt.
    (updated_at,) = sql("SELECT updated_at FROM conversations WHERE id = %s", [conversation])[0]
    (last_entry,) = sql("SELECT max(created_at) FROM conversation_entries WHERE conversation_id = %s",
                        [conversation])[0]
    assert updated_at >= last_entry


def test_reader_paging_while_32_writers_append_sees_every_entry_once_in_order(conversation, http) -> None:
    done = threading.Event()
    seen: list[str] = []
    problems: list[str] = []

    def read() -> None:
        # A polling client: the API hands out a cursor only when more items follow, so at the end of the list the
        # reader re-reads its current page (from the cursor that led to it) and takes only what it has not taken.
        # The part already taken must come back unchanged: the order is stable while writers commit.
        client = http("olivia")
        cursor, taken = None, 0
        try:
            while True:
                finished = done.is_set()
                response = client.get(url(conv_path(conversation, "entries"), limit=7, afterCursor=cursor))
                if response.status_code != 200:
                    problems.append(response.text)
                    return
                body = response.json()
                page_ids = [entry["id"] for entry in body["data"]]
                if page_ids[:taken] != seen[len(seen) - taken:]:
                    problems.append("a page changed under the reader")
                    return
                seen.extend(page_ids[taken:])
                if body["afterCursor"] is not None:
                    cursor, taken = body["afterCursor"], 0
                else:
                    taken = len(page_ids)
                    if finished:
                        return
        finally:
            connections.close_all()

    reader = threading.Thread(target=read)
    reader.start()
    results = run_concurrently([
        lambda i=i, c=http("walt"): [c.post(conv_path(conversation, "entries"), {"content": history(f"{i}-{n}")})
                                     for n in range(APPENDS_PER_CLIENT)]
        for i in range(CLIENTS)
    ])
    done.set()
    reader.join(timeout=120)
    assert not reader.is_alive()
    assert not problems, problems
    responses = [r for batch in results for r in batch]
    assert statuses(responses) == [201] * (CLIENTS * APPENDS_PER_CLIENT)
    final = [entry["id"] for entry in _all_entries(http("olivia"), conversation)]
    assert len(seen) == len(set(seen)), "an entry was returned twice"
    assert seen == final, "the reader missed entries or saw them out of order"


def test_32_appends_to_the_same_new_id_create_one_conversation(http) -> None:
    conversation_id = new_id()
    responses = run_concurrently([
        lambda i=i, c=http("olivia"): c.post(conv_path(conversation_id, "entries"),
                                             {"content": history(f"hello from {i}")})
        for i in range(CLIENTS)
    ])
    assert_no_5xx(responses)
    assert statuses(responses) == [201] * CLIENTS
    assert count("conversations", "id = %s", [conversation_id]) == 1
    assert count("conversation_entries", "conversation_id = %s", [conversation_id]) == CLIENTS
    assert sql("SELECT user_id, access_level FROM conversation_memberships WHERE root_id = %s",
               [conversation_id]) == [("olivia", "owner")]
    body = http("olivia").get(conv_path(conversation_id)).json()
    assert body["ownerUserId"] == "olivia"
    assert body["title"].startswith("hello from ")


def test_32_context_and_history_appends_to_one_new_id_never_title_it_from_private_text(http) -> None:
    """Issue 21 item 2: whichever append creates the conversation, its title is never context text (a context
    append that wins creates it untitled), and no context entry gets index text."""
    from tests.conftest import TEST_API_KEY

    conversation_id = new_id()
    calls = []
    for i in range(CLIENTS):
        client = http("olivia", api_key=TEST_API_KEY)
        if i % 2:
            body = {"channel": "context", "content": [{"text": f"private {i}"}]}
        else:
            body = {"content": history(f"hello from {i}")}
        calls.append(lambda c=client, b=body: c.post(conv_path(conversation_id, "entries"), b))
    responses = run_concurrently(calls)
    assert_no_5xx(responses)
    assert statuses(responses) == [201] * CLIENTS
    (title,) = sql("SELECT title FROM conversations WHERE id = %s", [conversation_id])[0]
    assert title == "" or title.startswith("hello from "), title
    assert count("conversation_entries", "conversation_id = %s AND channel = 'context' "
                 "AND (indexed_content IS NOT NULL OR embedding_pending)", [conversation_id]) == 0


def test_32_users_racing_to_create_the_same_new_id_one_owns_it_the_others_are_refused(http) -> None:
    conversation_id = new_id()
    users = [f"racer{i}" for i in range(CLIENTS)]
    responses = run_concurrently([
        lambda u=u: http(u).post(conv_path(conversation_id, "entries"), {"content": history(f"mine, says {u}")})
        for u in users
    ])
    assert_no_5xx(responses)
    assert statuses(responses) == [201] + [403] * (CLIENTS - 1)
    winner = next(u for u, r in zip(users, responses, strict=True) if r.status_code == 201)
    assert sql("SELECT owner_user_id FROM conversations WHERE id = %s", [conversation_id]) == [(winner,)]
    assert count("conversation_entries", "conversation_id = %s", [conversation_id]) == 1
    assert count("conversation_memberships", "root_id = %s", [conversation_id]) == 1


def test_32_creates_with_the_same_client_id_one_201_the_rest_409(http) -> None:
    conversation_id = new_id()
    responses = run_concurrently([
        lambda i=i, c=http("olivia"): c.post(CONVERSATIONS, {"id": conversation_id, "title": f"t{i}"})
        for i in range(CLIENTS)
    ])
    assert_no_5xx(responses)
    assert statuses(responses) == [201] + [409] * (CLIENTS - 1)
    assert count("conversations", "id = %s", [conversation_id]) == 1
    assert count("conversation_memberships", "root_id = %s", [conversation_id]) == 1


def test_32_concurrent_creates_of_fresh_conversations_all_201(http) -> None:
    responses = run_concurrently([lambda i=i, c=http("olivia"): c.post(CONVERSATIONS, {"title": f"c{i}"})
                                  for i in range(CLIENTS)])
    assert statuses(responses) == [201] * CLIENTS
    listed = http("olivia").get(url(CONVERSATIONS, mode="all", limit=200)).json()["data"]
    assert len(listed) == CLIENTS


def test_32_concurrent_forks_of_one_parent_all_land_in_its_tree(conversation, http) -> None:
    owner = http("olivia")
    entry = owner.post(conv_path(conversation, "entries"), {"content": history("fork here")}).json()
    fork_ids = [new_id() for _ in range(CLIENTS)]
    responses = run_concurrently([
        lambda f=f, c=http("walt"): c.post(conv_path(f, "entries"), {
            "content": history("branch"), "forkedAtConversationId": conversation, "forkedAtEntryId": entry["id"]})
        for f in fork_ids
    ])
    assert_no_5xx(responses)
    assert statuses(responses) == [201] * CLIENTS
    forks = owner.get(url(conv_path(conversation, "forks"), limit=200)).json()["data"]
    assert {f["conversationId"] for f in forks} == {conversation, *fork_ids}
    assert sql("SELECT count(DISTINCT root_id) FROM conversations WHERE id = ANY(%s::uuid[])",
               [[conversation, *fork_ids]]) == [(1,)]


def test_32_concurrent_title_updates_all_200_one_title_stays(conversation, http) -> None:
    titles = [f"title {i}" for i in range(CLIENTS)]
    responses = run_concurrently([lambda t=t, c=http("walt"): c.patch(conv_path(conversation), {"title": t})
                                  for t in titles])
    assert_no_5xx(responses)
    assert statuses(responses) == [200] * CLIENTS
    assert http("olivia").get(conv_path(conversation)).json()["title"] in titles


def test_delete_racing_appends_ends_without_5xx_and_leaves_nothing_readable(conversation, http) -> None:
    calls = [lambda c=http("olivia"): c.delete(conv_path(conversation))]
    calls += [lambda i=i, c=http("walt"): c.post(conv_path(conversation, "entries"), {"content": history(f"{i}")})
              for i in range(CLIENTS - 1)]
    responses = run_concurrently(calls)
    assert_no_5xx(responses)
    assert responses[0].status_code == 204
    assert set(statuses(responses[1:])) <= {201, 404}
    owner = http("olivia")
    assert owner.get(conv_path(conversation)).status_code == 404
    assert owner.get(conv_path(conversation, "entries")).status_code == 404
    assert conversation not in [c["id"] for c in owner.get(url(CONVERSATIONS, mode="all")).json()["data"]]


def test_32_writers_with_entry_keys_then_every_list_agrees(conversation, http) -> None:
    """32 writers append with one of two keys at once: each key's list holds exactly its entries, in commit order,
    and walking back from the tail gives the same list as walking forward (D11)."""

    def writer(index: int):
        client = http("walt" if index % 2 else "olivia")
        return [client.post(conv_path(conversation, "entries"),
                            {"content": history(f"w{index}-n{n}"), "key": f"key-{index % 2}"})
                for n in range(APPENDS_PER_CLIENT)]

    responses = [r for batch in run_concurrently([lambda i=i: writer(i) for i in range(CLIENTS)]) for r in batch]
    assert_no_5xx(responses)
    assert statuses(responses) == [201] * (CLIENTS * APPENDS_PER_CLIENT)
    reader = http("olivia")
    forward = _all_entries(reader, conversation, limit=9)
    backward: list[dict] = []
    body = reader.get(url(conv_path(conversation, "entries"), tail="true", limit=9)).json()
    while True:
        backward[:0] = body["data"]
        if body["beforeCursor"] is None:
            break
        body = reader.get(url(conv_path(conversation, "entries"), beforeCursor=body["beforeCursor"], limit=9)).json()
    assert [e["id"] for e in backward] == [e["id"] for e in forward]
    for key in ("key-0", "key-1"):
        keyed = reader.get(url(conv_path(conversation, "entries"), key=key, limit=200)).json()["data"]
        assert [e["id"] for e in keyed] == [e["id"] for e in forward if e.get("key") == key]
        assert {e["id"] for e in keyed} == {r.json()["id"] for r in responses if r.json()["key"] == key}
        assert len(keyed) == CLIENTS * APPENDS_PER_CLIENT // 2
