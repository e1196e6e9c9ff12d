"""Conversation writes: create, update, delete, append an entry. Each is one transaction.

Entries of one conversation are serialised by locking the conversation row (SELECT ... FOR UPDATE), and each
entry's ``created_at`` is taken after the lock, strictly later than the conversation's ``updated_at`` (which every
append moves to the new entry's time): entry order is commit order, so a reader paging by (created_at, id) never
misses an entry that commits late. Content is encrypted in Python; the database only sees ciphertext.

Memberships live in apps.sharing; this app grants the creator's owner membership and reads the caller's level
through apps.sharing.access (the only part of sharing it uses) and announces deletions with the core
``conversation_deleting`` signal. Fork trees are locked in the order apps.conversations.trees documents.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.conversations import selectors, trees
from apps.conversations.indexer import INDEXER
from apps.conversations.models import Channel, Conversation, Entry
from apps.conversations.responses import EntryResponse
from apps.core import errors, signals
from apps.encryption import crypto
from apps.events.publisher import publish, publish_all
from apps.identity.principal import Principal
from apps.limits import services as limits
from apps.retrieval import indexing
from apps.sharing import access
from apps.sharing.access import AccessLevel, at_least

TITLE_FROM_TEXT_CHARS = 40


# --- Conversations ----------------------------------------------------------------------------------------------


def create_conversation(
    principal: Principal, *, conversation_id: UUID | None, title: str | None, metadata: dict | None
) -> dict:
    conversation_id = conversation_id or uuid.uuid4()
    limits.check_class(principal, "creates")
    now = timezone.now()
    with transaction.atomic():
        inserted = _insert_conversation(
            conversation_id,
            root_id=conversation_id,
            owner_user_id=principal.user_id,
            title=title or "",
            metadata=metadata or {},
            now=now,
        )
        if not inserted:
            raise errors.conflict("A conversation with this id already exists.")
        limits.charge(principal.user_id, conversations=1)
        access.grant_owner(str(conversation_id), principal.user_id, now)
        publish_all(_created(conversation_id, principal.user_id))
    row = selectors.ConversationRow(
        id=conversation_id,
        title=title or "",
        owner_user_id=principal.user_id,
        created_at=now,
        updated_at=now,
        metadata=metadata or {},
        forked_at_conversation_id=None,
        forked_at_entry_id=None,
        deleted_at=None,
        root_id=conversation_id,
    )
    return selectors.conversation_full(row, AccessLevel.OWNER)


def _insert_conversation(
    conversation_id: UUID,
    *,
    root_id: UUID,
    owner_user_id: str,
    title: str,
    metadata: dict,
    now: datetime,
    forked_at_conversation_id: UUID | None = None,
    forked_at_entry_id: UUID | None = None,
) -> bool:
    """INSERT ... ON CONFLICT DO NOTHING: concurrent creators of one id never see an error; True for the winner
    (a soft-deleted conversation keeps its id, so that id stays taken)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO conversations (id, root_id, owner_user_id, title, metadata, forked_at_conversation_id, "
            "forked_at_entry_id, created_at, updated_at) VALUES (%s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s) "
            "ON CONFLICT (id) DO NOTHING",
            [
                conversation_id,
                root_id,
                owner_user_id,
                title,
                json.dumps(metadata, ensure_ascii=False),
                forked_at_conversation_id,
                forked_at_entry_id,
                now,
                now,
            ],
        )
        return cursor.rowcount == 1


def _created(conversation_id: UUID, owner_user_id: str | None) -> list[tuple[str, str, dict]]:
    """The events of a new conversation: it, and its owner's membership when it is a new tree's root."""
    events = [("created", "conversation", {"conversationId": str(conversation_id)})]
    if owner_user_id is not None:
        membership = {"conversationId": str(conversation_id), "userId": owner_user_id, "accessLevel": AccessLevel.OWNER.value}
        events.append(("created", "membership", membership))
    return events


@dataclass(frozen=True)
class _Locked:
    root_id: UUID
    deleted: bool
    updated_at: datetime
    forked_at_conversation_id: UUID | None
    forked_at_entry_id: UUID | None
    level: str | None


