"""The service credentials (API keys, D2)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


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
        db_table = "core_apikey"  # created by core's migration 0002, before identity was its own app

    def __str__(self) -> str:
        return f"{self.client} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None
