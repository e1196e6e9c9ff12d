"""Per-user overrides of the rates and quotas (edited by an admin), and the running totals the quotas are held to.

``UserLimits`` holds only what an admin changed: an empty field means the default (the QUOTA_* / RATE_LIMIT_*
setting). ``Usage`` is one row per (user, quota) for the counted quotas (definitions.COUNTED_QUOTAS): the stored
total, moved by the write that changes it, in that write's transaction, by the SQL function ``limits_charge``
(migration 0001), which refuses a write that would take it past the limit. ``manage.py limits recount`` rebuilds it
from the data.
"""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models

from apps.limits.definitions import QUOTAS, RATES


def _rate_field(help_text: str) -> models.PositiveIntegerField:
    return models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)], help_text=help_text)


def _quota_field(help_text: str) -> models.PositiveBigIntegerField:
    return models.PositiveBigIntegerField(null=True, blank=True, help_text=help_text)


class UserLimits(models.Model):
    user_id = models.TextField(primary_key=True, help_text="The user id as tokens carry it (D2).")
    note = models.TextField(blank=True, default="", help_text="Why (for the next operator).")
    updated_at = models.DateTimeField(auto_now=True)

    requests_per_minute = _rate_field(f"Sustained per minute: {RATES['requests'].covers}.")
    requests_burst = _rate_field(f"At once (the bucket's size): {RATES['requests'].covers}.")
    searches_per_minute = _rate_field(f"Sustained per minute: {RATES['searches'].covers}.")
    searches_burst = _rate_field(f"At once (the bucket's size): {RATES['searches'].covers}.")
    creates_per_minute = _rate_field(f"Sustained per minute: {RATES['creates'].covers}.")
    creates_burst = _rate_field(f"At once (the bucket's size): {RATES['creates'].covers}.")
    memberships_per_minute = _rate_field(f"Sustained per minute: {RATES['memberships'].covers}.")
    memberships_burst = _rate_field(f"At once (the bucket's size): {RATES['memberships'].covers}.")
    uploads_per_minute = _rate_field(f"Sustained per minute: {RATES['uploads'].covers}.")
    uploads_burst = _rate_field(f"At once (the bucket's size): {RATES['uploads'].covers}.")

    memories = _quota_field(QUOTAS["memories"].covers)
    memory_bytes = _quota_field(QUOTAS["memory_bytes"].covers)
    conversations = _quota_field(QUOTAS["conversations"].covers)
    entry_bytes = _quota_field(QUOTAS["entry_bytes"].covers)
    attachments = _quota_field(QUOTAS["attachments"].covers)
    attachment_bytes = _quota_field(QUOTAS["attachment_bytes"].covers)
    members_per_conversation = _quota_field(QUOTAS["members_per_conversation"].covers)

    class Meta:
        db_table = "limits_user_limits"
        verbose_name = "user limits"
        verbose_name_plural = "user limits"

    def __str__(self) -> str:
        return self.user_id


class Usage(models.Model):
    pk = models.CompositePrimaryKey("user_id", "quota")
    user_id = models.TextField()
    quota = models.TextField()
    used = models.BigIntegerField(default=0)

    class Meta:
        db_table = "limits_usage"
        constraints = [models.CheckConstraint(name="limits_usage_not_negative", condition=models.Q(used__gte=0))]

    def __str__(self) -> str:
        return f"{self.user_id} {self.quota}={self.used}"