def _lock(user_id: str, conversation_id: UUID) -> _Locked | None:
    """Lock the conversation row (never the membership: FOR UPDATE OF c) and read the caller's level with it."""
    level = access.level_of("c.root_id", user_id)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.root_id, c.deleted_at, c.updated_at, c.forked_at_conversation_id, c.forked_at_entry_id, "  # noqa: S608 - a fixed fragment
            f"{level.sql} FROM conversations c WHERE c.id = %s FOR UPDATE OF c",
            [*level.params, conversation_id],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return _Locked(row[0], row[1] is not None, row[2], row[3], row[4], row[5])


def _lock_live(principal: Principal, conversation_id: UUID, required: str) -> _Locked:
    locked = _lock(principal.user_id, conversation_id)
    if locked is None or locked.deleted:
        raise errors.not_found("Conversation not found.")
    if not at_least(locked.level, required):
        raise errors.forbidden("You do not have access to this conversation.")
    return locked


def update_conversation(
    principal: Principal, conversation_id: UUID, *, title: str | None = None, metadata: dict | None = None
) -> dict:
    with transaction.atomic():
        _lock_live(principal, conversation_id, AccessLevel.WRITER)
        sets = ["updated_at = GREATEST(clock_timestamp(), updated_at + interval '1 microsecond')"]
        params: list[Any] = []
        if title is not None:
            sets.append("title = %s")
            params.append(title)
        if metadata is not None:
            sets.append("metadata = %s::jsonb")
            params.append(json.dumps(metadata, ensure_ascii=False))
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE conversations SET {', '.join(sets)} WHERE id = %s", [*params, conversation_id])  # noqa: S608
        publish("updated", "conversation", {"conversationId": str(conversation_id)})
    return selectors.get_conversation(principal, conversation_id)


def delete_conversation(principal: Principal, conversation_id: UUID) -> None:
    """Soft-deletes the conversation and every fork below it (the whole tree when it is the root); the tree's
    memberships and pending transfers go with the root (apps.sharing's signal handler, same transaction)."""
    with transaction.atomic():
        # The tree lock first, then the tree's rows in id order (apps.conversations.trees' lock order). Of concurrent
        # deletes, the first wins; the others read the conversation afresh under the lock: 404.
        tree = access.lock_tree(principal.user_id, str(conversation_id))
        if tree is None:
            raise errors.not_found("Conversation not found.")
        root_id, level, owner = tree
        if not at_least(level, AccessLevel.OWNER):
            raise errors.forbidden("Only an owner may delete the conversation.")
        whole_tree = root_id == conversation_id
        with connection.cursor() as cursor:
            if whole_tree:
                cursor.execute(
                    "SELECT id FROM conversations WHERE root_id = %s AND deleted_at IS NULL ORDER BY id FOR UPDATE",
                    [root_id],
                )
            else:
                cursor.execute(
                    "WITH RECURSIVE below(id) AS (SELECT %s::uuid UNION SELECT c.id FROM conversations c "
                    "JOIN below ON c.forked_at_conversation_id = below.id WHERE c.deleted_at IS NULL) "
                    "SELECT c.id FROM conversations c JOIN below ON below.id = c.id ORDER BY c.id FOR UPDATE OF c",
                    [conversation_id],
                )
            ids = [found for (found,) in cursor.fetchall()]
        publish_all(("deleted", "conversation", {"conversationId": str(deleted_id)}) for deleted_id in ids)
        signals.conversation_deleting.send(
            sender=Conversation, conversation_ids=[str(i) for i in ids], root_id=str(root_id), whole_tree=whole_tree
        )
        with connection.cursor() as cursor:
            cursor.execute("UPDATE conversations SET deleted_at = clock_timestamp() WHERE id = ANY(%s)", [ids])
            # Out of search at once: semantic search reads vectors without joining conversations.
            cursor.execute("DELETE FROM conversation_entry_vectors WHERE conversation_id = ANY(%s)", [ids])
            # Out of their owner's and their writers' quotas (apps.limits), though kept for the admin views.
            cursor.execute(
                "SELECT user_id, sum(octet_length(content)) FROM conversation_entries WHERE conversation_id = ANY(%s) "
                "GROUP BY user_id",
                [ids],
            )
            written = cursor.fetchall()
        limits.credit(
            [(owner, "conversations", len(ids)), *((user_id, "entry_bytes", size) for user_id, size in written)]
        )


