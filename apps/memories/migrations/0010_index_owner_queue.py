"""The memory indexer takes each owner's oldest versions in turn (issue 28 item 1, D11: one user's backlog never
holds up another's): an index on ``(namespace[1:2], created_at, id)`` of the versions to embed, walked from one
owner to the next. Built concurrently, so writers are not blocked on a large table."""

import django.contrib.postgres.fields.array
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY

    dependencies = [
        ('memories', '0009_events_page_indexes'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='memory',
            index=models.Index(django.contrib.postgres.fields.array.SliceTransform(1, 2, 'namespace'), models.F('created_at'), models.F('id'), condition=models.Q(('index_quarantined_at__isnull', True), ('index_status', 'pending'), ('state', 'active')), name='memories_index_owner_queue'),
        ),
    ]
