"""The API key model moves from core to identity; its table (core_apikey) stays where core's 0002 created it."""

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('core', '0004_apikey_moved_to_identity'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='ApiKey',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('client', models.CharField(help_text="Becomes the caller's client_id.", max_length=200)),
                        ('prefix', models.CharField(db_index=True, editable=False, max_length=16)),
                        ('key_hash', models.CharField(editable=False, max_length=64, unique=True)),
                        ('created_at', models.DateTimeField(default=django.utils.timezone.now, editable=False)),
                        ('revoked_at', models.DateTimeField(blank=True, editable=False, null=True)),
                        ('last_used_at', models.DateTimeField(blank=True, editable=False, null=True)),
                    ],
                    options={
                        'verbose_name': 'API key',
                        'verbose_name_plural': 'API keys',
                        'ordering': ['client', 'created_at'],
                        'db_table': 'core_apikey',
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
