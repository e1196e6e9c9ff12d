"""Per-row indexing state (apps.core.models.IndexState): failures, backoff, last error and quarantine, so one
row that cannot be indexed never blocks the queue (apps.core.indexing). Adding nullable columns and one with a
constant default rewrites no rows."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('memories', '0005_memories_ns_depth_statistics'),
    ]

    operations = [
        migrations.AddField(
            model_name='memory',
            name='index_error',
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='memory',
            name='index_failures',
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name='memory',
            name='index_quarantined_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name='memory',
            index=models.Index(condition=models.Q(('index_quarantined_at__isnull', False)), fields=['index_quarantined_at'], name='memories_index_quarantined'),
        ),
    ]
