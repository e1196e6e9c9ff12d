"""Smoke tests of entries and forks (the implementer's; the full matrix lives in the other test files)."""

from __future__ import annotations

import uuid
from datetime import datetime
from functools import partial

import pytest
from django.db import connection

from tests.concurrency import run_concurrently
from tests.conftest import TEST_API_KEY

CONVERSATIONS = "/v1/conversations"


def entry(text: str, role: str = "USER") -> dict:
    return {"content": [{"role": role, "text": text}]}


def append(client, conversation_id: str, body: dict):
    return client.post(f"{CONVERSATIONS}/{conversation_id}/entries", body, format="json")


def texts(client, conversation_id: str, **params) -> list[str]:
    response = client.get(f"{CONVERSATIONS}/{conversation_id}/entries", params)
    assert response.status_code == 200, response.content
    return [item["content"][0].get("text") for item in response.json()["data"]]


@pytest.mark.django_db
def test_append_creates_conversation_and_lists_entries(client_for):
    bob = client_for("bob")
    cid = str(uuid.uuid4())
    first = append(bob, cid, entry("Hello there, this is a rather long first message of the chat"))
    assert first.status_code == 201, first.content
    body = first.json()
    assert set(body) == {"id", "conversationId", "userId", "channel", "contentType", "content", "createdAt"}
    assert body["conversationId"] == cid and body["channel"] == "history" and body["contentType"] == "history"
    conversation = bob.get(f"{CONVERSATIONS}/{cid}").json()
    assert conversation["title"] == "Hello there, this is a rather long first"
    assert conversation["ownerUserId"] == "bob"
    assert append(bob, cid, entry("second", "AI")).status_code == 201
    assert texts(bob, cid) == ["Hello there, this is a rather long first message of the chat", "second"]
    assert append(client_for("charlie"), cid, entry("x")).status_code == 403
    assert client_for("charlie").get(f"{CONVERSATIONS}/{cid}/entries").status_code == 403


@pytest.mark.django_db
def test_entry_validation(client_for):
    bob = client_for("bob")
    cid = str(uuid.uuid4())
    bad = [
        {},
        {"content": []},
        {"content": [{"role": "SYSTEM", "text": "x"}]},
        {"content": [{"text": "x"}]},
        {"content": [{"role": "USER", "text": 5}]},
        {"content": [{"role": "USER", "attachmentId": "nope"}]},
        {"content": ["x"]},
        {"channel": "other", "content": [{"role": "USER", "text": "x"}]},
        {"contentType": "text/plain", "content": [{"role": "USER", "text": "x"}]},
        {"content": [{"role": "USER", "text": "x"}], "unknown": 1},
        {"content": [{"role": "USER", "text": "x"}], "forkedAtConversationId": str(uuid.uuid4())},
    ]
    for body in bad:
        response = append(bob, cid, body)
        assert response.status_code == 400, (body, response.content)
        assert response.json()["code"] == "validation_error"
    huge = append(bob, cid, {"content": [{"role": "USER", "text": "x" * 270_000}]})
    assert huge.status_code == 413
    assert bob.get(f"{CONVERSATIONS}/{cid}").status_code == 404  # nothing was created
    assert append(bob, "not-a-uuid", entry("x")).status_code == 400


@pytest.mark.django_db
def test_context_channel_is_private_to_its_client(client_for):
    bob = client_for("bob")
    bob_app = client_for("bob", api_key=TEST_API_KEY)
    cid = str(uuid.uuid4())
    assert append(bob, cid, entry("hi")).status_code == 201
    assert append(bob, cid, {"channel": "context", "content": [{"k": "v"}]}).status_code == 403
    ctx = append(bob_app, cid, {"channel": "context", "content": [{"text": "state"}]})
    assert ctx.status_code == 201 and ctx.json()["contentType"] == "context"
    assert texts(bob, cid) == ["hi"]
    assert texts(bob_app, cid) == ["hi", "state"]
    assert texts(bob_app, cid, channel="context") == ["state"]
    assert bob.get(f"{CONVERSATIONS}/{cid}/entries", {"channel": "context"}).status_code == 403


@pytest.mark.django_db
def test_fork_sees_parent_before_fork_point(client_for):
    bob = client_for("bob")
    parent = str(uuid.uuid4())
    ids = [append(bob, parent, entry(f"p{i}")).json()["id"] for i in range(4)]
    fork = str(uuid.uuid4())
    body = {**entry("f0"), "forkedAtConversationId": parent, "forkedAtEntryId": ids[2]}
    created = append(bob, fork, body)
    assert created.status_code == 201, created.content
    assert append(bob, parent, entry("p4")).status_code == 201
    assert texts(bob, fork) == ["p0", "p1", "f0"]
    # A fork of the fork at its own entry sees the grandparent's prefix too.
    fork_entry = texts(bob, fork)
    assert fork_entry
    grand = str(uuid.uuid4())
    f1 = append(bob, fork, entry("f1")).json()["id"]
    assert append(bob, grand, {**entry("g0"), "forkedAtConversationId": fork, "forkedAtEntryId": f1}).status_code == 201
    assert texts(bob, grand) == ["p0", "p1", "f0", "g0"]
    forks = bob.get(f"{CONVERSATIONS}/{fork}/forks").json()["data"]
    assert [f["conversationId"] for f in forks] == [parent, fork, grand]
    assert forks[1]["forkedAtEntryId"] == ids[2]
    # Fork point not in the parent: 400, nothing created.
    other = str(uuid.uuid4())
    bad = append(bob, other, {**entry("x"), "forkedAtConversationId": parent, "forkedAtEntryId": str(uuid.uuid4())})
    assert bad.status_code == 400
    assert bob.get(f"{CONVERSATIONS}/{other}").status_code == 404
    # Fork fields naming an existing conversation: 400; a parent that does not exist: 400.
    taken = append(bob, parent, {**entry("x"), "forkedAtConversationId": fork, "forkedAtEntryId": f1})
    assert taken.status_code == 400
    again = append(bob, fork, {**entry("f2"), "forkedAtConversationId": parent, "forkedAtEntryId": ids[2]})
    assert again.status_code == 201  # the same fork point: a plain append
    missing = append(bob, str(uuid.uuid4()),
                     {**entry("x"), "forkedAtConversationId": str(uuid.uuid4()), "forkedAtEntryId": ids[0]})
    assert missing.status_code == 400
    # Non-member cannot fork.
    denied = append(client_for("charlie"), str(uuid.uuid4()),
                    {**entry("x"), "forkedAtConversationId": parent, "forkedAtEntryId": ids[0]})
    assert denied.status_code == 403
    # Modes: latest-fork shows one per tree, all shows every conversation, roots only the root.
    assert [c["id"] for c in bob.get(CONVERSATIONS, {"mode": "all"}).json()["data"]] == [fork, grand, parent]
    assert [c["id"] for c in bob.get(CONVERSATIONS, {"mode": "roots"}).json()["data"]] == [parent]
    assert [c["id"] for c in bob.get(CONVERSATIONS).json()["data"]] == [fork]


