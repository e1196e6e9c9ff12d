"""A link from a context entry keeps that entry's API-key client (issue 21): the attachment is then readable by the
conversation's readers only through that client, as the entry itself is (D5). Existing links of context entries get
their entry's client."""

from django.db import migrations, models

LINKS_OF_CONTEXT_ENTRIES = (
    "UPDATE attachment_links l SET client_id = e.client_id FROM conversation_entries e "
    "WHERE e.id = l.entry_id AND e.channel = 'context'"
)


class Migration(migrations.Migration):

    dependencies = [
        ("attachments", "0001_initial"),
        ("conversations", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="attachmentlink",
            name="client_id",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.RunSQL(LINKS_OF_CONTEXT_ENTRIES, reverse_sql=migrations.RunSQL.noop),
    ]
