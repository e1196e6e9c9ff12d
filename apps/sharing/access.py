"""Who may do what with a conversation (D6): the one home of access levels, owned by apps.sharing.

Conversations, attachments and the event stream ask here; none of them reads or writes the sharing tables. A read
that must decide access inside its own query (one round trip, a list or a search scoped in SQL, never a page
filtered in Python) embeds one of the fragments below (``SqlFragment``: the SQL and its parameters) instead of
naming the tables.

Tables, and who owns them:

- ``conversation_memberships`` (``root_id`` uuid, ``user_id`` text, ``access_level`` text; unique
  ``(root_id, user_id)``) and ``conversation_ownership_transfers``: apps.sharing (``models.py``). Memberships belong
  to the fork tree, so every fork shares its root's members. This module reads memberships and inserts the
  creator's owner membership; apps.sharing.services writes the rest.
- ``conversations``: apps.conversations. This module never names it: it locks a tree (every write that changes who
  may do what on a tree takes that lock first) and reads a tree's root through apps.conversations.trees, whose
  fragments it embeds where one statement reads both. That module imports nothing of apps.sharing.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from django.db import connection

from apps.conversations import trees
from apps.core.db.sql import SqlFragment


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


# --- Fragments: access decided inside another app's statement -------------------------------------------------
# ``root`` is the SQL expression of the tree's root id in the borrowing statement (e.g. ``"c.root_id"``).


def level_of(root: str, user_id: str) -> SqlFragment:
    """The caller's level (NULL: not a member) on the tree whose root id is ``root``, a scalar subquery: the one
    query for "this caller's level on this conversation", wherever it runs."""
    return SqlFragment(
        f"(SELECT m.access_level FROM conversation_memberships m WHERE m.root_id = {root} AND m.user_id = %s)",  # noqa: S608
        (user_id,),
    )


def is_member(root: str, user_id: str) -> SqlFragment:
    """True when the caller is a member (reader or above) of the tree whose root id is ``root``: a per-row probe."""
    return SqlFragment(
        f"EXISTS (SELECT 1 FROM conversation_memberships m WHERE m.root_id = {root} AND m.user_id = %s)",  # noqa: S608
        (user_id,),
    )


def member_trees(user_id: str) -> SqlFragment:
    """The caller's trees as a table ``(root_id, access_level)``, to start a list from (index ``(user_id,
    root_id)``): ``FROM {fragment.sql} m JOIN ... ON ....root_id = m.root_id``."""
    return SqlFragment("(SELECT root_id, access_level FROM conversation_memberships WHERE user_id = %s)", (user_id,))


# --- Reads --------------------------------------------------------------------------------------------------------


def tree_level(user_id: str, conversation_id: str) -> tuple[Any, str | None] | None:
    """(the tree's root id, the user's level or None) of a live conversation in one round trip; None when it does
    not exist or is deleted."""
    tree, level = trees.live_tree(conversation_id), level_of("t.root_id", user_id)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT t.root_id, {level.sql} FROM {tree.sql} t", [*level.params, *tree.params])  # noqa: S608
        row = cursor.fetchone()
    return None if row is None else (row[0], row[1])


def reads_any(user_id: str, conversation_ids: list[str]) -> bool:
    """True when ``user_id`` may read at least one of the (live) conversations: a reader or above of its tree.
    Attachments use it: an attachment referenced by an entry is readable by that conversation's readers (D7)."""
    if not conversation_ids:
        return False
    live = trees.live_roots(conversation_ids)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT EXISTS (SELECT 1 FROM {live.sql} t JOIN conversation_memberships m "  # noqa: S608
            "ON m.root_id = t.root_id AND m.user_id = %s)",
            [*live.params, user_id],
        )
        return bool(cursor.fetchone()[0])


def audiences(conversation_ids: list[str]) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """Per conversation (those that exist): (every member of its fork tree, those of them who are owners or
    managers), in one round trip: who hears about it on the live stream (D8, apps.events.publisher, which asks
    after the write committed). A tree deleted by that write has no memberships left: it answers with the members it
    had when it was deleted (the archive; a live tree has no archived members, and a deleted one never comes back)."""
    tree = trees.roots(conversation_ids)
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH t AS MATERIALIZED {tree.sql} "  # noqa: S608
            "SELECT t.id, m.user_id, m.access_level FROM t JOIN conversation_memberships m ON m.root_id = t.root_id "
            "UNION ALL "
            "SELECT t.id, a.user_id, a.access_level FROM t "
            "JOIN conversation_memberships_archive a ON a.root_id = t.root_id",
            [*tree.params],
        )
        rows = cursor.fetchall()
    members: dict[str, set[str]] = {}
    managers: dict[str, set[str]] = {}
    for conversation_id, user_id, level in rows:
        members.setdefault(str(conversation_id), set()).add(user_id)
        if level in _WATCHERS:
            managers.setdefault(str(conversation_id), set()).add(user_id)
    return {key: (frozenset(users), frozenset(managers.get(key, ()))) for key, users in members.items()}


_WATCHERS = {AccessLevel.OWNER.value, AccessLevel.MANAGER.value}  # who hears about memberships (D8)


# --- Tree-wide writes ---------------------------------------------------------------------------------------------
# Every write that changes who may do what on a fork tree (membership changes, transfers, deleting conversations,
# forking) first takes the tree lock (apps.conversations.trees, which documents the lock order).


def lock_tree(user_id: str, conversation_id: str) -> tuple[Any, str | None, str] | None:
    """Take the tree lock of ``conversation_id``'s tree; (root id, ``user_id``'s level or None, the primary owner's
    user id), or None when the conversation does not exist or is deleted.

    Two statements on purpose: a row lock that had to wait re-reads only the locked row, so the conversation's
    ``deleted_at`` and the caller's membership are read afresh once the lock is held (a delete or a membership
    change that committed meanwhile is seen)."""
    if trees.lock_tree_of(conversation_id) is None:
        return None
    tree, level = trees.live_tree(conversation_id), level_of("t.root_id", user_id)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT t.root_id, {level.sql}, t.owner_user_id FROM {tree.sql} t",  # noqa: S608
            [*level.params, *tree.params],
        )
        row = cursor.fetchone()
    return None if row is None else (row[0], row[1], row[2])


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


def count_members(root_id: Any) -> int:
    """The members of a fork tree, as of the current transaction (under the tree lock: exact)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM conversation_memberships WHERE root_id = %s", [root_id])
        return cursor.fetchone()[0]
