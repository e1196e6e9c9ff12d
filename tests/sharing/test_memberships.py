"""Memberships (interface "Membership access level" table, D6): add, change, remove, leave; who may grant what; the
primary owner's membership; memberships belong to the fork tree."""

from __future__ import annotations

import pytest

from tests.conversations.support import (
    ISO_Z,
    MANAGER,
    MEMBERSHIP_FIELDS,
    NON_MEMBER,
    OWNER,
    READER,
    WRITER,
    Shared,
    add_member,
    all_pages,
    append,
    append_ok,
    assert_error,
    assert_validation_error,
    conv_path,
    create,
    levels,
    new_id,
    snapshot,
)

pytestmark = pytest.mark.django_db


def _members(client, conversation_id: str) -> dict[str, str]:
    items = all_pages(client, conv_path(conversation_id, "memberships"), key=lambda m: m["userId"])
    return {m["userId"]: m["accessLevel"] for m in items}


def test_creator_is_the_owner_member(actor_client) -> None:
    owner = actor_client(OWNER)
    conversation = create(owner)
    items = owner.get(conv_path(conversation["id"], "memberships")).json()
    assert len(items["data"]) == 1 and items["afterCursor"] is None
    membership = items["data"][0]
    assert set(membership) == MEMBERSHIP_FIELDS
    assert membership["conversationId"] == conversation["id"]
    assert membership["userId"] == OWNER
    assert membership["accessLevel"] == "owner"
    assert ISO_Z.match(membership["createdAt"])


