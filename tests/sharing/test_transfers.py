"""The ownership-transfer state machine (interface "Ownership transfer" table, D6): initiate, accept, decline, cancel,
one pending transfer per conversation, and what happens to memberships and ``ownerUserId``."""

from __future__ import annotations

import pytest

from tests.conversations.support import (
    ISO_Z,
    MANAGER,
    NON_MEMBER,
    OWNER,
    READER,
    TRANSFER_FIELDS,
    TRANSFERS,
    WRITER,
    Shared,
    add_member,
    all_pages,
    append_ok,
    assert_error,
    assert_validation_error,
    conv_path,
    count,
    create,
    levels,
    new_id,
    snapshot,
    sql,
    start_transfer,
    url,
)

pytestmark = pytest.mark.django_db


def _start(shared: Shared, to: str = MANAGER) -> dict:
    response = start_transfer(shared[OWNER], shared.id, to)
    assert response.status_code == 201, response.content
    return response.json()


def test_initiate_answers_201_with_the_transfer(shared: Shared) -> None:
    transfer = _start(shared)
    assert set(transfer) == TRANSFER_FIELDS
    assert transfer["conversationId"] == shared.id
    assert transfer["fromUserId"] == OWNER
    assert transfer["toUserId"] == MANAGER
    assert ISO_Z.match(transfer["createdAt"])
    assert count("conversation_ownership_transfers") == 1


def test_sender_and_recipient_read_the_transfer(shared: Shared) -> None:
    transfer = _start(shared)
    for actor in (OWNER, MANAGER):
        response = shared[actor].get(f"{TRANSFERS}/{transfer['id']}")
        assert response.status_code == 200, response.content
        assert response.json() == transfer


def test_accept_makes_the_recipient_owner_and_the_old_owner_manager(shared: Shared) -> None:
    transfer = _start(shared, WRITER)
    response = shared[WRITER].post(f"{TRANSFERS}/{transfer['id']}/accept")
    assert response.status_code == 204
    assert response.content == b""

    conversation = shared[WRITER].get(conv_path(shared.id)).json()
    assert conversation["ownerUserId"] == WRITER
    assert conversation["accessLevel"] == "owner"
    assert shared[OWNER].get(conv_path(shared.id)).json()["accessLevel"] == "manager"
    members = {m["userId"]: m["accessLevel"] for m in all_pages(shared[READER], conv_path(shared.id, "memberships"),
                                                                key=lambda m: m["userId"])}
    assert members == {OWNER: "manager", WRITER: "owner", MANAGER: "manager", READER: "reader"}
    # The transfer is gone: not readable, not listed, not acceptable again.
    assert_error(shared[WRITER].get(f"{TRANSFERS}/{transfer['id']}"), 404, "not_found")
    assert shared[WRITER].get(TRANSFERS).json()["data"] == []
    assert shared[OWNER].get(TRANSFERS).json()["data"] == []
    assert_error(shared[WRITER].post(f"{TRANSFERS}/{transfer['id']}/accept"), 404, "not_found")
    assert count("conversation_ownership_transfers") == 0


def test_after_accept_the_new_owner_has_every_owner_right_and_the_old_one_none_of_them(shared: Shared) -> None:
    transfer = _start(shared, WRITER)
    assert shared[WRITER].post(f"{TRANSFERS}/{transfer['id']}/accept").status_code == 204
    # The old owner, now manager, may no longer start a transfer or delete the conversation...
    assert_error(start_transfer(shared[OWNER], shared.id, READER), 403, "forbidden")
    assert_error(shared[OWNER].delete(conv_path(shared.id)), 403, "forbidden")
    # ...and the new owner may lower or remove them (they are no longer the primary owner).
    response = shared[WRITER].patch(conv_path(shared.id, "memberships", OWNER), {"accessLevel": "reader"},
                                    format="json")
    assert response.status_code == 200, response.content
    # The new primary owner may not be lowered or removed by anyone.
    response = shared[WRITER].patch(conv_path(shared.id, "memberships", WRITER), {"accessLevel": "reader"},
                                    format="json")
    assert response.status_code == 400, response.content
    assert shared[WRITER].delete(conv_path(shared.id, "memberships", WRITER)).status_code == 400
    assert levels(shared.id)[WRITER] == "owner"
    # A transfer can go back.
    back = start_transfer(shared[WRITER], shared.id, OWNER)
    assert back.status_code == 201, back.content
    assert shared[OWNER].post(f"{TRANSFERS}/{back.json()['id']}/accept").status_code == 204
    assert shared[OWNER].get(conv_path(shared.id)).json()["ownerUserId"] == OWNER


