"""Every sharing write path under 32 real concurrent HTTP clients against the live server: memberships and ownership
transfers are serialised in the database (unique constraints, the partial unique index, row locks), so races end
with exactly one winner, no 5xx and consistent tables."""

# ruff: noqa: B008 - each call binds its own client (own connection) as a default argument, on purpose

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from tests.conversations.support import (
    CONVERSATIONS,
    TRANSFERS,
    assert_no_5xx,
    conv_path,
    count,
    levels,
    run_concurrently,
    sql,
    statuses,
)

pytestmark = pytest.mark.django_db(transaction=True)

CLIENTS = 32


@pytest.fixture
def tree(http):
    """A conversation owned by ``olivia`` with a manager ``mandy`` and a reader ``rita``; returns (id, owner)."""
    owner = http("olivia")
    response = owner.post(CONVERSATIONS, {"title": "raced"})
    assert response.status_code == 201, response.text
    conversation_id = response.json()["id"]
    for user, level in (("mandy", "manager"), ("rita", "reader")):
        response = owner.post(conv_path(conversation_id, "memberships"), {"userId": user, "accessLevel": level})
        assert response.status_code == 201, response.text
    return conversation_id, owner


def test_concurrent_adds_of_the_same_user_one_201_the_rest_409(tree, http) -> None:
    conversation_id, _ = tree
    adders = [http("olivia") if i % 2 else http("mandy") for i in range(CLIENTS)]
    responses = run_concurrently([
        lambda c=c: c.post(conv_path(conversation_id, "memberships"), {"userId": "nico", "accessLevel": "reader"})
        for c in adders
    ])
    assert_no_5xx(responses)
    assert statuses(responses) == [201] + [409] * (CLIENTS - 1)
    assert all(r.json()["code"] == "conflict" for r in responses if r.status_code == 409)
    assert count("conversation_memberships", "user_id = %s", ["nico"]) == 1


def test_concurrent_adds_of_different_users_all_201(tree, http) -> None:
    conversation_id, _ = tree
    responses = run_concurrently([
        lambda i=i, c=http("mandy"): c.post(conv_path(conversation_id, "memberships"),
                                            {"userId": f"user{i}", "accessLevel": "writer"})
        for i in range(CLIENTS)
    ])
    assert_no_5xx(responses)
    assert statuses(responses) == [201] * CLIENTS
    assert len(levels(conversation_id)) == CLIENTS + 3


def test_concurrent_patches_of_one_membership_all_200_and_the_last_write_stays(tree, http) -> None:
    conversation_id, _ = tree
    wanted = ["writer" if i % 2 else "reader" for i in range(CLIENTS)]
    responses = run_concurrently([
        lambda level=level, c=http("mandy"): c.patch(conv_path(conversation_id, "memberships", "rita"),
                                                     {"accessLevel": level})
        for level in wanted
    ])
    assert_no_5xx(responses)
    assert statuses(responses) == [200] * CLIENTS
    assert levels(conversation_id)["rita"] in {"writer", "reader"}
    assert count("conversation_memberships", "user_id = %s", ["rita"]) == 1


def test_concurrent_patches_and_deletes_of_one_membership(tree, http) -> None:
    conversation_id, _ = tree
    path = conv_path(conversation_id, "memberships", "rita")
    calls = []
    for i in range(CLIENTS):
        client = http("olivia" if i % 3 else "mandy")
        if i % 4 == 0:
            calls.append(lambda c=client: c.delete(path))
        else:
            calls.append(lambda c=client, i=i: c.patch(path, {"accessLevel": "writer" if i % 2 else "reader"}))
    responses = run_concurrently(calls)
    assert_no_5xx(responses)
    deletes = [r.status_code for i, r in enumerate(responses) if i % 4 == 0]
    patches = [r.status_code for i, r in enumerate(responses) if i % 4]
    assert sorted(deletes) == [204] + [404] * (len(deletes) - 1)
    assert set(patches) <= {200, 404}
    # The delete won in the end: whatever PATCH ran before it, the membership is gone and stays gone.
    assert "rita" not in levels(conversation_id)
    assert http("rita").get(conv_path(conversation_id)).status_code == 403


