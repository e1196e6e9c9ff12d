"""What a database failure answers (issue 28 item 5): only a failure of the connection itself is 503; a deadlock or a
serialization failure with a concurrent request is 409, a full disk or a program limit a 500 with its own code. A
deadlock used to answer 503 "database is unavailable" while the database was healthy."""

from __future__ import annotations

import logging

import psycopg
import pytest
from django.db import utils as django_db
from psycopg import errors as pg

from apps.core import errors


def _django(cause: psycopg.Error, wrapper: type[Exception] = django_db.OperationalError) -> Exception:
    """The exception a view sees: Django's wrapper, the driver's error as its cause (django.db.utils)."""
    try:
        raise wrapper(*cause.args) from cause
    except wrapper as exc:
        return exc


@pytest.mark.parametrize(
    ("cause", "status", "code"),
    [
        (pg.DeadlockDetected("deadlock detected"), 409, "conflict"),
        (pg.SerializationFailure("could not serialize access"), 409, "conflict"),
        (pg.LockNotAvailable("could not obtain lock"), 409, "conflict"),
        (pg.DiskFull("could not extend file"), 500, "disk_full"),
        (pg.ProgramLimitExceeded("index row size exceeds maximum"), 500, "program_limit_exceeded"),
        (pg.StatementTooComplex("stack depth limit exceeded"), 500, "program_limit_exceeded"),
        (pg.TooManyArguments("cannot pass more than 100 arguments"), 500, "program_limit_exceeded"),
        (psycopg.OperationalError("connection refused"), 503, "unavailable"),  # no SQLSTATE: the connection
        (pg.ConnectionFailure("server closed the connection"), 503, "unavailable"),
        (pg.AdminShutdown("terminating connection due to administrator command"), 503, "unavailable"),
        (pg.CannotConnectNow("the database system is starting up"), 503, "unavailable"),
        (pg.QueryCanceled("canceling statement due to statement timeout"), 503, "unavailable"),
        (pg.TooManyConnections("too many clients already"), 503, "unavailable"),
    ],
)
def test_each_failure_answers_by_its_sqlstate(cause, status, code):
    for raised in (_django(cause), cause):  # wrapped by Django, or straight from psycopg
        error = errors.from_exception(raised)
        assert (error.status, error.code) == (status, code), (type(cause).__name__, raised)
        assert ("Retry-After" in error.headers) is (status == 503)


def test_a_closed_connection_is_503():
    error = errors.from_exception(_django(psycopg.InterfaceError("connection already closed"),
                                          django_db.InterfaceError))
    assert (error.status, error.code) == (503, "unavailable")


def test_any_other_database_failure_is_an_unexpected_500():
    assert errors.from_exception(_django(pg.IoError("could not read block"))) is None
    assert errors.from_exception(_django(pg.InternalError_("unexpected"), django_db.InternalError)) is None


def test_the_body_carries_the_code_and_the_log_the_sqlstate_never_the_message(caplog):
    caplog.set_level(logging.WARNING, logger="apps.core.errors")
    secret = "DETAIL: Key (title)=(secret title) already"
    response = errors.exception_handler(_django(pg.DiskFull(secret)), {})
    assert response.status_code == 500
    assert response.data["code"] == "disk_full" and secret not in str(response.data)
    [record] = [r for r in caplog.records if r.name == "apps.core.errors"]
    assert record.sqlstate == "53100" and record.code == "disk_full"
    assert secret not in record.getMessage()

    caplog.clear()
    response = errors.exception_handler(_django(pg.DeadlockDetected(secret)), {})
    assert response.status_code == 409 and response.data["code"] == "conflict"
    [record] = [r for r in caplog.records if r.name == "apps.core.errors"]
    assert record.sqlstate == "40P01" and secret not in record.getMessage()
