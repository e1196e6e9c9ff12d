"""Conversation reads. Raw SQL where a list must start from the caller's memberships (apps.sharing.access's
fragments), so access is decided inside the query, never by filtering a page in Python; every per-conversation read
resolves the caller's level in the query that loads it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connection

from apps.conversations.models import Channel
from apps.conversations.responses import (
    AdminConversation,
    ConversationListItem,
    ConversationResponse,
    EntryResponse,
    ForkItem,
)
from apps.core import errors, pagination
from apps.encryption import crypto
from apps.identity.principal import Principal
from apps.sharing import access
from apps.sharing.access import AccessLevel, at_least

CONTENT_PURPOSE = "conversation_entry.content"
# Registered for rotate_encryption_key (apps.py): the envelope is bound to the entry's conversation and its id.
CONTENT_ROW_ID_FIELDS = "conversation_id,pk"


def content_row_id(conversation_id: Any, entry_id: Any) -> str:
    return f"{conversation_id}/{entry_id}"


def decrypt_content(blob: Any, conversation_id: Any, entry_id: Any) -> list:
    """Raises crypto.DecryptionError (the indexer's use); read paths call ``read_content``."""
    return crypto.decrypt_json(bytes(blob), purpose=CONTENT_PURPOSE, row_id=content_row_id(conversation_id, entry_id))


def read_content(blob: Any, conversation_id: Any, entry_id: Any) -> Any:
    """The entry's content for a reader, or ``crypto.UNDECRYPTABLE`` (responses.EntryResponse shows the marker)."""
    return crypto.decrypt_for_read(blob, purpose=CONTENT_PURPOSE, row_id=content_row_id(conversation_id, entry_id))


# --- Shapes -----------------------------------------------------------------------------------------------------

_UPDATED_AT = 4  # position of c.updated_at in _CONV_COLUMNS (the list cursors' sort key)
_CONV_COLUMNS = (
    "c.id, c.title, c.owner_user_id, c.created_at, c.updated_at, c.metadata, c.forked_at_conversation_id, "
    "c.forked_at_entry_id, c.deleted_at, c.root_id"
)


@dataclass(frozen=True)
class ConversationRow:
    id: UUID
    title: str
    owner_user_id: str
    created_at: datetime
    updated_at: datetime
    metadata: dict
    forked_at_conversation_id: UUID | None
    forked_at_entry_id: UUID | None
    deleted_at: datetime | None
    root_id: UUID

    @classmethod
    def from_db(cls, row: tuple) -> ConversationRow:
        metadata = row[5]
        if isinstance(metadata, str):  # Django's raw cursor hands jsonb back as text
            metadata = json.loads(metadata)
        return cls(*row[:5], metadata, *row[6:10])


def conversation_item(row: ConversationRow, level: str) -> dict:
    return ConversationListItem.from_object(row, level=level)


def conversation_full(row: ConversationRow, level: str) -> dict:
    return ConversationResponse.from_object(row, level=level)


def conversation_admin(row: ConversationRow) -> dict:
    return AdminConversation.from_object(row)


def entry_row(row: tuple) -> dict:
    """An entry from its (id, conversation_id, user_id, channel, content_type, content, created_at, key) columns
    (``ENTRY_COLUMNS``), its content decrypted for the reader; ``key`` shows only when it has one."""
    entry_id, conversation_id, user_id, channel, content_type, content, created_at, key = row
    return EntryResponse.render(
        id=entry_id,
        conversation_id=conversation_id,
        user_id=user_id,
        channel=channel,
        content_type=content_type,
        content=read_content(content, conversation_id, entry_id),
        created_at=created_at,
        key=key,
    )


# --- One conversation -------------------------------------------------------------------------------------------


def load_with_level(principal: Principal, conversation_id: UUID, required: str) -> tuple[ConversationRow, str]:
    """The live conversation and the caller's level, in one round trip; 404 when it does not exist (or is
    deleted), 403 when the caller's level is below ``required`` (D1, D6)."""
    level = access.level_of("c.root_id", principal.user_id)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {_CONV_COLUMNS}, {level.sql} FROM conversations c "  # noqa: S608 - fixed fragments
            "WHERE c.id = %s AND c.deleted_at IS NULL",
            [*level.params, conversation_id],
        )
        row = cursor.fetchone()
    if row is None:
        raise errors.not_found("Conversation not found.")
    level = row[-1]
    if not at_least(level, required):
        raise errors.forbidden("You do not have access to this conversation.")
    return ConversationRow.from_db(row[:-1]), level


