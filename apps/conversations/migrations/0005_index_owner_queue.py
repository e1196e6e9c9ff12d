"""The conversation indexer takes each writer's oldest entries in turn (issue 28 item 1, D11: one user's backlog
never holds up another's): one index per arm of its work list on ``(user_id, created_at, id)``, walked from one
writer to the next. Built concurrently, so appends are not blocked on a large table."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY

    dependencies = [
        ('conversations', '0004_context_entries_never_indexed'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='entry',
            index=models.Index(condition=models.Q(('embedding_pending', True), ('index_quarantined_at__isnull', True)), fields=['user_id', 'created_at', 'id'], name='conv_entries_embed_owner'),
        ),
        AddIndexConcurrently(
            model_name='entry',
            index=models.Index(condition=models.Q(('channel', 'history'), ('index_quarantined_at__isnull', True), ('indexed_content__isnull', True)), fields=['user_id', 'created_at', 'id'], name='conv_entries_unindexed_owner'),
        ),
    ]
