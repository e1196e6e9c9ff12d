"""The key ring model, moved from core (core/0005 created its table, core/0006 lets go of it): state only."""

from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('core', '0006_encryption_key_ring_moved'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='EncryptionKeyRing',
                    fields=[
                        ('id', models.BigAutoField(primary_key=True, serialize=False)),
                        ('ring_id', models.CharField(editable=False, help_text='digest of the primary and the fingerprints', max_length=64)),
                        ('hostname', models.CharField(editable=False, max_length=255)),
                        ('primary', models.CharField(editable=False, max_length=64)),
                        ('fingerprints', models.JSONField(editable=False, help_text='key id -> fingerprint')),
                        ('first_seen', models.DateTimeField(editable=False)),
                        ('seen_at', models.DateTimeField(db_index=True, editable=False)),
                    ],
                    options={
                        'verbose_name': 'encryption key ring',
                        'db_table': 'encryption_key_rings',
                        'constraints': [models.UniqueConstraint(fields=('ring_id', 'hostname'), name='encryption_key_ring_per_host')],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
