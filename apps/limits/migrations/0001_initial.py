
import django.core.validators
from django.db import migrations, models

# Moves a user's running totals in the caller's transaction, and refuses (SQLSTATE ML001, DETAIL a JSON object
# {quota, limit, used}) a positive change that would take a total past its limit: the row lock of the upsert
# serialises concurrent writers of one user, and each adds to the total as the one before it left it, so no
# interleaving overshoots. A credit (negative delta) never fails and never takes a total below 0 (data written before
# the totals were kept: `manage.py limits recount`). Quotas in array order: callers pass them sorted (one lock
# order). A NULL user charges nothing (a memory outside ["user", <id>, ...]).
CHARGE_FUNCTION = """
CREATE OR REPLACE FUNCTION limits_charge(p_user text, p_quotas text[], p_deltas bigint[], p_limits bigint[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    i integer;
    v_used bigint;
BEGIN
    IF p_user IS NULL THEN
        RETURN;
    END IF;
    FOR i IN 1 .. coalesce(array_length(p_quotas, 1), 0) LOOP
        CONTINUE WHEN p_deltas[i] IS NULL OR p_deltas[i] = 0;
        IF p_deltas[i] < 0 THEN
            UPDATE limits_usage SET used = greatest(used + p_deltas[i], 0)
            WHERE user_id = p_user AND quota = p_quotas[i];
            CONTINUE;
        END IF;
        INSERT INTO limits_usage AS u (user_id, quota, used) VALUES (p_user, p_quotas[i], p_deltas[i])
        ON CONFLICT (user_id, quota) DO UPDATE SET used = u.used + excluded.used
        RETURNING u.used INTO v_used;
        IF p_limits[i] IS NOT NULL AND v_used > p_limits[i] THEN
            RAISE EXCEPTION 'quota exceeded' USING ERRCODE = 'ML001', DETAIL = json_build_object(
                'quota', p_quotas[i], 'limit', p_limits[i], 'used', v_used - p_deltas[i])::text;
        END IF;
    END LOOP;
END
$$
"""


class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='UserLimits',
            fields=[
                ('user_id', models.TextField(help_text='The user id as tokens carry it (D2).', primary_key=True, serialize=False)),
                ('note', models.TextField(blank=True, default='', help_text='Why (for the next operator).')),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('requests_per_minute', models.PositiveIntegerField(blank=True, help_text='Sustained per minute: every authenticated API request.', null=True, validators=[django.core.validators.MinValueValidator(1)])),
                ('requests_burst', models.PositiveIntegerField(blank=True, help_text="At once (the bucket's size): every authenticated API request.", null=True, validators=[django.core.validators.MinValueValidator(1)])),
                ('searches_per_minute', models.PositiveIntegerField(blank=True, help_text='Sustained per minute: memory searches and conversation searches (also counted in requests).', null=True, validators=[django.core.validators.MinValueValidator(1)])),
                ('searches_burst', models.PositiveIntegerField(blank=True, help_text="At once (the bucket's size): memory searches and conversation searches (also counted in requests).", null=True, validators=[django.core.validators.MinValueValidator(1)])),
                ('creates_per_minute', models.PositiveIntegerField(blank=True, help_text='Sustained per minute: conversations created: POST /v1/conversations, an append that creates a conversation or a fork.', null=True, validators=[django.core.validators.MinValueValidator(1)])),
                ('creates_burst', models.PositiveIntegerField(blank=True, help_text="At once (the bucket's size): conversations created: POST /v1/conversations, an append that creates a conversation or a fork.", null=True, validators=[django.core.validators.MinValueValidator(1)])),
                ('memberships_per_minute', models.PositiveIntegerField(blank=True, help_text='Sustained per minute: membership adds and changes, ownership transfers started.', null=True, validators=[django.core.validators.MinValueValidator(1)])),
                ('memberships_burst', models.PositiveIntegerField(blank=True, help_text="At once (the bucket's size): membership adds and changes, ownership transfers started.", null=True, validators=[django.core.validators.MinValueValidator(1)])),
                ('uploads_per_minute', models.PositiveIntegerField(blank=True, help_text='Sustained per minute: attachment uploads.', null=True, validators=[django.core.validators.MinValueValidator(1)])),
                ('uploads_burst', models.PositiveIntegerField(blank=True, help_text="At once (the bucket's size): attachment uploads.", null=True, validators=[django.core.validators.MinValueValidator(1)])),
                ('memories', models.PositiveBigIntegerField(blank=True, help_text='active memories in the user\'s namespace ["user", <id>, ...]', null=True)),
                ('memory_bytes', models.PositiveBigIntegerField(blank=True, help_text="stored (encrypted) size of those memories' values", null=True)),
                ('conversations', models.PositiveBigIntegerField(blank=True, help_text="live conversations the user owns (forks count against the tree's owner, whoever forked)", null=True)),
                ('entry_bytes', models.PositiveBigIntegerField(blank=True, help_text='stored (encrypted) size of the entries the user wrote, in live conversations', null=True)),
                ('attachments', models.PositiveBigIntegerField(blank=True, help_text='attachments the user uploaded (uploading or ready)', null=True)),
                ('attachment_bytes', models.PositiveBigIntegerField(blank=True, help_text='size of those attachments', null=True)),
                ('members_per_conversation', models.PositiveBigIntegerField(blank=True, help_text="members of one conversation (its fork tree); the owner's limit applies", null=True)),
            ],
            options={
                'verbose_name': 'user limits',
                'verbose_name_plural': 'user limits',
                'db_table': 'limits_user_limits',
            },
        ),
        migrations.CreateModel(
            name='Usage',
            fields=[
                ('pk', models.CompositePrimaryKey('user_id', 'quota', blank=True, editable=False, primary_key=True, serialize=False)),
                ('user_id', models.TextField()),
                ('quota', models.TextField()),
                ('used', models.BigIntegerField(default=0)),
            ],
            options={
                'db_table': 'limits_usage',
                'constraints': [models.CheckConstraint(condition=models.Q(('used__gte', 0)), name='limits_usage_not_negative')],
            },
        ),
        migrations.RunSQL(CHARGE_FUNCTION, "DROP FUNCTION IF EXISTS limits_charge(text, text[], bigint[], bigint[])"),
    ]
