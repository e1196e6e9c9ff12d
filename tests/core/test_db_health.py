"""The database health check (apps.core.db): a healthy persistent connection is reused without a round trip, a
connection the server dropped is replaced before the request's first query, so the request still succeeds."""

from __future__ import annotations

import select
import time

import psycopg
import pytest
from django.db import close_old_connections, connection, connections
from django.db.backends.postgresql.base import DatabaseWrapper as PostgresDatabaseWrapper

pytestmark = pytest.mark.django_db(transaction=True)


def _count_select_one(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = PostgresDatabaseWrapper.is_usable

    def counting(self):
        calls.append(1)
        return real(self)

    monkeypatch.setattr(PostgresDatabaseWrapper, "is_usable", counting)
    return calls


def _new_request() -> None:
    # What Django does at request_started: health_check_done is reset, the next cursor() checks the connection.
    close_old_connections()


def test_settings_use_the_backend_with_health_checks():
    assert connection.vendor == "postgresql"
    assert type(connections["default"]).__module__ == "apps.core.db.base"
    assert connection.settings_dict["CONN_HEALTH_CHECKS"] is True


def test_healthy_connection_is_reused_without_select_one(monkeypatch):
    connection.ensure_connection()
    backend_pid = connection.connection.info.backend_pid
    calls = _count_select_one(monkeypatch)
    for _ in range(3):
        _new_request()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            assert cursor.fetchone()[0] == backend_pid
    assert calls == []


def test_connection_dropped_by_the_server_is_replaced_before_the_first_query():
    connection.ensure_connection()
    old_pid = connection.connection.info.backend_pid
    params = connection.get_connection_params()
    with psycopg.connect(**params, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [old_pid])
    poller = select.poll()
    poller.register(connection.connection.pgconn.socket, select.POLLIN)
    deadline = time.monotonic() + 5
    while not poller.poll(50) and time.monotonic() < deadline:
        pass
    _new_request()
    with connection.cursor() as cursor:  # a dead connection here would raise OperationalError
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != old_pid