# --- Entries ----------------------------------------------------------------------------------------------------


def _title_from(content: list) -> str:
    for item in content:
        text = item.get("text")
        if isinstance(text, str) and text:
            return text[:TITLE_FROM_TEXT_CHARS]
    return ""


def append_entry(principal: Principal, conversation_id: UUID, data: dict) -> dict:
    """Appends one entry; an unknown id creates the conversation (owned by the caller, or a fork of the given
    parent in the parent's tree). Concurrent first appends to one new id create it exactly once."""
    channel = data["channel"]
    if channel == Channel.CONTEXT and principal.client_id is None:
        raise errors.forbidden("context entries need an API-key client (X-API-Key).")
    content = data["content"]
    fork = (data["forkedAtConversationId"], data["forkedAtEntryId"]) if "forkedAtConversationId" in data else None
    entry_id = uuid.uuid4()
    sealed = crypto.encrypt_json(
        content, purpose=selectors.CONTENT_PURPOSE, row_id=selectors.content_row_id(conversation_id, entry_id)
    )
    with transaction.atomic():
        locked = _lock(principal.user_id, conversation_id)
        created: list[tuple[str, str, dict]] = []  # the events of creating the conversation, when this append does
        if locked is None:
            # A context entry is private to its client (D5): the plaintext title, which every member reads, never
            # comes from it; such a conversation starts untitled.
            title = _title_from(content) if channel == Channel.HISTORY else ""
            created = _create_for_append(principal, conversation_id, title, fork)
            locked = _lock(principal.user_id, conversation_id)
            assert locked is not None  # inserted above or by a concurrent creator; never deleted outright
        if locked.deleted:
            raise errors.not_found("Conversation not found.")
        if fork is not None and (locked.forked_at_conversation_id, locked.forked_at_entry_id) != fork:
            raise errors.validation_error(
                {"forkedAtConversationId": "a fork point can only be given when the conversation id is new"}
            )
        if not at_least(locked.level, AccessLevel.WRITER):
            raise errors.forbidden("You do not have write access to this conversation.")
        with connection.cursor() as cursor:
            # Strictly after the previous entry (updated_at), whatever the clock does: entry order = commit order.
            cursor.execute(
                "WITH e AS (INSERT INTO conversation_entries (id, conversation_id, user_id, client_id, channel, "
                "content_type, content, indexed_content, embedding_pending, key, created_at) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
                "GREATEST(clock_timestamp(), %s::timestamptz + interval '1 microsecond')) RETURNING created_at) "
                "UPDATE conversations SET updated_at = (SELECT created_at FROM e) WHERE id = %s RETURNING updated_at",
                [
                    entry_id,
                    conversation_id,
                    principal.user_id,
                    principal.client_id if channel == Channel.CONTEXT else None,
                    channel,
                    data["contentType"],
                    sealed,
                    data.get("indexedContent"),
                    data.get("indexedContent") is not None,
                    data.get("key"),
                    locked.updated_at,
                    conversation_id,
                ],
            )
            created_at = cursor.fetchone()[0]
        signals.entry_appending.send(
            sender=Entry,
            principal=principal,
            conversation_id=str(conversation_id),
            entry_id=str(entry_id),
            channel=channel,
            content=content,
        )
        publish_all([*created, ("created", "entry", {"conversationId": str(conversation_id), "entryId": str(entry_id)})])
        # Only history entries are indexed (the serializer refuses indexedContent on a context entry).
        if data.get("indexedContent") is not None or (channel == Channel.HISTORY and settings.CONVERSATION_AUTO_INDEX):
            # One indexer task per burst of appends (Indexer.request_run), after commit.
            transaction.on_commit(INDEXER.request_run_quietly)
        # Last: the writer's quota row stays locked until commit, and the writer's other appends wait for it.
        limits.charge(principal.user_id, entry_bytes=len(sealed))
    return EntryResponse.render(
        id=entry_id,
        conversation_id=conversation_id,
        user_id=principal.user_id,
        channel=channel,
        content_type=data["contentType"],
        content=content,
        created_at=created_at,
        key=data.get("key"),
    )