@pytest.mark.django_db
def test_content_encrypted_at_rest(client_for):
    bob = client_for("bob")
    cid = str(uuid.uuid4())
    assert append(bob, cid, entry("very-secret-marker")).status_code == 201
    with connection.cursor() as cursor:
        cursor.execute("SELECT content FROM conversation_entries WHERE conversation_id = %s", [cid])
        (blob,) = cursor.fetchone()
    assert b"very-secret-marker" not in bytes(blob)


WRITERS = 32


@pytest.mark.django_db(transaction=True)
def test_32_concurrent_appends_keep_every_entry_in_commit_order(client_for):
    bob = client_for("bob")
    cid = str(uuid.uuid4())
    statuses: list[int] = []
    returned: list[tuple[str, str]] = []

    def write(index: int) -> None:
        response = append(client_for("bob"), cid, entry(f"m{index}"))
        statuses.append(response.status_code)
        if response.status_code == 201:
            returned.append((datetime.fromisoformat(response.json()["createdAt"]), response.json()["id"]))

    # The first append of every writer races to create the conversation: exactly one wins, nobody fails.
    run_concurrently([partial(write, index) for index in range(WRITERS)])
    assert statuses == [201] * WRITERS
    run_concurrently([partial(write, index) for index in range(WRITERS)])
    assert statuses == [201] * (2 * WRITERS)

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM conversations WHERE id = %s", [cid])
        assert cursor.fetchone()[0] == 1
        cursor.execute("SELECT count(*) FROM conversation_memberships WHERE root_id = %s", [cid])
        assert cursor.fetchone()[0] == 1
    listed = []
    cursor_token = None
    while True:
        params = {"limit": 7, **({"afterCursor": cursor_token} if cursor_token else {})}
        page = bob.get(f"{CONVERSATIONS}/{cid}/entries", params).json()
        listed += page["data"]
        cursor_token = page["afterCursor"]
        if cursor_token is None:
            break
    assert len(listed) == 2 * WRITERS
    assert len({item["id"] for item in listed}) == 2 * WRITERS
    created = [datetime.fromisoformat(item["createdAt"]) for item in listed]
    assert created == sorted(created) and len(set(created)) == len(created), "entries share or reorder timestamps"
    assert [item["id"] for item in listed] == [entry_id for _, entry_id in sorted(returned)]


@pytest.mark.django_db(transaction=True)
def test_32_concurrent_fork_creations_of_one_id_make_one_fork(client_for):
    bob = client_for("bob")
    parent = str(uuid.uuid4())
    append(bob, parent, entry("p0"))
    point = append(bob, parent, entry("p1")).json()["id"]  # the fork sees the entries before it: p0
    fork = str(uuid.uuid4())
    statuses: list[int] = []

    def write(index: int) -> None:
        body = {**entry(f"f{index}"), "forkedAtConversationId": parent, "forkedAtEntryId": point}
        statuses.append(append(client_for("bob"), fork, body).status_code)

    run_concurrently([partial(write, index) for index in range(WRITERS)])
    assert statuses == [201] * WRITERS
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM conversations WHERE id = %s", [fork])
        assert cursor.fetchone()[0] == 1
    seen = texts(bob, fork, limit=200)
    assert seen[0] == "p0" and "p1" not in seen and len(seen) == 1 + WRITERS


@pytest.mark.django_db
def test_latest_fork_with_a_query_picks_the_latest_matching_conversation_of_each_tree(client_for):
    bob = client_for("bob")
    root = str(uuid.uuid4())
    first = append(bob, root, entry("Lisbon trip")).json()["id"]
    append(bob, root, entry("more"))
    fork = str(uuid.uuid4())
    append(bob, fork, {**entry("Porto instead"), "forkedAtConversationId": root, "forkedAtEntryId": first})
    assert [c["id"] for c in bob.get(CONVERSATIONS).json()["data"]] == [fork]
    assert [c["id"] for c in bob.get(CONVERSATIONS, {"query": "lisbon"}).json()["data"]] == [root]
    assert [c["id"] for c in bob.get(CONVERSATIONS, {"query": "PORTO"}).json()["data"]] == [fork]
