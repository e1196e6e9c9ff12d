"""The events page stays an index walk after updates and deletes (issue 23).

* ``memory_events_owner_kind_seq`` on ``(namespace[1:2], kind, seq + 0)``: a page filtered by kind walks each kind's
  events in seq order and merges the walks (selectors.events_query), so it reads at most one page per kind. Walking
  the owner's whole timeline and filtering, a first page of ``kinds=delete`` read the 13k adds and updates before
  the first delete (7-35 ms after 10k updates and deletes; 0.2-0.3 ms now).
* ``memory_events_ns_gin`` without a pending list (``fastupdate = off``): with it, new entries wait unsorted in a
  list that every scan of the index reads in full until VACUUM merges it, so a page under a deeper prefix (the GIN
  bitmap) took 3-13 ms after 10k events instead of 0.3-1.3 ms. Events are appended one per write; inserting each
  into the index directly cost about as much PostgreSQL CPU as the deferred merge (510-590 us per PUT either way).
  The pending list that exists is merged here, since turning fastupdate off does not flush it.

Plain CREATE INDEX: it runs on an existing database (the table is locked against writes while it builds).
"""

import django.contrib.postgres.fields.array
import django.contrib.postgres.indexes
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("memories", "0006_index_quarantine"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="memoryevent",
            index=models.Index(
                django.contrib.postgres.fields.array.SliceTransform(1, 2, "namespace"),
                models.F("kind"),
                models.F("seq") + 0,
                name="memory_events_owner_kind_seq",
            ),
        ),
        # ALTER INDEX rather than Django's drop and re-create of a changed index: no rebuild.
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    [
                        "ALTER INDEX memory_events_ns_gin SET (fastupdate = off)",
                        "SELECT gin_clean_pending_list('memory_events_ns_gin'::regclass)",
                    ],
                    reverse_sql="ALTER INDEX memory_events_ns_gin RESET (fastupdate)",
                ),
            ],
            state_operations=[
                migrations.RemoveIndex(model_name="memoryevent", name="memory_events_ns_gin"),
                migrations.AddIndex(
                    model_name="memoryevent",
                    index=django.contrib.postgres.indexes.GinIndex(
                        fields=["namespace"], name="memory_events_ns_gin", fastupdate=False
                    ),
                ),
            ],
        ),
    ]
