"""Memory versions and their append-only event timeline.

Every write inserts a new version row with a new id; the previous active version of the same (namespace, key) is
closed (superseded, deleted or expired) in the same transaction. A partial unique index keeps at most one active
version per address. Values are stored only as AES-256-GCM envelopes (apps.encryption.crypto); namespace, key,
attributes, index text and expiry are plaintext, as the interface says.
"""

from __future__ import annotations

import uuid

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.fields.array import SliceTransform
from django.contrib.postgres.indexes import GinIndex
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q
from pgvector.django import VectorField

from apps.retrieval.models import IndexState

# The ceiling of memory.episodic.namespace.max_depth (the admin form and the environment default refuse more), and
# so the deepest namespace that can exist: GET and DELETE accept addresses up to it whatever the setting is now,
# so that lowering the setting caps new writes only and every record written before stays reachable.
MAX_NAMESPACE_DEPTH = 64


class MemoryState(models.TextChoices):
    ACTIVE = "active"
    SUPERSEDED = "superseded"
    DELETED = "deleted"
    EXPIRED = "expired"


class IndexStatus(models.TextChoices):
    """Where a version stands with the semantic indexer (apps.memories.indexer)."""

    NONE = "none"  # no `index` map: never embedded
    PENDING = "pending"  # waiting to be embedded (or retrying after a failure, or quarantined: see IndexState)
    INDEXED = "indexed"  # vectors written
    REMOVED = "removed"  # version no longer active and its vectors are gone


