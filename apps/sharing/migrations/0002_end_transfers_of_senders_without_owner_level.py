"""Pending transfers whose sender no longer holds owner level are void (issue 21): before this release, removing or
lowering a co-owner left the transfers they had started pending. Accepting one is refused anyway (the service
re-checks the sender at accept); this removes them so nobody sees them listed."""

from django.db import migrations

END_VOID_TRANSFERS = """
DELETE FROM conversation_ownership_transfers t
WHERE NOT EXISTS (
    SELECT 1 FROM conversation_memberships m
    WHERE m.root_id = t.root_id AND m.user_id = t.from_user_id AND m.access_level = 'owner'
)
"""


class Migration(migrations.Migration):

    dependencies = [
        ("sharing", "0001_initial"),
    ]

    operations = [
        migrations.RunSQL(END_VOID_TRANSFERS, reverse_sql=migrations.RunSQL.noop, elidable=True),
    ]
