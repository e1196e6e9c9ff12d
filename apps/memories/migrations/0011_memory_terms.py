"""The keyword index of memory search (D11 "words and meaning"; apps.memories.keyword_index): per active version,
each term's keyed hash, its frequency and the version's length in terms, written in the PUT's own transaction.

Existing active versions with index text are indexed by 0013, which adds the owner key the index code now writes
(their backfill ran here before)."""

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


class Migration(migrations.Migration):

    dependencies = [
        ('memories', '0010_index_owner_queue'),
    ]

    operations = [
        migrations.RunSQL(CREATE, "DROP TABLE memory_terms"),
        migrations.RunPython(migrations.RunPython.noop, migrations.RunPython.noop),
    ]
