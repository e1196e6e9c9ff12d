"""Per-row indexing state (apps.core.models.IndexState): failures, backoff, last error and quarantine, so one
row that cannot be indexed never blocks the queue (apps.core.indexing). Adding nullable columns and one with a
constant default rewrites no rows."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0002_search'),
    ]

    operations = [
        migrations.AddField(
            model_name='entry',
            name='index_error',
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='entry',
            name='index_failures',
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name='entry',
            name='index_quarantined_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='entry',
            name='index_retry_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name='entry',
            index=models.Index(condition=models.Q(('index_quarantined_at__isnull', False)), fields=['index_quarantined_at'], name='conv_entries_quarantined'),
        ),
    ]
