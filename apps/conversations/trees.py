"""Fork trees: the tree lock, the primary owner, and the fragments other apps read trees through.

A fork tree is a root conversation and every conversation forked from it; each ``conversations`` row carries its
tree's ``root_id``. This app owns that table: apps.sharing (memberships, transfers) locks a tree, names its owner
and finds a tree's root through the functions below, and embeds the fragments below where one of its statements
must read a tree, so no other app writes this table's name. This module imports nothing of apps.sharing (which
imports it).

Lock order
----------
Every transaction that locks rows of a fork tree takes them in this order, so no wait cycle (deadlock) can form:

1. **The tree lock**: the root's ``conversations`` row, ``FOR UPDATE`` (``lock_tree_of``, ``lock_root``) by a write
   that changes the tree (deleting conversations, forking, membership changes, transfers), ``FOR SHARE``
   (``share_roots``) by one that must see the tree stay as it is while it writes beside it (the conversation
   indexer storing vectors). One transaction locks one tree, except ``share_roots``, which takes its roots in id
   order. The lock is taken before anything else of the tree is locked.
2. **The tree's other conversation rows**, ``FOR UPDATE``, in id order (deleting conversations, ``set_owner``).
   Only a holder of the tree lock locks more than one of them. An append locks its own conversation row alone (the root's
   row, for an append to a root conversation: the tree lock itself) and then no other conversation row.
3. **Rows below a conversation or beside the tree**: entries (in id order where several), their vectors, the
   tree's memberships and transfers (apps.sharing, under the tree lock), attachment links.

A deadlock or serialization failure that still happens is answered 409 (apps.core.errors), never 503.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection

from apps.core.db.sql import SqlFragment


@dataclass(frozen=True)
class Tree:
    root_id: Any
    owner_user_id: str  # the primary owner (``ownerUserId``)


# --- Locks --------------------------------------------------------------------------------------------------------


def lock_tree_of(conversation_id: Any) -> Tree | None:
    """Take the tree lock of ``conversation_id``'s tree (deleted or not); None when the conversation never existed.

    A row lock that had to wait re-reads only the locked row: read anything else of the tree (is this conversation
    deleted, who is a member) in a later statement, once the lock is held."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT r.id, r.owner_user_id FROM conversations c JOIN conversations r ON r.id = c.root_id "
            "WHERE c.id = %s FOR UPDATE OF r",
            [conversation_id],
        )
        row = cursor.fetchone()
    return None if row is None else Tree(row[0], row[1])


def lock_root(root_id: Any) -> str | None:
    """Take the tree lock of a live tree by its root's id; the primary owner's user id, or None when it is gone."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT owner_user_id FROM conversations WHERE id = %s AND deleted_at IS NULL FOR UPDATE", [root_id]
        )
        row = cursor.fetchone()
    return None if row is None else row[0]


def share_roots(root_ids: Sequence[Any]) -> None:
    """Hold the trees of ``root_ids`` unchanged (``FOR SHARE`` of their roots, in id order) until the transaction
    ends: no conversation of them is deleted meanwhile. A write that changes a tree waits, and so does an append to
    a root conversation; appends to forks do not."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM conversations WHERE id = ANY(%s::uuid[]) ORDER BY id FOR SHARE",
            [sorted({str(root_id) for root_id in root_ids})],
        )


def set_owner(root_id: Any, user_id: str) -> int:
    """Name ``user_id`` the primary owner (``ownerUserId``) of every conversation of the tree (a transfer of
    ownership; the caller holds the tree lock); how many of them are live (what moves between the owners' quotas).
    The rows are locked in id order first, as the lock order says."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE conversations SET owner_user_id = %s WHERE id IN "
            "(SELECT id FROM conversations WHERE root_id = %s ORDER BY id FOR UPDATE) RETURNING deleted_at IS NULL",
            [user_id, root_id],
        )
        return sum(1 for (live,) in cursor.fetchall() if live)


# --- Reads --------------------------------------------------------------------------------------------------------


def root_of(conversation_id: Any) -> Any | None:
    """The tree root of any conversation, deleted ones included (admin views); None when it never existed."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT root_id FROM conversations WHERE id = %s", [conversation_id])
        row = cursor.fetchone()
    return None if row is None else row[0]


# --- Fragments: trees read inside another app's statement -----------------------------------------------------


def live_tree(conversation_id: Any) -> SqlFragment:
    """A table ``(root_id, owner_user_id)``: one row for a live conversation, none for a deleted or unknown one."""
    return SqlFragment(
        "(SELECT c.root_id, r.owner_user_id FROM conversations c JOIN conversations r ON r.id = c.root_id "
        "WHERE c.id = %s AND c.deleted_at IS NULL)",
        (conversation_id,),
    )


def live_roots(conversation_ids: Sequence[Any]) -> SqlFragment:
    """A table ``(root_id)``: the trees of the live conversations among ``conversation_ids``."""
    return SqlFragment(
        "(SELECT root_id FROM conversations WHERE id = ANY(%s::uuid[]) AND deleted_at IS NULL)",
        ([str(conversation_id) for conversation_id in conversation_ids],),
    )


def roots(conversation_ids: Sequence[Any]) -> SqlFragment:
    """A table ``(id, root_id)``: each of ``conversation_ids`` that exists (deleted ones included) with its tree."""
    return SqlFragment(
        "(SELECT id, root_id FROM conversations WHERE id = ANY(%s::uuid[]))",
        ([str(conversation_id) for conversation_id in conversation_ids],),
    )
