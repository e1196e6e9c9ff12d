"""What surrounds the API: every conversation, entry and membership write calls the live-stream publishing hook with
ids only (issue 8 "Publishing hook"), and the Django admin pages show metadata, never entry content."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model

from tests.conversations.support import (
    MANAGER,
    OWNER,
    READER,
    TRANSFERS,
    WRITER,
    add_member,
    append_ok,
    conv_path,
    create,
    new_id,
    start_transfer,
)

pytestmark = pytest.mark.django_db

SECRET = "hook-and-admin-secret-text"


@pytest.fixture
def published(monkeypatch) -> list[tuple[str, str, dict[str, Any]]]:
    """Every event the conversation and sharing services record (publish(event, kind, data), publish_all(events))."""
    calls: list[tuple[str, str, dict[str, Any]]] = []

    def record(event: str, kind: str, data: dict[str, Any]) -> None:
        calls.append((event, kind, dict(data)))

    def record_all(events) -> None:
        for event in events:
            record(*event)

    import apps.conversations.services as conversation_services
    import apps.sharing.services as sharing_services

    for services in (conversation_services, sharing_services):
        monkeypatch.setattr(services, "publish", record)
        monkeypatch.setattr(services, "publish_all", record_all)
    return calls


def _kinds(calls, since: int = 0) -> list[tuple[str, str]]:
    return [(event, kind) for event, kind, _ in calls[since:]]


def test_every_write_publishes_its_event_with_ids_only(actor_client, published) -> None:
    owner = actor_client(OWNER)
    conversation = create(owner, title="hooked")["id"]
    assert ("created", "conversation") in _kinds(published)
    assert all(data["conversationId"] == conversation for _, _, data in published)

    mark = len(published)
    entry = append_ok(owner, conversation, SECRET)
    assert _kinds(published, mark) == [("created", "entry")]
    assert published[-1][2] == {"conversationId": conversation, "entryId": entry["id"]}

    mark = len(published)
    owner.patch(conv_path(conversation), {"title": "renamed"}, format="json")
    assert _kinds(published, mark) == [("updated", "conversation")]

    mark = len(published)
    add_member(owner, conversation, READER, "reader")
    assert _kinds(published, mark) == [("created", "membership")]
    assert published[-1][2]["userId"] == READER and published[-1][2]["accessLevel"] == "reader"

    mark = len(published)
    owner.patch(conv_path(conversation, "memberships", READER), {"accessLevel": "writer"}, format="json")
    assert _kinds(published, mark) == [("updated", "membership")]

    mark = len(published)
    assert owner.delete(conv_path(conversation, "memberships", READER)).status_code == 204
    assert _kinds(published, mark) == [("deleted", "membership")]

    mark = len(published)
    assert owner.delete(conv_path(conversation)).status_code == 204
    assert ("deleted", "conversation") in _kinds(published, mark)

    assert SECRET not in repr(published), "entry content must never reach the event stream hook"


def test_an_append_that_creates_a_conversation_publishes_both(actor_client, published) -> None:
    conversation = new_id()
    append_ok(actor_client(WRITER), conversation, SECRET)
    kinds = _kinds(published)
    assert ("created", "conversation") in kinds and ("created", "entry") in kinds
    assert kinds.index(("created", "conversation")) < kinds.index(("created", "entry"))


def test_accepting_a_transfer_publishes_membership_updates_for_both_users(actor_client, published) -> None:
    owner = actor_client(OWNER)
    conversation = create(owner)["id"]
    add_member(owner, conversation, MANAGER, "manager")
    transfer = start_transfer(owner, conversation, MANAGER).json()
    mark = len(published)
    assert actor_client(MANAGER).post(f"{TRANSFERS}/{transfer['id']}/accept").status_code == 204
    updates = {(data["userId"], data["accessLevel"]) for event, kind, data in published[mark:]
               if (event, kind) == ("updated", "membership")}
    assert updates == {(MANAGER, "owner"), (OWNER, "manager")}


def test_refused_writes_publish_nothing(actor_client, published) -> None:
    owner = actor_client(OWNER)
    conversation = create(owner)["id"]
    add_member(owner, conversation, READER, "reader")
    mark = len(published)
    reader = actor_client(READER)
    assert reader.post(conv_path(conversation, "entries"), {"content": [{"role": "USER", "text": "x"}]},
                       format="json").status_code == 403
    assert reader.patch(conv_path(conversation), {"title": "x"}, format="json").status_code == 403
    assert owner.post(conv_path(conversation, "memberships"), {"userId": READER, "accessLevel": "reader"},
                      format="json").status_code == 409
    assert published[mark:] == []


@pytest.fixture
def staff_client(client):
    user = get_user_model().objects.create_superuser("ops", "ops@example.com", "pw-not-used")
    client.force_login(user)
    return client


def test_django_admin_pages_show_metadata_but_never_entry_content(actor_client, staff_client) -> None:
    owner = actor_client(OWNER)
    # The title is the first 40 characters of the first text (plaintext metadata by design): keep SECRET past it.
    entry = append_ok(owner, new_id(), "A title long enough to fill forty characters: " + SECRET)
    conversation = entry["conversationId"]
    add_member(owner, conversation, READER, "reader")
    add_member(owner, conversation, MANAGER, "manager")
    assert start_transfer(owner, conversation, MANAGER).status_code == 201
    pages = [
        "/admin/conversations/conversation/",
        f"/admin/conversations/conversation/{conversation}/change/",
        "/admin/conversations/entry/",
        f"/admin/conversations/entry/{entry['id']}/change/",
        "/admin/sharing/membership/",
        "/admin/sharing/ownershiptransfer/",
    ]
    for page in pages:
        response = staff_client.get(page)
        assert response.status_code == 200, page
        assert SECRET not in response.content.decode(), page
    listing = staff_client.get("/admin/conversations/entry/").content.decode()
    assert entry["id"] in listing
