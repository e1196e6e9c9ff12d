"""The keyword index rebuilt: apps.retrieval.keywords now strips plurals in "es" only after s, x, z, ch, sh and o
and drops a final "e" ("note", "notes" and "noted" meet; "notes" was "not" and "note" stayed "note"), so every
stored term hash of an e-final word changed.

0013 rebuilds every version's terms: the rebuild ran here before 0013 added the owner key the index code now
writes."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("memories", "0011_memory_terms"),
    ]

    operations = [
        migrations.RunPython(migrations.RunPython.noop, migrations.RunPython.noop),
    ]
