"""The events page walks an owner's timeline on an index instead of sorting every event under the prefix.

``list_events`` asks ``namespace @> prefix AND namespace[1:n] = prefix ORDER BY seq LIMIT 50``. With no statistics
on ``namespace[1:n]`` the planner guessed 0.5% of the rows for that equality, so for a user holding most of the
table it believed a few dozen events matched and sorted all of them after a bitmap scan of the GIN index or a
sequential scan (17-70 ms EXPLAIN ANALYZE for 17k events; the plan flipped with each ANALYZE). Now:

* ``memory_events_owner_seq`` on ``(namespace[1:2], seq + 0)``: the page for a user's subtree (what filter.rego
  narrows a user to) is one ordered index walk that stops after ``limit`` rows. The query orders by ``seq + 0``
  too, an order the primary key cannot give: walking the primary key and filtering, the planner's other ordered
  plan, reads every other owner's events between two of this owner's;
* ``memory_events_ns_depth``: expression statistics on ``namespace[1:n]`` for the deeper prefixes, so the planner
  chooses between walking that index (prefix holds many events) and the GIN bitmap (few) knowing roughly how many
  events the prefix holds (it still multiplies in the ``@>`` clause's own estimate, so it undercounts).

Plain CREATE INDEX: it runs on an existing database (the table is locked against writes while it builds).
"""

import django.contrib.postgres.fields.array
from django.db import migrations, models

# Depths 3..5 (5 is the default namespace depth limit); depth 2 has the index's own statistics, listed here too so
# ANALYZE also records how the deeper prefixes depend on it (functional-dependency statistics).
CREATE_STATISTICS = (
    "CREATE STATISTICS IF NOT EXISTS memory_events_ns_depth "
    "ON (namespace[1:2]), (namespace[1:3]), (namespace[1:4]), (namespace[1:5]) FROM memory_events"
)


class Migration(migrations.Migration):
    dependencies = [
        ("memories", "0003_memory_vector_chunks"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="memoryevent",
            index=models.Index(
                django.contrib.postgres.fields.array.SliceTransform(1, 2, "namespace"),
                models.F("seq") + 0,
                name="memory_events_owner_seq",
            ),
        ),
        migrations.RunSQL(
            [CREATE_STATISTICS, "ANALYZE memory_events"],
            reverse_sql="DROP STATISTICS IF EXISTS memory_events_ns_depth",
        ),
    ]
