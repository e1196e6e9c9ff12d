"""The API key model moves to the identity app (apps/identity/migrations/0001); its table stays."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('core', '0003_admin_audit_log'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name='ApiKey')],
            database_operations=[],
        ),
    ]
