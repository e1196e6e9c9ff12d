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

Outages (issue 21 item 13): every connection has a connect timeout (DB_CONNECT_TIMEOUT_SECONDS), a server-side
statement timeout (DB_STATEMENT_TIMEOUT_SECONDS) and TCP keepalives with a TCP user timeout, and waits for the
server in ``ProbingConnection``: a server that stays silent is asked, over a fresh connection, whether it is alive,
and a frozen one (SIGSTOP, or a path that stopped forwarding: the kernel may still acknowledge what was sent, so
nothing on the connection itself shows it) makes the statement fail within seconds instead of hanging for as long
as the freeze lasts. The failure is an
OperationalError, which the error model answers with 503 ``unavailable``; the abandoned connection is closed, so
Django replaces it on the next request and the service recovers by itself when PostgreSQL returns.
"""

from __future__ import annotations

import functools
import logging
import select
from datetime import UTC, datetime
from typing import Any

import psycopg
from django.conf import settings
from django.db.backends.postgresql.base import DatabaseWrapper as PostgresDatabaseWrapper
from psycopg import adapt, pq
from psycopg import errors as pg_errors
from psycopg.conninfo import make_conninfo

logger = logging.getLogger(__name__)

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


# psycopg.Connection.connect's own arguments: everything else it takes is a libpq connection parameter.
_CONNECT_ARGUMENTS = frozenset({"autocommit", "prepare_threshold", "context", "row_factory", "cursor_factory"})


class ProbingConnection(psycopg.Connection):
    """A psycopg connection that never waits for a frozen server.

    psycopg waits for the server's answer for as long as it takes, and neither a server-side statement timeout nor
    TCP keepalives help when the server process is stopped (SIGSTOP) or a proxy stops forwarding: the kernel still
    acknowledges every byte. So a wait is cut into slices of ``probe_after`` seconds; after a silent slice the server
    must accept a fresh connection within the connect timeout (``connect_timeout`` of the same conninfo). A server
    that does accept is alive and merely busy: the wait goes on (a long statement is the statement timeout's
    business), probing again at doubling intervals. One that does not is treated as gone: this connection is closed
    and the wait raises OperationalError."""

    probe_after: float | None = None  # seconds of silence before probing; None = wait as psycopg does
    _probe_conninfo: str = ""

    @classmethod
    def connect(cls, conninfo: str = "", **kwargs: Any) -> ProbingConnection:
        conn = super().connect(conninfo, **kwargs)
        params = {name: value for name, value in kwargs.items() if name not in _CONNECT_ARGUMENTS}
        conn._probe_conninfo = make_conninfo(conninfo, **params)
        return conn

    def wait(self, gen, interval: float = 0.1, timeout: float | None = None):
        silence = self.probe_after
        if timeout is not None or not silence:
            return super().wait(gen, interval, timeout)
        while True:
            try:
                # The generator is left suspended where it was when a slice ends, and the next slice resumes it.
                return super().wait(gen, interval, silence)
            except pg_errors._WaitTimeout:
                if not self._server_answers():
                    self.pgconn.finish()  # its state is unknown: never reuse it (Django replaces a closed one)
                    logger.warning("database did not answer; connection abandoned", extra={"silent_seconds": silence})
                    raise psycopg.OperationalError(
                        "the database server did not answer a new connection: frozen or unreachable"
                    ) from None
                silence = min(silence * 2, 60.0)

    def _server_answers(self) -> bool:
        try:
            with psycopg.Connection.connect(self._probe_conninfo, autocommit=True):
                return True
        except psycopg.OperationalError as exc:
            # A server shutting down or out of connection slots refuses with a message: alive, still serving this
            # session. Silence (a timeout) or a refused socket means it is not there.
            return exc.sqlstate is not None


class _PsycopgWithProbing:
    """What the backend sees as its ``Database`` module: psycopg, with connections made by ProbingConnection."""

    def __getattr__(self, name: str) -> Any:
        return getattr(psycopg, name)

    @staticmethod
    def connect(**params: Any) -> ProbingConnection:
        conn = ProbingConnection.connect(**params)
        conn.probe_after = float(settings.DB_PROBE_AFTER_SECONDS) or None
        return conn


def timeout_parameters() -> dict[str, Any]:
    """libpq parameters of every connection the service opens (a DATABASE_URL's own values win)."""
    return {
        "connect_timeout": max(2, int(settings.DB_CONNECT_TIMEOUT_SECONDS)),  # libpq rounds anything lower up to 2
        # TCP only (ignored on a Unix socket): a peer gone without a FIN is noticed on an idle connection
        # (keepalives) and while bytes we sent stay unacknowledged (user timeout, ms).
        "keepalives": 1,
        "keepalives_idle": 15,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": int(settings.DB_TCP_USER_TIMEOUT_SECONDS * 1000),
    }


class DatabaseWrapper(PostgresDatabaseWrapper):
    Database = _PsycopgWithProbing()

    def get_connection_params(self) -> dict:
        params = super().get_connection_params()
        # self.timezone is UTC only under USE_TZ without a database TIME_ZONE; then Django sets every connection's
        # TimeZone to UTC before its first query, and the C loader's datetimes are Django's.
        if self.timezone is UTC and "context" in params:
            params["context"] = _with_utc_loader(params["context"])
        for name, value in timeout_parameters().items():
            params.setdefault(name, value)
        statement_timeout_ms = int(settings.DB_STATEMENT_TIMEOUT_SECONDS * 1000)
        if statement_timeout_ms and "statement_timeout" not in params.get("options", ""):
            # Set at connection start (no round trip): bounds every statement the server runs for the service.
            params["options"] = f"{params.get('options', '')} -c statement_timeout={statement_timeout_ms}".strip()
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
