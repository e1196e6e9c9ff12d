"""Statistics on namespace prefixes of memories, for attribute search.

Search asks ``namespace @> prefix AND namespace[1:n] = prefix ORDER BY created_at DESC``. Without statistics on
``namespace[1:n]`` the planner guessed 0.5% of the rows for the equality, so a later page of a large subtree (or a
deeper prefix) looked like a few rows to sort and it sorted the whole subtree: 14 ms for bob's page at offset
500 (10k memories) instead of walking memories_active_recent (1.8 ms). Statistics only: nothing to maintain on
writes, ANALYZE keeps them.
"""

from django.db import migrations

CREATE_STATISTICS = (
    "CREATE STATISTICS IF NOT EXISTS memories_ns_depth "
    "ON (namespace[1:2]), (namespace[1:3]), (namespace[1:4]), (namespace[1:5]) FROM memories"
)


class Migration(migrations.Migration):
    dependencies = [
        ("memories", "0004_memory_events_owner_seq"),
    ]

    operations = [
        migrations.RunSQL(
            [CREATE_STATISTICS, "ANALYZE memories"],
            reverse_sql="DROP STATISTICS IF EXISTS memories_ns_depth",
        ),
    ]
