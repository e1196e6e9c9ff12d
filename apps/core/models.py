"""Core models: the service credentials (API keys, D2), the admin audit trail, and the per-row state columns every
background indexer's table carries (IndexState, used by apps.core.indexing)."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models.signals import post_migrate
from django.utils import timezone


class IndexState(models.Model):
    """The columns apps.core.indexing keeps on each row an indexer works on (each app's migration adds them to its
    own table): a row whose text fails to index is retried with a growing backoff and, after
    INDEXING_MAX_ATTEMPTS failures, quarantined: left alone until an operator runs ``manage.py indexing retry``."""

    index_failures = models.PositiveIntegerField(default=0, db_default=0)  # failures of this row's own text
    index_retry_at = models.DateTimeField(null=True, blank=True)  # not taken again before then
    # Why the last attempt failed ("embedding: EmbeddingError", "decrypt: key id 'k1'"): never the row's content.
    index_error = models.TextField(null=True, blank=True)  # noqa: DJ001 - null = no failure
    index_quarantined_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True


class ApiKey(models.Model):
    """An API key of one client application. Only a SHA-256 hash of the key is stored; ``prefix`` (the first
    characters of the key) is not secret and serves to look the key up and to tell keys apart in listings."""

    client = models.CharField(max_length=200, help_text="Becomes the caller's client_id.")
    prefix = models.CharField(max_length=16, db_index=True, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["client", "created_at"]
        verbose_name = "API key"
        verbose_name_plural = "API keys"

    def __str__(self) -> str:
        return f"{self.client} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


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


def _seed_api_keys(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """API_KEYS is seeded right after migrate so that `apikeys list` and the admin show the keys; authentication
    also seeds on demand (apps.core.auth.api_keys) for databases that were migrated before a key was added."""
    if getattr(sender, "label", None) != "core":
        return
    from apps.core.auth.api_keys import seed_from_settings

    seed_from_settings(using=using)


post_migrate.connect(_seed_api_keys, dispatch_uid="apps.core.models.seed_api_keys")