def test_accept_moves_ownership_of_every_conversation_of_the_fork_tree(shared: Shared) -> None:
    fork_id = new_id()
    append_ok(shared[WRITER], fork_id, "a fork", forkedAtConversationId=shared.id,
              forkedAtEntryId=shared.entries[-1]["id"])
    transfer = _start(shared, READER)
    assert shared[READER].post(f"{TRANSFERS}/{transfer['id']}/accept").status_code == 204
    for conversation_id in (shared.id, fork_id):
        body = shared[READER].get(conv_path(conversation_id)).json()
        assert body["ownerUserId"] == READER
        assert body["accessLevel"] == "owner"
    assert count("conversations", "owner_user_id <> %s", [READER]) == 0


def test_decline_by_the_recipient_deletes_the_transfer_and_keeps_ownership(shared: Shared) -> None:
    transfer = _start(shared)
    response = shared[MANAGER].delete(f"{TRANSFERS}/{transfer['id']}")
    assert response.status_code == 204
    assert response.content == b""
    assert_error(shared[OWNER].get(f"{TRANSFERS}/{transfer['id']}"), 404, "not_found")
    assert_error(shared[MANAGER].post(f"{TRANSFERS}/{transfer['id']}/accept"), 404, "not_found")
    assert shared[OWNER].get(conv_path(shared.id)).json()["ownerUserId"] == OWNER
    assert levels(shared.id)[OWNER] == "owner" and levels(shared.id)[MANAGER] == "manager"


def test_cancel_by_the_sender_deletes_the_transfer(shared: Shared) -> None:
    transfer = _start(shared)
    assert shared[OWNER].delete(f"{TRANSFERS}/{transfer['id']}").status_code == 204
    assert_error(shared[MANAGER].post(f"{TRANSFERS}/{transfer['id']}/accept"), 404, "not_found")
    assert_error(shared[OWNER].delete(f"{TRANSFERS}/{transfer['id']}"), 404, "not_found")
    assert count("conversation_ownership_transfers") == 0
    # With the first one gone, a new transfer may start.
    assert _start(shared, WRITER)["toUserId"] == WRITER


def test_second_pending_transfer_is_409_naming_the_existing_one(shared: Shared) -> None:
    first = _start(shared)
    before = snapshot()
    for recipient in (MANAGER, WRITER):
        body = assert_error(start_transfer(shared[OWNER], shared.id, recipient), 409, "conflict")
        assert body["details"]["existingTransferId"] == first["id"]
    assert snapshot() == before


def test_second_pending_transfer_through_a_fork_of_the_same_tree_is_409(shared: Shared) -> None:
    first = _start(shared)
    fork_id = new_id()
    append_ok(shared[OWNER], fork_id, "fork", forkedAtConversationId=shared.id,
              forkedAtEntryId=shared.entries[0]["id"])
    body = assert_error(start_transfer(shared[OWNER], fork_id, WRITER), 409, "conflict")
    assert body["details"]["existingTransferId"] == first["id"]


def test_transfers_of_different_conversations_are_independent(shared: Shared) -> None:
    _start(shared)
    other = create(shared[OWNER], title="other")
    add_member(shared[OWNER], other["id"], MANAGER, "reader")
    response = start_transfer(shared[OWNER], other["id"], MANAGER)
    assert response.status_code == 201, response.content
    assert count("conversation_ownership_transfers") == 2


@pytest.mark.parametrize("recipient", [NON_MEMBER, "never-heard-of"])
def test_recipient_who_is_not_a_member_is_400(shared: Shared, recipient: str) -> None:
    before = snapshot()
    response = start_transfer(shared[OWNER], shared.id, recipient)
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "validation_error"
    assert snapshot() == before