def test_concurrent_leaves_and_removals_of_one_member_one_204(tree, http) -> None:
    conversation_id, _ = tree
    path = conv_path(conversation_id, "memberships", "rita")
    responses = run_concurrently([lambda c=http(("rita", "olivia", "mandy")[i % 3]): c.delete(path)
                                  for i in range(CLIENTS)])
    assert_no_5xx(responses)
    # rita's own DELETEs after her membership is gone are 403 (she is no longer a member) or 404.
    codes = statuses(responses)
    assert codes.count(204) == 1
    assert set(codes) <= {204, 403, 404}
    assert "rita" not in levels(conversation_id)


def test_concurrent_transfers_one_201_the_rest_409_naming_it(tree, http) -> None:
    conversation_id, _ = tree
    recipients = ["mandy", "rita"]
    responses = run_concurrently([
        lambda i=i, c=http("olivia"): c.post(TRANSFERS, {"conversationId": conversation_id,
                                                         "newOwnerUserId": recipients[i % 2]})
        for i in range(CLIENTS)
    ])
    assert_no_5xx(responses)
    assert statuses(responses) == [201] + [409] * (CLIENTS - 1)
    winner = next(r.json() for r in responses if r.status_code == 201)
    for response in responses:
        if response.status_code == 409:
            assert response.json()["details"]["existingTransferId"] == winner["id"]
    assert sql("SELECT id::text FROM conversation_ownership_transfers") == [(winner["id"],)]


def test_concurrent_accepts_one_204_the_rest_404(tree, http) -> None:
    conversation_id, owner = tree
    response = owner.post(TRANSFERS, {"conversationId": conversation_id, "newOwnerUserId": "rita"})
    assert response.status_code == 201, response.text
    transfer_id = response.json()["id"]

    responses = run_concurrently([lambda c=http("rita"): c.post(f"{TRANSFERS}/{transfer_id}/accept")
                                  for _ in range(CLIENTS)])
    assert_no_5xx(responses)
    assert statuses(responses) == [204] + [404] * (CLIENTS - 1)
    assert levels(conversation_id) == {"rita": "owner", "olivia": "manager", "mandy": "manager"}
    assert sql("SELECT DISTINCT owner_user_id FROM conversations WHERE root_id = %s", [conversation_id]) == [("rita",)]
    assert count("conversation_ownership_transfers") == 0


