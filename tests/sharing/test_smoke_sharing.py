"""Smoke tests of memberships and ownership transfers (the implementer's; the full matrix lives elsewhere)."""

from __future__ import annotations

import uuid

import pytest

from tests.concurrency import run_concurrently

CONVERSATIONS = "/v1/conversations"
TRANSFERS = "/v1/ownership-transfers"


def new_conversation(client) -> str:
    response = client.post(CONVERSATIONS, {"title": "shared"}, format="json")
    assert response.status_code == 201
    return response.json()["id"]


def members(client, cid: str) -> dict[str, str]:
    response = client.get(f"{CONVERSATIONS}/{cid}/memberships")
    assert response.status_code == 200, response.content
    return {item["userId"]: item["accessLevel"] for item in response.json()["data"]}


def grant(client, cid: str, user: str, level: str):
    return client.post(f"{CONVERSATIONS}/{cid}/memberships", {"userId": user, "accessLevel": level}, format="json")


@pytest.mark.django_db
def test_membership_lifecycle_and_manager_limits(client_for):
    bob, charlie, dave = client_for("bob"), client_for("charlie"), client_for("dave")
    cid = new_conversation(bob)
    created = grant(bob, cid, "charlie", "manager")
    assert created.status_code == 201
    assert set(created.json()) == {"conversationId", "userId", "accessLevel", "createdAt"}
    assert grant(bob, cid, "charlie", "reader").status_code == 409
    assert grant(charlie, cid, "dave", "writer").status_code == 201
    assert grant(charlie, cid, "erin", "manager").status_code == 403
    assert grant(dave, cid, "erin", "reader").status_code == 403
    assert charlie.patch(f"{CONVERSATIONS}/{cid}/memberships/dave", {"accessLevel": "reader"},
                         format="json").status_code == 200
    assert charlie.patch(f"{CONVERSATIONS}/{cid}/memberships/dave", {"accessLevel": "manager"},
                         format="json").status_code == 403
    assert charlie.patch(f"{CONVERSATIONS}/{cid}/memberships/bob", {"accessLevel": "reader"},
                         format="json").status_code == 403
    lowered = bob.patch(f"{CONVERSATIONS}/{cid}/memberships/bob", {"accessLevel": "manager"}, format="json")
    assert lowered.status_code == 400
    assert bob.delete(f"{CONVERSATIONS}/{cid}/memberships/bob").status_code == 400
    assert members(dave, cid) == {"bob": "owner", "charlie": "manager", "dave": "reader"}
    assert dave.delete(f"{CONVERSATIONS}/{cid}/memberships/dave").status_code == 204  # leave
    assert dave.get(f"{CONVERSATIONS}/{cid}").status_code == 403
    assert bob.delete(f"{CONVERSATIONS}/{cid}/memberships/nobody").status_code == 404
    for body in ({"userId": "x"}, {"userId": "x", "accessLevel": "boss"}, {"userId": "", "accessLevel": "reader"},
                 {"userId": "x", "accessLevel": "reader", "extra": 1}):
        response = bob.post(f"{CONVERSATIONS}/{cid}/memberships", body, format="json")
        assert response.status_code == 400, (body, response.content)
    assert bob.get(f"{CONVERSATIONS}/bad/memberships").status_code == 400


@pytest.mark.django_db
def test_fork_shares_memberships(client_for):
    bob = client_for("bob")
    root = str(uuid.uuid4())
    first = bob.post(f"{CONVERSATIONS}/{root}/entries", {"content": [{"role": "USER", "text": "a"}]}, format="json")
    fork = str(uuid.uuid4())
    assert bob.post(f"{CONVERSATIONS}/{fork}/entries", {"content": [{"role": "USER", "text": "b"}],
                    "forkedAtConversationId": root, "forkedAtEntryId": first.json()["id"]},
                    format="json").status_code == 201
    assert grant(bob, fork, "charlie", "reader").json()["conversationId"] == fork
    assert members(client_for("charlie"), root) == {"bob": "owner", "charlie": "reader"}


