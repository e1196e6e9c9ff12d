"""Operator pages. Metadata only: file contents are never read or shown here."""

from django.contrib import admin

from apps.attachments.models import Attachment, AttachmentLink
from apps.core.admin import ReadOnlyModelAdmin


@admin.register(Attachment)
class AttachmentAdmin(ReadOnlyModelAdmin):
    list_display = ("id", "filename", "user_id", "content_type", "size", "status", "encrypted", "created_at", "expires_at")
    list_filter = ("status", "encrypted")
    search_fields = ("=id", "=user_id", "=sha256", "filename")
    ordering = ("-created_at",)
    fields = ("id", "user_id", "filename", "content_type", "size", "sha256", "status", "encrypted", "storage_name",
              "created_at", "expires_at")
    readonly_fields = fields


@admin.register(AttachmentLink)
class AttachmentLinkAdmin(ReadOnlyModelAdmin):
    list_display = ("attachment_id", "conversation_id", "entry_id", "created_at")
    search_fields = ("=attachment__id", "=conversation_id", "=entry_id")
    ordering = ("-created_at",)
    fields = ("attachment", "conversation_id", "entry_id", "created_at")
    readonly_fields = fields
