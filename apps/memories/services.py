"""Memory writes: upsert, delete, expiry. Each is one transaction (one round trip, see below) that also appends its
timeline events.

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
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from apps.core import errors
from apps.core.db.prepared import run_pipelined
from apps.encryption import crypto
from apps.identity.principal import Principal
from apps.limits import services as limits
from apps.memories import keyword_index
from apps.memories.indexer import INDEXER
from apps.memories.models import EventKind, IndexStatus, MemoryEvent, MemoryState
from apps.policy import get_engine, policy_context

logger = logging.getLogger(__name__)

VALUE_PURPOSE = "memory.value"
EVENT_VALUE_PURPOSE = "memory_event.value"

MEMORY_QUOTAS = ("memories", "memory_bytes")

# The class half of the two-int advisory locks that serialise writers per address (see _ADDRESS_LOCK_SQL).
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
# Each write is one round trip of raw SQL: building and compiling the four ORM statements it used to send was ~40%
# of a PUT's CPU, and every round trip the web process waits on costs it CPU too. Its statements travel together in
# one pipeline (apps.core.db.prepared.run_pipelined), prepared: planning the PUT's statement afresh cost PostgreSQL
# more CPU than running it. Outside a caller's atomic() they are one implicit transaction, ended by the pipeline's
# Sync; inside one they join it. Under READ COMMITTED each statement takes its own snapshot. A write is two
# statements:
#
# 1. The per-address advisory lock (_ADDRESS_LOCK_SQL), always first.
# 2. One statement that closes the active version, inserts the new one (PUT), and appends the events
#    (_append_events_sql). It reads a fresh snapshot taken after the lock was granted, and the write's time (_CLOCK)
#    is read there too: a time taken before the query, while another writer of the address still held the lock,
#    could be earlier than that writer's, and an address's versions would then not follow each other in time (the
#    version a write supersedes ending before it began).
#
# No lock is shared by writers of different addresses (nor by the expiry sweep): the event timeline keeps its order
# without one, by transaction id (models.MemoryEvent, selectors.events_query). A write's transaction id is assigned
# by its first row change, which comes after the address lock (and after any row lock it waits for), so of two
# writes of one address the later one always has the larger id: the timeline reads as each address's history.
#
# bench/memories.py runs these same statements as its floor.

# Serialises every writer and deleter of one (namespace, key) until the transaction ends. Row locks alone cannot do
# it: when no active version exists there is no row to lock, so two writers would both insert and one would hit the
# one-active-version unique index (a 500). The advisory lock exists before the row does. Taken first, before any row
# lock, and each statement after it reads a fresh READ COMMITTED snapshot, so a writer that waited sees the version
# its predecessor committed. A hash collision between two addresses only makes them wait for each other.
_ADDRESS_LOCK_SQL = "SELECT pg_advisory_xact_lock(%(lock_class)s, hashtext(%(address)s))"


# The time of a PUT or DELETE, read once when its statement starts (after the address lock): the CTE ``clock``.
_CLOCK = "clock AS MATERIALIZED (SELECT clock_timestamp() AS now)"
_NOW = "(SELECT now FROM clock)"


def _close_sql(where: str, now: str) -> str:
    """End the active versions matching ``where`` at time ``now`` (SQL): already past their expiry they become
    expired (the sweep's job done late), otherwise %(closed_state)s. One still waiting for the indexer will never
    need vectors; one that has vectors keeps index_status=indexed, which is how the indexer finds vectors to remove
    on its next cycle (and how a DELETE knows to wake it)."""
    return (
        f"UPDATE memories SET state = CASE WHEN expires_at <= {now} THEN 'expired' ELSE %(closed_state)s END, "  # noqa: S608
        f"ended_at = {now}, index_status = CASE WHEN index_status = 'pending' THEN 'removed' ELSE index_status END "
        f"WHERE {where} RETURNING id, namespace, key, state, attributes, expires_at, index_status, "
        "octet_length(value_ciphertext) AS stored_bytes"
    )


# The events of the versions in the CTE ``closed``: a deleted one records a delete, an expired one its expiry; a
# superseded one none (its successor's update event records the change). Columns as _append_events_sql wants them.
_CLOSED_EVENTS = (
    "SELECT 0 AS ordinal, gen_random_uuid() AS id, id AS memory_id, namespace, key, "
    "CASE state WHEN 'deleted' THEN 'delete' ELSE 'expired' END AS kind, NULL::bytea AS value_ciphertext, attributes, "
    "expires_at FROM closed WHERE state <> 'superseded'"
)


def _append_events_sql(events: str) -> str:
    """Insert the rows of ``events`` in (ordinal, expires_at) order, stamped with this transaction's id (the
    timeline's order, see models.MemoryEvent); returns the memory_id and kind of each event."""
    return (
        "INSERT INTO memory_events (id, memory_id, namespace, key, kind, occurred_at, value_ciphertext, attributes, tx) "  # noqa: S608
        "SELECT e.id, e.memory_id, e.namespace, e.key, e.kind, clock_timestamp(), e.value_ciphertext, e.attributes, "
        "pg_current_xact_id()::text::bigint "
        f"FROM ({events}) AS e ORDER BY e.ordinal, e.expires_at RETURNING memory_id, kind"
    )


_CLOSE_ACTIVE = _close_sql("namespace = %(namespace)s::text[] AND key = %(key)s AND state = 'active'", _NOW)

# The quotas (apps.limits): active memories count against the user their namespace names, ["user", <id>, ...]
# (quota_owner), one per version and its stored value's size, moved in the write's own statement by the SQL function
# limits_charge, which refuses a write that would pass the owner's limit (the statement, and so the write, fails:
# 403 quota_exceeded). A version leaves the total when it is closed (superseded, deleted or expired).
_QUOTAS = "ARRAY['memories', 'memory_bytes']"  # sorted: one lock order (apps.limits.quotas)
_QUOTA_OWNER_SQL = "CASE WHEN namespace[1] = 'user' THEN namespace[2] END"
_CLOSED_COUNT = "(SELECT count(*) FROM closed)"
_CLOSED_BYTES = "(SELECT coalesce(sum(stored_bytes), 0) FROM closed)"

# The keyword index (apps.memories.keyword_index) holds only active versions: a write's own statement removes the
# closed version's terms and adds the new one's, so a search after the write matches its words and not the old ones.
_TERMS_CLOSED = "terms_closed AS (DELETE FROM memory_terms WHERE memory_id IN (SELECT id FROM closed))"

# PUT. The new version's INSERT reads the UPDATE's output (count(*) consumes all of it), so the old version has left
# the partial unique index before the new one enters it. Its last rows: each event's memory_id and kind, with the
# new version's created_at and expires_at on its own event's row (the response).
PUT_SQL = (
    f"WITH {_CLOCK}, closed AS ({_CLOSE_ACTIVE}), version AS ("  # noqa: S608
    "INSERT INTO memories (id, namespace, key, value_ciphertext, attributes, indexed_content, created_at, expires_at, "
    "state, index_status, index_attempts) SELECT %(id)s, %(namespace)s::text[], %(key)s, %(value)s, "
    f"%(attributes)s::jsonb, %(indexed_content)s::jsonb, {_NOW}, {_NOW} + make_interval(secs => %(ttl_seconds)s), "
    "'active', %(index_status)s, 0 "
    "FROM (SELECT count(*) FROM closed) AS after_close "
    "RETURNING id, namespace, key, attributes, created_at, expires_at, octet_length(value_ciphertext) AS stored_bytes), "
    f"charged AS MATERIALIZED (SELECT limits_charge(%(quota_user)s, {_QUOTAS}, ARRAY[1 - {_CLOSED_COUNT}, "
    f"(SELECT stored_bytes FROM version) - {_CLOSED_BYTES}], %(quota_limits)s::bigint[])), "
    f"{_TERMS_CLOSED}, "
    "terms_added AS (INSERT INTO memory_terms (term, owner_key, memory_id, tf, dl, key_id) "
    f"SELECT u.term, {keyword_index.owner_key_sql('version.namespace')}, version.id, u.tf, %(term_dl)s, "
    "%(term_key)s FROM version, "
    "unnest(%(terms)s::bigint[], %(tfs)s::int[]) AS u(term, tf)), "
    "appended AS ("
    + _append_events_sql(
        f"{_CLOSED_EVENTS} UNION ALL SELECT 1, %(event_id)s, id, namespace, key, "  # noqa: S608
        "CASE WHEN EXISTS (SELECT FROM closed WHERE state = 'superseded') THEN 'update' ELSE 'add' END, "
        "%(event_value)s, attributes, expires_at FROM version",
    )
    + ") SELECT appended.memory_id, appended.kind, version.created_at, version.expires_at "
    "FROM appended LEFT JOIN version ON version.id = appended.memory_id CROSS JOIN charged"
)
PUT_STATEMENTS = (_ADDRESS_LOCK_SQL, PUT_SQL)
# DELETE. Its rows: each event's kind, with the closed version's index_status ('indexed': it has vectors to remove).
DELETE_STATEMENTS = (
    _ADDRESS_LOCK_SQL,
    f"WITH {_CLOCK}, closed AS ({_CLOSE_ACTIVE}), {_TERMS_CLOSED}, "  # noqa: S608
    f"appended AS ({_append_events_sql(_CLOSED_EVENTS)}), "
    f"credited AS MATERIALIZED (SELECT limits_charge(%(quota_user)s, {_QUOTAS}, "
    f"ARRAY[-{_CLOSED_COUNT}, -{_CLOSED_BYTES}], NULL::bigint[])) "
    "SELECT appended.kind, closed.index_status FROM appended JOIN closed ON closed.id = appended.memory_id "
    "CROSS JOIN credited",
)
# The expiry sweep, one batch. SKIP LOCKED lets several beat/worker processes sweep at once without double-expiring
# a row or waiting on each other (nor on a writer holding a row).
_DUE = _close_sql(
    "id IN (SELECT id FROM memories WHERE state = 'active' AND expires_at <= %(now)s "
    "ORDER BY expires_at LIMIT %(batch_size)s FOR UPDATE SKIP LOCKED)",
    "%(now)s",
)
# Each owner's total is lowered by what expired, the owners' rows taken in (quota, owner) order.
_CREDIT_EXPIRED = (
    "credited AS MATERIALIZED (SELECT limits_charge(owner, ARRAY[quota], ARRAY[-amount], NULL::bigint[]) FROM ("  # noqa: S608
    f"SELECT owner, quota, amount FROM (SELECT {_QUOTA_OWNER_SQL} AS owner, count(*) AS n, "
    "sum(stored_bytes) AS bytes FROM closed GROUP BY 1) AS per_owner "
    "CROSS JOIN LATERAL (VALUES ('memories', n), ('memory_bytes', bytes)) AS q(quota, amount) "
    "WHERE owner IS NOT NULL ORDER BY quota, owner) AS ordered)"
)
EXPIRE_SQL = (
    f"WITH closed AS ({_DUE}), {_CREDIT_EXPIRED}, {_TERMS_CLOSED}, "  # noqa: S608
    f"appended AS ({_append_events_sql(_CLOSED_EVENTS)}) "
    "SELECT appended.memory_id, appended.kind FROM appended WHERE (SELECT count(*) FROM credited) >= 0"
)


def quota_owner(namespace: list[str]) -> str | None:
    """The user whose memory quotas a memory at ``namespace`` counts against (_QUOTA_OWNER_SQL): the <id> of
    ["user", <id>, ...], the built-in policies' own namespace. None (not counted) elsewhere, which only a custom
    policy lets anyone write."""
    return namespace[1] if len(namespace) >= 2 and namespace[0] == "user" else None


def write_params(namespace: list[str], key: str, closed_state: str) -> dict:
    """The parameters PUT_STATEMENTS and DELETE_STATEMENTS share."""
    owner = quota_owner(namespace)
    return {
        "lock_class": _ADDRESS_LOCK_CLASS,
        "address": json.dumps([namespace, key], separators=(",", ":"), ensure_ascii=False),
        "closed_state": closed_state,
        "namespace": namespace,
        "key": key,
        "quota_user": owner,
        "quota_limits": limits.limits_for(owner, MEMORY_QUOTAS) if owner is not None else None,
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
    """Write a new version at (namespace, key) and close the previous one, with its events, in one transaction."""
    serialized = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    if len(serialized) > settings.MEMORY_MAX_VALUE_BYTES:
        raise errors.payload_too_large(f"value exceeds {settings.MEMORY_MAX_VALUE_BYTES} bytes serialized")
    index = index or {}
    authorize(principal, "write", namespace, key, value=value, index=index)
    attributes = get_engine().attributes(
        {"namespace": namespace, "key": key, "value": value, "index": index, "context": policy_context(principal)}
    )

    version_id, event_id = uuid.uuid4(), uuid.uuid4()
    params = {
        **write_params(namespace, key, MemoryState.SUPERSEDED),
        "id": version_id,
        "value": crypto.encrypt(serialized, purpose=VALUE_PURPOSE, row_id=str(version_id)),
        "attributes": json.dumps(attributes),
        "indexed_content": json.dumps(index) if index else None,
        "ttl_seconds": ttl_seconds or None,
        "index_status": IndexStatus.PENDING if index else IndexStatus.NONE,
        "event_id": event_id,
        "event_value": crypto.encrypt(serialized, purpose=EVENT_VALUE_PURPOSE, row_id=str(event_id)),
        **keyword_index.document_params(index),
    }
    # A refusal fails the statement and so the write. Inside a caller's atomic() (no savepoint of its own: that
    # would be two more round trips on every write) it leaves the caller's transaction failed, as any database error
    # does there: the caller lets the 403 out of its block, which rolls back.
    try:
        rows = run_pipelined(PUT_STATEMENTS, params)
    except DatabaseError as exc:
        limits.raise_if_refused(exc)  # 403 quota_exceeded
        raise
    kind, created_at, expires_at = next(
        (kind, created_at, expires_at) for memory_id, kind, created_at, expires_at in rows if memory_id == version_id
    )
    if index:
        transaction.on_commit(_enqueue_indexing)  # at once when committed already (no atomic() around us)
    return WriteResult(version_id, namespace, key, attributes, created_at, expires_at, kind)


def delete_memory(principal: Principal, *, namespace: list[str], key: str) -> bool:
    """Idempotent (D4): 204 whenever authorized; an event only when an active record was deleted. A record already
    past its expiry (invisible, not swept yet) records its expiry instead."""
    authorize(principal, "delete", namespace, key)
    rows = run_pipelined(DELETE_STATEMENTS, write_params(namespace, key, MemoryState.DELETED))
    deleted = [index_status for kind, index_status in rows if kind == EventKind.DELETE]
    if IndexStatus.INDEXED in deleted:
        # Search already ignores the deleted version's vectors; removing them soon keeps them from slowing the
        # HNSW walk (which steps over them) until beat's next run. A version without vectors (no index, or one
        # still pending, which the delete made `removed`) leaves the indexer nothing to do: no wake-up.
        transaction.on_commit(_enqueue_indexing)
    return bool(deleted)


def expire_due_memories(batch_size: int | None = None) -> int:
    """Mark active versions whose expires_at has passed as expired, writing their events; returns the count. One
    transaction per batch."""
    batch_size = batch_size or settings.MEMORY_EXPIRY_BATCH_SIZE
    total = 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                EXPIRE_SQL,
                {
                    "now": timezone.now(),
                    "closed_state": MemoryState.EXPIRED,
                    "batch_size": batch_size,
                },
            )
            expired = len(cursor.fetchall())
        total += expired
        if expired < batch_size:
            return total


def prune_events(retention_days: int | None = None) -> int:
    days = retention_days if retention_days is not None else settings.MEMORY_EVENTS_RETENTION_DAYS
    cutoff = timezone.now() - timedelta(days=days)
    deleted, _ = MemoryEvent.objects.filter(occurred_at__lt=cutoff).delete()
    return deleted


def _enqueue_indexing() -> None:
    """Ask a worker to run the indexer now: embed a new version, remove a deleted one's vectors (beat's periodic
    run is the safety net)."""
    INDEXER.request_run_quietly()
