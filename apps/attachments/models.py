"""Uploaded files and the entries that reference them.

An attachment row is written before its blob (``status = uploading``) and marked ``ready`` once the blob is
complete, so every blob in storage has a row naming it: an upload cut short by a crash is found and removed by the
expiry task, never left behind unnamed. Blobs live in the configured storage (apps.attachments.storage), by
default AES-256-GCM chunked streams (apps.encryption.crypto format 2) bound to the attachment id.

``attachment_links`` records which conversation entries reference an attachment (D7): whoever may read the entry may
read the attachment, and a referenced attachment no longer expires. The conversation ids are plain uuids (no FK
across apps).
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q


class AttachmentStatus(models.TextChoices):
    UPLOADING = "uploading"  # blob being written; never visible through the API
    READY = "ready"


class Attachment(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user_id = models.TextField()  # the uploader
    filename = models.TextField()
    content_type = models.TextField()
    size = models.BigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, default="")
    status = models.CharField(max_length=16, choices=AttachmentStatus.choices, default=AttachmentStatus.UPLOADING)
    storage_name = models.TextField()
    encrypted = models.BooleanField()
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "attachments"
        indexes = [
            models.Index(fields=["created_at", "id"], name="attachments_created"),
            models.Index(fields=["user_id", "created_at", "id"], name="attachments_user_created"),
            # The expiry sweep: expired or stale rows, oldest first.
            models.Index(fields=["expires_at"], name="attachments_expires"),
        ]
        constraints = [
            models.CheckConstraint(name="attachments_size_non_negative", condition=Q(size__gte=0)),
        ]

    def __str__(self) -> str:
        return f"{self.filename} ({self.id})"


class AttachmentLink(models.Model):
    """An entry of a conversation references the attachment (content item ``{"attachmentId": ...}``).

    ``client_id`` is the API-key client of a ``context`` entry (private to that client, D5) and null for a history
    entry: a history link lets every reader of the conversation read the attachment, a context link only readers
    calling through that client."""

    id = models.BigAutoField(primary_key=True)
    attachment = models.ForeignKey(Attachment, on_delete=models.CASCADE, related_name="links", db_index=False)
    conversation_id = models.UUIDField()
    entry_id = models.UUIDField()
    client_id = models.TextField(null=True, blank=True)  # noqa: DJ001 - null = a history entry's link
    created_at = models.DateTimeField()

    class Meta:
        db_table = "attachment_links"
        constraints = [
            models.UniqueConstraint(fields=["attachment", "entry_id"], name="attachment_links_once_per_entry"),
        ]
        indexes = [models.Index(fields=["conversation_id"], name="attachment_links_conversation")]

    def __str__(self) -> str:
        return f"{self.attachment_id} in {self.conversation_id}/{self.entry_id}"