def test_add_answers_201_with_the_membership(shared: Shared) -> None:
    response = shared[OWNER].post(conv_path(shared.id, "memberships"), {"userId": "nico", "accessLevel": "writer"},
                                  format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == MEMBERSHIP_FIELDS
    assert (body["conversationId"], body["userId"], body["accessLevel"]) == (shared.id, "nico", "writer")
    assert levels(shared.id)["nico"] == "writer"


@pytest.mark.parametrize("level", ["reader", "writer", "manager", "owner"])
def test_adding_an_existing_member_is_409_whatever_the_level(shared: Shared, level: str) -> None:
    before = snapshot()
    response = shared[OWNER].post(conv_path(shared.id, "memberships"), {"userId": READER, "accessLevel": level},
                                  format="json")
    assert_error(response, 409, "conflict")
    assert snapshot() == before


def test_memberships_list_oldest_first(shared: Shared) -> None:
    items = shared[READER].get(conv_path(shared.id, "memberships")).json()["data"]
    assert [m["userId"] for m in items] == [OWNER, MANAGER, WRITER, READER]
    assert [m["createdAt"] for m in items] == sorted(m["createdAt"] for m in items)
    assert all(m["conversationId"] == shared.id for m in items)


def test_new_member_gains_access_and_removed_member_loses_it(shared: Shared) -> None:
    nora = shared[NON_MEMBER]
    assert_error(nora.get(conv_path(shared.id)), 403, "forbidden")
    add_member(shared[MANAGER], shared.id, NON_MEMBER, "reader")
    assert nora.get(conv_path(shared.id)).json()["accessLevel"] == "reader"
    assert nora.get(conv_path(shared.id, "entries")).status_code == 200
    assert_error(append(nora, shared.id, "may I?"), 403, "forbidden")

    response = shared[MANAGER].patch(conv_path(shared.id, "memberships", NON_MEMBER), {"accessLevel": "writer"},
                                     format="json")
    assert response.status_code == 200, response.content
    assert set(response.json()) == MEMBERSHIP_FIELDS
    assert response.json()["accessLevel"] == "writer"
    assert append(nora, shared.id, "now I may").status_code == 201

    response = shared[MANAGER].delete(conv_path(shared.id, "memberships", NON_MEMBER))
    assert response.status_code == 204 and response.content == b""
    for path in ("", "/entries", "/memberships", "/forks"):
        assert_error(nora.get(conv_path(shared.id) + path), 403, "forbidden")
    assert shared.id not in [c["id"] for c in nora.get("/v1/conversations?mode=all").json()["data"]]


def test_owner_may_grant_owner_without_changing_the_primary_owner(shared: Shared, actor_client) -> None:
    add_member(shared[OWNER], shared.id, "cora", "owner")
    body = actor_client("cora").get(conv_path(shared.id)).json()
    assert (body["accessLevel"], body["ownerUserId"]) == ("owner", OWNER)
    # A co-owner may grant manager, which a manager may not.
    add_member(actor_client("cora"), shared.id, "nico", "manager")


def test_owner_may_promote_to_manager_and_manager_then_manages(shared: Shared) -> None:
    response = shared[OWNER].patch(conv_path(shared.id, "memberships", WRITER), {"accessLevel": "manager"},
                                   format="json")
    assert response.status_code == 200, response.content
    add_member(shared[WRITER], shared.id, "nico", "reader")
    assert levels(shared.id)["nico"] == "reader"


@pytest.mark.parametrize(
    ("target", "level"),
    [(READER, "manager"), (READER, "owner"), (WRITER, "manager"), (MANAGER, "writer"), (MANAGER, "reader"),
     (OWNER, "reader")],
)
def test_manager_cannot_grant_or_touch_manager_and_owner_levels(shared: Shared, target: str, level: str) -> None:
    before = snapshot()
    response = shared[MANAGER].patch(conv_path(shared.id, "memberships", target), {"accessLevel": level},
                                     format="json")
    assert_error(response, 403, "forbidden")
    assert snapshot() == before


@pytest.mark.parametrize("level", ["manager", "owner"])
def test_manager_cannot_add_manager_or_owner(shared: Shared, level: str) -> None:
    before = snapshot()
    response = shared[MANAGER].post(conv_path(shared.id, "memberships"), {"userId": "nico", "accessLevel": level},
                                    format="json")
    assert_error(response, 403, "forbidden")
    assert snapshot() == before


def test_manager_cannot_remove_the_owner_or_another_manager(shared: Shared) -> None:
    add_member(shared[OWNER], shared.id, "max", "manager")
    before = snapshot()
    assert_error(shared[MANAGER].delete(conv_path(shared.id, "memberships", "max")), 403, "forbidden")
    assert_error(shared[MANAGER].delete(conv_path(shared.id, "memberships", OWNER)), 403, "forbidden")
    assert snapshot() == before


@pytest.mark.parametrize("level", ["manager", "writer", "reader"])
def test_primary_owner_cannot_be_lowered(shared: Shared, level: str) -> None:
    before = snapshot()
    response = shared[OWNER].patch(conv_path(shared.id, "memberships", OWNER), {"accessLevel": level}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "validation_error"
    assert snapshot() == before


def test_primary_owner_cannot_be_removed_even_by_a_co_owner(shared: Shared, actor_client) -> None:
    add_member(shared[OWNER], shared.id, "cora", "owner")
    before = snapshot()
    for client in (shared[OWNER], actor_client("cora")):
        response = client.delete(conv_path(shared.id, "memberships", OWNER))
        assert response.status_code == 400, response.content
    response = actor_client("cora").patch(conv_path(shared.id, "memberships", OWNER), {"accessLevel": "reader"},
                                          format="json")
    assert response.status_code == 400, response.content
    assert snapshot() == before


def test_patch_to_the_same_level_is_200_and_keeps_created_at(shared: Shared) -> None:
    before = {m["userId"]: m for m in shared[OWNER].get(conv_path(shared.id, "memberships")).json()["data"]}
    response = shared[OWNER].patch(conv_path(shared.id, "memberships", READER), {"accessLevel": "reader"},
                                   format="json")
    assert response.status_code == 200
    assert response.json() == before[READER]


@pytest.mark.parametrize("method", ["patch", "delete"])
def test_patch_or_delete_of_a_non_member_is_404(shared: Shared, method: str) -> None:
    kwargs = {"data": {"accessLevel": "reader"}, "format": "json"} if method == "patch" else {}
    response = getattr(shared[OWNER], method)(conv_path(shared.id, "memberships", "stranger"), **kwargs)
    assert_error(response, 404, "not_found")


@pytest.mark.parametrize("actor", [MANAGER, WRITER, READER])
def test_any_member_but_the_primary_owner_may_leave(shared: Shared, actor: str) -> None:
    assert shared[actor].delete(conv_path(shared.id, "memberships", actor)).status_code == 204
    assert actor not in levels(shared.id)
    assert_error(shared[actor].get(conv_path(shared.id)), 403, "forbidden")


def test_membership_on_a_fork_is_the_membership_of_the_whole_tree(shared: Shared) -> None:
    fork_id = new_id()
    append_ok(shared[OWNER], fork_id, "fork", forkedAtConversationId=shared.id,
              forkedAtEntryId=shared.entries[1]["id"])  # the fork sees entries[0]
    grandchild = new_id()
    append_ok(shared[OWNER], grandchild, "fork of fork", forkedAtConversationId=fork_id,
              forkedAtEntryId=shared.entries[0]["id"])
    # Every conversation of the tree lists the same members...
    assert _members(shared[READER], fork_id) == _members(shared[READER], shared.id)
    items = shared[READER].get(conv_path(fork_id, "memberships")).json()["data"]
    assert {m["conversationId"] for m in items} == {fork_id}
    # ...a member added through a fork reaches the root and every other fork...
    add_member(shared[OWNER], fork_id, NON_MEMBER, "reader")
    for conversation_id in (shared.id, fork_id, grandchild):
        assert shared[NON_MEMBER].get(conv_path(conversation_id)).json()["accessLevel"] == "reader"
    # ...and a change or removal through another conversation of the tree applies everywhere.
    assert shared[OWNER].patch(conv_path(grandchild, "memberships", NON_MEMBER), {"accessLevel": "writer"},
                               format="json").status_code == 200
    assert shared[NON_MEMBER].get(conv_path(fork_id)).json()["accessLevel"] == "writer"
    assert_error(shared[OWNER].post(conv_path(shared.id, "memberships"),
                                    {"userId": NON_MEMBER, "accessLevel": "reader"}, format="json"), 409, "conflict")
    assert shared[OWNER].delete(conv_path(shared.id, "memberships", NON_MEMBER)).status_code == 204
    for conversation_id in (shared.id, fork_id, grandchild):
        assert_error(shared[NON_MEMBER].get(conv_path(conversation_id)), 403, "forbidden")


def test_memberships_of_separate_conversations_are_separate(shared: Shared) -> None:
    other = create(shared[OWNER], title="private")
    assert _members(shared[OWNER], other["id"]) == {OWNER: "owner"}
    assert_error(shared[READER].get(conv_path(other["id"])), 403, "forbidden")


def test_memberships_of_a_deleted_conversation_are_gone(shared: Shared) -> None:
    assert shared[OWNER].delete(conv_path(shared.id)).status_code == 204
    assert levels(shared.id) == {}
    assert_error(shared[OWNER].get(conv_path(shared.id, "memberships")), 404, "not_found")
    assert_error(shared[OWNER].post(conv_path(shared.id, "memberships"), {"userId": "nico", "accessLevel": "reader"},
                                    format="json"), 404, "not_found")


BAD_BODIES = [
    ({}, "missing both"),
    ({"userId": "nico"}, "missing level"),
    ({"accessLevel": "reader"}, "missing user"),
    ({"userId": "nico", "accessLevel": "admin"}, "unknown level"),
    ({"userId": "nico", "accessLevel": "READER"}, "level case"),
    ({"userId": "nico", "accessLevel": ""}, "empty level"),
    ({"userId": "nico", "accessLevel": None}, "null level"),
    ({"userId": "", "accessLevel": "reader"}, "empty user"),
    ({"userId": 12, "accessLevel": "reader"}, "user not a string"),
    ({"userId": ["nico"], "accessLevel": "reader"}, "user list"),
    ({"userId": "nico", "accessLevel": "reader", "expires": "never"}, "unknown field"),
]


@pytest.mark.parametrize("body", [b for b, _ in BAD_BODIES], ids=[i for _, i in BAD_BODIES])
def test_malformed_add_is_400_and_writes_nothing(shared: Shared, body: dict) -> None:
    before = snapshot()
    assert_validation_error(shared[OWNER].post(conv_path(shared.id, "memberships"), body, format="json"))
    assert snapshot() == before


@pytest.mark.parametrize(
    "body",
    [{}, {"accessLevel": "boss"}, {"accessLevel": 3}, {"accessLevel": "reader", "userId": "other"}],
    ids=["empty", "unknown level", "level int", "unknown field"],
)
def test_malformed_patch_is_400_and_writes_nothing(shared: Shared, body: dict) -> None:
    before = snapshot()
    response = shared[OWNER].patch(conv_path(shared.id, "memberships", READER), body, format="json")
    assert_validation_error(response)
    assert snapshot() == before


def test_malformed_json_and_non_object_bodies_are_400(shared: Shared) -> None:
    path = conv_path(shared.id, "memberships")
    assert_validation_error(shared[OWNER].post(path, "{", content_type="application/json"))
    assert_validation_error(shared[OWNER].post(path, [], format="json"))
    assert_validation_error(shared[OWNER].patch(path + "/" + READER, "[1]", content_type="application/json"))


@pytest.mark.parametrize("method", ["get", "post"])
def test_malformed_conversation_id_in_the_path_is_400(shared: Shared, method: str) -> None:
    kwargs = {"data": {"userId": "nico", "accessLevel": "reader"}, "format": "json"} if method == "post" else {}
    response = getattr(shared[OWNER], method)("/v1/conversations/not-a-uuid/memberships", **kwargs)
    assert_validation_error(response)