def _create_for_append(
    principal: Principal, conversation_id: UUID, title: str, fork: tuple[UUID, UUID] | None
) -> list[tuple[str, str, dict]]:
    """Create the conversation an append names (unless a concurrent append just did); the events to publish."""
    # Creating is its own, tighter rate (the request's own token was taken by the REST hook).
    limits.check_class(principal, "creates")
    now = timezone.now()
    title = title.replace("\x00", "")
    if fork is None:
        if _insert_conversation(
            conversation_id, root_id=conversation_id, owner_user_id=principal.user_id, title=title, metadata={}, now=now
        ):
            limits.charge(principal.user_id, conversations=1)
            access.grant_owner(str(conversation_id), principal.user_id, now)
            return _created(conversation_id, principal.user_id)
        return []
    parent_id, entry_id = fork
    # Lock the tree's root first, as every tree-wide write does: a delete of the parent (or of the tree) either
    # finished before (we see it deleted) or waits until the fork exists (and deletes it with its parent).
    tree = trees.lock_tree_of(parent_id)
    vis = selectors.visibility(principal.user_id, parent_id) if tree else None
    if vis is None or vis.deleted:
        # The parent is a reference in the body, not the addressed resource: a validation error of that field.
        raise errors.validation_error({"forkedAtConversationId": "no such conversation"})
    if not at_least(vis.level, AccessLevel.WRITER):
        raise errors.forbidden("Forking needs write access to the parent conversation.")
    if not selectors.history_entry_visible(vis, entry_id):
        raise errors.validation_error({"forkedAtEntryId": "not a history entry of the parent conversation"})
    # A fork joins its parent's tree: same members, same primary owner (memberships belong to the tree, D5).
    if _insert_conversation(
        conversation_id,
        root_id=tree.root_id,
        owner_user_id=tree.owner_user_id,
        title=title,
        metadata={},
        now=now,
        forked_at_conversation_id=parent_id,
        forked_at_entry_id=entry_id,
    ):
        # A fork is its tree's, owned by the tree's owner: it counts against that owner's quota.
        limits.charge(tree.owner_user_id, conversations=1)
        return _created(conversation_id, None)
    return []


# --- Search index text (D5) -------------------------------------------------------------------------------------


def index_entries(items: list[dict]) -> int:
    """``POST /v1/conversations/index`` (indexer role): replace the index text of entries, all or none; their
    vectors are (re)made by the background indexer. Search covers history entries only, so an item naming anything
    else than a history entry of that conversation is a 404 for the whole batch. Returns how many entries were updated."""
    latest: dict = {}
    for item in items:  # the same entry twice in one batch: the last text wins
        latest[item["entryId"]] = item
    with transaction.atomic(), connection.cursor() as cursor:
        # Row locks in id order, so concurrent batches naming the same entries never deadlock.
        cursor.execute(
            "SELECT id, conversation_id FROM conversation_entries WHERE id = ANY(%s) AND channel = 'history' "
            "ORDER BY id FOR UPDATE",
            [list(latest)],
        )
        found = dict(cursor.fetchall())
        missing = [
            str(entry_id) for entry_id, item in latest.items() if found.get(entry_id) != item["conversationId"]
        ]
        if missing:
            raise errors.ApiError(
                404, "No such history entry in that conversation.", details={"entryIds": missing[:100]}
            )
        # A new text starts with no failure counted, even on an entry its old text had quarantined.
        cursor.execute(
            "UPDATE conversation_entries e SET indexed_content = t.text, embedding_pending = true, "  # noqa: S608
            f"{indexing.RESET_STATE_SQL} FROM unnest(%s::uuid[], %s::text[]) AS t(id, text) WHERE e.id = t.id",
            [list(latest), [item["indexedContent"] for item in latest.values()]],
        )
        updated = cursor.rowcount
        transaction.on_commit(INDEXER.request_run_quietly)
    return updated
