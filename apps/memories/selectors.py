"""Memory reads: one record, attribute search, namespaces, the event timeline.

Every list is scoped by filter.rego first: its namespace_prefix replaces the requested one and its
attribute_filter is ANDed with the caller's. Values are decrypted only for the rows actually returned.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from django.utils import timezone

from apps.core import errors, pagination
from apps.core.db.prepared import bound_cursor, prepared_cursor
from apps.encryption import crypto
from apps.identity.principal import Principal
from apps.memories import filters
from apps.memories.models import EventKind
from apps.memories.responses import MemoryEventItem, MemoryEventsResponse, MemoryResponse, MemorySearchItem
from apps.memories.services import EVENT_VALUE_PURPOSE, VALUE_PURPOSE, authorize
from apps.policy import get_engine, policy_context


def decrypt_value(ciphertext: bytes | memoryview, purpose: str, row_id: Any) -> Any:
    """The value for a reader, or ``crypto.UNDECRYPTABLE`` when its envelope does not open (list items show it as
    ``value_error``: responses.MemorySearchItem; a single GET answers ``errors.undecryptable``)."""
    # orjson: a page of 50 events decodes 100 documents (values and attributes), 3-4x faster than json.loads.
    return crypto.decrypt_for_read(ciphertext, purpose=purpose, row_id=row_id, decode=orjson.loads)


# The hottest read: one prepared statement on the partial unique index, without the ORM's query compilation.
# Parameters: namespace, key, now. (bench/memories.py runs the same statement as its floor.)
GET_MEMORY_SQL = (
    "SELECT id, value_ciphertext, attributes, created_at, expires_at FROM memories "
    "WHERE namespace = %s::text[] AND key = %s AND state = 'active' AND (expires_at IS NULL OR expires_at > %s)"
)


def get_memory(principal: Principal, *, namespace: list[str], key: str) -> dict:
    authorize(principal, "read", namespace, key)
    with prepared_cursor() as cursor:
        cursor.execute(GET_MEMORY_SQL, [namespace, key, timezone.now()])
        row = cursor.fetchone()
    if row is None:
        raise errors.not_found("No active memory at that namespace and key.")
    memory_id, ciphertext, attributes, created_at, expires_at = row
    value = decrypt_value(ciphertext, VALUE_PURPOSE, memory_id)
    if value is crypto.UNDECRYPTABLE:
        raise errors.undecryptable("The memory's value")
    return MemoryResponse.render(
        id=memory_id,
        namespace=namespace,
        key=key,
        value=value,
        attributes=_json(attributes),
        created_at=created_at,
        expires_at=expires_at,
    )


@dataclass(frozen=True)
class Scope:
    """What a caller may see in a list: the effective prefix and the merged attribute filter."""

    namespace_prefix: list[str]
    attribute_filter: filters.CompiledFilter


def scope_for(principal: Principal, requested_prefix: list[str], caller_filter: Any) -> Scope:
    caller = filters.parse_filter(caller_filter)
    result = get_engine().filter(
        {
            "namespace_prefix": requested_prefix,
            "filter": caller_filter if isinstance(caller_filter, dict) else {},
            "context": policy_context(principal),
        }
    )
    prefix = list(result.namespace_prefix)
    try:
        policy_filter = filters.parse_filter(result.attribute_filter, where="policy.attribute_filter")
    except errors.ApiError as exc:
        # A policy producing a filter we cannot run is the policy's fault, never a reason to widen access.
        raise errors.ApiError(500, "The filter policy returned an invalid attribute_filter.", code="policy_error") from exc
    return Scope(prefix, filters.merge(policy_filter, caller))


def _visible_where(scope: Scope, table: str) -> tuple[str, list[Any]]:
    """Active, unexpired rows inside the scope (the primary store's WHERE clause).

    Expiry is judged against the application clock, as GET and the writes do: SQL now() is the transaction's start
    time, which inside a longer transaction would still show a record GET already treats as expired."""
    prefix_sql, prefix_params = filters.namespace_prefix_sql(scope.namespace_prefix, f"{table}.namespace")
    filter_sql, filter_params = filters.to_sql(scope.attribute_filter, f"{table}.attributes")
    sql = (
        f"{table}.state = 'active' AND ({table}.expires_at IS NULL OR {table}.expires_at > %s) "
        f"AND {prefix_sql} AND {filter_sql}"
    )
    return sql, [timezone.now(), *prefix_params, *filter_params]


def search_by_attributes(principal: Principal, *, namespace_prefix: list[str], filter: Any, limit: int, offset: int) -> list[dict]:
    scope = scope_for(principal, namespace_prefix, filter)
    where, params = _visible_where(scope, "m")
    with bound_cursor() as cursor:
        cursor.execute(
            f"SELECT m.id, m.namespace, m.key, m.value_ciphertext, m.attributes, m.created_at "  # noqa: S608
            f"FROM memories m WHERE {where} ORDER BY m.created_at DESC, m.id DESC LIMIT %s OFFSET %s",
            [*params, limit, offset],
        )
        rows = cursor.fetchall()
    items = []
    for row_id, namespace, key, ciphertext, attributes, created_at in rows:
        row_id_text = str(row_id)  # once: the response's id and the ciphertext's binding
        items.append(
            MemorySearchItem.render(
                id=row_id_text,
                namespace=namespace,
                key=key,
                value=decrypt_value(ciphertext, VALUE_PURPOSE, row_id_text),
                attributes=_json(attributes),
                score=None,
                created_at=created_at,
            )
        )
    return items


def _json(value: Any) -> Any:
    # psycopg returns jsonb already decoded; a raw cursor over Django's connection does too, but be explicit.
    return orjson.loads(value) if isinstance(value, str) else value


def namespaces_query(scope: Scope, suffix: list[str], max_depth: int | None) -> tuple[str, list[Any]]:
    """The loose index scan of list_namespaces (bench/memories.py runs the same statement as its floor)."""
    effective = scope.namespace_prefix
    filter_sql, filter_params = filters.to_sql(scope.attribute_filter, "m.attributes")
    suffix_sql, suffix_params = filters.namespace_suffix_sql(suffix, "walk.ns")
    depth = len(effective)
    column = "walk.ns[1:%s]" if max_depth else "walk.ns"
    column_params = [max_depth] if max_depth else []
    # The visibility probe orders by the (namespace, key) index so the planner takes that index for an equality
    # on namespace rather than the GIN index, which would visit every row of the namespace.
    sql = f"""
        WITH RECURSIVE walk(ns) AS (
            (SELECT namespace FROM memories WHERE state = 'active' AND namespace >= %s::text[]
             ORDER BY namespace LIMIT 1)
            UNION ALL
            SELECT (SELECT m.namespace FROM memories m WHERE m.state = 'active' AND m.namespace > walk.ns
                    ORDER BY m.namespace LIMIT 1)
            FROM walk WHERE walk.ns IS NOT NULL AND walk.ns[1:%s] = %s::text[]
        )
        SELECT DISTINCT {column} AS namespace FROM walk
        CROSS JOIN LATERAL (
            SELECT 1 FROM memories m
            WHERE m.namespace = walk.ns AND m.state = 'active'
              AND (m.expires_at IS NULL OR m.expires_at > %s) AND {filter_sql}
            ORDER BY m.namespace, m.key LIMIT 1
        ) AS visible
        WHERE walk.ns IS NOT NULL AND walk.ns[1:%s] = %s::text[] AND {suffix_sql}
        ORDER BY namespace
    """  # noqa: S608 - fragments come from code; values are bound parameters
    params = [effective, depth, effective, *column_params, timezone.now(), *filter_params, depth, effective,
              *suffix_params]
    return sql, params


def list_namespaces(
    principal: Principal, *, prefix: list[str], suffix: list[str], max_depth: int | None
) -> list[list[str]]:
    """Distinct namespaces holding a visible record, by a loose index scan.

    ``SELECT DISTINCT`` would read every record in scope (tens of milliseconds at 10k memories, growing with the
    data). Instead a recursive query hops from one namespace to the next on the (namespace, key) index of active
    versions: one index probe per distinct namespace, plus one probe for "holds a visible record that passes the
    filter". Namespaces under a prefix are contiguous in array order (compared element by element,
    whatever the collation), so the walk starts at the prefix and stops at the first namespace outside it.
    """
    scope = scope_for(principal, prefix, None)
    sql, params = namespaces_query(scope, suffix, max_depth)
    with bound_cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


@dataclass(frozen=True)
class EventQuery:
    namespace_prefix: list[str]
    kinds: list[str] | None
    after: datetime | None
    before: datetime | None
    after_cursor: str | None
    limit: int


# An event's place on the timeline: (tx, seq), the id of the transaction that wrote it and its sequence number. A
# cursor carries tx as its position and seq as its item id.
Position = tuple[int, int]
EVENTS_CURSOR = "memories.events"


def encode_event_cursor(position: Position) -> str:
    return pagination.encode_cursor(EVENTS_CURSOR, position[0], position[1])


def decode_event_cursor(cursor: str) -> Position:
    return pagination.decode_cursor(cursor, EVENTS_CURSOR, int, "after_cursor", id_kind=int)


# The timeline's horizon (see events_query): the oldest transaction still running in this database, and the
# reader's own transaction when it has written (tests run inside one), both as bigints.
#
# Transaction ids are the whole server's, so pg_snapshot_xmin alone would let a transaction that writes in another
# database of a shared server (another application's batch job, a stuck session) hold every event back for as long
# as it stays open. It cannot write this database's events, so it is left out: a transaction whose id is held by a
# backend connected elsewhere (pg_locks and pg_stat_activity's pid and datname, which every role may read) does
# not count. The function memory_events_horizon (migration 0014) looks at who runs where first and takes its
# snapshot after: read in the other order, a transaction of another database that began before an event and ended
# between the two counted as one of ours, and the page hid that event until the next poll (a test reading the
# timeline right after writing it failed about once in a few suite runs; one read in 60 overlapping such a commit).
# In this order one that ended before the snapshot is not in it, and one that began after the look is newer than
# every event already written, so it holds back none of them.
HORIZON_SQL = "SELECT oldest_running, own FROM memory_events_horizon()"


@dataclass(frozen=True)
class Horizon:
    """Events of transactions older than ``oldest_running`` (all of which have ended) may be read, and the reader's
    own (``own``, None unless it has written)."""

    oldest_running: int
    own: int | None = None


def read_horizon(cursor: Any) -> Horizon:
    cursor.execute(HORIZON_SQL, [])
    oldest_running, own = cursor.fetchone()
    return Horizon(int(oldest_running), None if own is None else int(own))


def events_query(
    scope: Scope,
    *,
    horizon: Horizon,
    kinds: list[str] | None = None,
    after: datetime | None = None,
    before: datetime | None = None,
    after_position: Position | None = None,
    limit: int,
) -> tuple[str, list[Any]]:
    """One page of the timeline in (tx, seq) order: (tx, seq, id, namespace, key, kind, occurred_at,
    value_ciphertext, attributes) rows (bench/memories.py runs the same statement as its floor).

    Only events of transactions older than the horizon are returned (and the reader's own, when it writes): every
    transaction that commits later has a larger id, so everything it writes sorts after what a reader has seen,
    and a reader paging by position never passes an event. The horizon is read before the page (read_horizon): any
    horizon taken earlier is as safe, since the transactions older than it ended before this statement's snapshot
    too. Read apart, it is a constant when the page is planned, so the planner knows it excludes almost nothing.
    Memory writes are short, so the horizon trails the present by milliseconds; a long writing transaction
    in this database holds it back (one in another database of the server does not: HORIZON_SQL), which delays
    events, never loses them.

    Inside one owner's subtree (a prefix of two or more segments) PostgreSQL walks memory_events_owner_timeline,
    ``(namespace[1:2], tx + 0, seq)``, from the cursor to the horizon, and stops after ``limit`` events. Two
    planner traps are shut: the prefix test leads with ``namespace[1:2] = owner``, which has statistics
    (filters.owner_prefix_sql), so a large owner is never mistaken for a few rows to collect and sort; and the
    order and cursor are written ``tx + 0``, which memory_events_timeline cannot provide, so PostgreSQL cannot walk
    every owner's events in order and filter out the others (it did so for a large owner: 70 ms skipping 120k other
    events after a polling client's cursor). A shorter prefix (admins) walks memory_events_timeline.

    With ``kinds``, inside an owner's subtree the page is one walk per kind on memory_events_kind_timeline,
    ``(namespace[1:2], kind, tx + 0, seq)``, each stopped after ``limit`` rows, merged in timeline order: a walk of
    the owner's timeline filtered by kind reads every event of the other kinds in between (a first ``kinds=delete``
    page after 10k updates read the 12.5k adds and updates before the first delete: 58-61 ms; 0.3 ms merged)."""
    owner_walk = len(scope.namespace_prefix) >= filters.OWNER_DEPTH
    tx = "(e.tx + 0)" if owner_walk else "e.tx"
    prefix_sql, prefix_params = filters.owner_prefix_sql(scope.namespace_prefix, "e.namespace")
    filter_sql, filter_params = filters.to_sql(scope.attribute_filter, "e.attributes")
    where = [prefix_sql, filter_sql]
    params: list[Any] = [*prefix_params, *filter_params]
    if horizon.own is None:
        where.append(f"{tx} < %s")
        params.append(horizon.oldest_running)
    else:
        where.append(f"({tx} < %s OR {tx} = %s)")
        params.extend([horizon.oldest_running, horizon.own])
    if kinds and not owner_walk:
        where.append("e.kind = ANY(%s)")
        params.append(kinds)
    if after is not None:
        where.append("e.occurred_at > %s")
        params.append(after)
    if before is not None:
        where.append("e.occurred_at < %s")
        params.append(before)
    if after_position is not None:
        where.append(f"({tx}, e.seq) > (%s, %s)")
        params.extend(after_position)
    columns = "e.tx, e.seq, e.id, e.namespace, e.key, e.kind, e.occurred_at, e.value_ciphertext, e.attributes"
    if not (kinds and owner_walk):
        sql = f"SELECT {columns} FROM memory_events e WHERE {' AND '.join(where)} ORDER BY {tx}, e.seq LIMIT %s"  # noqa: S608
        return sql, [*params, limit]
    # One walk per kind. The kind is compared with =: with = ANY the index order would not be timeline order.
    walk = (
        f"(SELECT {columns} FROM memory_events e WHERE {' AND '.join(where)} AND e.kind = %s "  # noqa: S608
        f"ORDER BY {tx}, e.seq LIMIT %s)"
    )
    kinds = list(dict.fromkeys(kinds))
    walks = " UNION ALL ".join([walk] * len(kinds))
    sql = f"SELECT {columns} FROM ({walks}) AS e ORDER BY e.tx, e.seq LIMIT %s"  # noqa: S608
    return sql, [*(value for kind in kinds for value in (*params, kind, limit)), limit]


def list_events(principal: Principal, query: EventQuery) -> dict:
    scope = scope_for(principal, query.namespace_prefix, None)
    after_position = decode_event_cursor(query.after_cursor) if query.after_cursor else None
    with bound_cursor() as cursor:
        horizon = read_horizon(cursor)
        sql, params = events_query(
            scope,
            horizon=horizon,
            kinds=query.kinds,
            after=query.after,
            before=query.before,
            after_position=after_position,
            limit=query.limit,
        )
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    events = []
    for _tx, _seq, event_id, namespace, key, kind, occurred_at, ciphertext, attributes in rows:
        carries_snapshot = kind in (EventKind.ADD, EventKind.UPDATE)
        event_id_text = str(event_id)  # once: the response's id and the ciphertext's binding
        events.append(
            MemoryEventItem.render(
                id=event_id_text,
                namespace=namespace,
                key=key,
                kind=kind,
                occurred_at=occurred_at,
                value=decrypt_value(ciphertext, EVENT_VALUE_PURPOSE, event_id_text) if carries_snapshot else None,
                attributes=_json(attributes) if carries_snapshot else None,
            )
        )
    # The cursor always points after the last event seen, so a client can keep polling for newer events. An empty
    # page read everything before the horizon: every event still to come sorts after (horizon, 0), so the cursor
    # moves there (never back), and a poller with nothing new yet still gets a cursor to continue from. Except past
    # the reader's own transaction, when it has written (one that composes writes and reads, the tests): its later
    # events sort at (own, next seq), and the horizon passes it as soon as a newer transaction commits anywhere on
    # the server (ids are the server's), which hid those events from the cursor.
    if rows:
        position = (rows[-1][0], rows[-1][1])
    else:
        reach = (horizon.oldest_running, 0)
        if horizon.own is not None:
            reach = min(reach, (horizon.own, 0))
        position = max(after_position or (0, 0), reach)
    return MemoryEventsResponse.render(events=events, after_cursor=encode_event_cursor(position))


# --- Quota totals (apps.limits recounts them: `manage.py limits recount`) -----------------------------------------


def quota_usage(user_id: str) -> dict[str, int]:
    """What counts against ``user_id``'s memory quotas (services.quota_owner): active versions under ["user",
    user_id] and their stored values' size."""
    with bound_cursor() as cursor:
        cursor.execute(
            "SELECT count(*), coalesce(sum(octet_length(value_ciphertext)), 0) FROM memories "
            "WHERE state = 'active' AND namespace @> ARRAY['user', %s]::text[] AND namespace[1:2] = ARRAY['user', %s]",
            [user_id, user_id],
        )
        count, size = cursor.fetchone()
    return {"memories": count, "memory_bytes": size}


def quota_users() -> list[str]:
    with bound_cursor() as cursor:
        cursor.execute("SELECT DISTINCT namespace[2] FROM memories WHERE state = 'active' AND namespace[1] = 'user'", [])
        return [user for (user,) in cursor.fetchall() if user is not None]
