"""The migration graph: every migration that needs pgvector runs after the one that creates the extension, so
migrating one app alone on a fresh database (``manage.py migrate memories``) cannot reach a vector column first."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from pgvector.django import VectorField

PGVECTOR = ("core", "0001_pgvector")


def _uses_pgvector(migration) -> bool:
    for operation in migration.operations:
        fields = [field for _name, field in getattr(operation, "fields", [])]
        if getattr(operation, "field", None) is not None:
            fields.append(operation.field)
        if any(isinstance(field, VectorField) for field in fields):
            return True
        if "vector" in str(getattr(operation, "sql", "")).lower():
            return True
    return False


@pytest.mark.django_db
def test_every_migration_using_pgvector_depends_on_the_extension() -> None:
    loader = MigrationLoader(connection, ignore_no_migrations=True)
    users = [key for key, migration in loader.disk_migrations.items() if key != PGVECTOR and _uses_pgvector(migration)]
    assert ("memories", "0002_memory_vectors") in users
    missing = [key for key in users if PGVECTOR not in loader.graph.forwards_plan(key)]
    assert missing == []