class Memory(IndexState):
    """One version of a memory. ``id`` is the version id the API returns."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    namespace = ArrayField(models.TextField())
    key = models.TextField()
    value_ciphertext = models.BinaryField()
    attributes = models.JSONField(null=True, blank=True)
    indexed_content = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=MemoryState.choices, default=MemoryState.ACTIVE)
    ended_at = models.DateTimeField(null=True, blank=True)
    index_status = models.CharField(max_length=16, choices=IndexStatus.choices, default=IndexStatus.NONE)
    index_attempts = models.PositiveIntegerField(default=0)  # times the indexer took this version

    class Meta:
        db_table = "memories"
        constraints = [
            models.UniqueConstraint(
                fields=["namespace", "key"], condition=Q(state="active"), name="memories_one_active_version"
            ),
        ]
        indexes = [
            # Prefix matching is `namespace @> prefix AND namespace[1:n] = prefix`: segment-exact, GIN-backed.
            # Migration 0005 keeps statistics on namespace[1:n] (CREATE STATISTICS) so the planner can tell how
            # many memories sit under a prefix.
            GinIndex(fields=["namespace"], name="memories_active_ns_gin", condition=Q(state="active")),
            GinIndex(
                fields=["attributes"],
                name="memories_active_attrs_gin",
                opclasses=["jsonb_path_ops"],
                condition=Q(state="active"),
            ),
            models.Index(
                fields=["-created_at", "-id"], name="memories_active_recent", condition=Q(state="active")
            ),
            # The expiry sweep: active rows with an expiry, oldest first.
            models.Index(
                fields=["expires_at"],
                name="memories_expiring",
                condition=Q(state="active", expires_at__isnull=False),
            ),
            # The indexer's work queue: versions to embed, or whose vectors must go.
            models.Index(
                fields=["index_retry_at", "created_at"],
                name="memories_index_queue",
                condition=Q(index_status="pending") | (Q(index_status="indexed") & ~Q(state="active")),
            ),
            # The indexer's fair rotation (apps.retrieval.indexing: Indexer.claim): the owners with versions to
            # embed, one index step from each to the next, and each owner's oldest.
            models.Index(
                SliceTransform(1, 2, "namespace"), F("created_at"), F("id"),
                name="memories_index_owner_queue",
                condition=Q(index_status="pending", state="active", index_quarantined_at__isnull=True),
            ),
            # Quarantined versions (apps.retrieval.indexing): counted for /readyz and /metrics after every cycle.
            models.Index(
                fields=["index_quarantined_at"],
                name="memories_index_quarantined",
                condition=Q(index_quarantined_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{'/'.join(self.namespace)}:{self.key} ({self.state})"


class EventKind(models.TextChoices):
    ADD = "add"
    UPDATE = "update"
    DELETE = "delete"
    EXPIRED = "expired"


class CurrentTransactionId(models.Func):
    """The writing transaction's id (PostgreSQL's 64-bit xid8, which never wraps around), as a bigint."""

    template = "(pg_current_xact_id()::text::bigint)"
    output_field = models.BigIntegerField()


class MemoryEvent(models.Model):
    """An append-only timeline entry, written in the same transaction as the change it records.

    The timeline's order is ``(tx, seq)``: the id of the transaction that wrote the event, then its sequence number.
    Writers take no common lock (each address is serialised on its own, services._ADDRESS_LOCK_SQL), so sequence
    numbers are not commit order; a reader instead only returns events of transactions older than every transaction
    still running (selectors.events_query), and any transaction that commits later has a larger id than all of
    those. So a reader paging by ``(tx, seq)`` never passes an event that commits later. ``attributes`` is kept for
    every kind so access filtering works on delete/expired events too; the API shows it only for add/update, as
    the interface says.
    """

    seq = models.BigAutoField(primary_key=True)
    # 0 for events written before this column existed: they precede every later one, in seq order (they were
    # written under one global lock, in commit order).
    tx = models.BigIntegerField(db_default=CurrentTransactionId(), editable=False)
    id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    memory_id = models.UUIDField()
    namespace = ArrayField(models.TextField())
    key = models.TextField()
    kind = models.CharField(max_length=8, choices=EventKind.choices)
    occurred_at = models.DateTimeField()
    value_ciphertext = models.BinaryField(null=True)
    attributes = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "memory_events"
        indexes = [
            # For prefixes deeper than the owner. No pending list (fastupdate): every scan reads all of it until
            # VACUUM merges it, and events arrive one per write (migration 0009).
            GinIndex(fields=["namespace"], name="memory_events_ns_gin", fastupdate=False),
            models.Index(fields=["occurred_at"], name="memory_events_occurred"),
            # The events page walks the timeline in (tx, seq) order: the whole of it for an admin's short prefix ...
            models.Index(fields=["tx", "seq"], name="memory_events_timeline"),
            # ... one owner's part of it otherwise: `namespace[1:2] = owner ORDER BY tx + 0, seq`
            # (selectors.events_query; `+ 0` so the index above cannot serve that order: walking it and filtering
            # reads every other owner's events between two of this owner's). Migration 0004 also keeps statistics
            # on namespace[1:n] (CREATE STATISTICS) for prefixes deeper than the owner.
            models.Index(
                SliceTransform(1, 2, "namespace"), F("tx") + 0, F("seq"), name="memory_events_owner_timeline"
            ),
            # ... and a page filtered by kind walks one kind at a time, the walks merged (migration 0009).
            models.Index(
                SliceTransform(1, 2, "namespace"), F("kind"), F("tx") + 0, F("seq"),
                name="memory_events_kind_timeline",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {'/'.join(self.namespace)}:{self.key}"


class ServiceSettings(models.Model):
    """Operator-tunable settings, edited in Django admin; one row. Read through apps.memories.config with a short
    cache so a change applies without a restart."""

    memory_episodic_namespace_max_depth = models.PositiveSmallIntegerField(
        "memory.episodic.namespace.max_depth",
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_NAMESPACE_DEPTH)],
        help_text=(
            f"Maximum namespace depth for new writes (1 to {MAX_NAMESPACE_DEPTH}). Empty: "
            "MEMORY_EPISODIC_NAMESPACE_MAX_DEPTH (default 5). Lowering it caps new writes only: deeper records "
            "stay readable, deletable and searchable."
        ),
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "service_settings"
        verbose_name = "service settings"
        verbose_name_plural = "service settings"

    def __str__(self) -> str:
        return "Service settings"


class MemoryVector(models.Model):
    """One embedding per (memory version, index field, chunk), for semantic search.

    A field that fits the model's input window has one vector (chunk 0); a longer one has one per overlapping
    chunk (0, 1, ...), which together cover all of its text, and search scores a memory by its best vector.

    Holds only the embedding, the namespace, the plaintext policy attributes and the expiry (so the ANN query can
    scope and hide expired rows by itself) — never the value. ``embedding`` has no fixed dimension: the HNSW index
    is an expression index on ``embedding::vector(<dimension>)`` for the configured provider, and ``model`` keeps
    vectors of another provider out of the results until ``reindex_memories`` replaces them
    (apps.memories.vector_index).
    """

    id = models.BigAutoField(primary_key=True)
    memory = models.ForeignKey(Memory, on_delete=models.CASCADE, related_name="vectors", db_constraint=True)
    field = models.TextField()
    chunk = models.PositiveIntegerField(default=0, db_default=0)
    model = models.TextField()
    namespace = ArrayField(models.TextField())
    attributes = models.JSONField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    embedding = VectorField()

    class Meta:
        db_table = "memory_vectors"
        constraints = [
            models.UniqueConstraint(fields=["memory", "field", "chunk"], name="memory_vectors_one_per_chunk"),
        ]
        indexes = [
            GinIndex(fields=["namespace"], name="memory_vectors_ns_gin"),
            GinIndex(fields=["attributes"], name="memory_vectors_attrs_gin", opclasses=["jsonb_path_ops"]),
        ]

    def __str__(self) -> str:
        return f"{self.memory_id}:{self.field}#{self.chunk}"
