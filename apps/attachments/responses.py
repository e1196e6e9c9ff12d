"""Response shapes of the attachment endpoints (camelCase): each declaration renders its body
(``Shape.from_object``, ``Shape.render``) and documents it in the schema (apps.core.shapes). A list's page is
apps.core.shapes.page_of(<item>)."""

from __future__ import annotations

from rest_framework import serializers

from apps.core.shapes import Shape


class AttachmentResponse(Shape):
    id = serializers.UUIDField()
    href = serializers.CharField(help_text="/v1/attachments/{id}")
    contentType = serializers.CharField(source="content_type")
    filename = serializers.CharField()
    size = serializers.IntegerField()
    sha256 = serializers.CharField(help_text="Hex SHA-256 of the content")
    expiresAt = serializers.DateTimeField(source="expires_at", help_text="Ignored once an entry references the attachment")
    status = serializers.ChoiceField(choices=["ready"])


class AdminAttachmentResponse(AttachmentResponse):
    userId = serializers.CharField(source="user_id", help_text="The uploader")
    createdAt = serializers.DateTimeField(source="created_at")


class DownloadUrlResponse(Shape):
    url = serializers.CharField(help_text="/v1/attachments/download/{token}/{filename}; no Authorization needed")
    expiresIn = serializers.IntegerField(source="expires_in", help_text="Seconds the URL stays valid")
