"""Admin conversation views (D5): auditor and admin see every conversation, deleted ones on request, every entry of
every channel decrypted, memberships and forks; each call leaves an audit row and a JSON log line; the views are
read-only."""

from __future__ import annotations

import logging

import pytest

from tests.conftest import TEST_API_KEY
from tests.conversations.support import (
    ADMIN,
    ADMIN_USER,
    AUDITOR_USER,
    ENTRY_FIELDS,
    MEMBERSHIP_FIELDS,
    OWNER,
    READER,
    WRITER,
    Shared,
    all_pages,
    append_ok,
    assert_error,
    conv_path,
    create,
    new_id,
    snapshot,
    sql,
    url,
)

pytestmark = pytest.mark.django_db

BASE_FIELDS = {"id", "title", "ownerUserId", "createdAt", "updatedAt"}


@pytest.fixture(params=[ADMIN_USER, AUDITOR_USER])
def staff(request, actor_client):
    return actor_client(request.param)


def _ids(items: list[dict], key: str = "id") -> list[str]:
    return [item[key] for item in items]


def test_admin_list_holds_every_users_conversations_newest_first(staff, actor_client) -> None:
    a = create(actor_client(OWNER), title="olivia's")
    b = create(actor_client(WRITER), title="walt's")
    c = create(actor_client(READER), title="rita's")
    items = all_pages(staff, ADMIN)
    assert _ids(items) == [c["id"], b["id"], a["id"]]
    for item in items:
        assert BASE_FIELDS <= set(item)
    assert {item["id"]: item["ownerUserId"] for item in items} == {a["id"]: OWNER, b["id"]: WRITER, c["id"]: READER}


def test_admin_list_filters_by_owner(staff, actor_client) -> None:
    mine = [create(actor_client(OWNER))["id"] for _ in range(2)]
    create(actor_client(WRITER))
    assert set(_ids(all_pages(staff, ADMIN, userId=OWNER))) == set(mine)
    assert all_pages(staff, ADMIN, userId="nobody-at-all") == []


def test_admin_list_includes_deleted_conversations_only_on_request(staff, actor_client) -> None:
    owner = actor_client(OWNER)
    kept = create(owner)["id"]
    gone = create(owner)["id"]
    assert owner.delete(conv_path(gone)).status_code == 204
    assert _ids(all_pages(staff, ADMIN)) == [kept]
    assert _ids(all_pages(staff, ADMIN, includeDeleted="false")) == [kept]
    with_deleted = all_pages(staff, ADMIN, includeDeleted="true")
    assert set(_ids(with_deleted)) == {kept, gone}
    deleted_at = {item["id"]: item.get("deletedAt") for item in with_deleted}
    assert deleted_at[kept] is None and deleted_at[gone]


def test_admin_get_returns_any_conversation_even_a_deleted_one(staff, shared: Shared) -> None:
    response = staff.get(f"{ADMIN}/{shared.id}")
    assert response.status_code == 200, response.content
    body = response.json()
    assert BASE_FIELDS <= set(body)
    assert (body["id"], body["title"], body["ownerUserId"]) == (shared.id, "Shared plans", OWNER)
    assert shared[OWNER].delete(conv_path(shared.id)).status_code == 204
    body = staff.get(f"{ADMIN}/{shared.id}").json()
    assert body["id"] == shared.id and body["deletedAt"]
    assert_error(staff.get(f"{ADMIN}/{new_id()}"), 404, "not_found")


def test_admin_entries_hold_every_channel_decrypted(staff, shared: Shared, client_for) -> None:
    app = client_for(WRITER, api_key=TEST_API_KEY)
    response = app.post(conv_path(shared.id, "entries"), {"channel": "context", "content": [{"state": "s1"}]},
                        format="json")
    assert response.status_code == 201, response.content
    items = all_pages(staff, f"{ADMIN}/{shared.id}/entries")
    assert all(ENTRY_FIELDS <= set(item) for item in items)
    assert [(item["channel"], item["content"]) for item in items] == [
        ("history", [{"role": "USER", "text": "first words"}]),
        ("history", [{"role": "AI", "text": "second words"}]),
        ("context", [{"state": "s1"}]),
    ]


def test_admin_memberships_and_forks(staff, shared: Shared) -> None:
    members = all_pages(staff, f"{ADMIN}/{shared.id}/memberships", key=lambda m: m["userId"])
    assert all(MEMBERSHIP_FIELDS <= set(m) for m in members)
    assert [(m["userId"], m["accessLevel"]) for m in members] == [
        (OWNER, "owner"), ("mandy", "manager"), (WRITER, "writer"), (READER, "reader")]
    fork = append_ok(shared[WRITER], new_id(), "fork", forkedAtConversationId=shared.id,
                     forkedAtEntryId=shared.entries[1]["id"])["conversationId"]
    forks = all_pages(staff, f"{ADMIN}/{shared.id}/forks", key=lambda f: f["conversationId"])
    assert _ids(forks, "conversationId") == [shared.id, fork]


