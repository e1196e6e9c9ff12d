"""Conversation access levels (D6), shared by every app that guards a conversation.

Conversations, sharing, attachments and the event stream all ask "what may this user do with this conversation?";
the answer lives here, once, in SQL over two tables owned by those apps (names fixed by their migrations):

- ``conversations`` (``id`` uuid, ``root_id`` uuid: the fork tree's root, equal to ``id`` for a root,
  ``deleted_at`` timestamptz null)
- ``conversation_memberships`` (``root_id`` uuid, ``user_id`` text, ``access_level`` text; unique
  ``(root_id, user_id)``): memberships belong to the fork tree, so every fork shares its root's members.

No app imports another app's models to answer these questions; they call the functions below.
"""

from __future__ import annotations

from enum import StrEnum

from django.db import connection

from apps.core import errors


class AccessLevel(StrEnum):
    OWNER = "owner"
    MANAGER = "manager"
    WRITER = "writer"
    READER = "reader"


RANK: dict[str, int] = {AccessLevel.READER: 1, AccessLevel.WRITER: 2, AccessLevel.MANAGER: 3, AccessLevel.OWNER: 4}


def at_least(level: str | None, required: str) -> bool:
    """True when ``level`` (None = no membership) ranks at or above ``required``."""
    return level is not None and RANK[level] >= RANK[required]


_LEVEL_SQL = """
    SELECT m.access_level
    FROM conversations c
    LEFT JOIN conversation_memberships m ON m.root_id = c.root_id AND m.user_id = %s
    WHERE c.id = %s AND c.deleted_at IS NULL
"""


def conversation_level(user_id: str, conversation_id: str) -> tuple[bool, str | None]:
    """(conversation exists and is not deleted, the user's level or None) in one round trip."""
    with connection.cursor() as cursor:
        cursor.execute(_LEVEL_SQL, [user_id, conversation_id])
        row = cursor.fetchone()
    if row is None:
        return False, None
    return True, row[0]


def require_level(user_id: str, conversation_id: str, required: str) -> str:
    """The user's level on the conversation; 404 when it does not exist, 403 when the level is too low (D1, D6)."""
    exists, level = conversation_level(user_id, conversation_id)
    if not exists:
        raise errors.not_found("Conversation not found.")
    if not at_least(level, required):
        raise errors.forbidden("You do not have access to this conversation.")
    return level  # type: ignore[return-value]


def conversation_members(conversation_id: str) -> list[tuple[str, str]]:
    """Every (user_id, access_level) of the conversation's fork tree, as of the current transaction."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT m.user_id, m.access_level FROM conversations c "
            "JOIN conversation_memberships m ON m.root_id = c.root_id WHERE c.id = %s ORDER BY m.user_id",
            [conversation_id],
        )
        return [(user_id, level) for user_id, level in cursor.fetchall()]


def grant_owner(root_id: str, user_id: str, created_at) -> bool:
    """Make ``user_id`` the owner member of the fork tree ``root_id`` (a new conversation's creator). Lives here,
    next to the level queries, so apps.conversations never imports apps.sharing; True when a row was inserted."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO conversation_memberships (id, root_id, user_id, access_level, created_at) "
            "VALUES (gen_random_uuid(), %s, %s, %s, %s) ON CONFLICT (root_id, user_id) DO NOTHING",
            [root_id, user_id, AccessLevel.OWNER.value, created_at],
        )
        return cursor.rowcount == 1


# --- Tree-wide writes (apps.sharing) ----------------------------------------------------------------------------
# Every write that changes who may do what on a fork tree (membership changes, transfers, deleting conversations)
# first locks the tree's root row, so they serialise per tree and always take locks in the same order.


def lock_tree(user_id: str, conversation_id: str) -> tuple[str, str | None, str] | None:
    """Lock the root of ``conversation_id``'s tree; (root id, ``user_id``'s level or None, the primary owner's user
    id), or None when the conversation does not exist or is deleted.

    Two statements on purpose: a row lock that had to wait re-reads only the locked row, so the conversation's
    ``deleted_at`` and the caller's membership are read afresh once the lock is held (a delete or a membership
    change that committed meanwhile is seen)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT r.id FROM conversations c JOIN conversations r ON r.id = c.root_id WHERE c.id = %s "
            "FOR UPDATE OF r",
            [conversation_id],
        )
        if cursor.fetchone() is None:
            return None
        cursor.execute(
            "SELECT r.id, m.access_level, r.owner_user_id FROM conversations c "
            "JOIN conversations r ON r.id = c.root_id "
            "LEFT JOIN conversation_memberships m ON m.root_id = c.root_id AND m.user_id = %s "
            "WHERE c.id = %s AND c.deleted_at IS NULL",
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


def set_tree_owner(root_id: str, user_id: str) -> None:
    """Name ``user_id`` the primary owner (``ownerUserId``) of every conversation of the tree."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE conversations SET owner_user_id = %s WHERE root_id = %s", [user_id, root_id])


def root_of(conversation_id: str) -> str | None:
    """The tree root of any conversation, deleted ones included (admin views); None when it never existed."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT root_id FROM conversations WHERE id = %s", [conversation_id])
        row = cursor.fetchone()
    return None if row is None else row[0]


def tree_level(user_id: str, conversation_id: str) -> tuple[str, str | None] | None:
    """(the tree's root id, the user's level or None) of a live conversation in one round trip; None when it does
    not exist or is deleted."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.root_id, m.access_level FROM conversations c "
            "LEFT JOIN conversation_memberships m ON m.root_id = c.root_id AND m.user_id = %s "
            "WHERE c.id = %s AND c.deleted_at IS NULL",
            [user_id, conversation_id],
        )
        row = cursor.fetchone()
    return None if row is None else (row[0], row[1])