def test_transfer_to_oneself_is_400(shared: Shared) -> None:
    before = snapshot()
    response = start_transfer(shared[OWNER], shared.id, OWNER)
    assert response.status_code == 400, response.content
    assert snapshot() == before


@pytest.mark.parametrize("actor", [MANAGER, WRITER, READER])
def test_only_the_owner_may_initiate(shared: Shared, actor: str) -> None:
    assert_error(start_transfer(shared[actor], shared.id, MANAGER if actor != MANAGER else WRITER), 403, "forbidden")


def test_non_member_initiating_is_403_and_unknown_conversation_404(shared: Shared) -> None:
    assert_error(start_transfer(shared[NON_MEMBER], shared.id, MANAGER), 403, "forbidden")
    assert_error(start_transfer(shared[OWNER], new_id(), MANAGER), 404, "not_found")


def test_initiating_on_a_deleted_conversation_is_404(shared: Shared) -> None:
    assert shared[OWNER].delete(conv_path(shared.id)).status_code == 204
    assert_error(start_transfer(shared[OWNER], shared.id, MANAGER), 404, "not_found")


def test_accept_by_the_sender_is_403_and_changes_nothing(shared: Shared) -> None:
    transfer = _start(shared)
    before = snapshot()
    assert_error(shared[OWNER].post(f"{TRANSFERS}/{transfer['id']}/accept"), 403, "forbidden")
    assert snapshot() == before


@pytest.mark.parametrize("actor", [WRITER, READER, NON_MEMBER])
def test_accept_or_delete_by_a_third_party_is_403(shared: Shared, actor: str) -> None:
    transfer = _start(shared)
    before = snapshot()
    assert_error(shared[actor].post(f"{TRANSFERS}/{transfer['id']}/accept"), 403, "forbidden")
    assert_error(shared[actor].delete(f"{TRANSFERS}/{transfer['id']}"), 403, "forbidden")
    assert_error(shared[actor].get(f"{TRANSFERS}/{transfer['id']}"), 404, "not_found")
    assert snapshot() == before


def test_accept_of_a_deleted_transfer_is_404(shared: Shared) -> None:
    transfer = _start(shared)
    assert shared[OWNER].delete(f"{TRANSFERS}/{transfer['id']}").status_code == 204
    before = snapshot()
    assert_error(shared[MANAGER].post(f"{TRANSFERS}/{transfer['id']}/accept"), 404, "not_found")
    assert snapshot() == before


def test_unknown_transfer_is_404_and_malformed_id_400(shared: Shared) -> None:
    assert_error(shared[OWNER].get(f"{TRANSFERS}/{new_id()}"), 404, "not_found")
    assert_error(shared[OWNER].post(f"{TRANSFERS}/{new_id()}/accept"), 404, "not_found")
    assert_error(shared[OWNER].delete(f"{TRANSFERS}/{new_id()}"), 404, "not_found")
    for method in ("get", "delete"):
        assert_validation_error(getattr(shared[OWNER], method)(f"{TRANSFERS}/not-a-uuid"))
    assert_validation_error(shared[OWNER].post(f"{TRANSFERS}/not-a-uuid/accept"))


def test_removing_the_recipients_membership_deletes_the_pending_transfer(shared: Shared) -> None:
    transfer = _start(shared, READER)
    assert shared[OWNER].delete(conv_path(shared.id, "memberships", READER)).status_code == 204
    assert_error(shared[OWNER].get(f"{TRANSFERS}/{transfer['id']}"), 404, "not_found")
    assert count("conversation_ownership_transfers") == 0


def test_recipient_leaving_deletes_the_pending_transfer(shared: Shared) -> None:
    transfer = _start(shared, READER)
    assert shared[READER].delete(conv_path(shared.id, "memberships", READER)).status_code == 204
    assert_error(shared[READER].post(f"{TRANSFERS}/{transfer['id']}/accept"), 404, "not_found")


