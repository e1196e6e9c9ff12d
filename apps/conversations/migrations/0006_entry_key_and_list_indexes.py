"""D11's entry lists from either end (tail, beforeCursor) and entry keys (issue 31): a nullable ``key`` column (adding
it rewrites nothing), and the indexes each list scans in its order, so reading the newest page or one key's entries
never passes over the rest of a long conversation. The indexes are built concurrently (as 0005's), so appends are not
blocked on a large table."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY

    dependencies = [
        ('conversations', '0005_index_owner_queue'),
    ]

    operations = [
        migrations.AddField(
            model_name='entry',
            name='key',
            field=models.TextField(blank=True, null=True),
        ),
        AddIndexConcurrently(
            model_name='entry',
            index=models.Index(condition=models.Q(('channel', 'history')), fields=['conversation', 'created_at', 'id'], name='conv_entries_history'),
        ),
        AddIndexConcurrently(
            model_name='entry',
            index=models.Index(condition=models.Q(('channel', 'context')), fields=['conversation', 'client_id', 'created_at', 'id'], name='conv_entries_context'),
        ),
        AddIndexConcurrently(
            model_name='entry',
            index=models.Index(condition=models.Q(('key__isnull', False)), fields=['conversation', 'key', 'created_at', 'id'], name='conv_entries_key'),
        ),
    ]
