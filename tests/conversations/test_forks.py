"""Forks (D5): a fork sees its parent's entries before the fork point and its own after; forks nest; the forks list
is the whole tree, oldest first; the fork point must be an entry the caller can see in the parent."""

from __future__ import annotations

import pytest

from tests.conftest import TEST_API_KEY
from tests.conversations.support import (
    FORK_FIELDS,
    FULL_FIELDS,
    ISO_Z,
    NON_MEMBER,
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
    count,
    create,
    history,
    new_id,
    snapshot,
)

pytestmark = pytest.mark.django_db


def _texts(client, conversation_id: str) -> list[str]:
    items = all_pages(client, conv_path(conversation_id, "entries"))
    return [item["content"][0]["text"] for item in items]


@pytest.fixture
def chat(shared: Shared) -> Shared:
    """The shared conversation with entries p0..p3 (after its two fixture entries)."""
    for index in range(4):
        shared.entries.append(append_ok(shared[OWNER], shared.id, f"p{index}"))
    return shared


def _fork(client, parent: str, at: str, text: str = "f0", fork_id: str | None = None) -> str:
    fork_id = fork_id or new_id()
    append_ok(client, fork_id, text, forkedAtConversationId=parent, forkedAtEntryId=at)
    return fork_id


def test_fork_sees_the_parents_entries_before_the_fork_point_then_its_own(chat: Shared) -> None:
    p2 = chat.entries[4]["id"]
    fork = _fork(chat[WRITER], chat.id, p2)
    append_ok(chat[WRITER], fork, "f1")
    append_ok(chat[OWNER], chat.id, "p4")  # later parent entries stay in the parent
    assert _texts(chat[READER], fork) == ["first words", "second words", "p0", "p1", "f0", "f1"]
    assert _texts(chat[READER], chat.id) == ["first words", "second words", "p0", "p1", "p2", "p3", "p4"]


def test_fork_entries_keep_their_own_conversation_id(chat: Shared) -> None:
    fork = _fork(chat[WRITER], chat.id, chat.entries[3]["id"])
    items = all_pages(chat[READER], conv_path(fork, "entries"))
    assert [item["conversationId"] for item in items] == [chat.id, chat.id, chat.id, fork]


def test_fork_at_the_first_entry_sees_nothing_of_the_parent(chat: Shared) -> None:
    fork = _fork(chat[WRITER], chat.id, chat.entries[0]["id"])
    assert _texts(chat[READER], fork) == ["f0"]


def test_fork_of_a_fork_sees_both_ancestors_prefixes(chat: Shared) -> None:
    fork = _fork(chat[WRITER], chat.id, chat.entries[4]["id"])  # sees ..p1
    f1 = append_ok(chat[WRITER], fork, "f1")["id"]
    append_ok(chat[WRITER], fork, "f2")
    grandchild = _fork(chat[OWNER], fork, f1, "g0")
    assert _texts(chat[READER], grandchild) == ["first words", "second words", "p0", "p1", "f0", "g0"]
    # Forking the grandchild at an entry it inherited from the root works too.
    great = _fork(chat[OWNER], grandchild, chat.entries[3]["id"], "h0")
    assert _texts(chat[READER], great) == ["first words", "second words", "p0", "h0"]


def test_created_fork_is_a_conversation_of_the_parents_tree(chat: Shared) -> None:
    fork = _fork(chat[WRITER], chat.id, chat.entries[4]["id"], "Branching off here to try another approach")
    body = chat[WRITER].get(conv_path(fork)).json()
    assert set(body) == FULL_FIELDS
    assert body["forkedAtConversationId"] == chat.id
    assert body["forkedAtEntryId"] == chat.entries[4]["id"]
    # Memberships and ownership belong to the tree: the writer who forked stays a writer of the fork.
    assert body["ownerUserId"] == OWNER
    assert body["accessLevel"] == "writer"
    assert chat[OWNER].get(conv_path(fork)).json()["accessLevel"] == "owner"
    assert chat[READER].get(conv_path(fork)).json()["accessLevel"] == "reader"


def test_forks_list_is_the_whole_tree_oldest_first_from_any_member_of_it(chat: Shared) -> None:
    a = _fork(chat[WRITER], chat.id, chat.entries[4]["id"])
    a_entry = append_ok(chat[WRITER], a, "a1")["id"]
    b = _fork(chat[OWNER], chat.id, chat.entries[2]["id"])
    c = _fork(chat[OWNER], a, a_entry)
    expected = [chat.id, a, b, c]
    for conversation_id in expected:
        items = all_pages(chat[READER], conv_path(conversation_id, "forks"), key=lambda f: f["conversationId"])
        assert [f["conversationId"] for f in items] == expected
    items = chat[READER].get(conv_path(c, "forks")).json()["data"]
    assert all(set(item) == FORK_FIELDS for item in items)
    assert all(ISO_Z.match(item["createdAt"]) for item in items)
    by_id = {item["conversationId"]: item for item in items}
    assert (by_id[chat.id]["forkedAtConversationId"], by_id[chat.id]["forkedAtEntryId"]) == (None, None)
    assert (by_id[a]["forkedAtConversationId"], by_id[a]["forkedAtEntryId"]) == (chat.id, chat.entries[4]["id"])
    assert (by_id[c]["forkedAtConversationId"], by_id[c]["forkedAtEntryId"]) == (a, a_entry)
    assert by_id[chat.id]["title"] == "Shared plans"