def test_concurrent_accepts_cancels_and_declines_exactly_one_wins(tree, http) -> None:
    conversation_id, owner = tree
    transfer_id = owner.post(TRANSFERS, {"conversationId": conversation_id, "newOwnerUserId": "rita"}).json()["id"]
    kinds = ["accept", "cancel", "decline", "accept"] * (CLIENTS // 4)

    def call(kind: str):
        if kind == "accept":
            return lambda c=http("rita"): c.post(f"{TRANSFERS}/{transfer_id}/accept")
        return lambda c=http("olivia" if kind == "cancel" else "rita"): c.delete(f"{TRANSFERS}/{transfer_id}")

    responses = run_concurrently([call(kind) for kind in kinds])
    assert_no_5xx(responses)
    assert statuses(responses) == [204] + [404] * (CLIENTS - 1)
    winner = next(kind for kind, r in zip(kinds, responses, strict=True) if r.status_code == 204)
    expected_owner = "rita" if winner == "accept" else "olivia"
    assert levels(conversation_id)[expected_owner] == "owner"
    assert sql("SELECT owner_user_id FROM conversations WHERE id = %s", [conversation_id]) == [(expected_owner,)]
    assert Counter(levels(conversation_id).values())["owner"] == 1
    assert count("conversation_ownership_transfers") == 0


def test_accept_racing_the_removal_of_the_recipient_leaves_a_consistent_tree(tree, http) -> None:
    conversation_id, owner = tree
    transfer_id = owner.post(TRANSFERS, {"conversationId": conversation_id, "newOwnerUserId": "rita"}).json()["id"]
    calls = []
    for i in range(CLIENTS):
        if i % 2:
            calls.append(lambda c=http("rita"): c.post(f"{TRANSFERS}/{transfer_id}/accept"))
        else:
            calls.append(lambda c=http("olivia"): c.delete(conv_path(conversation_id, "memberships", "rita")))
    responses = run_concurrently(calls)
    assert_no_5xx(responses)
    accepted = [r.status_code for i, r in enumerate(responses) if i % 2]
    removals = [r.status_code for i, r in enumerate(responses) if not i % 2]
    final = levels(conversation_id)
    (primary,) = sql("SELECT owner_user_id FROM conversations WHERE id = %s", [conversation_id])[0]
    assert count("conversation_ownership_transfers") == 0
    if 204 in accepted:
        # rita became the primary owner first; removing her afterwards is refused (403 for the now-manager olivia).
        assert sorted(accepted) == [204] + [404] * (len(accepted) - 1)
        assert primary == "rita" and final["rita"] == "owner" and final["olivia"] == "manager"
        assert set(removals) <= {400, 403, 404}
    else:
        # rita was removed first: the transfer went with her membership.
        assert set(accepted) <= {403, 404}
        assert primary == "olivia" and "rita" not in final
        assert removals.count(204) == 1
    assert final[primary] == "owner"


def test_concurrent_adds_through_different_conversations_of_one_tree_one_201(tree, http) -> None:
    conversation_id, owner = tree
    entry = owner.post(conv_path(conversation_id, "entries"), {"content": [{"role": "USER", "text": "x"}]}).json()
    forks = []
    for _ in range(3):
        fork_id = str(uuid.uuid4())
        response = owner.post(conv_path(fork_id, "entries"), {
            "content": [{"role": "USER", "text": "fork"}], "forkedAtConversationId": conversation_id,
            "forkedAtEntryId": entry["id"]})
        assert response.status_code == 201, response.text
        forks.append(fork_id)
    targets = [conversation_id, *forks]
    responses = run_concurrently([
        lambda i=i, c=http("olivia"): c.post(conv_path(targets[i % len(targets)], "memberships"),
                                             {"userId": "nico", "accessLevel": "writer"})
        for i in range(CLIENTS)
    ])
    assert_no_5xx(responses)
    assert statuses(responses) == [201] + [409] * (CLIENTS - 1)
    assert count("conversation_memberships", "user_id = %s", ["nico"]) == 1
    for target in targets:
        assert http("nico").get(conv_path(target)).json()["accessLevel"] == "writer"


def test_accept_of_a_co_owners_transfer_racing_the_removal_and_lowering_of_that_co_owner(http) -> None:
    """Issue 21 item 1 under 32 clients on two trees: charlie (primary owner) removes or lowers alice (co-owner) while
    bob accepts alice's transfer. Either the accept ran first (bob primary owner, charlie manager, alice still owner:
    charlie, now a manager, may no longer touch her) or a removal/lowering did (the transfer went with alice's
    authority: every accept 404, charlie still the primary owner). Never both."""
    charlie = http("charlie")
    trees = []
    for _ in range(2):
        conversation_id = charlie.post(CONVERSATIONS, {"title": "co-owned"}).json()["id"]
        for user, level in (("alice", "owner"), ("bob", "reader")):
            response = charlie.post(conv_path(conversation_id, "memberships"), {"userId": user, "accessLevel": level})
            assert response.status_code == 201, response.text
        response = http("alice").post(TRANSFERS, {"conversationId": conversation_id, "newOwnerUserId": "bob"})
        assert response.status_code == 201, response.text
        trees.append((conversation_id, response.json()["id"]))

    kinds = ["accept", "remove", "accept", "lower"] * (CLIENTS // 4)
    calls = []
    for i, kind in enumerate(kinds):
        conversation_id, transfer_id = trees[(i // 4) % 2]
        alice_path = conv_path(conversation_id, "memberships", "alice")
        if kind == "accept":
            calls.append(lambda c=http("bob"), t=transfer_id: c.post(f"{TRANSFERS}/{t}/accept"))
        elif kind == "remove":
            calls.append(lambda c=http("charlie"), p=alice_path: c.delete(p))
        else:
            calls.append(lambda c=http("charlie"), p=alice_path: c.patch(p, {"accessLevel": "writer"}))
    responses = run_concurrently(calls)
    assert_no_5xx(responses)

    for tree_index, (conversation_id, _transfer_id) in enumerate(trees):
        mine = [(kind, r.status_code) for i, (kind, r) in enumerate(zip(kinds, responses, strict=True))
                if (i // 4) % 2 == tree_index]
        accepts = sorted(code for kind, code in mine if kind == "accept")
        changes = [code for kind, code in mine if kind != "accept"]
        final = levels(conversation_id)
        (primary,) = sql("SELECT DISTINCT owner_user_id FROM conversations WHERE root_id = %s", [conversation_id])[0]
        if 204 in accepts:
            assert accepts == [204] + [404] * (len(accepts) - 1)
            assert set(changes) == {403}  # charlie is a manager by then; alice an owner
            assert primary == "bob"
            assert final == {"bob": "owner", "charlie": "manager", "alice": "owner"}
        else:
            assert set(accepts) == {404}
            assert 204 in changes or 200 in changes
            assert set(changes) <= {200, 204, 404}
            assert primary == "charlie"
            assert final["charlie"] == "owner" and final["bob"] == "reader"
            assert final.get("alice") in (None, "writer")
        assert Counter(final.values())["owner"] in (1, 2)
    assert count("conversation_ownership_transfers") == 0


def test_delete_racing_membership_changes_archives_exactly_the_members_it_saw(tree, http) -> None:
    """Issue 21 item 3 under 32 clients: the owner deletes the conversation while the manager adds members and the
    owner lowers the reader. Whatever ran before the delete is what the admin view shows afterwards; nothing is left
    live, and nothing done after the delete landed."""
    conversation_id, _ = tree
    calls = []
    for i in range(CLIENTS):
        if i % 8 == 0:
            calls.append(lambda c=http("olivia"): c.delete(conv_path(conversation_id)))
        elif i % 8 == 1:
            calls.append(lambda c=http("olivia"), i=i: c.patch(conv_path(conversation_id, "memberships", "rita"),
                                                               {"accessLevel": "writer" if i % 16 == 1 else "reader"}))
        else:
            calls.append(lambda c=http("mandy"), i=i: c.post(conv_path(conversation_id, "memberships"),
                                                             {"userId": f"late{i}", "accessLevel": "reader"}))
    responses = run_concurrently(calls)
    assert_no_5xx(responses)
    deletes = sorted(r.status_code for i, r in enumerate(responses) if i % 8 == 0)
    assert deletes == [204] + [404] * (len(deletes) - 1)
    added = {f"late{i}" for i, r in enumerate(responses) if i % 8 > 1 and r.status_code == 201}
    assert {r.status_code for i, r in enumerate(responses) if i % 8 > 1} <= {201, 404}
    assert levels(conversation_id) == {}
    archived = dict(sql("SELECT user_id, access_level FROM conversation_memberships_archive WHERE root_id = %s",
                        [conversation_id]))
    assert set(archived) == {"olivia", "mandy", "rita"} | added
    assert archived["olivia"] == "owner" and archived["mandy"] == "manager"
    admin = http("adam", roles=("user", "admin"))
    response = admin.get(f"/v1/admin/conversations/{conversation_id}/memberships?limit=1000")
    assert response.status_code == 200, response.text
    assert {m["userId"]: m["accessLevel"] for m in response.json()["data"]} == archived
    for user in archived:
        assert http(user).get(conv_path(conversation_id)).status_code == 404
