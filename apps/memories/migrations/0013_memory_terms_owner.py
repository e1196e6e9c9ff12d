"""The keyword index keyed by owner: each row carries its version's owner key (keyword_index.owner_key_sql: the
first two namespace segments, hashed), and the primary key leads with (term, owner_key). A search inside one
owner's subtree reads only that owner's rows of a term, however many other users hold it.

Every active version's terms are rebuilt here (with the owner key, and under the stemming of 0012): the backfills of
0011 and 0012 no longer run their own, since they would write rows without the column this adds.

While a deploy replaces the processes, some still run the code from before: their PUT writes terms without the key.
A trigger fills it from the version's namespace for such rows only (``WHEN owner_key IS NULL``: today's code writes
the key itself and never fires it), so those PUTs keep working instead of failing on NOT NULL."""

from django.db import migrations

ADD = "ALTER TABLE memory_terms ADD COLUMN owner_key bigint"
KEY = """
DELETE FROM memory_terms WHERE owner_key IS NULL;
ALTER TABLE memory_terms ALTER COLUMN owner_key SET NOT NULL;
ALTER TABLE memory_terms DROP CONSTRAINT memory_terms_pkey;
ALTER TABLE memory_terms ADD PRIMARY KEY (term, owner_key, memory_id) INCLUDE (tf, dl);
"""
# The same expression as keyword_index.owner_key_sql (tests/memories/test_terms_migration.py compares them).
FILL = """
CREATE FUNCTION memory_terms_fill_owner_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    SELECT hashtextextended(array_to_string(m.namespace[1:2], chr(31)), 0) INTO NEW.owner_key
    FROM memories m WHERE m.id = NEW.memory_id;
    RETURN NEW;
END
$$;
CREATE TRIGGER memory_terms_fill_owner_key BEFORE INSERT ON memory_terms
    FOR EACH ROW WHEN (NEW.owner_key IS NULL) EXECUTE FUNCTION memory_terms_fill_owner_key();
"""
UNFILL = """
DROP TRIGGER memory_terms_fill_owner_key ON memory_terms;
DROP FUNCTION memory_terms_fill_owner_key();
"""
UNKEY = """
ALTER TABLE memory_terms DROP CONSTRAINT memory_terms_pkey;
ALTER TABLE memory_terms ADD PRIMARY KEY (term, memory_id) INCLUDE (tf, dl);
ALTER TABLE memory_terms DROP COLUMN owner_key;
"""


def rebuild(apps, schema_editor):
    from apps.memories import keyword_index

    keyword_index.rebuild(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [
        ("memories", "0012_memory_terms_rehash"),
    ]

    operations = [
        migrations.RunSQL(ADD, migrations.RunSQL.noop),
        migrations.RunPython(rebuild, migrations.RunPython.noop),
        migrations.RunSQL(KEY, UNKEY),
        migrations.RunSQL(FILL, UNFILL),
    ]
