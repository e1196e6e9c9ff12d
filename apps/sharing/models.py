"""Memberships and pending ownership transfers, both keyed by fork tree (``root_id``, see apps.conversations).

No foreign keys to apps.conversations (which imports only apps.sharing.access; this app reads its trees through
apps.conversations.trees). Rows of a deleted tree are removed by
the ``conversation_deleting`` signal handler in the same transaction; its memberships move to
``ArchivedMembership``, which only the admin view reads. Table names are fixed: apps.sharing.access reads
``conversation_memberships`` with raw SQL, in its own queries and in the fragments other apps embed.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

from apps.sharing.access import AccessLevel


class Membership(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    root_id = models.UUIDField()
    user_id = models.TextField()
    access_level = models.CharField(max_length=16, choices=[(level.value, level.value) for level in AccessLevel])
    created_at = models.DateTimeField()

    class Meta:
        db_table = "conversation_memberships"
        constraints = [
            models.UniqueConstraint(fields=["root_id", "user_id"], name="conversation_memberships_one_per_user"),
            models.CheckConstraint(
                name="conversation_memberships_level",
                condition=Q(access_level__in=[level.value for level in AccessLevel]),
            ),
        ]
        indexes = [
            # "My conversations": every list starts from the caller's memberships.
            models.Index(fields=["user_id", "root_id"], name="conversation_memberships_user"),
        ]

    def __str__(self) -> str:
        return f"{self.user_id} {self.access_level} on {self.root_id}"


class OwnershipTransfer(models.Model):
    """A pending transfer. Accepted, declined and cancelled transfers are deleted (the interface's "deleted" /
    "no longer listed"), so every row is pending and one unique index on ``root_id`` keeps at most one pending
    transfer per fork tree in the database, whatever races the callers run."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    root_id = models.UUIDField()
    conversation_id = models.UUIDField()
    from_user_id = models.TextField()
    to_user_id = models.TextField()
    created_at = models.DateTimeField()

    class Meta:
        db_table = "conversation_ownership_transfers"
        constraints = [
            models.UniqueConstraint(fields=["root_id"], name="conversation_transfers_one_pending"),
        ]
        indexes = [
            models.Index(fields=["to_user_id", "created_at", "id"], name="conversation_transfers_to"),
            models.Index(fields=["from_user_id", "created_at", "id"], name="conversation_transfers_from"),
        ]

    def __str__(self) -> str:
        return f"{self.from_user_id} -> {self.to_user_id} ({self.conversation_id})"


class ArchivedMembership(models.Model):
    """A membership of a deleted fork tree, as it was when the tree was deleted, kept for the admin view (who had
    access). It grants nothing: no access check reads this table (they read ``conversation_memberships`` only),
    and a deleted tree never comes back. ``id`` is the membership's own id."""

    id = models.UUIDField(primary_key=True, editable=False)
    root_id = models.UUIDField()
    user_id = models.TextField()
    access_level = models.CharField(max_length=16, choices=[(level.value, level.value) for level in AccessLevel])
    created_at = models.DateTimeField()
    archived_at = models.DateTimeField()

    class Meta:
        db_table = "conversation_memberships_archive"
        indexes = [
            # The admin view's page: one tree's members, oldest first.
            models.Index(fields=["root_id", "created_at", "id"], name="conv_memberships_archive_page"),
        ]

    def __str__(self) -> str:
        return f"{self.user_id} was {self.access_level} on {self.root_id}"
