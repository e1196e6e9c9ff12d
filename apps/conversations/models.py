"""Conversations, their fork trees and their entries.

A fork tree is a root conversation and every conversation forked from it (directly or from another fork); each row
carries ``root_id`` (its own id for a root) because memberships, ownership and transfers belong to the tree
(apps.sharing keys them by ``root_id``). Conversations are soft-deleted (``deleted_at``) so admin views can still
audit them; entries stay with them. Entry content is stored only as an AES-256-GCM envelope (apps.encryption.crypto)
bound to the entry's id and conversation id; titles, metadata and ``indexed_content`` are plaintext (D5).

Other apps never name these tables: they lock a tree, name its owner and read a tree's root through
apps.conversations.trees.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from pgvector.django import VectorField

from apps.retrieval.models import IndexState


class Conversation(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    root_id = models.UUIDField()
    owner_user_id = models.TextField()
    title = models.TextField(default="", blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    forked_at_conversation_id = models.UUIDField(null=True, blank=True)
    forked_at_entry_id = models.UUIDField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "conversations"
        indexes = [
            # Keyset orders of the lists (newest first by updated_at; admin and forks by created_at).
            models.Index(fields=["updated_at", "id"], name="conversations_updated", condition=Q(deleted_at__isnull=True)),
            models.Index(fields=["created_at", "id"], name="conversations_created", condition=Q(deleted_at__isnull=True)),
            models.Index(fields=["root_id"], name="conversations_root"),
            models.Index(fields=["owner_user_id"], name="conversations_owner"),
        ]
        constraints = [
            models.CheckConstraint(
                name="conversations_fork_point_both_or_neither",
                condition=Q(forked_at_conversation_id__isnull=True, forked_at_entry_id__isnull=True)
                | Q(forked_at_conversation_id__isnull=False, forked_at_entry_id__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.title or '(untitled)'} ({self.id})"


class Channel(models.TextChoices):
    HISTORY = "history"
    CONTEXT = "context"  # private to the API-key client that wrote it


class Entry(IndexState):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="entries", db_index=False, db_column="conversation_id"
    )
    user_id = models.TextField()
    client_id = models.TextField(null=True, blank=True)  # noqa: DJ001 - null = no API-key client
    channel = models.CharField(max_length=16, choices=Channel.choices)
    content_type = models.TextField()
    content = models.BinaryField()
    indexed_content = models.TextField(null=True, blank=True)  # noqa: DJ001 - null = not indexed yet
    # True while indexed_content has no vectors yet (set with every new index text, cleared by the indexer). The
    # full-text side needs no flag: ``search_vector`` is a generated tsvector column (migration 0002).
    embedding_pending = models.BooleanField(default=False, db_default=False)
    created_at = models.DateTimeField()
    # A client-chosen lookup key (D11: GET .../entries?key=): several entries may share one (a LangGraph checkpoint
    # and its pending writes). Plaintext, like the content type: never a secret.
    key = models.TextField(null=True, blank=True)  # noqa: DJ001 - null = no key

    class Meta:
        db_table = "conversation_entries"
        verbose_name_plural = "entries"
        constraints = [
            # Search is shared by every member; a context entry is private to its client (D5): never indexed.
            models.CheckConstraint(
                name="conversation_entries_context_never_indexed",
                condition=Q(channel="history") | Q(indexed_content__isnull=True, embedding_pending=False),
            ),
        ]
        indexes = [
            models.Index(fields=["conversation", "created_at", "id"], name="conversation_entries_order"),
            # What a reader's entry list scans, each in list order (apps.conversations.selectors._EntryKeyset): the
            # shared history, one API-key client's context entries, and the entries of one key. Read from either
            # end (tail, beforeCursor) without passing over the other channel's or the other clients' entries.
            models.Index(
                fields=["conversation", "created_at", "id"], name="conv_entries_history", condition=Q(channel="history")
            ),
            models.Index(
                fields=["conversation", "client_id", "created_at", "id"],
                name="conv_entries_context",
                condition=Q(channel="context"),
            ),
            models.Index(
                fields=["conversation", "key", "created_at", "id"], name="conv_entries_key", condition=Q(key__isnull=False)
            ),
            # GET /v1/conversations/unindexed and the background indexer's text pass.
            models.Index(
                fields=["created_at", "id"],
                name="conv_entries_unindexed",
                condition=Q(indexed_content__isnull=True, channel="history"),
            ),
            # The indexer's embedding pass.
            models.Index(
                fields=["created_at", "id"], name="conv_entries_embed", condition=Q(embedding_pending=True)
            ),
            # The indexer's fair rotation between writers (apps.retrieval.indexing: Indexer.claim), per arm.
            models.Index(
                fields=["user_id", "created_at", "id"],
                name="conv_entries_embed_owner",
                condition=Q(embedding_pending=True, index_quarantined_at__isnull=True),
            ),
            models.Index(
                fields=["user_id", "created_at", "id"],
                name="conv_entries_unindexed_owner",
                condition=Q(indexed_content__isnull=True, channel="history", index_quarantined_at__isnull=True),
            ),
            # Quarantined entries (apps.retrieval.indexing): counted for /readyz and /metrics after every cycle.
            models.Index(
                fields=["index_quarantined_at"],
                name="conv_entries_quarantined",
                condition=Q(index_quarantined_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.channel} entry {self.id}"


class EntryVector(models.Model):
    """One embedded chunk of an entry's index text (a text longer than the model's window is several chunks).

    ``root_id`` is the entry's fork tree (fixed for a conversation's life), so the membership check of a semantic
    search is one probe of ``conversation_memberships (root_id, user_id)`` per candidate vector, without a join
    to ``conversations``. Vectors of a deleted conversation are removed in the deleting transaction. The HNSW index
    per dimension is created on first use (apps.retrieval.vectors), like the memories'.
    """

    id = models.BigAutoField(primary_key=True)
    entry = models.ForeignKey(Entry, on_delete=models.CASCADE, related_name="vectors", db_column="entry_id")
    conversation_id = models.UUIDField()
    root_id = models.UUIDField()
    chunk = models.IntegerField()
    model = models.TextField()
    embedding = VectorField()

    class Meta:
        db_table = "conversation_entry_vectors"
        constraints = [
            models.UniqueConstraint(fields=["entry", "chunk"], name="conversation_entry_vectors_one_per_chunk"),
        ]
        indexes = [
            models.Index(fields=["root_id"], name="conv_entry_vectors_root"),
            models.Index(fields=["conversation_id"], name="conv_entry_vectors_conv"),
        ]

    def __str__(self) -> str:
        return f"vector {self.entry_id}#{self.chunk}"
