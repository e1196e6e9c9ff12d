"""D11's entry lists from either end (tail, beforeCursor) and entry keys (issue 31): a nullable ``key`` column (adding
it rewrites nothing), and the indexes each list scans in its order, so reading the newest page or one key's entries
never passes over the rest of a long conversation."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0004_context_entries_never_indexed'),
    ]

    operations = [
        migrations.AddField(
            model_name='entry',
            name='key',
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name='entry',
            index=models.Index(condition=models.Q(('channel', 'history')), fields=['conversation', 'created_at', 'id'], name='conv_entries_history'),
        ),
        migrations.AddIndex(
            model_name='entry',
            index=models.Index(condition=models.Q(('channel', 'context')), fields=['conversation', 'client_id', 'created_at', 'id'], name='conv_entries_context'),
        ),
        migrations.AddIndex(
            model_name='entry',
            index=models.Index(condition=models.Q(('key__isnull', False)), fields=['conversation', 'key', 'created_at', 'id'], name='conv_entries_key'),
        ),
    ]