@pytest.mark.django_db
def test_transfer_state_machine(client_for):
    bob, charlie, dave = client_for("bob"), client_for("charlie"), client_for("dave")
    cid = new_conversation(bob)
    grant(bob, cid, "charlie", "writer")
    assert bob.post(TRANSFERS, {"conversationId": cid, "newOwnerUserId": "dave"}, format="json").status_code == 400
    assert bob.post(TRANSFERS, {"conversationId": cid, "newOwnerUserId": "bob"}, format="json").status_code == 400
    assert charlie.post(TRANSFERS, {"conversationId": cid, "newOwnerUserId": "bob"}, format="json").status_code == 403
    created = bob.post(TRANSFERS, {"conversationId": cid, "newOwnerUserId": "charlie"}, format="json")
    assert created.status_code == 201, created.content
    transfer = created.json()
    assert set(transfer) == {"id", "conversationId", "fromUserId", "toUserId", "createdAt"}
    second = bob.post(TRANSFERS, {"conversationId": cid, "newOwnerUserId": "charlie"}, format="json")
    assert second.status_code == 409 and second.json()["details"]["existingTransferId"] == transfer["id"]
    assert bob.get(f"{TRANSFERS}/{transfer['id']}").json() == transfer
    assert dave.get(f"{TRANSFERS}/{transfer['id']}").status_code == 404
    assert [t["id"] for t in charlie.get(TRANSFERS, {"role": "recipient"}).json()["data"]] == [transfer["id"]]
    assert charlie.get(TRANSFERS, {"role": "sender"}).json()["data"] == []
    assert bob.get(TRANSFERS).json()["data"][0]["id"] == transfer["id"]
    assert bob.post(f"{TRANSFERS}/{transfer['id']}/accept").status_code == 403
    assert dave.delete(f"{TRANSFERS}/{transfer['id']}").status_code == 403
    assert charlie.post(f"{TRANSFERS}/{transfer['id']}/accept").status_code == 204
    assert charlie.post(f"{TRANSFERS}/{transfer['id']}/accept").status_code == 404
    assert members(charlie, cid) == {"bob": "manager", "charlie": "owner"}
    assert charlie.get(f"{CONVERSATIONS}/{cid}").json()["ownerUserId"] == "charlie"
    # Decline and cancel.
    again = charlie.post(TRANSFERS, {"conversationId": cid, "newOwnerUserId": "bob"}, format="json").json()
    assert bob.delete(f"{TRANSFERS}/{again['id']}").status_code == 204
    assert bob.get(f"{TRANSFERS}/{again['id']}").status_code == 404
    third = charlie.post(TRANSFERS, {"conversationId": cid, "newOwnerUserId": "bob"}, format="json").json()
    # Removing the recipient's membership deletes the transfer to them.
    assert charlie.delete(f"{CONVERSATIONS}/{cid}/memberships/bob").status_code == 204
    assert charlie.get(f"{TRANSFERS}/{third['id']}").status_code == 404


@pytest.mark.django_db
def test_delete_conversation_removes_memberships_and_transfers(client_for):
    bob, charlie = client_for("bob"), client_for("charlie")
    cid = new_conversation(bob)
    grant(bob, cid, "charlie", "manager")
    transfer = bob.post(TRANSFERS, {"conversationId": cid, "newOwnerUserId": "charlie"}, format="json").json()
    assert charlie.delete(f"{CONVERSATIONS}/{cid}").status_code == 403
    assert bob.delete(f"{CONVERSATIONS}/{cid}").status_code == 204
    assert bob.get(f"{CONVERSATIONS}/{cid}").status_code == 404
    assert charlie.get(f"{TRANSFERS}/{transfer['id']}").status_code == 404
    # The admin view still shows who had access (issue 21); it grants nothing.
    members = client_for("alice").get(f"/v1/admin/conversations/{cid}/memberships").json()["data"]
    assert {(m["userId"], m["accessLevel"]) for m in members} == {("bob", "owner"), ("charlie", "manager")}
    assert charlie.get(f"{CONVERSATIONS}/{cid}/memberships").status_code == 404
    admin_view = client_for("alice").get(f"/v1/admin/conversations/{cid}")
    assert admin_view.status_code == 200 and admin_view.json()["deletedAt"] is not None
    assert bob.get("/v1/admin/conversations").status_code == 403


@pytest.mark.django_db(transaction=True)
def test_concurrent_accepts_exactly_one_wins(client_for):
    bob = client_for("bob")
    cid = new_conversation(bob)
    grant(bob, cid, "charlie", "reader")
    transfer = bob.post(TRANSFERS, {"conversationId": cid, "newOwnerUserId": "charlie"}, format="json").json()
    accept = f"{TRANSFERS}/{transfer['id']}/accept"
    charlies = [client_for("charlie") for _ in range(32)]
    statuses = run_concurrently([lambda client=client: client.post(accept).status_code for client in charlies])
    assert sorted(statuses) == [204] + [404] * 31
    assert members(bob, cid) == {"bob": "manager", "charlie": "owner"}