def test_deleting_the_conversation_deletes_its_pending_transfer(shared: Shared) -> None:
    transfer = _start(shared)
    assert shared[OWNER].delete(conv_path(shared.id)).status_code == 204
    assert_error(shared[MANAGER].post(f"{TRANSFERS}/{transfer['id']}/accept"), 404, "not_found")
    assert shared[MANAGER].get(TRANSFERS).json()["data"] == []
    assert count("conversation_ownership_transfers") == 0


def test_list_by_role_defaults_to_all_and_lists_oldest_first(shared: Shared) -> None:
    # MANAGER receives one transfer and sends another (as owner of a second conversation).
    received = _start(shared)
    mine = create(shared[MANAGER], title="mandy's")
    add_member(shared[MANAGER], mine["id"], OWNER, "writer")
    sent = start_transfer(shared[MANAGER], mine["id"], OWNER).json()

    client = shared[MANAGER]
    assert client.get(url(TRANSFERS, role="recipient")).json()["data"] == [received]
    assert client.get(url(TRANSFERS, role="sender")).json()["data"] == [sent]
    assert client.get(url(TRANSFERS, role="all")).json()["data"] == [received, sent]
    assert client.get(TRANSFERS).json() == {"data": [received, sent], "afterCursor": None}
    assert shared[OWNER].get(url(TRANSFERS, role="recipient")).json()["data"] == [sent]
    assert shared[OWNER].get(url(TRANSFERS, role="sender")).json()["data"] == [received]


@pytest.mark.parametrize("role", ["", "owner", "RECIPIENT", "both", "recipient,sender"])
def test_list_with_an_unknown_role_is_400(shared: Shared, role: str) -> None:
    assert_validation_error(shared[OWNER].get(url(TRANSFERS, role=role)), "role")


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"conversationId": "x", "newOwnerUserId": MANAGER},
        {"newOwnerUserId": MANAGER},
        {"conversationId": "<id>"},
        {"conversationId": "<id>", "newOwnerUserId": 7},
        {"conversationId": "<id>", "newOwnerUserId": ""},
        {"conversationId": "<id>", "newOwnerUserId": None},
        {"conversationId": "<id>", "newOwnerUserId": MANAGER, "note": "please"},
        {"conversationId": ["<id>"], "newOwnerUserId": MANAGER},
        [],
        "text",
    ],
    ids=["empty", "bad-uuid", "no-conversation", "no-recipient", "recipient-int", "recipient-empty",
         "recipient-null", "unknown-field", "conversation-list", "array", "string"],
)
def test_malformed_initiate_bodies_are_400_and_write_nothing(shared: Shared, body) -> None:
    def fill(value):
        if value == "<id>":
            return shared.id
        if isinstance(value, list):
            return [fill(item) for item in value]
        return value

    if isinstance(body, dict):
        body = {name: fill(value) for name, value in body.items()}
    before = snapshot()
    assert_validation_error(shared[OWNER].post(TRANSFERS, body, format="json"))
    assert snapshot() == before


def test_malformed_json_is_400(shared: Shared) -> None:
    response = shared[OWNER].post(TRANSFERS, "{not json", content_type="application/json")
    assert_validation_error(response)


# --- A transfer carries its sender's authority (issue 21 item 1) ----------------------------------------------------


@pytest.fixture
def co_owned(client_for) -> tuple[str, dict]:
    """The issue's tree: charlie (primary owner) with alice (co-owner) and bob (reader); alice has started a transfer
    to bob. Returns (conversation id, clients by name)."""
    clients = {name: client_for(name) for name in ("charlie", "alice", "bob")}
    conversation = create(clients["charlie"], title="co-owned")
    add_member(clients["charlie"], conversation["id"], "alice", "owner")
    add_member(clients["charlie"], conversation["id"], "bob", "reader")
    response = start_transfer(clients["alice"], conversation["id"], "bob")
    assert response.status_code == 201, response.content
    clients["transfer"] = response.json()
    return conversation["id"], clients


def _owner_user_id(conversation_id: str) -> str:
    return sql("SELECT owner_user_id FROM conversations WHERE id = %s", [conversation_id])[0][0]


