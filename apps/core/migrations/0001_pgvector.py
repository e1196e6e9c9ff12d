from django.db import migrations


class Migration(migrations.Migration):
    """pgvector is needed by semantic search; creating it first makes a missing extension fail at migrate time."""

    initial = True
    dependencies: list = []

    operations = [
        migrations.RunSQL("CREATE EXTENSION IF NOT EXISTS vector", reverse_sql=migrations.RunSQL.noop),
    ]
