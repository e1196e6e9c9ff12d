"""Request parsing and response shapes of the attachment endpoints (camelCase)."""

from __future__ import annotations

import re

from django.conf import settings
from rest_framework import serializers

from apps.core import errors

_DURATION = re.compile(
    r"^P(?!$)(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?:T(?=\d)(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+)S)?)?$"
)
_MAX_DIGITS = 12  # beyond any sane maximum; keeps int() and the arithmetic small


def parse_expires_in(raw: str | None) -> int:
    """``expiresIn`` (D7): an ISO-8601 duration (PT90S, PT30M, PT1H, P1D) or whole seconds; absent = the default;
    from 1 second up to ATTACHMENT_MAX_EXPIRES_IN, else 400."""
    maximum = settings.ATTACHMENT_MAX_EXPIRES_IN
    if raw is None or raw == "":
        return min(settings.ATTACHMENT_DEFAULT_EXPIRES_IN, maximum)
    text = raw.strip().upper()
    problem = {"expiresIn": f"must be an ISO-8601 duration (e.g. PT30M, P1D) or whole seconds, from 1 s to {maximum} s"}
    if len(text) > 40:
        raise errors.validation_error(problem)
    if text.isdigit() and text.isascii():
        seconds = int(text[:_MAX_DIGITS + 1]) if len(text) <= _MAX_DIGITS else maximum + 1
    else:
        match = _DURATION.match(text)
        if match is None or any(len(value) > _MAX_DIGITS for value in match.groupdict(default="").values()):
            raise errors.validation_error(problem)
        parts = {name: int(value) for name, value in match.groupdict(default="0").items()}
        seconds = (
            parts["weeks"] * 604800 + parts["days"] * 86400 + parts["hours"] * 3600 + parts["minutes"] * 60
            + parts["seconds"]
        )
    if not 1 <= seconds <= maximum:
        raise errors.validation_error(problem)
    return seconds


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


class AdminAttachmentPage(serializers.Serializer):
    data = AdminAttachmentResponse(many=True)
    afterCursor = serializers.CharField(allow_null=True)


class DownloadUrlResponse(serializers.Serializer):
    url = serializers.CharField(help_text="/v1/attachments/download/{token}/{filename}; no Authorization needed")
    expiresIn = serializers.IntegerField(help_text="Seconds the URL stays valid")
