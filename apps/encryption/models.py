"""The encryption app's one table: which key ring each host holds (apps.encryption.key_rings)."""

from __future__ import annotations

from django.db import models


class EncryptionKeyRing(models.Model):
    """A key ring the processes of one host hold (key_rings): which key ids it has, each key's fingerprint
    (never the key), which one it encrypts with, and when a process holding it last said so. One row per ring and
    host. Lets each host see whether it can decrypt what the others write, and ``rotate_encryption_key`` refuse a
    primary some host lacks (issue 32.2, 32.5)."""

    id = models.BigAutoField(primary_key=True)
    ring_id = models.CharField(max_length=64, editable=False, help_text="digest of the primary and the fingerprints")
    hostname = models.CharField(max_length=255, editable=False)
    primary = models.CharField(max_length=64, editable=False)
    fingerprints = models.JSONField(editable=False, help_text="key id -> fingerprint")
    first_seen = models.DateTimeField(editable=False)
    seen_at = models.DateTimeField(editable=False, db_index=True)

    class Meta:
        db_table = "encryption_key_rings"
        verbose_name = "encryption key ring"
        constraints = [models.UniqueConstraint(fields=["ring_id", "hostname"], name="encryption_key_ring_per_host")]

    def __str__(self) -> str:
        return f"{self.primary} ({', '.join(sorted(self.fingerprints))}) on {self.hostname}"
