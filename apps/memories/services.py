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
from typing import TYPE_CHECKING, NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.core import crypto, errors
from apps.core.auth.principal import Principal
from apps.core.policy import get_engine, policy_context
from apps.memories.models import EventKind, IndexStatus, Memory, MemoryEvent, MemoryState

if TYPE_CHECKING:
    from django.db.backends.utils import CursorWrapper

logger = logging.getLogger(__name__)

VALUE_PURPOSE = "memory.value"
EVENT_VALUE_PURPOSE = "memory_event.value"

# Any constant works; it names the lock that orders event sequence numbers by commit (see _append_events).
_EVENT_ORDER_LOCK = 0x6D656D6F  # "memo"
# The class half of the two-int advisory locks that serialise writers per address (see _ADDRESS_LOCK_SQL). The two-int
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
    """The version a PUT wrote (its response, without the value) and the event kind it recorded."""

    id: uuid.UUID
    namespace: list[str]
    key: str
    attributes: dict
    created_at: datetime
    expires_at: datetime | None
    kind: str


# --- The write path's SQL -------------------------------------------------------------------------------------------
#
# Raw statements, not the ORM: building and compiling four ORM statements was ~40% of a PUT's CPU. Each write is at
# most four round trips: BEGIN; the address lock with the statement that closes (and for a PUT also inserts) a
# version; the event-order lock with the event insert; COMMIT. Each pair travels as one simple-protocol query
# (client-side binding, Django's default for psycopg 3), and under READ COMMITTED each statement of such a query
# takes its own snapshot, so the one after the lock sees what the lock's previous holder committed.
# bench/memories.py runs these same statements as its floor.

# Serialises every writer and deleter of one (namespace, key) until the transaction ends; always the transaction's
# first statement. Row locks alone cannot do it: when no active version exists there is no row to lock, so two
# writers would both insert and one would hit the one-active-version unique index (a 500). The advisory lock exists
# before the row does. Taken first, before any row lock, and each statement after it reads a fresh READ COMMITTED
# snapshot, so a writer that waited sees the version its predecessor committed. A hash collision between two
# addresses only makes them wait for each other.
_ADDRESS_LOCK_SQL = "SELECT pg_advisory_xact_lock(%(lock_class)s, hashtext(%(address)s))"


def _close_sql(where: str) -> str:
    """End the active versions matching ``where``: already past their expiry they become expired (the sweep's job
    done late), otherwise %(closed_state)s. One still waiting for the indexer will never need vectors; one that has
    vectors keeps index_status=indexed, which is how the indexer finds vectors to remove on its next cycle. Returns
    what the events need: id, the state written and the attributes (as JSON text, passed back as is)."""
    return (
        "UPDATE memories SET state = CASE WHEN expires_at <= %(now)s THEN 'expired' ELSE %(closed_state)s END, "  # noqa: S608
        "ended_at = %(now)s, index_status = CASE WHEN index_status = 'pending' THEN 'removed' ELSE index_status END "
        f"WHERE {where} RETURNING id, state, attributes::text"
    )


_CLOSE_ACTIVE_SQL = _close_sql("namespace = %(namespace)s::text[] AND key = %(key)s AND state = 'active'")
_CLOSE_IDS_SQL = _close_sql("id = ANY(%(ids)s::uuid[])")

# PUT: close the active version and insert the new one in one statement. The INSERT reads the UPDATE's output
# (count(*) consumes all of it), so the old version has left the partial unique index before the new one enters.
PUT_VERSION_SQL = (
    f"{_ADDRESS_LOCK_SQL}; WITH closed AS ({_CLOSE_ACTIVE_SQL}), inserted AS ("  # noqa: S608
    "INSERT INTO memories (id, namespace, key, value_ciphertext, attributes, indexed_content, created_at, expires_at, "
    "state, index_status, index_attempts) SELECT %(id)s, %(namespace)s::text[], %(key)s, %(value)s, "
    "%(attributes)s::jsonb, %(indexed_content)s::jsonb, %(now)s, %(expires_at)s, 'active', %(index_status)s, 0 "
    "FROM (SELECT count(*) FROM closed) AS after_close"
    ") SELECT id, state, attributes FROM closed"
)
DELETE_VERSION_SQL = f"{_ADDRESS_LOCK_SQL}; {_CLOSE_ACTIVE_SQL}"

_EVENT_COLUMNS = "id, memory_id, namespace, key, kind, occurred_at, value_ciphertext, attributes"
# occurred_at is taken under the event-order lock too, so it never runs backwards along the sequence.
_EVENT_ROW = "(%s, %s, %s::text[], %s, %s, clock_timestamp(), %s, %s::jsonb)"


def events_sql(count: int) -> str:
    """The event-order lock and the insert of ``count`` events (parameters: the lock key, then each EventRow)."""
    return (
        f"SELECT pg_advisory_xact_lock(%s); INSERT INTO memory_events ({_EVENT_COLUMNS}) VALUES "  # noqa: S608
        + ", ".join([_EVENT_ROW] * count)
    )


