"""Core models: the admin audit trail (apps.core.audit), written by every app that serves ``/v1/admin/...``."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class AdminAuditRecord(models.Model):
    """One call to an admin endpoint (``/v1/admin/...``): who, what, when. Written by ``apps.core.audit.record``;
    never holds entry content, file bytes or credentials, only ids and the query parameters that shaped the call."""

    id = models.BigAutoField(primary_key=True)
    occurred_at = models.DateTimeField(default=timezone.now, db_index=True, editable=False)
    user_id = models.TextField(editable=False)
    client_id = models.TextField(null=True, blank=True, editable=False)  # noqa: DJ001 (null = no API-key client)
    action = models.CharField(max_length=100, editable=False, help_text="e.g. admin.conversations.list")
    target_id = models.TextField(null=True, blank=True, editable=False, help_text="The resource id, when one")  # noqa: DJ001
    params = models.JSONField(default=dict, blank=True, editable=False)
    request_id = models.CharField(max_length=128, editable=False)

    class Meta:
        db_table = "admin_audit_log"
        ordering = ["-occurred_at", "-id"]
        verbose_name = "admin audit record"

    def __str__(self) -> str:
        return f"{self.occurred_at:%Y-%m-%d %H:%M:%S} {self.user_id} {self.action}"
