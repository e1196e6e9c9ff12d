"""The keyword index of memory search (D11 "words and meaning"; apps.memories.keyword_index): per active version,
each term's keyed hash, its frequency and the version's length in terms, written in the PUT's own transaction.
Existing active versions with index text are indexed here."""

from django.db import migrations

CREATE = """
CREATE TABLE memory_terms (
    term bigint NOT NULL,
    memory_id uuid NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    tf integer NOT NULL,
    dl integer NOT NULL,
    key_id text NOT NULL,
    PRIMARY KEY (term, memory_id) INCLUDE (tf, dl)
);
CREATE INDEX memory_terms_memory ON memory_terms (memory_id);
CREATE INDEX memory_terms_key ON memory_terms (key_id);
"""


def backfill(apps, schema_editor):
    from apps.memories import keyword_index

    keyword_index.rebuild(schema_editor.connection, missing_only=True)


class Migration(migrations.Migration):

    dependencies = [
        ('memories', '0010_index_owner_queue'),
    ]

    operations = [
        migrations.RunSQL(CREATE, "DROP TABLE memory_terms"),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
