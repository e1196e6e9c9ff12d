"""Memory writes: upsert, delete, expiry. Each is one transaction that also appends its timeline event.

Policies run before the transaction (authorization and attribute derivation never hold row locks); encryption
happens in Python, so the database only ever sees ciphertext.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, F, Value, When
from django.db.models.expressions import RawSQL
from django.utils import timezone

from apps.core import crypto, errors
from apps.core.auth.principal import Principal
from apps.core.policy import get_engine, policy_context
from apps.memories.models import EventKind, IndexStatus, Memory, MemoryEvent, MemoryState

logger = logging.getLogger(__name__)

VALUE_PURPOSE = "memory.value"
EVENT_VALUE_PURPOSE = "memory_event.value"

# Any constant works; it names the lock that orders event sequence numbers by commit (see _append_event).
_EVENT_ORDER_LOCK = 0x6D656D6F  # "memo"
# The class half of the two-int advisory locks that serialise writers per address (see _lock_address). The two-int
# key space never overlaps the single-bigint one _EVENT_ORDER_LOCK lives in.
_ADDRESS_LOCK_CLASS = 0x61646472  # "addr"


def authorize(principal: Principal, operation: str, namespace: list[str], key: str, **write_fields) -> None:
    """authz.rego on a direct write/read/delete; a deny is 403 carrying the policy's reason."""
    decision = get_engine().authorize(
        {"operation": operation, "namespace": namespace, "key": key, **write_fields, "context": policy_context(principal)}
    )
    if not decision.allow:
        raise errors.forbidden("Access denied by policy.", reason=decision.reason or "access denied")


@dataclass(frozen=True)
class WriteResult:
    memory: Memory
    kind: str


def put_memory(
    principal: Principal,
    *,
    namespace: list[str],
    key: str,
    value: dict,
    index: dict[str, str] | None = None,
    ttl_seconds: int | None = None,
) -> WriteResult:
    serialized = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    if len(serialized) > settings.MEMORY_MAX_VALUE_BYTES:
        raise errors.payload_too_large(f"value exceeds {settings.MEMORY_MAX_VALUE_BYTES} bytes serialized")
    index = index or {}
    authorize(principal, "write", namespace, key, value=value, index=index)
    attributes = get_engine().attributes(
        {"namespace": namespace, "key": key, "value": value, "index": index, "context": policy_context(principal)}
    )

    with transaction.atomic():
        _lock_address(namespace, key)
        return _write_version(namespace, key, serialized, attributes, index, ttl_seconds)


def _write_version(
    namespace: list[str],
    key: str,
    serialized_value: bytes,
    attributes: dict,
    index: dict[str, str],
    ttl_seconds: int | None,
) -> WriteResult:
    now = timezone.now()
    previous = _lock_active_version(namespace, key)
    kind = EventKind.ADD
    if previous is not None:
        if previous.expires_at is not None and previous.expires_at <= now:
            # Already invisible to readers: record the expiry the sweep would have, then this is a new record.
            _close_versions([previous.id], MemoryState.EXPIRED, now)
            _append_event(previous, EventKind.EXPIRED, namespace, key)
        else:
            _close_versions([previous.id], MemoryState.SUPERSEDED, now)
            kind = EventKind.UPDATE

    version_id = uuid.uuid4()
    memory = Memory.objects.create(
        id=version_id,
        namespace=namespace,
        key=key,
        value_ciphertext=crypto.encrypt(serialized_value, purpose=VALUE_PURPOSE, row_id=str(version_id)),
        attributes=attributes,
        indexed_content=index or None,
        created_at=now,
        expires_at=now + timedelta(seconds=ttl_seconds) if ttl_seconds else None,
        state=MemoryState.ACTIVE,
        index_status=IndexStatus.PENDING if index else IndexStatus.NONE,
    )
    _append_event(memory, kind, namespace, key, serialized_value=serialized_value)
    if index:
        transaction.on_commit(_enqueue_indexing)
    return WriteResult(memory, kind)


def _lock_address(namespace: list[str], key: str) -> None:
    """Serialise every writer and deleter of one (namespace, key) until the transaction ends.

    Row locks alone cannot do it: when no active version exists there is no row to lock, so two writers would both
    insert and one would hit the one-active-version unique index (a 500). The advisory lock exists before the row
    does. Taken first, before any row lock, and each statement after it reads a fresh READ COMMITTED snapshot, so a
    writer that waited sees the version its predecessor committed. A hash collision between two addresses only
    makes them wait for each other.
    """
    address = json.dumps([namespace, key], separators=(",", ":"), ensure_ascii=False)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [_ADDRESS_LOCK_CLASS, address])


