"""The events page stays an index walk after updates and deletes (issue 23).

* ``memory_events_kind_timeline`` on ``(namespace[1:2], kind, tx + 0, seq)``: a page filtered by kind walks
  each kind's events in timeline order and merges the walks (selectors.events_query), so it reads at most one page
  per kind. Walking the owner's whole timeline and filtering, a first page of ``kinds=delete`` read the 12.5k adds
  and updates before the first delete (58-61 ms EXPLAIN ANALYZE after 10k updates and deletes on a loaded machine;
  0.3 ms now).
* ``memory_events_ns_gin`` without a pending list (``fastupdate = off``): with it, new entries wait unsorted in a
  list that every scan of the index reads in full until VACUUM merges it, so a page under a deeper prefix (the GIN
  bitmap) took 3-13 ms after 10k events instead of 0.3-1.3 ms. Events are appended one per write; inserting each
  into the index directly cost about as much PostgreSQL CPU as the deferred merge (510-590 us per PUT either way).
  The pending list that exists is merged here, since turning fastupdate off does not flush it.

Built concurrently, as 0008's indexes, so writers are not blocked on a large timeline.
"""

import django.contrib.postgres.fields.array
import django.contrib.postgres.indexes
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY

    dependencies = [
        ("memories", "0008_memory_events_tx"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="memoryevent",
            index=models.Index(
                django.contrib.postgres.fields.array.SliceTransform(1, 2, "namespace"),
                models.F("kind"),
                models.F("tx") + 0,
                models.F("seq"),
                name="memory_events_kind_timeline",
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
