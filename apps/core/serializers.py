"""Serializer building blocks shared by every app."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class StrictSerializer(serializers.Serializer):
    """Rejects unknown top-level fields (D1): a misspelt field is a 400, not silently ignored."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: "unknown field" for name in unknown})
        return super().to_internal_value(data)


class StrictCharField(serializers.CharField):
    """A string that really is a string: DRF's CharField would turn 12 or true into "12"/"True"."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        if "\x00" in data:
            raise serializers.ValidationError("must not contain NUL characters")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    """An integer that really is an integer: no "5", 5.0 or true."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


def isoformat(value) -> str | None:
    """ISO 8601 in UTC with a Z suffix, the one timestamp format of every response."""
    if value is None:
        return None
    from datetime import UTC

    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


class ErrorSerializer(serializers.Serializer):
    """The one error body (D1). A policy deny adds `reason`; validation errors name fields in `details.fields`."""

    code = serializers.CharField(help_text="Stable machine-readable code, e.g. validation_error, forbidden")
    error = serializers.CharField(help_text="Safe human-readable message")
    requestId = serializers.CharField(help_text="Also in the X-Request-ID response header")
    reason = serializers.CharField(required=False, help_text="Policy reason on a 403 deny")
    details = serializers.DictField(required=False)


def error_responses(*statuses: int) -> dict:
    """OpenAPI responses for the given error statuses, all with the one error body."""
    from drf_spectacular.utils import OpenApiResponse

    return {status: OpenApiResponse(ErrorSerializer, description=_ERROR_DESCRIPTIONS.get(status, "")) for status in statuses}


_ERROR_DESCRIPTIONS = {
    400: "Validation error (details.fields names the offending fields)",
    401: "Missing or invalid credentials",
    403: "Denied (by policy: reason carries the policy's reason)",
    404: "Not found",
    413: "Payload too large",
    500: "Internal error (policy_error when a policy fails to evaluate)",
    503: "A dependency is unavailable",
}