def _lock_active_version(namespace: list[str], key: str) -> Memory | None:
    """The active version at the address, row-locked until the transaction ends (None when there is none)."""
    return (
        Memory.objects.select_for_update()
        .filter(namespace=namespace, key=key, state=MemoryState.ACTIVE)
        .only("id", "expires_at", "attributes")
        .first()
    )


def _close_versions(ids: list, state: str, now: datetime) -> None:
    """End versions. One still waiting for the indexer will never need vectors; one that has vectors keeps
    index_status=indexed, which is how the indexer finds vectors to remove on its next cycle."""
    Memory.objects.filter(id__in=ids).update(
        state=state,
        ended_at=now,
        index_status=Case(
            When(index_status=IndexStatus.PENDING, then=Value(IndexStatus.REMOVED)), default=F("index_status")
        ),
    )


def _append_event(
    memory: Memory,
    kind: str,
    namespace: list[str],
    key: str,
    *,
    serialized_value: bytes | None = None,
) -> MemoryEvent:
    """Append the timeline event as the transaction's last statement.

    The transaction-level advisory lock is held from here to commit, so events take their sequence numbers in
    commit order: a reader paging by seq cannot pass an event that commits later with a smaller number.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_EVENT_ORDER_LOCK])
    event_id = uuid.uuid4()
    ciphertext = None
    if serialized_value is not None:
        ciphertext = crypto.encrypt(serialized_value, purpose=EVENT_VALUE_PURPOSE, row_id=str(event_id))
    return MemoryEvent.objects.create(
        id=event_id,
        memory_id=memory.id,
        namespace=namespace,
        key=key,
        kind=kind,
        # Taken under the lock too, so occurred_at never runs backwards along the sequence.
        occurred_at=RawSQL("clock_timestamp()", []),
        value_ciphertext=ciphertext,
        attributes=memory.attributes,
    )


def delete_memory(principal: Principal, *, namespace: list[str], key: str) -> bool:
    """Idempotent (D4): 204 whenever authorized; an event only when an active record was deleted."""
    authorize(principal, "delete", namespace, key)
    with transaction.atomic():
        _lock_address(namespace, key)
        now = timezone.now()
        current = _lock_active_version(namespace, key)
        if current is None:
            return False
        if current.expires_at is not None and current.expires_at <= now:
            _close_versions([current.id], MemoryState.EXPIRED, now)
            _append_event(current, EventKind.EXPIRED, namespace, key)
            return False
        _close_versions([current.id], MemoryState.DELETED, now)
        _append_event(current, EventKind.DELETE, namespace, key)
        return True


def expire_due_memories(batch_size: int | None = None) -> int:
    """Mark active versions whose expires_at has passed as expired, writing their events; returns the count.

    ``FOR UPDATE SKIP LOCKED`` lets several beat/worker processes sweep at once without double-expiring a row
    or waiting on each other.
    """
    batch_size = batch_size or settings.MEMORY_EXPIRY_BATCH_SIZE
    total = 0
    while True:
        with transaction.atomic():
            now = timezone.now()
            due = list(
                Memory.objects.select_for_update(skip_locked=True)
                .filter(state=MemoryState.ACTIVE, expires_at__lte=now)
                .order_by("expires_at")
                .only("id", "namespace", "key", "attributes")[:batch_size]
            )
            if not due:
                return total
            ids = [memory.id for memory in due]
            _close_versions(ids, MemoryState.EXPIRED, now)
            for memory in due:
                _append_event(memory, EventKind.EXPIRED, memory.namespace, memory.key)
            total += len(due)
        if len(due) < batch_size:
            return total


def prune_events(retention_days: int | None = None) -> int:
    days = retention_days if retention_days is not None else settings.MEMORY_EVENTS_RETENTION_DAYS
    cutoff = timezone.now() - timedelta(days=days)
    deleted, _ = MemoryEvent.objects.filter(occurred_at__lt=cutoff).delete()
    return deleted


def _enqueue_indexing() -> None:
    """Ask a worker to embed the new version now (beat's periodic run is the safety net)."""
    try:
        from apps.memories.tasks import request_indexing

        request_indexing()
    except Exception:  # a broker hiccup must not fail a committed write; beat picks the row up later
        logger.warning("could not enqueue the memory indexer; the periodic run will pick the write up")
