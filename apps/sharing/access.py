"""Who may do what with a conversation (D6): the one home of access levels, owned by apps.sharing.

Conversations, attachments and the event stream ask here; none of them reads or writes the sharing tables. A read
that must decide access inside its own query (one round trip, a list or a search scoped in SQL, never a page
filtered in Python) embeds one of the SQL fragments below instead of naming the tables.

Tables, and who owns them:

- ``conversation_memberships`` (``root_id`` uuid, ``user_id`` text, ``access_level`` text; unique
  ``(root_id, user_id)``) and ``conversation_ownership_transfers``: apps.sharing (``models.py``). Memberships belong
  to the fork tree, so every fork shares its root's members. This module reads memberships and inserts the
  creator's owner membership; apps.sharing.services writes the rest.
- ``conversations`` (``id``, ``root_id``: the fork tree's root, equal to ``id`` for a root, ``deleted_at``,
  ``owner_user_id``): apps.conversations. This module reads those columns with raw SQL, locks root rows (every
  write that changes who may do what on a tree takes that lock first) and writes ``owner_user_id`` when ownership
  is transferred. It never imports apps.conversations, which imports it.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from django.db import connection


class AccessLevel(StrEnum):
    OWNER = "owner"
    MANAGER = "manager"
    WRITER = "writer"
    READER = "reader"


LEVELS = [level.value for level in AccessLevel]  # as the API spells them (the schema's choices)

RANK: dict[str, int] = {AccessLevel.READER: 1, AccessLevel.WRITER: 2, AccessLevel.MANAGER: 3, AccessLevel.OWNER: 4}


def at_least(level: str | None, required: str) -> bool:
    """True when ``level`` (None = no membership) ranks at or above ``required``."""
    return level is not None and RANK[level] >= RANK[required]


# --- SQL fragments: access decided inside another app's query ----------------------------------------------------
# Each takes one bound parameter, the user id, at its place in the statement.


def level_sql(root: str) -> str:
    """The caller's level (NULL: not a member) on the tree whose root id is the SQL expression ``root``: the one
    query for "this caller's level on this conversation", wherever it runs."""
    return f"(SELECT m.access_level FROM conversation_memberships m WHERE m.root_id = {root} AND m.user_id = %s)"  # noqa: S608


def member_sql(root: str) -> str:
    """True when the caller is a member (reader or above) of the tree whose root id is ``root``: a per-row probe."""
    return f"EXISTS (SELECT 1 FROM conversation_memberships m WHERE m.root_id = {root} AND m.user_id = %s)"  # noqa: S608


# The caller's trees as a table ``(root_id, access_level)``, to start a list from (index ``(user_id, root_id)``):
# ``FROM {MEMBER_TREES_SQL} m JOIN conversations c ON c.root_id = m.root_id``.
MEMBER_TREES_SQL = "(SELECT root_id, access_level FROM conversation_memberships WHERE user_id = %s)"


# --- Reads --------------------------------------------------------------------------------------------------------


def tree_level(user_id: str, conversation_id: str) -> tuple[Any, str | None] | None:
    """(the tree's root id, the user's level or None) of a live conversation in one round trip; None when it does
    not exist or is deleted."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT c.root_id, {level_sql('c.root_id')} FROM conversations c "  # noqa: S608 - fixed fragment
            "WHERE c.id = %s AND c.deleted_at IS NULL",
            [user_id, conversation_id],
        )
        row = cursor.fetchone()
    return None if row is None else (row[0], row[1])


def reads_any(user_id: str, conversation_ids: list[str]) -> bool:
    """True when ``user_id`` may read at least one of the (live) conversations: a reader or above of its tree.
    Attachments use it: an attachment referenced by an entry is readable by that conversation's readers (D7)."""
    if not conversation_ids:
        return False
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT EXISTS (SELECT 1 FROM conversations c WHERE {member_sql('c.root_id')} "  # noqa: S608
            "AND c.id = ANY(%s::uuid[]) AND c.deleted_at IS NULL)",
            [user_id, [str(conversation_id) for conversation_id in conversation_ids]],
        )
        return bool(cursor.fetchone()[0])