def test_forks_list_of_a_conversation_without_forks_is_itself(actor_client) -> None:
    client = actor_client(OWNER)
    conversation = create(client, title="alone")
    assert client.get(conv_path(conversation["id"], "forks")).json() == {
        "data": [{"conversationId": conversation["id"], "title": "alone", "forkedAtConversationId": None,
                  "forkedAtEntryId": None, "createdAt": conversation["createdAt"]}],
        "afterCursor": None,
    }


def test_fork_point_that_is_not_an_entry_of_the_parent_is_400_and_creates_nothing(chat: Shared) -> None:
    elsewhere = append_ok(chat[OWNER], new_id(), "another conversation")
    sibling = _fork(chat[OWNER], chat.id, chat.entries[4]["id"])
    sibling_entry = append_ok(chat[OWNER], sibling, "only in the sibling")["id"]
    before = snapshot()
    for at in (new_id(), elsewhere["id"], sibling_entry):
        target = new_id()
        response = append(chat[OWNER], target, "x", forkedAtConversationId=chat.id, forkedAtEntryId=at)
        assert_validation_error(response, "forkedAtEntryId")
        assert count("conversations", "id = %s", [target]) == 0
    assert snapshot() == before


def test_fork_point_must_be_in_the_parents_visible_history(chat: Shared) -> None:
    # p3 lies after the fork point: the fork never saw it, so it cannot be a fork point of the fork.
    fork = _fork(chat[OWNER], chat.id, chat.entries[4]["id"])
    response = append(chat[OWNER], new_id(), "x", forkedAtConversationId=fork, forkedAtEntryId=chat.entries[5]["id"])
    assert_validation_error(response, "forkedAtEntryId")


def test_fork_point_cannot_be_a_context_entry(chat: Shared, client_for) -> None:
    app = client_for(OWNER, api_key=TEST_API_KEY)
    context = app.post(conv_path(chat.id, "entries"), {"channel": "context", "content": [{"s": 1}]}, format="json")
    assert context.status_code == 201, context.content
    response = append(app, new_id(), "x", forkedAtConversationId=chat.id, forkedAtEntryId=context.json()["id"])
    assert_validation_error(response, "forkedAtEntryId")


def test_fork_of_an_unknown_or_deleted_parent_is_400_naming_it(chat: Shared) -> None:
    # The addressed resource is the new conversation; the parent is a reference in the body, so a parent that does
    # not exist is a validation error of that field (not a 404 of the path).
    response = append(chat[OWNER], new_id(), "x", forkedAtConversationId=new_id(),
                      forkedAtEntryId=chat.entries[0]["id"])
    assert_validation_error(response, "forkedAtConversationId")
    other = append_ok(chat[OWNER], new_id(), "doomed")
    assert chat[OWNER].delete(conv_path(other["conversationId"])).status_code == 204
    before = snapshot()
    response = append(chat[OWNER], new_id(), "x", forkedAtConversationId=other["conversationId"],
                      forkedAtEntryId=other["id"])
    assert_validation_error(response, "forkedAtConversationId")
    assert snapshot() == before


@pytest.mark.parametrize("actor", [READER, NON_MEMBER])
def test_fork_needs_writer_level_on_the_tree(chat: Shared, actor: str) -> None:
    before = snapshot()
    response = append(chat[actor], new_id(), "x", forkedAtConversationId=chat.id, forkedAtEntryId=chat.entries[3]["id"])
    assert_error(response, 403, "forbidden")
    assert snapshot() == before


def test_fork_fields_on_an_existing_conversation_are_400(chat: Shared) -> None:
    other = append_ok(chat[OWNER], new_id(), "exists")["conversationId"]
    before = snapshot()
    response = append(chat[OWNER], other, "x", forkedAtConversationId=chat.id, forkedAtEntryId=chat.entries[3]["id"])
    assert response.status_code == 400, response.content
    assert snapshot() == before


@pytest.mark.parametrize(
    "fields",
    [
        {"forkedAtConversationId": "<parent>"},
        {"forkedAtEntryId": "<entry>"},
        {"forkedAtConversationId": "nope", "forkedAtEntryId": "<entry>"},
        {"forkedAtConversationId": "<parent>", "forkedAtEntryId": "nope"},
        {"forkedAtConversationId": "<parent>", "forkedAtEntryId": None},
    ],
    ids=["only-conversation", "only-entry", "bad-conversation-uuid", "bad-entry-uuid", "null-entry"],
)
def test_malformed_fork_fields_are_400(chat: Shared, fields: dict) -> None:
    values = {"<parent>": chat.id, "<entry>": chat.entries[3]["id"]}
    body = {"content": history("x"), **{k: values.get(v, v) if isinstance(v, str) else v for k, v in fields.items()}}
    before = snapshot()
    assert_validation_error(chat[OWNER].post(conv_path(new_id(), "entries"), body, format="json"))
    assert snapshot() == before


def test_forking_a_fork_of_a_deleted_branch_is_400(chat: Shared) -> None:
    fork = _fork(chat[OWNER], chat.id, chat.entries[4]["id"])
    f_entry = append_ok(chat[OWNER], fork, "f1")["id"]
    assert chat[OWNER].delete(conv_path(fork)).status_code == 204
    response = append(chat[OWNER], new_id(), "x", forkedAtConversationId=fork, forkedAtEntryId=f_entry)
    assert_validation_error(response, "forkedAtConversationId")
