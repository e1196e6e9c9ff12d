"""Response shapes of the attachment endpoints (camelCase), for the OpenAPI schema only: selectors build the
dicts. A list's page is apps.core.openapi.page_of(<item>)."""

from __future__ import annotations

from rest_framework import serializers


class AttachmentResponse(serializers.Serializer):
    id = serializers.UUIDField()
    href = serializers.CharField(help_text="/v1/attachments/{id}")
    contentType = serializers.CharField()
    filename = serializers.CharField()
    size = serializers.IntegerField()
    sha256 = serializers.CharField(help_text="Hex SHA-256 of the content")
    expiresAt = serializers.DateTimeField(help_text="Ignored once an entry references the attachment")
    status = serializers.ChoiceField(choices=["ready"])


class AdminAttachmentResponse(AttachmentResponse):
    userId = serializers.CharField(help_text="The uploader")
    createdAt = serializers.DateTimeField()


class DownloadUrlResponse(serializers.Serializer):
    url = serializers.CharField(help_text="/v1/attachments/download/{token}/{filename}; no Authorization needed")
    expiresIn = serializers.IntegerField(help_text="Seconds the URL stays valid")