def test_removing_the_sender_ends_their_transfer_and_accept_is_404(co_owned) -> None:
    conversation_id, clients = co_owned
    transfer_id = clients["transfer"]["id"]
    assert clients["charlie"].delete(conv_path(conversation_id, "memberships", "alice")).status_code == 204
    # Gone with alice's membership: not listed, not readable, and accepting it changes nothing.
    assert clients["bob"].get(TRANSFERS).json()["data"] == []
    assert_error(clients["bob"].get(f"{TRANSFERS}/{transfer_id}"), 404, "not_found")
    before = snapshot()
    assert_error(clients["bob"].post(f"{TRANSFERS}/{transfer_id}/accept"), 404, "not_found")
    assert snapshot() == before
    assert levels(conversation_id) == {"charlie": "owner", "bob": "reader"}
    assert _owner_user_id(conversation_id) == "charlie"


def test_sender_leaving_ends_their_transfer(co_owned) -> None:
    conversation_id, clients = co_owned
    assert clients["alice"].delete(conv_path(conversation_id, "memberships", "alice")).status_code == 204
    assert_error(clients["bob"].post(f"{TRANSFERS}/{clients['transfer']['id']}/accept"), 404, "not_found")
    assert levels(conversation_id) == {"charlie": "owner", "bob": "reader"}
    assert count("conversation_ownership_transfers") == 0


@pytest.mark.parametrize("level", ["manager", "writer", "reader"])
def test_lowering_the_sender_below_owner_ends_their_transfer(co_owned, level: str) -> None:
    conversation_id, clients = co_owned
    response = clients["charlie"].patch(conv_path(conversation_id, "memberships", "alice"), {"accessLevel": level},
                                        format="json")
    assert response.status_code == 200, response.content
    assert count("conversation_ownership_transfers") == 0
    assert_error(clients["bob"].post(f"{TRANSFERS}/{clients['transfer']['id']}/accept"), 404, "not_found")
    assert levels(conversation_id) == {"charlie": "owner", "alice": level, "bob": "reader"}
    assert _owner_user_id(conversation_id) == "charlie"


def test_patching_the_sender_to_owner_again_keeps_their_transfer(co_owned) -> None:
    conversation_id, clients = co_owned
    response = clients["charlie"].patch(conv_path(conversation_id, "memberships", "alice"), {"accessLevel": "owner"},
                                        format="json")
    assert response.status_code == 200, response.content
    assert count("conversation_ownership_transfers") == 1


def test_accept_rechecks_the_senders_level(co_owned) -> None:
    """A transfer whose sender lost owner level by any way (here: a row from before this rule, lowered in the table)
    is void at accept: 404, deleted, and nobody's level or ownerUserId changes."""
    conversation_id, clients = co_owned
    sql("UPDATE conversation_memberships SET access_level = 'writer' WHERE user_id = 'alice'")
    assert_error(clients["bob"].post(f"{TRANSFERS}/{clients['transfer']['id']}/accept"), 404, "not_found")
    assert levels(conversation_id) == {"charlie": "owner", "alice": "writer", "bob": "reader"}
    assert _owner_user_id(conversation_id) == "charlie"
    assert count("conversation_ownership_transfers") == 0


def test_a_co_owners_valid_transfer_moves_primary_ownership_and_demotes_only_the_previous_primary_owner(
    co_owned,
) -> None:
    """D6 for a co-owner's transfer: the recipient becomes owner and ownerUserId, the previous primary owner becomes
    manager, the co-owner who sent it stays owner; nobody else changes."""
    conversation_id, clients = co_owned
    add_member(clients["charlie"], conversation_id, "dave", "writer")
    assert clients["bob"].post(f"{TRANSFERS}/{clients['transfer']['id']}/accept").status_code == 204
    assert levels(conversation_id) == {"bob": "owner", "charlie": "manager", "alice": "owner", "dave": "writer"}
    assert _owner_user_id(conversation_id) == "bob"
    assert clients["bob"].get(conv_path(conversation_id)).json()["ownerUserId"] == "bob"