def get_conversation(principal: Principal, conversation_id: UUID) -> dict:
    row, level = load_with_level(principal, conversation_id, AccessLevel.READER)
    return conversation_full(row, level)


def admin_get_conversation(conversation_id: UUID) -> dict:
    """Any conversation, deleted ones included (with ``deletedAt``): the admin view audits."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {_CONV_COLUMNS} FROM conversations c WHERE c.id = %s", [conversation_id])  # noqa: S608
        row = cursor.fetchone()
    if row is None:
        raise errors.not_found("Conversation not found.")
    return conversation_admin(ConversationRow.from_db(row))


# --- Lists of conversations -------------------------------------------------------------------------------------

CONVERSATIONS_CURSOR = "conversations.updated"
ADMIN_CONVERSATIONS_CURSOR = "admin.conversations.updated"


def list_conversations(
    principal: Principal, *, mode: str, query: str | None, cursor: str | None, limit: int
) -> dict:
    """The caller's conversations, newest first by (updated_at, id). Starts from the caller's memberships
    (``access.member_trees``), so only conversations they are a member of are ever read."""
    trees = access.member_trees(principal.user_id)
    where = ["c.deleted_at IS NULL"]
    params: list[Any] = [*trees.params]
    if mode == "roots":
        where.append("c.id = c.root_id")
    elif mode == "latest-fork":
        # One conversation per fork tree: the most recently updated live one (among those whose title matches,
        # when there is a query: a newer fork with another title does not hide the tree from a search).
        newer = (
            "SELECT 1 FROM conversations n WHERE n.root_id = c.root_id AND n.deleted_at IS NULL "
            "AND (n.updated_at, n.id) > (c.updated_at, c.id)"
        )
        if query:
            newer += " AND strpos(lower(n.title), lower(%s)) > 0"
            params.append(query)
        where.append(f"NOT EXISTS ({newer})")
    if query:
        where.append("strpos(lower(c.title), lower(%s)) > 0")
        params.append(query)
    page = pagination.keyset_page(
        pagination.SqlKeyset(
            f"SELECT {_CONV_COLUMNS}, m.access_level FROM {trees.sql} m "  # noqa: S608 - fixed fragments
            "JOIN conversations c ON c.root_id = m.root_id",
            where, params, order=("c.updated_at", "c.id"), position_index=_UPDATED_AT, descending=True,
        ),
        tag=CONVERSATIONS_CURSOR, cursor=cursor, limit=limit,
    )
    data = [conversation_item(ConversationRow.from_db(row[:-1]), row[-1]) for row in page.items]
    return pagination.envelope(data, page.next_cursor)


def admin_list_conversations(*, user_id: str | None, include_deleted: bool, cursor: str | None, limit: int) -> dict:
    where = ["TRUE"]
    params: list[Any] = []
    if not include_deleted:
        where.append("c.deleted_at IS NULL")
    if user_id is not None:
        where.append("c.owner_user_id = %s")
        params.append(user_id)
    page = pagination.keyset_page(
        pagination.SqlKeyset(
            f"SELECT {_CONV_COLUMNS} FROM conversations c",  # noqa: S608 - fixed fragments
            where, params, order=("c.updated_at", "c.id"), position_index=_UPDATED_AT, descending=True,
        ),
        tag=ADMIN_CONVERSATIONS_CURSOR, cursor=cursor, limit=limit,
    )
    data = [conversation_admin(ConversationRow.from_db(row)) for row in page.items]
    return pagination.envelope(data, page.next_cursor)


# --- Forks ------------------------------------------------------------------------------------------------------

FORKS_CURSOR = "conversations.forks"


def list_forks(root_id: UUID, *, cursor: str | None, limit: int, include_deleted: bool = False) -> dict:
    """The whole fork tree, root included, oldest first."""
    where = ["c.root_id = %s"]
    params: list[Any] = [root_id]
    if not include_deleted:
        where.append("c.deleted_at IS NULL")
    page = pagination.keyset_page(
        pagination.SqlKeyset(
            "SELECT c.id, c.title, c.forked_at_conversation_id, c.forked_at_entry_id, c.created_at "
            "FROM conversations c",
            where, params, order=("c.created_at", "c.id"), position_index=4,
        ),
        tag=FORKS_CURSOR, cursor=cursor, limit=limit,
    )
    data = [
        ForkItem.render(
            conversation_id=conversation_id,
            title=title,
            forked_at_conversation_id=forked_at_conversation_id,
            forked_at_entry_id=forked_at_entry_id,
            created_at=created_at,
        )
        for conversation_id, title, forked_at_conversation_id, forked_at_entry_id, created_at in page.items
    ]
    return pagination.envelope(data, page.next_cursor)


def forks(principal: Principal, conversation_id: UUID, *, cursor: str | None, limit: int) -> dict:
    row, _level = load_with_level(principal, conversation_id, AccessLevel.READER)
    return list_forks(row.root_id, cursor=cursor, limit=limit)


def admin_forks(conversation_id: UUID, *, cursor: str | None, limit: int) -> dict:
    with connection.cursor() as db:
        db.execute("SELECT root_id FROM conversations WHERE id = %s", [conversation_id])
        row = db.fetchone()
    if row is None:
        raise errors.not_found("Conversation not found.")
    return list_forks(row[0], cursor=cursor, limit=limit, include_deleted=True)


# --- Entries ----------------------------------------------------------------------------------------------------

ENTRIES_CURSOR = "conversations.entries"

# The conversation, its ancestors up the fork chain, each ancestor's fork point as (created_at, id), and the
# caller's level on the tree (the placeholder {level}): everything an entries read needs, in one round trip.
_CHAIN_SQL = """
WITH RECURSIVE chain(id, root_id, parent_id, fork_entry_id, depth, deleted_at) AS (
    SELECT c.id, c.root_id, c.forked_at_conversation_id, c.forked_at_entry_id, 0, c.deleted_at
    FROM conversations c WHERE c.id = %s
    UNION ALL
    SELECT p.id, p.root_id, p.forked_at_conversation_id, p.forked_at_entry_id, chain.depth + 1, p.deleted_at
    FROM chain JOIN conversations p ON p.id = chain.parent_id
    WHERE chain.depth < 1000
)
SELECT chain.id, chain.depth, chain.deleted_at, e.created_at, e.id, {level}
FROM chain LEFT JOIN conversation_entries e ON e.id = chain.fork_entry_id
ORDER BY chain.depth
"""


@dataclass(frozen=True)
class Visibility:
    """Which entries a conversation shows: its own, and each ancestor's before the (smallest) fork point below it."""

    conversation_id: UUID
    level: str | None
    deleted: bool
    segments: list[tuple[UUID, tuple[datetime, UUID] | None]]  # (conversation id, exclusive upper bound or None)


