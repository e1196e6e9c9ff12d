"""The keyword index rebuilt: apps.retrieval.keywords now strips plurals in "es" only after s, x, z, ch, sh and o
and drops a final "e" ("note", "notes" and "noted" meet; "notes" was "not" and "note" stayed "note"), so every
stored term hash of an e-final word changed."""

from django.db import migrations


def rehash(apps, schema_editor):
    from apps.memories import keyword_index

    keyword_index.rebuild(schema_editor.connection)


class Migration(migrations.Migration):

    dependencies = [
        ("memories", "0011_memory_terms"),
    ]

    operations = [
        migrations.RunPython(rehash, migrations.RunPython.noop),
    ]
