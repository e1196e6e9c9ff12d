"""32 concurrent clients on each write path of memberships, transfers and conversations: no 5xx, exactly one winner
where one is expected, invariants hold (the implementer's smoke tests; convtests owns the full suite)."""

from __future__ import annotations

import uuid
from functools import partial

import pytest
from django.db import connection

from tests.concurrency import run_concurrently

CONVERSATIONS = "/v1/conversations"
TRANSFERS = "/v1/ownership-transfers"
CLIENTS = 32

pytestmark = pytest.mark.django_db(transaction=True)


def race(action) -> list:
    """``action(index)`` by CLIENTS concurrent clients; their results."""
    return run_concurrently([partial(action, index) for index in range(CLIENTS)])


def count(sql: str, *params) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def test_same_client_chosen_id(client_for):
    chosen = str(uuid.uuid4())
    statuses = race(lambda i: client_for("bob").post(CONVERSATIONS, {"id": chosen}, format="json").status_code)
    assert sorted(statuses) == [201] + [409] * (CLIENTS - 1)
    assert count("SELECT count(*) FROM conversation_memberships WHERE root_id = %s", chosen) == 1


def test_same_member_added_and_distinct_members_added(client_for):
    bob = client_for("bob")
    cid = bob.post(CONVERSATIONS, {}, format="json").json()["id"]
    path = f"{CONVERSATIONS}/{cid}/memberships"
    same = race(lambda i: client_for("bob").post(path, {"userId": "carol", "accessLevel": "reader"},
                                                 format="json").status_code)
    assert sorted(same) == [201] + [409] * (CLIENTS - 1)
    distinct = race(lambda i: client_for("bob").post(path, {"userId": f"user{i}", "accessLevel": "writer"},
                                                     format="json").status_code)
    assert distinct == [201] * CLIENTS
    assert count("SELECT count(*) FROM conversation_memberships WHERE root_id = %s", cid) == CLIENTS + 2


def test_level_changes_and_removals(client_for):
    bob = client_for("bob")
    cid = bob.post(CONVERSATIONS, {}, format="json").json()["id"]
    path = f"{CONVERSATIONS}/{cid}/memberships"
    bob.post(path, {"userId": "carol", "accessLevel": "reader"}, format="json")
    levels = ["reader", "writer", "manager"]
    patched = race(lambda i: client_for("bob").patch(f"{path}/carol", {"accessLevel": levels[i % 3]},
                                                     format="json").status_code)
    assert patched == [200] * CLIENTS
    removed = race(lambda i: client_for("bob").delete(f"{path}/carol").status_code)
    assert sorted(removed) == [204] + [404] * (CLIENTS - 1)
    assert count("SELECT count(*) FROM conversation_memberships WHERE root_id = %s", cid) == 1


def test_one_pending_transfer(client_for):
    bob = client_for("bob")
    cid = bob.post(CONVERSATIONS, {}, format="json").json()["id"]
    for user in ("carol", "dave"):
        bob.post(f"{CONVERSATIONS}/{cid}/memberships", {"userId": user, "accessLevel": "reader"}, format="json")

    def start(index: int):
        response = client_for("bob").post(
            TRANSFERS, {"conversationId": cid, "newOwnerUserId": "carol" if index % 2 else "dave"}, format="json"
        )
        return response.status_code, response.json()

    results = race(start)
    assert sorted(status for status, _ in results) == [201] + [409] * (CLIENTS - 1)
    winner = next(body["id"] for status, body in results if status == 201)
    assert {body["details"]["existingTransferId"] for status, body in results if status == 409} == {winner}
    assert count("SELECT count(*) FROM conversation_ownership_transfers WHERE root_id = %s", cid) == 1


def test_delete_races_appends(client_for):
    bob = client_for("bob")
    cid = str(uuid.uuid4())
    bob.post(f"{CONVERSATIONS}/{cid}/entries", {"content": [{"role": "USER", "text": "x"}]}, format="json")

    def act(index: int) -> int:
        client = client_for("bob")
        if index % 4 == 0:
            return client.delete(f"{CONVERSATIONS}/{cid}").status_code
        return client.post(f"{CONVERSATIONS}/{cid}/entries", {"content": [{"role": "AI", "text": str(index)}]},
                           format="json").status_code

    statuses = race(act)
    assert all(status in (201, 204, 404) for status in statuses), statuses
    assert statuses.count(204) == 1
    assert bob.get(f"{CONVERSATIONS}/{cid}").status_code == 404
    assert count("SELECT count(*) FROM conversation_memberships WHERE root_id = %s", cid) == 0
