"""Hot statements run as prepared statements: parsed and planned once per connection, not on every call.

Django binds parameters client-side and never prepares, so PostgreSQL parses and plans every query again. For a
statement whose plan does not depend on its parameters (a lookup by a unique key, an insert) that planning is most
of the server's work: the memory GET's statement costs PostgreSQL 84-88 us of CPU and a 260-325 us round trip
planned each time, 16 us and 83-93 us prepared (`bench`-style loop of 5,000 calls, issue 12). Only such statements
belong here: a prepared statement may switch to a generic plan, which for a list filtered by a prefix or attribute
of very different selectivity can be much worse than planning each call.

The statement is bound server-side on Django's own connection (same transaction, same adapters), inside Django's
cursor so its connection checks and error translation apply. DB_PREPARED_STATEMENTS=false runs the same
statements unprepared, for a connection pooler in transaction mode that cannot keep them (PgBouncer before 1.21,
or without max_prepared_statements).

``run_pipelined`` does the same for a write of several statements that must be one transaction: they travel in one
round trip (psycopg's pipeline mode) and run prepared. A memory PUT's statement costs PostgreSQL about 2.0 ms of
CPU planned each time and 0.8 ms prepared (issue 12).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection


class PreparedCursor:
    """``execute`` prepares on first use per connection; ``fetchone`` is psycopg's."""

    def __init__(self, raw: psycopg.Cursor) -> None:
        self._raw = raw
        self._prepare = getattr(settings, "DB_PREPARED_STATEMENTS", True)

    def execute(self, sql: str, params: Sequence[Any]) -> None:
        if not connection.queries_logged:
            self._raw.execute(sql, params, prepare=self._prepare)
            return
        # Logged like Django's own debug cursor, so DEBUG's query log and tests counting queries still see it.
        started = time.monotonic()
        try:
            self._raw.execute(sql, params, prepare=self._prepare)
        finally:
            connection.queries_log.append(
                {"sql": connection.ops.compose_sql(sql, params), "time": f"{time.monotonic() - started:.3f}"}
            )

    def fetchone(self) -> tuple | None:
        return self._raw.fetchone()


@contextmanager
def prepared_cursor() -> Iterator[PreparedCursor]:
    with connection.cursor() as django_cursor, connection.wrap_database_errors:
        with psycopg.Cursor(django_cursor.cursor.connection) as raw:
            yield PreparedCursor(raw)


Params = Sequence[Any] | Mapping[str, Any]


def run_pipelined(statements: Sequence[str], params: Params) -> list[tuple]:
    """Run ``statements`` (each given the same ``params``) in one round trip, as one transaction, prepared; the rows
    of the last one.

    Outside a transaction they form the implicit transaction that the pipeline's single Sync message ends: one
    statement failing rolls back all of them. Inside a caller's atomic() they join its transaction. Under READ
    COMMITTED each statement still reads a fresh snapshot, so a statement after a lock sees what the lock waited for.
    """
    prepare = getattr(settings, "DB_PREPARED_STATEMENTS", True)
    started = time.monotonic()
    with connection.cursor() as django_cursor, connection.wrap_database_errors:
        raw_connection = django_cursor.cursor.connection
        cursors = []
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
            if connection.queries_logged:
                elapsed = f"{time.monotonic() - started:.3f}"
                for sql in statements:
                    connection.queries_log.append({"sql": connection.ops.compose_sql(sql, params), "time": elapsed})
