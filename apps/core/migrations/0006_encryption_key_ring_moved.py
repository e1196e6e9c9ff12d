"""The key ring model moves to the encryption app (apps/encryption/migrations/0001); its table stays."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('core', '0005_encryption_key_rings'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name='EncryptionKeyRing')],
            database_operations=[],
        ),
    ]
