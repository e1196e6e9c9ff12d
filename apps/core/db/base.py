"""Django's PostgreSQL backend, with a connection health check that needs no round trip in the common case and
timestamps loaded by psycopg's C loader.

With CONN_HEALTH_CHECKS, Django checks a persistent connection once per request before its first query by sending
``SELECT 1``: a whole extra round trip on every request (8.5% of a web worker's busy time under GET load, issue 12).
A connection that the server closed (restart, idle timeout, pg_terminate_backend) or that broke always has
something to read on its socket (the server's FATAL message and/or EOF), while a healthy idle connection has
nothing pending. So the socket is polled without blocking: nothing pending and the connection idle means usable;
anything else falls back to Django's ``SELECT 1``, which then decides as before.

Django loads ``timestamptz`` with a subclass of psycopg's pure-Python loader (it swaps in Django's time zone), which
bypasses psycopg's C loader: 15-19 us per value on the issue-12 machine against 2, so 0.8 ms of an events page of 50.
Under USE_TZ with UTC (Django then keeps every connection's TimeZone at UTC) the C loader returns the very same
datetimes, tzinfo ``datetime.UTC`` included, so the connections get it instead.
"""

from __future__ import annotations

import functools
import select
from datetime import UTC, datetime

import psycopg
from django.db.backends.postgresql.base import DatabaseWrapper as PostgresDatabaseWrapper
from psycopg import adapt, pq

_TIMESTAMPTZ_OID = psycopg.adapters.types["timestamptz"].oid
# psycopg's global map holds its optimised (C) loader when the binary package is installed, else the Python one.
_TIMESTAMPTZ_LOADER = psycopg.adapters.get_loader(_TIMESTAMPTZ_OID, pq.Format.TEXT)


class UtcTimestamptzLoader(adapt.Loader):
    """psycopg's own timestamptz loader (C, when available), on a connection whose TimeZone is UTC.

    The C class cannot be subclassed, so each instance delegates to one. ``timezone`` is what Django's
    ``create_cursor`` compares with the connection's zone: equal, it installs no per-cursor loader of its own."""

    timezone = UTC

    def __init__(self, oid: int, context: adapt.AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        # The instance attribute shadows load() below: psycopg then calls the C method with no Python frame between.
        self.load = _TIMESTAMPTZ_LOADER(oid, context).load

    def load(self, data: bytes) -> datetime:  # replaced per instance in __init__
        raise NotImplementedError


@functools.lru_cache(maxsize=4)  # Django's template is itself cached: one map per distinct template
def _with_utc_loader(template: adapt.AdaptersMap) -> adapt.AdaptersMap:
    adapters = adapt.AdaptersMap(template)
    adapters.register_loader(_TIMESTAMPTZ_OID, UtcTimestamptzLoader)
    return adapters


class DatabaseWrapper(PostgresDatabaseWrapper):
    def get_connection_params(self) -> dict:
        params = super().get_connection_params()
        # self.timezone is UTC only under USE_TZ without a database TIME_ZONE; then Django sets every connection's
        # TimeZone to UTC before its first query, and the C loader's datetimes are Django's.
        if self.timezone is UTC and "context" in params:
            params["context"] = _with_utc_loader(params["context"])
        return params

    def is_usable(self) -> bool:
        connection = self.connection
        if connection is None or connection.closed or connection.broken:
            return False
        try:
            idle = connection.info.transaction_status == pq.TransactionStatus.IDLE
            poller = select.poll()
            poller.register(connection.pgconn.socket, select.POLLIN | select.POLLPRI)
            pending = bool(poller.poll(0))
        except Exception:  # any doubt (no socket, closed fd): let the real query decide
            return super().is_usable()
        if idle and not pending:
            return True
        return super().is_usable()