def visibility(user_id: str, conversation_id: UUID) -> Visibility | None:
    """None when the conversation does not exist."""
    level = access.level_of("chain.root_id", user_id)
    with connection.cursor() as db:
        db.execute(_CHAIN_SQL.format(level=level.sql), [conversation_id, *level.params])
        rows = db.fetchall()
    if not rows:
        return None
    segments: list[tuple[UUID, tuple[datetime, UUID] | None]] = []
    bound: tuple[datetime, UUID] | None = None
    for chain_id, _depth, _deleted, fork_created_at, fork_entry_id, _level in rows:
        segments.append((chain_id, bound))
        if fork_entry_id is not None:
            point = (fork_created_at, fork_entry_id)
            bound = point if bound is None or point < bound else bound
    first = rows[0]
    return Visibility(conversation_id=first[0], level=first[5], deleted=first[2] is not None, segments=segments)


def _visible_where(vis: Visibility) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    for chain_id, bound in vis.segments:
        if bound is None:
            clauses.append("e.conversation_id = %s")
            params.append(chain_id)
        else:
            clauses.append("(e.conversation_id = %s AND (e.created_at, e.id) < (%s, %s))")
            params += [chain_id, bound[0], bound[1]]
    return "(" + " OR ".join(clauses) + ")", params


