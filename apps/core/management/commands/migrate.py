"""Django's ``migrate``, without the service's statement timeout (DB_STATEMENT_TIMEOUT_SECONDS): building an index
or rewriting a table may take far longer than any request's statement should."""

from __future__ import annotations

from django.core.management.commands.migrate import Command as DjangoMigrateCommand
from django.db import connections


class Command(DjangoMigrateCommand):
    def handle(self, *args, **options):
        connection = connections[options["database"]]
        with connection.cursor() as cursor:
            cursor.execute("SET statement_timeout = 0")  # this session only
        try:
            return super().handle(*args, **options)
        finally:
            if connection.connection is not None and not connection.connection.closed:
                with connection.cursor() as cursor:
                    cursor.execute("RESET statement_timeout")