def test_admin_memberships_of_a_deleted_conversation_show_who_had_access(staff, shared: Shared) -> None:
    """Issue 21 item 3: the members a tree had when it was deleted stay visible to the admin view (the conversation
    itself and any fork of it), and grant nothing: every former member is refused and lists none of it."""
    fork = append_ok(shared[WRITER], new_id(), "fork", forkedAtConversationId=shared.id,
                     forkedAtEntryId=shared.entries[1]["id"])["conversationId"]
    before = all_pages(staff, f"{ADMIN}/{shared.id}/memberships", key=lambda m: m["userId"])
    assert shared[OWNER].delete(conv_path(shared.id)).status_code == 204
    for conversation_id in (shared.id, fork):
        after = all_pages(staff, f"{ADMIN}/{conversation_id}/memberships", key=lambda m: m["userId"], limit=2)
        assert [(m["userId"], m["accessLevel"], m["createdAt"]) for m in after] == [
            (m["userId"], m["accessLevel"], m["createdAt"]) for m in before]
        assert {m["conversationId"] for m in after} == {conversation_id}
    assert sql("SELECT count(*) FROM conversation_memberships WHERE root_id = %s", [shared.id]) == [(0,)]
    for actor in (OWNER, "mandy", WRITER, READER):
        client = shared[actor]
        for conversation_id in (shared.id, fork):
            assert_error(client.get(conv_path(conversation_id)), 404, "not_found")
            assert_error(client.get(conv_path(conversation_id, "entries")), 404, "not_found")
            assert_error(client.get(conv_path(conversation_id, "memberships")), 404, "not_found")
            assert_error(client.get(conv_path(conversation_id, "forks")), 404, "not_found")
        assert_error(client.post(conv_path(shared.id, "memberships"), {"userId": "nico", "accessLevel": "reader"},
                                 format="json"), 404, "not_found")
        assert_error(client.post(conv_path(shared.id, "entries"), {"content": [{"role": "USER", "text": "x"}]},
                                 format="json"), 404, "not_found")
        for mode in ("all", "roots", "latest-fork"):
            assert client.get(url("/v1/conversations", mode=mode)).json()["data"] == []
        response = client.post("/v1/conversations/search", {"query": "words"}, format="json")
        assert response.status_code == 200 and response.json()["data"] == []


@pytest.mark.parametrize(
    ("path", "action_part"),
    [("", "list"), ("/{id}", "get"), ("/{id}/entries", "entries"), ("/{id}/memberships", "memberships"),
     ("/{id}/forks", "forks")],
)
def test_every_admin_call_is_audited_to_the_table_and_the_log(shared: Shared, actor_client, caplog, path: str,
                                                                action_part: str) -> None:
    auditor = actor_client(AUDITOR_USER)
    before = sql("SELECT count(*) FROM admin_audit_log")[0][0]
    with caplog.at_level(logging.INFO, logger="apps.audit"):
        response = auditor.get(url(ADMIN + path.format(id=shared.id), limit=7))
    assert response.status_code == 200, response.content
    rows = sql("SELECT user_id, action, target_id, params::text, request_id FROM admin_audit_log ORDER BY id")
    assert len(rows) == before + 1
    user_id, action, target_id, params, request_id = rows[-1]
    assert user_id == AUDITOR_USER
    assert action.startswith("admin.conversations") and action_part in action
    assert request_id == response["X-Request-ID"]
    if "{id}" in path:
        assert target_id == shared.id
    # Content never reaches the audit trail.
    assert "first words" not in params
    logged = [r for r in caplog.records if r.name == "apps.audit"]
    assert logged and getattr(logged[-1], "action", None) == action
    assert all("first words" not in r.getMessage() for r in caplog.records)


def test_refused_admin_calls_show_nothing(shared: Shared) -> None:
    response = shared[OWNER].get(f"{ADMIN}/{shared.id}/entries")
    body = assert_error(response, 403, "forbidden")
    assert "first words" not in str(body)


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
@pytest.mark.parametrize("path", ["", "/{id}", "/{id}/entries", "/{id}/memberships"])
def test_admin_views_are_read_only(shared: Shared, actor_client, method: str, path: str) -> None:
    admin = actor_client(ADMIN_USER)
    before = snapshot()
    response = getattr(admin, method)(ADMIN + path.format(id=shared.id), {}, format="json")
    assert response.status_code == 405, (method, path, response.status_code)
    assert response["Content-Type"].startswith("application/json")
    assert snapshot() == before