# One stream per index (models.Entry's conv_entries_history / conv_entries_context / conversation_entries_order):
# what a reader sees is the merge of these streams over the conversation's visible segments, each read in list
# order from where the page starts. Channels are literals, never parameters: the planner matches partial indexes
# only against literals.
_HISTORY_STREAM = ("e.channel = 'history'", ())
_ALL_STREAM = ("TRUE", ())


def _context_stream(client_id: str) -> tuple[str, tuple]:
    return "e.channel = 'context' AND e.client_id = %s", (client_id,)


def _streams(channel: str | None, client_id: str | None, *, admin: bool) -> list[tuple[str, tuple]]:
    """history is shared; context entries are private to the API-key client that wrote them (D5). The admin view
    reads every channel of every client."""
    if admin:
        if channel == Channel.HISTORY:
            return [_HISTORY_STREAM]
        if channel == Channel.CONTEXT:
            return [("e.channel = 'context'", ())]
        return [_ALL_STREAM]
    if channel == Channel.HISTORY:
        return [_HISTORY_STREAM]
    if channel == Channel.CONTEXT:
        return [_context_stream(client_id)] if client_id is not None else []
    if client_id is None:
        return [_HISTORY_STREAM]
    return [_HISTORY_STREAM, _context_stream(client_id)]


ENTRY_COLUMNS = "e.id, e.conversation_id, e.user_id, e.channel, e.content_type, e.content, e.created_at, e.key"
_ENTRY_CREATED_AT = 6


@dataclass(frozen=True)
class _EntryKeyset:
    """A conversation's visible entries (its own and its ancestors' before each fork point) in the reader's streams,
    optionally only those of one ``key``, by (created_at, id). Each (segment, stream) is one index range scan of at
    most a page's rows from where the page starts; their UNION ALL is sorted and cut to the page, so a page costs
    its own rows times the streams, whichever end it starts from, never the conversation's length."""

    vis: Visibility
    streams: list[tuple[str, tuple]]
    entry_key: str | None = None
    kind: type = datetime

    def fetch(self, after: tuple[datetime, UUID] | None, count: int) -> list[tuple]:
        return self._rows(after, count, backward=False)

    def fetch_before(self, before: tuple[datetime, UUID] | None, count: int) -> list[tuple]:
        return self._rows(before, count, backward=True)

    def key(self, row: tuple) -> tuple[datetime, UUID]:
        return row[_ENTRY_CREATED_AT], row[0]

    def _rows(self, position: tuple[datetime, UUID] | None, count: int, *, backward: bool) -> list[tuple]:
        if not self.streams:
            return []
        sql, params = self.query(position, count, backward=backward)
        with connection.cursor() as db:
            db.execute(sql, params)
            return db.fetchall()

    def query(self, position: tuple[datetime, UUID] | None, count: int, *, backward: bool) -> tuple[str, list]:
        """The SQL of a fetch and its parameters (tests explain it)."""
        direction = "DESC" if backward else "ASC"
        order = f"ORDER BY e.created_at {direction}, e.id {direction}"
        parts: list[str] = []
        params: list[Any] = []
        for chain_id, bound in self.vis.segments:
            for stream_sql, stream_params in self.streams:
                where = ["e.conversation_id = %s", stream_sql]
                params += [chain_id, *stream_params]
                if bound is not None:
                    where.append("(e.created_at, e.id) < (%s, %s)")
                    params += [bound[0], bound[1]]
                if self.entry_key is not None:
                    where.append("e.key = %s")
                    params.append(self.entry_key)
                if position is not None:
                    where.append(f"(e.created_at, e.id) {'<' if backward else '>'} (%s, %s)")
                    params += [position[0], position[1]]
                # Its own ORDER BY ... LIMIT makes each part an index range scan that stops after `count` rows,
                # however the planner weighs the table (a seq scan and a sort of the whole conversation otherwise
                # wins where one conversation is most of the table).
                parts.append(
                    f"(SELECT {ENTRY_COLUMNS} FROM conversation_entries e WHERE {' AND '.join(where)} {order} LIMIT %s)"  # noqa: S608
                )
                params.append(count)
        union = " UNION ALL ".join(parts)
        return f"SELECT * FROM ({union}) e {order} LIMIT %s", [*params, count]  # noqa: S608


