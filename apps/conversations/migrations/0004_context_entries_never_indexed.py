"""Context entries are private to their API-key client (D5), and search is shared by every member, so a context entry
is never indexed (issue 21). Before this release an append could give one ``indexedContent``, which the indexer
embedded and semantic search then returned to any member: those index texts and vectors are removed, and a check
constraint keeps every context entry without index text from now on."""

from django.db import migrations, models

FORGET_CONTEXT_INDEX = [
    "DELETE FROM conversation_entry_vectors v USING conversation_entries e "
    "WHERE e.id = v.entry_id AND e.channel <> 'history'",
    "UPDATE conversation_entries SET indexed_content = NULL, embedding_pending = false "
    "WHERE channel <> 'history' AND (indexed_content IS NOT NULL OR embedding_pending)",
]


class Migration(migrations.Migration):

    dependencies = [
        ("conversations", "0003_index_quarantine"),
    ]

    operations = [
        migrations.RunSQL(FORGET_CONTEXT_INDEX, reverse_sql=migrations.RunSQL.noop),
        migrations.AddConstraint(
            model_name="entry",
            constraint=models.CheckConstraint(
                condition=models.Q(("channel", "history"), models.Q(("embedding_pending", False), ("indexed_content__isnull", True)), _connector="OR"),
                name="conversation_entries_context_never_indexed",
            ),
        ),
    ]