class EventRow(NamedTuple):
    """One event's parameters, in _EVENT_ROW order."""

    id: uuid.UUID
    memory_id: uuid.UUID
    namespace: list[str]
    key: str
    kind: str
    value_ciphertext: bytes | None
    attributes_json: str | None


def address_lock_params(namespace: list[str], key: str) -> dict:
    """Parameters of _ADDRESS_LOCK_SQL."""
    return {
        "lock_class": _ADDRESS_LOCK_CLASS,
        "address": json.dumps([namespace, key], separators=(",", ":"), ensure_ascii=False),
    }


def put_memory(
    principal: Principal,
    *,
    namespace: list[str],
    key: str,
    value: dict,
    index: dict[str, str] | None = None,
    ttl_seconds: int | None = None,
) -> WriteResult:
    """Write a new version at (namespace, key) and close the previous one, in one transaction with its event."""
    serialized = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    if len(serialized) > settings.MEMORY_MAX_VALUE_BYTES:
        raise errors.payload_too_large(f"value exceeds {settings.MEMORY_MAX_VALUE_BYTES} bytes serialized")
    index = index or {}
    authorize(principal, "write", namespace, key, value=value, index=index)
    attributes = get_engine().attributes(
        {"namespace": namespace, "key": key, "value": value, "index": index, "context": policy_context(principal)}
    )

    # Everything that does not depend on the previous version is computed before the locks are taken.
    now = timezone.now()
    version_id, event_id = uuid.uuid4(), uuid.uuid4()
    attributes_json = json.dumps(attributes)
    expires_at = now + timedelta(seconds=ttl_seconds) if ttl_seconds else None
    params = {
        **address_lock_params(namespace, key),
        "now": now,
        "closed_state": MemoryState.SUPERSEDED,
        "namespace": namespace,
        "key": key,
        "id": version_id,
        "value": crypto.encrypt(serialized, purpose=VALUE_PURPOSE, row_id=str(version_id)),
        "attributes": attributes_json,
        "indexed_content": json.dumps(index) if index else None,
        "expires_at": expires_at,
        "index_status": IndexStatus.PENDING if index else IndexStatus.NONE,
    }
    event_value = crypto.encrypt(serialized, purpose=EVENT_VALUE_PURPOSE, row_id=str(event_id))

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(PUT_VERSION_SQL, params)
        cursor.nextset()
        previous = cursor.fetchone()
        kind = EventKind.ADD
        events = []
        if previous is not None:
            previous_id, previous_state, previous_attributes = previous
            if previous_state == MemoryState.EXPIRED:
                # It was already invisible to readers: record the expiry the sweep would have; this is a new record.
                events.append(
                    EventRow(uuid.uuid4(), previous_id, namespace, key, EventKind.EXPIRED, None, previous_attributes)
                )
            else:
                kind = EventKind.UPDATE
        events.append(EventRow(event_id, version_id, namespace, key, kind, event_value, attributes_json))
        _append_events(cursor, events)
        if index:
            transaction.on_commit(_enqueue_indexing)
    return WriteResult(version_id, namespace, key, attributes, now, expires_at, kind)


def _append_events(cursor: CursorWrapper, events: list[EventRow]) -> None:
    """Append timeline events as the transaction's last statement.

    The transaction-level advisory lock is held from here to commit, so events take their sequence numbers in
    commit order: a reader paging by seq cannot pass an event that commits later with a smaller number. Events of
    one call take their numbers in list order.
    """
    cursor.execute(events_sql(len(events)), [_EVENT_ORDER_LOCK, *(param for event in events for param in event)])


def delete_memory(principal: Principal, *, namespace: list[str], key: str) -> bool:
    """Idempotent (D4): 204 whenever authorized; an event only when an active record was deleted.

    Same transaction shape and address lock as put_memory."""
    authorize(principal, "delete", namespace, key)
    params = {
        **address_lock_params(namespace, key),
        "now": timezone.now(),
        "closed_state": MemoryState.DELETED,
        "namespace": namespace,
        "key": key,
    }
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(DELETE_VERSION_SQL, params)
        cursor.nextset()
        current = cursor.fetchone()
        if current is None:
            return False
        current_id, current_state, current_attributes = current
        # Already past its expiry, it was invisible: record the expiry the sweep would have, not a delete.
        kind = EventKind.EXPIRED if current_state == MemoryState.EXPIRED else EventKind.DELETE
        _append_events(cursor, [EventRow(uuid.uuid4(), current_id, namespace, key, kind, None, current_attributes)])
        return kind == EventKind.DELETE


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
                .only("id", "namespace", "key")[:batch_size]
            )
            if not due:
                return total
            with connection.cursor() as cursor:
                cursor.execute(
                    _CLOSE_IDS_SQL, {"now": now, "closed_state": MemoryState.EXPIRED, "ids": [row.id for row in due]}
                )
                closed = {row[0]: row[2] for row in cursor.fetchall()}
                _append_events(
                    cursor,
                    [
                        EventRow(uuid.uuid4(), row.id, row.namespace, row.key, EventKind.EXPIRED, None, closed[row.id])
                        for row in due
                    ],
                )
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
