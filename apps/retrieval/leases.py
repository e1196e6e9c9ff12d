"""Work leases that die with the worker: PostgreSQL session-level advisory locks.

A background job (the memory indexer, the conversation indexer: apps.retrieval.indexing) takes a batch of rows and works
on them outside any transaction (embedding can take seconds). While it works, no other worker may take the same
rows, and when the worker is killed (``kill -9``, OOM, a lost machine) the rows must become available again at once,
not after a timeout runs out. A session-level advisory lock does both: it is held by the worker's database
connection, other sessions' ``pg_try_advisory_lock`` fails while it is held, and PostgreSQL drops it the moment that
connection closes, which the kernel does for a dead process. Nothing is written to the rows to lease them, so a
crash leaves nothing behind.

Keys are the two-int form ``(kind, 32 bits of the row id)``: ``kind`` keeps each job's leases apart from each other
and from the service's other advisory locks (single-bigint keys). Two ids sharing 32 bits merely look taken to each
other for one cycle, which delays one row slightly and never lets two workers take the same row.

Callers must re-read the rows after taking them (a row finished and released by another worker between the caller's
candidate query and its lease would otherwise be done twice), and must release in ``finally``.
Requires a session-pinned connection: behind a transaction-pooling bouncer (pgbouncer ``pool_mode=transaction``)
session locks do not work; use session pooling or a direct connection for workers.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError, connection

logger = logging.getLogger(__name__)

# One constant per kind of work; any int4 works as long as kinds differ.
MEMORY_INDEXING = 0x6D696478  # "midx"
CONVERSATION_INDEXING = 0x63696478  # "cidx"


def lock_key(row_id: Any) -> int:
    """The int4 second half of the key for ``row_id`` (a UUID or an integer id): its low 32 bits, signed."""
    raw = row_id.int if isinstance(row_id, uuid.UUID) else int(row_id)
    value = raw & 0xFFFFFFFF
    return value - (1 << 32) if value >= (1 << 31) else value


def try_take(kind: int, row_ids: Sequence[Any], *, limit: int | None = None, cursor=None) -> list[Any]:
    """Lease the free ids among ``row_ids``, keeping at most ``limit`` (the first free ones, in the given order);
    returns the leased ids. ``cursor`` defaults to the default connection's: the leases belong to that
    connection's session until released or until it closes."""
    limit = len(row_ids) if limit is None else limit
    candidates: dict[int, Any] = {}
    for row_id in row_ids:
        # Session locks are re-entrant: an id sharing its key with an earlier one would be "taken" twice.
        candidates.setdefault(lock_key(row_id), row_id)
    if not candidates or limit <= 0:
        return []
    keys = list(candidates)
    with _cursor(cursor) as cur:
        cur.execute(
            "SELECT k FROM unnest(%s::int[]) WITH ORDINALITY AS t(k, n) WHERE pg_try_advisory_lock(%s, k) ORDER BY n",
            [keys, kind],
        )
        taken = [row[0] for row in cur.fetchall()]
        if len(taken) > limit:
            _unlock(cur, kind, taken[limit:])
    return [candidates[key] for key in taken[:limit]]


def release(kind: int, row_ids: Iterable[Any], *, cursor=None) -> None:
    """Give leases back (ids this session does not hold are ignored)."""
    keys = sorted({lock_key(row_id) for row_id in row_ids})
    if keys:
        with _cursor(cursor) as cur:
            _unlock(cur, kind, keys)


def release_quietly(kind: int, row_ids: Iterable[Any]) -> None:
    """``release`` for ``finally`` blocks: when the connection broke, the session that held the leases is gone and
    so are they; closing the connection lets the next cycle reconnect instead of failing on the dead one."""
    try:
        release(kind, row_ids)
    except DatabaseError:
        logger.warning("could not release work leases; closing the connection", exc_info=True)
        connection.close()


def _unlock(cur, kind: int, keys: list[int]) -> None:
    cur.execute("SELECT pg_advisory_unlock(%s, k) FROM unnest(%s::int[]) AS k", [kind, keys])


@contextmanager
def _cursor(cursor) -> Iterator[Any]:
    if cursor is not None:
        yield cursor
    else:
        with connection.cursor() as own:
            yield own


@contextmanager
def leased(kind: int, row_ids: Sequence[Any], *, limit: int | None = None) -> Iterator[list[Any]]:
    """``with leased(kind, ids, limit=n) as mine:`` work on ``mine``; the leases are released on the way out,
    whatever happens (and by PostgreSQL if the process dies first)."""
    mine = try_take(kind, row_ids, limit=limit)
    try:
        yield mine
    finally:
        if mine:
            release_quietly(kind, mine)


def held_by_others(kind: int) -> int:
    """How many leases of ``kind`` other sessions hold on this database (operations and tests). Advisory locks are
    per database; pg_locks shows every database of the server, and another database's workers (another deployment,
    a parallel test process) hold leases that are not this one's."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s::oid AND objsubid = 2 "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND pid <> pg_backend_pid() AND granted",
            [kind & 0xFFFFFFFF],
        )
        return int(cursor.fetchone()[0])
