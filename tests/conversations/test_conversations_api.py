"""Conversations through HTTP (D5): create, read, update, delete, and the list with its modes, title filter, order and
caller-scoped access levels."""

from __future__ import annotations

import time

import pytest

from tests.conversations.support import (
    CONVERSATIONS,
    FULL_FIELDS,
    ISO_Z,
    LIST_FIELDS,
    OWNER,
    READER,
    WRITER,
    Shared,
    add_member,
    all_pages,
    append_ok,
    assert_error,
    conv_path,
    count,
    create,
    new_id,
    snapshot,
)

pytestmark = pytest.mark.django_db


def _list(client, **params) -> list[dict]:
    return all_pages(client, CONVERSATIONS, **params)


def test_create_answers_201_with_the_full_conversation(actor_client) -> None:
    owner = actor_client(OWNER)
    response = owner.post(CONVERSATIONS, {"title": "Trip", "metadata": {"topic": "travel", "n": [1, 2]}},
                          format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == FULL_FIELDS
    assert body["title"] == "Trip"
    assert body["metadata"] == {"topic": "travel", "n": [1, 2]}
    assert body["ownerUserId"] == OWNER and body["accessLevel"] == "owner"
    assert body["forkedAtConversationId"] is None and body["forkedAtEntryId"] is None
    assert ISO_Z.match(body["createdAt"]) and ISO_Z.match(body["updatedAt"])
    assert owner.get(conv_path(body["id"])).json() == body


def test_create_with_an_empty_body_gives_defaults(actor_client) -> None:
    body = create(actor_client(OWNER))
    assert body["title"] == ""
    assert body["metadata"] == {}


def test_create_with_a_client_chosen_id_and_409_when_it_exists(actor_client) -> None:
    chosen = new_id()
    assert create(actor_client(OWNER), id=chosen)["id"] == chosen
    before = snapshot()
    for user in (OWNER, WRITER):  # whoever asks: the id is taken
        response = actor_client(user).post(CONVERSATIONS, {"id": chosen, "title": "again"}, format="json")
        assert_error(response, 409, "conflict")
    assert snapshot() == before


def test_client_chosen_id_of_a_deleted_conversation_stays_taken(actor_client) -> None:
    chosen = new_id()
    owner = actor_client(OWNER)
    create(owner, id=chosen)
    assert owner.delete(conv_path(chosen)).status_code == 204
    assert_error(owner.post(CONVERSATIONS, {"id": chosen}, format="json"), 409, "conflict")


def test_title_of_500_characters_is_accepted(actor_client) -> None:
    assert create(actor_client(OWNER), title="é" * 500)["title"] == "é" * 500


def test_get_answers_the_callers_level(shared: Shared) -> None:
    for actor, level in ((OWNER, "owner"), (WRITER, "writer"), (READER, "reader")):
        body = shared[actor].get(conv_path(shared.id)).json()
        assert set(body) == FULL_FIELDS
        assert body["accessLevel"] == level
        assert body["ownerUserId"] == OWNER


def test_get_of_an_unknown_id_is_404(actor_client) -> None:
    assert_error(actor_client(OWNER).get(conv_path(new_id())), 404, "not_found")


def test_patch_changes_title_and_metadata_and_bumps_updated_at(shared: Shared) -> None:
    before = shared[OWNER].get(conv_path(shared.id)).json()
    time.sleep(0.01)
    response = shared[WRITER].patch(conv_path(shared.id), {"title": "Renamed", "metadata": {"a": 1}}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == FULL_FIELDS
    assert (body["title"], body["metadata"]) == ("Renamed", {"a": 1})
    assert body["accessLevel"] == "writer"
    assert body["createdAt"] == before["createdAt"]
    assert body["updatedAt"] > before["updatedAt"]
    assert shared[READER].get(conv_path(shared.id)).json()["title"] == "Renamed"


def test_patch_of_only_the_title_keeps_the_metadata(actor_client) -> None:
    owner = actor_client(OWNER)
    conversation = create(owner, title="a", metadata={"keep": True})
    body = owner.patch(conv_path(conversation["id"]), {"title": "b"}, format="json").json()
    assert body["metadata"] == {"keep": True}
    body = owner.patch(conv_path(conversation["id"]), {"metadata": {}}, format="json").json()
    assert (body["title"], body["metadata"]) == ("b", {})


def test_patch_of_an_unknown_or_deleted_conversation_is_404(shared: Shared) -> None:
    assert_error(shared[OWNER].patch(conv_path(new_id()), {"title": "x"}, format="json"), 404, "not_found")
    assert shared[OWNER].delete(conv_path(shared.id)).status_code == 204
    assert_error(shared[OWNER].patch(conv_path(shared.id), {"title": "x"}, format="json"), 404, "not_found")


def test_delete_hides_the_conversation_everywhere(shared: Shared) -> None:
    response = shared[OWNER].delete(conv_path(shared.id))
    assert response.status_code == 204 and response.content == b""
    for actor in (OWNER, WRITER):
        for path in ("", "/entries", "/forks", "/memberships"):
            assert_error(shared[actor].get(conv_path(shared.id) + path), 404, "not_found")
        assert shared.id not in [c["id"] for c in _list(shared[actor], mode="all")]
    assert_error(shared[OWNER].delete(conv_path(shared.id)), 404, "not_found")
    assert_error(shared[WRITER].post(conv_path(shared.id, "entries"), {"content": [{"role": "USER", "text": "x"}]},
                                     format="json"), 404, "not_found")


def test_deleting_the_root_deletes_every_fork(shared: Shared) -> None:
    fork = new_id()
    append_ok(shared[WRITER], fork, "fork", forkedAtConversationId=shared.id, forkedAtEntryId=shared.entries[1]["id"])
    grandchild = new_id()
    append_ok(shared[WRITER], grandchild, "deeper", forkedAtConversationId=fork,
              forkedAtEntryId=shared.entries[0]["id"])
    assert shared[OWNER].delete(conv_path(shared.id)).status_code == 204
    for conversation_id in (fork, grandchild):
        assert_error(shared[OWNER].get(conv_path(conversation_id)), 404, "not_found")
    assert count("conversation_memberships", "root_id = %s", [shared.id]) == 0
    assert _list(shared[OWNER], mode="all") == []


def test_deleting_a_fork_deletes_it_and_its_descendants_but_not_the_parent(shared: Shared) -> None:
    fork = new_id()
    append_ok(shared[WRITER], fork, "fork", forkedAtConversationId=shared.id, forkedAtEntryId=shared.entries[1]["id"])
    grandchild = new_id()
    append_ok(shared[WRITER], grandchild, "deeper", forkedAtConversationId=fork,
              forkedAtEntryId=shared.entries[0]["id"])
    sibling = new_id()
    append_ok(shared[WRITER], sibling, "sibling", forkedAtConversationId=shared.id,
              forkedAtEntryId=shared.entries[1]["id"])
    assert_error(shared[WRITER].delete(conv_path(fork)), 403, "forbidden")
    assert shared[OWNER].delete(conv_path(fork)).status_code == 204
    for gone in (fork, grandchild):
        assert_error(shared[OWNER].get(conv_path(gone)), 404, "not_found")
    for kept in (shared.id, sibling):
        assert shared[READER].get(conv_path(kept)).status_code == 200
    forks = [f["conversationId"] for f in shared[READER].get(conv_path(shared.id, "forks")).json()["data"]]
    assert forks == [shared.id, sibling]
    # The tree's members are untouched: they belong to the root.
    assert count("conversation_memberships", "root_id = %s", [shared.id]) == 4


def test_list_holds_only_the_callers_conversations_with_list_fields(actor_client) -> None:
    olivia, walt = actor_client(OWNER), actor_client(WRITER)
    mine = create(olivia, title="mine")
    theirs = create(walt, title="theirs")
    shared = create(walt, title="shared")
    add_member(walt, shared["id"], OWNER, "reader")
    listed = _list(olivia, mode="all")
    assert {c["id"] for c in listed} == {mine["id"], shared["id"]}
    assert theirs["id"] not in {c["id"] for c in listed}
    for item in listed:
        assert set(item) == LIST_FIELDS
    assert {c["id"]: c["accessLevel"] for c in listed} == {mine["id"]: "owner", shared["id"]: "reader"}


def test_list_is_newest_updated_first_and_an_append_moves_a_conversation_up(actor_client) -> None:
    owner = actor_client(OWNER)
    created = [create(owner, title=f"c{i}") for i in range(4)]
    assert [c["id"] for c in _list(owner)] == [c["id"] for c in reversed(created)]
    append_ok(owner, created[0]["id"], "bump")
    assert next(c["id"] for c in _list(owner)) == created[0]["id"]
    owner.patch(conv_path(created[1]["id"]), {"title": "renamed"}, format="json")
    assert [c["id"] for c in _list(owner)][:2] == [created[1]["id"], created[0]["id"]]
    updated = [c["updatedAt"] for c in _list(owner)]
    assert updated == sorted(updated, reverse=True)


def test_list_query_filters_titles_case_insensitively(actor_client) -> None:
    owner = actor_client(OWNER)
    wanted = [create(owner, title=t)["id"] for t in ("Trip to Paris", "paris notes", "PARISIAN")]
    create(owner, title="Rome")
    create(owner, title="")
    assert {c["id"] for c in _list(owner, query="pARis")} == set(wanted)
    assert _list(owner, query="nothing like it") == []
    # LIKE metacharacters are matched literally.
    percent = create(owner, title="100% done")["id"]
    assert [c["id"] for c in _list(owner, query="%")] == [percent]
    assert [c["id"] for c in _list(owner, query="0%_d")] == []


@pytest.fixture
def forest(actor_client):
    """Two trees of olivia's: ``a`` with forks a1 (and a1's fork a11) and a2, ``b`` without forks."""
    owner = actor_client(OWNER)
    a = append_ok(owner, new_id(), "root a")["conversationId"]
    a_entry = owner.get(conv_path(a, "entries")).json()["data"][0]["id"]
    append_ok(owner, a, "second")
    a1 = append_ok(owner, new_id(), "fork a1", forkedAtConversationId=a, forkedAtEntryId=a_entry)["conversationId"]
    a1_entry = owner.get(conv_path(a1, "entries")).json()["data"][-1]["id"]
    append_ok(owner, a1, "more a1")
    a11 = append_ok(owner, new_id(), "fork a11", forkedAtConversationId=a1,
                    forkedAtEntryId=a1_entry)["conversationId"]
    a2 = append_ok(owner, new_id(), "fork a2", forkedAtConversationId=a, forkedAtEntryId=a_entry)["conversationId"]
    b = append_ok(owner, new_id(), "root b")["conversationId"]
    return {"client": owner, "a": a, "a1": a1, "a11": a11, "a2": a2, "b": b}


def test_list_mode_all_lists_every_conversation_of_every_tree(forest) -> None:
    listed = [c["id"] for c in _list(forest["client"], mode="all")]
    assert listed == [forest[name] for name in ("b", "a2", "a11", "a1", "a")]


def test_list_mode_roots_lists_only_roots(forest) -> None:
    assert [c["id"] for c in _list(forest["client"], mode="roots")] == [forest["b"], forest["a"]]


def test_list_mode_latest_fork_lists_the_most_recently_updated_of_each_tree(forest) -> None:
    client = forest["client"]
    assert [c["id"] for c in _list(client, mode="latest-fork")] == [forest["b"], forest["a2"]]
    assert [c["id"] for c in _list(client)] == [forest["b"], forest["a2"]]  # the default mode
    append_ok(client, forest["a1"], "a1 is now the freshest")
    assert [c["id"] for c in _list(client)] == [forest["a1"], forest["b"]]
    append_ok(client, forest["a"], "the root again")
    assert [c["id"] for c in _list(client)] == [forest["a"], forest["b"]]


def test_list_modes_combine_with_the_title_query(forest) -> None:
    client = forest["client"]
    assert [c["id"] for c in _list(client, mode="all", query="fork a1")] == [forest["a11"], forest["a1"]]
    assert [c["id"] for c in _list(client, mode="roots", query="root b")] == [forest["b"]]


def test_list_modes_follow_membership_of_the_tree(forest, actor_client) -> None:
    add_member(forest["client"], forest["a1"], READER, "reader")  # membership of tree a
    reader = actor_client(READER)
    assert {c["id"] for c in _list(reader, mode="all")} == {forest[n] for n in ("a", "a1", "a11", "a2")}
    assert [c["id"] for c in _list(reader, mode="roots")] == [forest["a"]]
    assert [c["id"] for c in _list(reader, mode="latest-fork")] == [forest["a2"]]
    assert all(c["accessLevel"] == "reader" for c in _list(reader, mode="all"))


def test_deleted_fork_leaves_the_lists(forest) -> None:
    client = forest["client"]
    assert client.delete(conv_path(forest["a2"])).status_code == 204
    assert forest["a2"] not in [c["id"] for c in _list(client, mode="all")]
    assert [c["id"] for c in _list(client)] == [forest["b"], forest["a11"]]
