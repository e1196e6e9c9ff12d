"""Emptying the test database after tests that commit (``django_db(transaction=True)``, and modules that write
through the live service), in a fraction of the time ``manage.py flush`` takes.

Django's flush, run after every transactional test, TRUNCATEs every table (new files for each table and index: about
0.3 s for this schema) and then replays post_migrate (content types, permissions, the API_KEYS seed: another 0.3 s).
``empty_tables`` leaves the database as that flush does, cheaper: it finds the tables that hold rows (one query),
DELETEs those in one transaction (every foreign key here is deferrable, checked at commit), keeps the content types
and permissions migrate wrote (no test writes them) and seeds the configured API keys again.
"""

from __future__ import annotations

import logging
import os
import subprocess

from django.core.management import call_command
from django.db import DatabaseError, connections, transaction
from django.test import TransactionTestCase

from apps.runtime import embedded_services

logger = logging.getLogger(__name__)

# Written by migrate's post_migrate for the installed models, never by a test: kept as they are.
_KEPT = frozenset({"django_content_type", "auth_permission"})


def empty_tables(using: str = "default") -> None:
    connection = connections[using]
    tables = sorted(set(connection.introspection.django_table_names(only_existing=True, include_views=False)) - _KEPT)
    quote = connection.ops.quote_name
    try:
        with transaction.atomic(using=using), connection.cursor() as cursor:
            cursor.execute(
                " UNION ALL ".join(f"SELECT %s WHERE EXISTS (SELECT 1 FROM {quote(table)})" for table in tables), tables
            )
            filled = [row[0] for row in cursor.fetchall()]
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")
            for table in filled:
                cursor.execute(f"DELETE FROM {quote(table)}")
            from apps.identity.api_keys import seed_from_settings

            seed_from_settings(using=using)
    except DatabaseError:
        # A constraint DELETE cannot satisfy (a future table's non-deferrable foreign key): Django's own flush.
        logger.warning("emptying the tables failed; flushing instead", exc_info=True)
        call_command("flush", verbosity=0, interactive=False, database=using)


def pg_dump(using: str = "default") -> bytes:
    """The test database's rows as ``pg_dump --data-only`` writes them (committed rows only): what a backup holds."""
    settings_dict = connections[using].settings_dict
    return subprocess.run(
        [
            str(embedded_services.pg_bin("pg_dump")),
            "--data-only",
            "--host",
            settings_dict["HOST"],
            "--port",
            str(settings_dict["PORT"] or 5432),
            "--username",
            settings_dict["USER"] or "postgres",
            settings_dict["NAME"],
        ],
        capture_output=True,
        check=True,
        env={**os.environ, "PGPASSWORD": settings_dict["PASSWORD"] or ""},
    ).stdout


_flush_teardown = TransactionTestCase._fixture_teardown


def _fixture_teardown(self: TransactionTestCase) -> None:
    if self.available_apps is not None or self.serialized_rollback:
        _flush_teardown(self)  # flushes of a subset of apps, serialized rollbacks: Django's own way
        return
    for name in self._databases_names(include_mirrors=False):
        empty_tables(name)


def install() -> None:
    """After every transactional test (pytest-django runs them as Django TransactionTestCases), empty the tables
    with ``empty_tables`` instead of a flush. Called once by tests/conftest.py."""
    TransactionTestCase._fixture_teardown = _fixture_teardown
