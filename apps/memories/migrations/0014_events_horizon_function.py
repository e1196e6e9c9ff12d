"""The events page's horizon (selectors.read_horizon) in one round trip: who runs in another database is read first,
then a snapshot is taken, as two statements of one function (each statement of a volatile PL/pgSQL function runs on a
new snapshot under READ COMMITTED). Read in one statement, the snapshot came first and a transaction of another
database that ended between the two counted as ours; read as two statements from the client, the page took one more
round trip (events page p50 +0.5 ms, bench/memories.py --quick)."""

from django.db import migrations

FUNCTION = """
CREATE FUNCTION memory_events_horizon(OUT oldest_running bigint, OUT own bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    elsewhere bigint[];
BEGIN
    SELECT coalesce(array_agg(l.transactionid::text::bigint), '{}') INTO elsewhere
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted
      AND a.datname IS DISTINCT FROM current_database();
    -- A new statement, so a new snapshot: taken after the look at pg_locks.
    SELECT coalesce(
        (SELECT min(x::text::bigint) FROM pg_snapshot_xip(pg_current_snapshot()) AS x
         WHERE x::text::bigint % 4294967296 <> ALL(elsewhere)),
        pg_snapshot_xmax(pg_current_snapshot())::text::bigint
    ), pg_current_xact_id_if_assigned()::text::bigint
    INTO oldest_running, own;
END
$$;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("memories", "0013_memory_terms_owner"),
    ]

    operations = [
        migrations.RunSQL(FUNCTION, "DROP FUNCTION memory_events_horizon()"),
    ]
