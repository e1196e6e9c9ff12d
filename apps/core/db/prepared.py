"""Hot statements run as prepared statements: parsed and planned once per connection, not on every call.

Django binds parameters client-side and never prepares, so PostgreSQL parses and plans every query again. For a
statement whose plan does not depend on its parameters (a lookup by a unique key, an insert) that planning is most
of the server's work: the memory GET's statement costs PostgreSQL 84-88 us of CPU and a 260-325 us round trip
planned each time, 16 us and 83-93 us prepared (`bench`-style loop of 5,000 calls, issue 12). Only such statements
belong here: a prepared statement may switch to a generic plan, which for a list filtered by a prefix or attribute
of very different selectivity can be much worse than planning each call.

The statement is bound server-side on Django's own connection (same transaction, same adapters), after the checks
Django's ``cursor()`` makes (the per-request health check, connecting if needed, thread sharing) and under its error
translation. One psycopg cursor per connection is reused rather than a Django cursor wrapper and a psycopg cursor
built and closed around every statement: their setup was a tenth of a memory GET's CPU (issue 12).
DB_PREPARED_STATEMENTS=false runs the same statements unprepared, for a connection pooler in transaction mode that
cannot keep them (PgBouncer before 1.21, or without max_prepared_statements).

``bound_cursor`` runs a statement the same way (server-side binding, the reused cursor, logged and translated alike)
but never prepares it: the lists (attribute search, namespaces, the events page) filter by a prefix or attribute of
very different selectivity, so each call is planned for its own values, as before. What it saves is Python's side:
Django's client-side binding quotes every parameter into the SQL text (177 us of an attribute search's 392 us of
SQL handling under py-spy, issue 12) and builds a cursor wrapper and a psycopg cursor per statement (98 us).
Server-side, the values travel apart from the text (psycopg turns ``%s`` into ``$1``...), so PostgreSQL types
each from its context: a parameter whose type the context leaves open is cast in the SQL (``%s::text[]``,
``%s::jsonb``, ``%s::numeric``).

A block must fetch its rows before its context ends: the next statement on the connection reuses the cursor.

``run_pipelined`` does the same for a write of several statements that must be one transaction: they travel in one
round trip (psycopg's pipeline mode) and run prepared. A memory PUT's statement costs PostgreSQL about 2.0 ms of
CPU planned each time and 0.8 ms prepared (issue 12).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper


class BoundCursor:
    """``execute`` binds server-side, prepared (on first use per connection) or not; the fetches are psycopg's."""

    def __init__(self, raw: psycopg.Cursor, db: BaseDatabaseWrapper, prepare: bool) -> None:
        self._raw = raw
        self._db = db
        self._prepare = prepare

    def execute(self, sql: str, params: Sequence[Any]) -> None:
        db = self._db
        if not db.queries_logged:
            self._raw.execute(sql, params, prepare=self._prepare)
            return
        started = time.monotonic()
        try:
            self._raw.execute(sql, params, prepare=self._prepare)
        finally:
            _log_queries(db, (sql,), params, started)

    def fetchone(self) -> tuple | None:
        return self._raw.fetchone()

    def fetchall(self) -> list[tuple]:
        return self._raw.fetchall()


def _log_queries(db: BaseDatabaseWrapper, statements: Sequence[str], params: Any, started: float) -> None:
    """Append ``statements`` to the query log as Django's own debug cursor does, so DEBUG's query log and tests
    counting queries still see them."""
    elapsed = f"{time.monotonic() - started:.3f}"
    for sql in statements:
        db.queries_log.append({"sql": db.ops.compose_sql(sql, params), "time": elapsed})


def _ready_connection(db: BaseDatabaseWrapper) -> psycopg.Connection:
    """What BaseDatabaseWrapper._cursor() does before it creates a cursor (the per-request health check, connecting
    if needed, thread sharing); the psycopg connection."""
    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    return db.connection


@contextmanager
def _bound_cursor(prepare: bool) -> Iterator[BoundCursor]:
    # The thread's connection, looked up once: django.db.connection is a proxy that repeats that lookup (a
    # thread-local read) on every attribute, 1-3 us each.
    db = connections[DEFAULT_DB_ALIAS]
    raw_connection = _ready_connection(db)
    # What Django's cursor checks before every statement: inside an atomic block that already failed, refuse
    # with Django's error rather than send a statement PostgreSQL would refuse.
    db.validate_no_broken_transaction()
    raw = getattr(db, "_prepared_raw_cursor", None)
    if raw is None or raw.closed or raw.connection is not raw_connection:  # first use, or Django reconnected
        raw = db._prepared_raw_cursor = psycopg.Cursor(raw_connection)
    with db.wrap_database_errors:
        yield BoundCursor(raw, db, prepare)


def prepared_cursor() -> AbstractContextManager[BoundCursor]:
    """For a statement whose plan does not depend on its parameters: prepared (unless DB_PREPARED_STATEMENTS is
    off)."""
    return _bound_cursor(getattr(settings, "DB_PREPARED_STATEMENTS", True))


def bound_cursor() -> AbstractContextManager[BoundCursor]:
    """For any other statement: bound server-side, planned on every call."""
    return _bound_cursor(False)


Params = Sequence[Any] | Mapping[str, Any]


def run_pipelined(statements: Sequence[str], params: Params) -> list[tuple]:
    """Run ``statements`` (each given the same ``params``) in one round trip, as one transaction, prepared; the rows
    of the last one.

    Outside a transaction they form the implicit transaction that the pipeline's single Sync message ends: one
    statement failing rolls back all of them. Inside a caller's atomic() they join its transaction. Under READ
    COMMITTED each statement still reads a fresh snapshot, so a statement after a lock sees what the lock waited for.
    """
    db = connections[DEFAULT_DB_ALIAS]
    prepare = getattr(settings, "DB_PREPARED_STATEMENTS", True)
    started = time.monotonic()
    cursors: list[psycopg.Cursor] = []
    with db.wrap_database_errors:
        raw_connection = _ready_connection(db)
        try:
            with raw_connection.pipeline():
                for sql in statements:
                    cursor = psycopg.Cursor(raw_connection)
                    cursors.append(cursor)
                    cursor.execute(sql, params, prepare=prepare)
            return cursors[-1].fetchall()
        finally:
            for cursor in cursors:
                cursor.close()
            if db.queries_logged:
                _log_queries(db, statements, params, started)
