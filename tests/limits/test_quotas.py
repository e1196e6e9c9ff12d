"""Quotas on stored totals (D11, issue 28 items 2 and 3): each refused at its boundary with 403 ``quota_exceeded``
and ``details: {quota, limit, used}``, nothing written by the refused call, the totals going down again when
things are deleted or expire, admin overrides, the refusals counted on /metrics, and `manage.py limits recount`."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from apps.limits import services
from apps.limits.definitions import QUOTAS
from apps.memories.models import Memory
from apps.memories.services import expire_due_memories
from tests.conversations.support import assert_error
from tests.limits.conftest import sample

pytestmark = pytest.mark.django_db


def assert_quota_exceeded(response, quota: str, limit: int, used: int) -> None:
    body = assert_error(response, 403, "quota_exceeded")
    assert body["details"] == {"quota": quota, "limit": limit, "used": used}


def put(client, user: str, key: str, value: object, **extra):
    body = {"namespace": ["user", user, "q"], "key": key, "value": value, **extra}
    return client.put("/v1/memories", body, format="json")


def get(client, user: str, key: str):
    return client.get("/v1/memories", {"ns": ["user", user, "q"], "key": key})


# --- Memories ---------------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # the PUT outside any transaction, as in production
def test_memories_count_refuses_the_new_memory_past_the_limit(client_for, fresh_user) -> None:
    user = fresh_user("mem")
    services.set_limits(user, {"memories": 3})
    client = client_for(user)
    for index in range(3):
        assert put(client, user, f"k{index}", {"n": index}).status_code == 200
    before = sample("quota_exceeded_total", quota="memories")
    assert_quota_exceeded(put(client, user, "k3", {"n": 3}), "memories", 3, 3)
    assert get(client, user, "k3").status_code == 404  # the refused write left nothing
    assert sample("quota_exceeded_total", quota="memories") == before + 1
    # Replacing a memory adds none; deleting one makes room.
    assert put(client, user, "k0", {"n": "again"}).status_code == 200
    assert client.delete(delete_path(user, "k1")).status_code == 204
    assert services.usage(user)["memories"] == 2
    assert put(client, user, "k3", {"n": 3}).status_code == 200
    assert services.usage(user)["memories"] == 3


def delete_path(user: str, key: str) -> str:
    return f"/v1/memories?ns=user&ns={user}&ns=q&key={key}"


@pytest.mark.django_db(transaction=True)  # the PUT outside any transaction, as in production
def test_memory_bytes_count_the_stored_values_and_follow_replacements(client_for, fresh_user) -> None:
    user = fresh_user("bytes")
    client = client_for(user)
    assert put(client, user, "a", {"text": "x" * 1000}).status_code == 200
    size = services.usage(user)["memory_bytes"]
    assert size > 1000  # the stored (encrypted) value
    services.set_limits(user, {"memory_bytes": 2 * size})
    assert put(client, user, "b", {"text": "y" * 1000}).status_code == 200
    assert_quota_exceeded(put(client, user, "c", {"text": "z" * 1000}), "memory_bytes", 2 * size, 2 * size)
    # Growing a memory needs room; shrinking one makes some.
    assert_quota_exceeded(put(client, user, "a", {"text": "x" * 1001}), "memory_bytes", 2 * size, 2 * size)
    assert get(client, user, "a").json()["value"] == {"text": "x" * 1000}
    assert put(client, user, "a", {"text": "x" * 500}).status_code == 200
    assert services.usage(user)["memory_bytes"] == 2 * size - 500
    assert put(client, user, "c", {"text": "z" * 400}).status_code == 200


def test_expired_and_deleted_memories_leave_the_totals(client_for, fresh_user) -> None:
    user = fresh_user("ttl")
    client = client_for(user)
    assert put(client, user, "short", {"v": 1}, ttl_seconds=60).status_code == 200
    assert put(client, user, "late", {"v": 1}, ttl_seconds=60).status_code == 200
    assert put(client, user, "kept", {"v": 1}).status_code == 200
    assert services.usage(user)["memories"] == 3
    Memory.objects.filter(key__in=["short", "late"], state="active").update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert expire_due_memories() >= 1
    assert services.usage(user)["memories"] == 1
    # A delete of a memory the sweep has not reached yet counts it once too.
    assert put(client, user, "late2", {"v": 1}, ttl_seconds=60).status_code == 200
    Memory.objects.filter(key="late2", state="active").update(expires_at=timezone.now() - timedelta(seconds=1))
    assert client.delete(delete_path(user, "late2")).status_code == 204
    assert services.usage(user) == {**services.usage(user), "memories": 1}
    assert services.recount(user)["memories"] == (1, 1)


# --- Conversations, entries, members ----------------------------------------------------------------------------


def _create(client, **body) -> str:
    response = client.post("/v1/conversations", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def _append(client, conversation_id: str, text: str = "hi", **extra):
    body = {"content": [{"role": "USER", "text": text}], **extra}
    return client.post(f"/v1/conversations/{conversation_id}/entries", body, format="json")


def test_conversations_count_creates_appends_and_forks_against_the_owner(client_for, fresh_user) -> None:
    owner, writer = fresh_user("owner"), fresh_user("writer")
    services.set_limits(owner, {"conversations": 2})
    alice = client_for(owner)
    first = _create(alice)
    entry = _append(alice, first).json()["id"]
    assert alice.post(f"/v1/conversations/{first}/memberships", {"userId": writer, "accessLevel": "writer"},
                      format="json").status_code == 201
    # A fork by a writer counts against the tree's owner.
    fork = {"forkedAtConversationId": first, "forkedAtEntryId": entry}
    fork_id = str(uuid.uuid4())
    assert _append(client_for(writer), fork_id, **fork).status_code == 201
    assert_quota_exceeded(alice.post("/v1/conversations", {}, format="json"), "conversations", 2, 2)
    new_id = str(uuid.uuid4())
    assert_quota_exceeded(_append(alice, new_id), "conversations", 2, 2)
    assert alice.get(f"/v1/conversations/{new_id}").status_code == 404
    assert_quota_exceeded(_append(client_for(writer), str(uuid.uuid4()), **fork), "conversations", 2, 2)
    assert services.usage(writer)["conversations"] == 0
    # Deleting the fork frees its place.
    assert alice.delete(f"/v1/conversations/{fork_id}").status_code == 204
    assert services.usage(owner)["conversations"] == 1
    _create(alice)
    assert services.recount(owner)["conversations"] == (2, 2)


def test_an_ownership_transfer_moves_the_conversations_and_needs_room(client_for, fresh_user) -> None:
    giver, taker = fresh_user("giver"), fresh_user("taker")
    services.set_limits(taker, {"conversations": 1})
    source, target = client_for(giver), client_for(taker)
    conversation = _create(source)
    _create(target)  # the taker is at the limit
    assert source.post(f"/v1/conversations/{conversation}/memberships", {"userId": taker, "accessLevel": "reader"},
                       format="json").status_code == 201
    transfer = source.post("/v1/ownership-transfers", {"conversationId": conversation, "newOwnerUserId": taker},
                           format="json").json()["id"]
    assert_quota_exceeded(target.post(f"/v1/ownership-transfers/{transfer}/accept"), "conversations", 1, 1)
    assert target.get(f"/v1/conversations/{conversation}").json()["ownerUserId"] == giver
    services.set_limits(taker, {"conversations": 2})
    assert target.post(f"/v1/ownership-transfers/{transfer}/accept").status_code == 204
    assert (services.usage(giver)["conversations"], services.usage(taker)["conversations"]) == (0, 2)


def test_entry_bytes_count_what_the_writer_stored_until_the_conversation_goes(client_for, fresh_user) -> None:
    user = fresh_user("writer")
    client = client_for(user)
    conversation = _create(client)
    assert _append(client, conversation, "a" * 2000).status_code == 201
    size = services.usage(user)["entry_bytes"]
    assert size > 2000
    services.set_limits(user, {"entry_bytes": 2 * size})
    assert _append(client, conversation, "b" * 2000).status_code == 201
    assert_quota_exceeded(_append(client, conversation, "c" * 2000), "entry_bytes", 2 * size, 2 * size)
    assert len(client.get(f"/v1/conversations/{conversation}/entries").json()["data"]) == 2
    assert client.delete(f"/v1/conversations/{conversation}").status_code == 204
    assert services.usage(user)["entry_bytes"] == 0


def test_a_keyed_append_is_charged_and_refused_as_any_append(client_for, fresh_user) -> None:
    """An entry key (D11) rides on the append: the same entry_bytes charge (the stored content, as `limits
    recount` counts it), the same refusal, and a refused keyed append leaves nothing its key would find."""
    user = fresh_user("keyed")
    client = client_for(user)
    conversation = _create(client)
    assert _append(client, conversation, "a" * 2000).status_code == 201
    size = services.usage(user)["entry_bytes"]
    assert _append(client, conversation, "b" * 2000, key="lgcp-1").status_code == 201
    assert services.usage(user)["entry_bytes"] == 2 * size
    call_command("limits", "recount", user, verbosity=0)
    assert services.usage(user)["entry_bytes"] == 2 * size
    services.set_limits(user, {"entry_bytes": 2 * size})
    assert_quota_exceeded(_append(client, conversation, "c" * 2000, key="lgcp-2"), "entry_bytes", 2 * size, 2 * size)
    assert client.get(f"/v1/conversations/{conversation}/entries", {"key": "lgcp-2"}).json()["data"] == []
    assert [entry["key"] for entry in client.get(f"/v1/conversations/{conversation}/entries",
                                                 {"key": "lgcp-1"}).json()["data"]] == ["lgcp-1"]  # fmt: skip


def test_the_default_members_quota_stops_invented_members(client_for, fresh_user) -> None:
    """Issue 28 item 3: any user could add 2,000 invented user ids to a conversation. The default quota (the owner
    counts as a member) stops that at its limit."""
    limit = QUOTAS["members_per_conversation"].default
    owner = fresh_user("host")
    client = client_for(owner)
    conversation = _create(client)
    path = f"/v1/conversations/{conversation}/memberships"
    for index in range(limit - 1):
        response = client.post(path, {"userId": f"invented-{index}", "accessLevel": "reader"}, format="json")
        assert response.status_code == 201, (index, response.content)
    before = sample("quota_exceeded_total", quota="members_per_conversation")
    refused = client.post(path, {"userId": "one-too-many", "accessLevel": "reader"}, format="json")
    assert_quota_exceeded(refused, "members_per_conversation", limit, limit)
    assert sample("quota_exceeded_total", quota="members_per_conversation") == before + 1
    assert client.delete(f"{path}/invented-0").status_code == 204
    assert client.post(path, {"userId": "one-too-many", "accessLevel": "reader"}, format="json").status_code == 201


def test_the_owners_members_limit_applies_whoever_adds(client_for, fresh_user) -> None:
    owner, manager = fresh_user("host"), fresh_user("manager")
    services.set_limits(owner, {"members_per_conversation": 3})
    services.set_limits(manager, {"members_per_conversation": 1000})
    conversation = _create(client_for(owner))
    path = f"/v1/conversations/{conversation}/memberships"
    assert client_for(owner).post(path, {"userId": manager, "accessLevel": "manager"}, format="json").status_code == 201
    assert client_for(manager).post(path, {"userId": "r1", "accessLevel": "reader"}, format="json").status_code == 201
    assert_quota_exceeded(
        client_for(manager).post(path, {"userId": "r2", "accessLevel": "reader"}, format="json"),
        "members_per_conversation", 3, 3,
    )
    # Already a member: the conflict, not the quota.
    assert client_for(owner).post(path, {"userId": "r1", "accessLevel": "reader"}, format="json").status_code == 409


# --- Attachments ------------------------------------------------------------------------------------------------


def _upload(client, size: int):
    file = SimpleUploadedFile("f.bin", b"\x01" * size, content_type="application/octet-stream")
    return client.post("/v1/attachments", {"file": file}, format="multipart")


def test_attachments_count_and_bytes(client_for, fresh_user, settings, tmp_path) -> None:
    settings.ATTACHMENT_DIR = str(tmp_path)
    user = fresh_user("files")
    services.set_limits(user, {"attachments": 3, "attachment_bytes": 2500})
    client = client_for(user)
    first = _upload(client, 1000)
    assert first.status_code == 201
    assert _upload(client, 1000).status_code == 201
    # The third would pass the bytes quota: refused while it streams, nothing left behind.
    assert_quota_exceeded(_upload(client, 1000), "attachment_bytes", 2500, 2000)
    assert services.usage(user) | {} == {**services.usage(user), "attachments": 2, "attachment_bytes": 2000}
    assert _upload(client, 500).status_code == 201
    assert_quota_exceeded(_upload(client, 1), "attachments", 3, 3)
    assert len([path for path in tmp_path.rglob("*") if path.is_file()]) == 3
    assert client.delete(f"/v1/attachments/{first.json()['id']}").status_code == 204
    assert services.usage(user)["attachments"] == 2 and services.usage(user)["attachment_bytes"] == 1500


def test_expired_attachments_leave_the_totals(client_for, fresh_user, settings, tmp_path) -> None:
    from apps.attachments.models import Attachment
    from apps.attachments.services import remove_expired

    settings.ATTACHMENT_DIR = str(tmp_path)
    user = fresh_user("expiring")
    client = client_for(user)
    assert _upload(client, 700).status_code == 201
    assert _upload(client, 300).status_code == 201
    Attachment.objects.filter(user_id=user).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert remove_expired() == 2
    assert services.usage(user)["attachments"] == 0 and services.usage(user)["attachment_bytes"] == 0


# --- Recount, show --------------------------------------------------------------------------------------------------


def test_recount_rebuilds_drifted_totals(client_for, fresh_user, capsys) -> None:
    user = fresh_user("drift")
    client = client_for(user)
    assert put(client, user, "a", {"v": 1}).status_code == 200
    _append(client, _create(client), "hello")
    truth = services.usage(user)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE limits_usage SET used = used + 999 WHERE user_id = %s", [user])
        cursor.execute("DELETE FROM limits_usage WHERE user_id = %s AND quota = 'conversations'", [user])
    assert services.usage(user) != truth
    call_command("limits", "recount", user)
    assert "->" in capsys.readouterr().out
    assert services.usage(user) == truth
    call_command("limits", "recount", "--all")
    assert f"{user}: unchanged" in capsys.readouterr().out
    call_command("limits", "show", user)
    shown = capsys.readouterr().out
    assert "memories" in shown and "members_per_conversation" in shown