def conversation_members(conversation_id: str) -> list[tuple[str, str]]:
    """Every (user_id, access_level) of the conversation's fork tree, as of the current transaction."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT m.user_id, m.access_level FROM conversations c "
            "JOIN conversation_memberships m ON m.root_id = c.root_id WHERE c.id = %s ORDER BY m.user_id",
            [conversation_id],
        )
        return [(user_id, level) for user_id, level in cursor.fetchall()]


def root_of(conversation_id: str) -> Any | None:
    """The tree root of any conversation, deleted ones included (admin views); None when it never existed."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT root_id FROM conversations WHERE id = %s", [conversation_id])
        row = cursor.fetchone()
    return None if row is None else row[0]


# --- Tree-wide writes ---------------------------------------------------------------------------------------------
# Every write that changes who may do what on a fork tree (membership changes, transfers, deleting conversations,
# forking) first locks the tree's root row, so they serialise per tree and always take locks in the same order.


def lock_tree_of(conversation_id: Any) -> tuple[Any, str] | None:
    """Lock the root row of ``conversation_id``'s tree (deleted or not); (root id, the primary owner's user id), or
    None when the conversation never existed."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT r.id, r.owner_user_id FROM conversations c JOIN conversations r ON r.id = c.root_id "
            "WHERE c.id = %s FOR UPDATE OF r",
            [conversation_id],
        )
        row = cursor.fetchone()
    return None if row is None else (row[0], row[1])


def lock_tree(user_id: str, conversation_id: str) -> tuple[Any, str | None, str] | None:
    """Lock the root of ``conversation_id``'s tree; (root id, ``user_id``'s level or None, the primary owner's user
    id), or None when the conversation does not exist or is deleted.

    Two statements on purpose: a row lock that had to wait re-reads only the locked row, so the conversation's
    ``deleted_at`` and the caller's membership are read afresh once the lock is held (a delete or a membership
    change that committed meanwhile is seen)."""
    if lock_tree_of(conversation_id) is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT r.id, {level_sql('c.root_id')}, r.owner_user_id FROM conversations c "  # noqa: S608
            "JOIN conversations r ON r.id = c.root_id WHERE c.id = %s AND c.deleted_at IS NULL",
            [user_id, conversation_id],
        )
        row = cursor.fetchone()
    return None if row is None else (row[0], row[1], row[2])


def lock_root(root_id: str) -> str | None:
    """Lock a live tree's root row by its id; the primary owner's user id, or None when the tree is gone."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT owner_user_id FROM conversations WHERE id = %s AND deleted_at IS NULL FOR UPDATE", [root_id]
        )
        row = cursor.fetchone()
    return None if row is None else row[0]


def grant_owner(root_id: str, user_id: str, created_at: datetime) -> bool:
    """Make ``user_id`` the owner member of the fork tree ``root_id`` (a new conversation's creator); True when a
    row was inserted."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO conversation_memberships (id, root_id, user_id, access_level, created_at) "
            "VALUES (gen_random_uuid(), %s, %s, %s, %s) ON CONFLICT (root_id, user_id) DO NOTHING",
            [root_id, user_id, AccessLevel.OWNER.value, created_at],
        )
        return cursor.rowcount == 1


def set_tree_owner(root_id: str, user_id: str) -> int:
    """Name ``user_id`` the primary owner (``ownerUserId``) of every conversation of the tree (a transfer of
    ownership, under the tree lock); how many of them are live (what moves between the owners' quotas)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE conversations SET owner_user_id = %s WHERE root_id = %s RETURNING deleted_at IS NULL",
            [user_id, root_id],
        )
        return sum(1 for (live,) in cursor.fetchall() if live)


def count_members(root_id: Any) -> int:
    """The members of a fork tree, as of the current transaction (under the tree lock: exact)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM conversation_memberships WHERE root_id = %s", [root_id])
        return cursor.fetchone()[0]
