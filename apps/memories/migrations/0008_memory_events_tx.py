"""The event timeline is ordered by (writing transaction id, seq), and writers no longer take one global lock.

Until now every memory write (and the expiry sweep) appended its events under one advisory lock held to commit, so
that ``seq`` followed commit order and a reader paging by ``seq`` could not pass an event committing later with a
smaller number. That lock made all memory writes commit one at a time. Now each event records ``tx``, the id of
the transaction that wrote it (``pg_current_xact_id()``, 64 bits, never wrapping), and a reader pages by
``(tx, seq)`` over events of transactions older than every transaction still running (selectors.events_query): a
transaction that commits later has a larger id than all of those, so nothing can appear behind a reader's cursor.

* ``tx``: 0 for the events written before, which keep their order (seq, commit order under the old lock) ahead of
  every new one. Added with a constant default (no table rewrite), then given its real default.
* ``memory_events_timeline`` on ``(tx, seq)`` (an admin's page) and ``memory_events_owner_timeline`` on
  ``(namespace[1:2], tx + 0, seq)`` (a user's: see 0004 for why ``+ 0``), built concurrently so writers are not
  blocked on a large timeline; the ``(namespace[1:2], seq + 0)`` index of 0004 goes.
"""

import django.contrib.postgres.fields.array
from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models

import apps.memories.models


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY

    dependencies = [
        ("memories", "0007_service_settings_depth_bounds"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    [
                        "ALTER TABLE memory_events ADD COLUMN tx bigint NOT NULL DEFAULT 0",
                        "ALTER TABLE memory_events ALTER COLUMN tx SET DEFAULT (pg_current_xact_id()::text::bigint)",
                    ],
                    reverse_sql="ALTER TABLE memory_events DROP COLUMN tx",
                ),
            ],
            state_operations=[
                migrations.AddField(
                    model_name="memoryevent",
                    name="tx",
                    field=models.BigIntegerField(
                        db_default=apps.memories.models.CurrentTransactionId(), editable=False
                    ),
                ),
            ],
        ),
        AddIndexConcurrently(
            model_name="memoryevent",
            index=models.Index(fields=["tx", "seq"], name="memory_events_timeline"),
        ),
        AddIndexConcurrently(
            model_name="memoryevent",
            index=models.Index(
                django.contrib.postgres.fields.array.SliceTransform(1, 2, "namespace"),
                models.F("tx") + 0,
                models.F("seq"),
                name="memory_events_owner_timeline",
            ),
        ),
        RemoveIndexConcurrently(model_name="memoryevent", name="memory_events_owner_seq"),
        migrations.RunSQL("ANALYZE memory_events", reverse_sql=migrations.RunSQL.noop),
    ]