def _entries_page(
    vis: Visibility, streams: list[tuple[str, tuple]], window: pagination.Window, key: str | None
) -> dict:
    page = pagination.keyset_window(_EntryKeyset(vis, streams, key), tag=ENTRIES_CURSOR, window=window)
    data = [entry_row(row) for row in page.items]
    return pagination.window_envelope(data, page)


def list_entries(
    principal: Principal, conversation_id: UUID, *, channel: str | None, window: pagination.Window, key: str | None = None
) -> dict:
    """The page of ``window`` (D11: after or before a cursor, or the newest page) of the entries the caller sees,
    oldest first; only those of ``key`` when given."""
    vis = visibility(principal.user_id, conversation_id)
    if vis is None or vis.deleted:
        raise errors.not_found("Conversation not found.")
    if not at_least(vis.level, AccessLevel.READER):
        raise errors.forbidden("You do not have access to this conversation.")
    if channel == Channel.CONTEXT and principal.client_id is None:
        raise errors.forbidden("context entries are readable only through the API-key client that wrote them.")
    return _entries_page(vis, _streams(channel, principal.client_id, admin=False), window, key)


def admin_list_entries(
    conversation_id: UUID, *, channel: str | None, window: pagination.Window, key: str | None = None
) -> dict:
    vis = visibility("", conversation_id)
    if vis is None:
        raise errors.not_found("Conversation not found.")
    return _entries_page(vis, _streams(channel, None, admin=True), window, key)


def history_entry_visible(vis: Visibility, entry_id: UUID) -> bool:
    """Whether ``entry_id`` is a history entry of the conversation ``vis`` describes (a valid fork point: forks
    branch the shared history; context entries are private to one client)."""
    visible_sql, params = _visible_where(vis)
    with connection.cursor() as db:
        db.execute(
            f"SELECT 1 FROM conversation_entries e WHERE e.id = %s AND {visible_sql} AND e.channel = 'history'",  # noqa: S608
            [entry_id, *params],
        )
        return db.fetchone() is not None


# --- Quota totals (apps.limits recounts them: `manage.py limits recount`) -----------------------------------------


def quota_usage(user_id: str) -> dict[str, int]:
    """What counts against ``user_id``'s conversation quotas: the live conversations they own (forks included) and
    the stored size of the entries they wrote in live conversations."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM conversations WHERE owner_user_id = %s AND deleted_at IS NULL), "
            "(SELECT coalesce(sum(octet_length(e.content)), 0) FROM conversation_entries e "
            "JOIN conversations c ON c.id = e.conversation_id WHERE e.user_id = %s AND c.deleted_at IS NULL)",
            [user_id, user_id],
        )
        conversations, entry_bytes = cursor.fetchone()
    return {"conversations": conversations, "entry_bytes": entry_bytes}


def quota_users() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT owner_user_id FROM conversations WHERE deleted_at IS NULL UNION "
            "SELECT DISTINCT e.user_id FROM conversation_entries e JOIN conversations c ON c.id = e.conversation_id "
            "WHERE c.deleted_at IS NULL"
        )
        return [user for (user,) in cursor.fetchall()]
