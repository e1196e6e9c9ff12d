"""Request validation and response shapes of the memory endpoints (snake_case, as the interface says)."""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.core.serializers import StrictCharField, StrictIntegerField, StrictSerializer
from apps.memories import config

MAX_SEGMENT_CHARS = 256
MAX_KEY_BYTES = 1024
MAX_INDEX_FIELDS = 32
MAX_INDEX_CHARS = 8192


class NamespaceField(serializers.ListField):
    """An ordered list of non-empty strings, at most the configured depth (memory.episodic.namespace.max_depth)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("child", StrictCharField(max_length=MAX_SEGMENT_CHARS, allow_blank=False, trim_whitespace=False))
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> list[str]:
        if not isinstance(data, list):
            raise serializers.ValidationError("must be an array of strings")
        segments = super().to_internal_value(data)
        max_depth = config.namespace_max_depth()
        if len(segments) > max_depth:
            raise serializers.ValidationError(f"depth must be at most {max_depth}")
        return segments


MAX_VALUE_NESTING = 32
_INT64 = range(-(2**63), 2**63)


def json_value_problem(value: Any, depth: int = 0) -> str | None:
    """Why ``value`` cannot be stored and handed to the policies, or None. Values reach attributes.rego and
    authz.rego as input, which carries no NUL, no integer beyond 64 bits, no Infinity/NaN (``1e400`` parses to
    Infinity) and limited nesting; a lone surrogate cannot be encoded as UTF-8 at all."""
    if depth > MAX_VALUE_NESTING:
        return f"must not be nested deeper than {MAX_VALUE_NESTING} levels"
    if isinstance(value, str):
        return _text_problem(value)
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return None if value in _INT64 else "integers must fit in 64 bits"
    if isinstance(value, float):
        return None if math.isfinite(value) else "numbers must be finite"
    if isinstance(value, dict):
        for key, item in value.items():
            problem = _text_problem(key) or json_value_problem(item, depth + 1)
            if problem:
                return problem
        return None
    if isinstance(value, list):
        for item in value:
            problem = json_value_problem(item, depth + 1)
            if problem:
                return problem
        return None
    return "must be JSON"


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "strings must not contain NUL characters"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "strings must not contain lone surrogates"
    return None


@extend_schema_field({"type": "object", "additionalProperties": True})
class JsonObjectField(serializers.Field):
    default_error_messages = {"invalid": "must be a JSON object"}

    def to_internal_value(self, data: Any) -> dict:
        if not isinstance(data, dict):
            self.fail("invalid")
        problem = json_value_problem(data)
        if problem:
            raise serializers.ValidationError(problem)
        return data

    def to_representation(self, value: dict) -> dict:
        return value


class IndexField(serializers.DictField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("child", StrictCharField(max_length=MAX_INDEX_CHARS, allow_blank=True, trim_whitespace=False))
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> dict[str, str]:
        if not isinstance(data, dict):
            raise serializers.ValidationError("must be an object of string values")
        if len(data) > MAX_INDEX_FIELDS:
            raise serializers.ValidationError(f"at most {MAX_INDEX_FIELDS} fields")
        if any(not name or "\x00" in name for name in data):
            raise serializers.ValidationError("field names must be non-empty strings without NUL")
        return super().to_internal_value(data)


class MemoryWriteSerializer(StrictSerializer):
    """PUT /v1/memories body. Unknown fields are rejected."""

    namespace = NamespaceField(min_length=1)
    key = StrictCharField(allow_blank=False, trim_whitespace=False)
    value = JsonObjectField()
    index = IndexField(required=False)
    ttl_seconds = StrictIntegerField(required=False, min_value=0)

    def validate_key(self, key: str) -> str:
        if len(key.encode()) > MAX_KEY_BYTES:
            raise serializers.ValidationError(f"must be at most {MAX_KEY_BYTES} bytes")
        return key

    def validate_ttl_seconds(self, ttl: int) -> int:
        if ttl > settings.MEMORY_MAX_TTL_SECONDS:
            raise serializers.ValidationError(f"must be at most {settings.MEMORY_MAX_TTL_SECONDS}")
        return ttl


class MemoryAddressSerializer(StrictSerializer):
    """The query of GET and DELETE: ns repeated once per segment, and key. Unknown fields are rejected."""

    ns = NamespaceField(min_length=1)
    key = StrictCharField(allow_blank=False, trim_whitespace=False)


@extend_schema_field({"type": "object", "additionalProperties": True, "description": "Attribute filter"})
class FilterField(serializers.JSONField):
    """Validated by apps.memories.filters (one compiler for both search modes)."""


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": 100, "default": 10})
class SearchLimitField(serializers.JSONField):
    """Validated by apps.core.pagination.parse_limit, the one place limits are checked."""


@extend_schema_field({"type": "integer", "minimum": 0, "maximum": 10000, "default": 0})
class SearchOffsetField(serializers.JSONField):
    """Validated by apps.core.pagination.parse_offset."""


class MemorySearchSerializer(StrictSerializer):
    """POST /v1/memories/search body. Unknown fields are rejected."""

    namespace_prefix = serializers.ListField(
        child=StrictCharField(max_length=MAX_SEGMENT_CHARS, allow_blank=False, trim_whitespace=False)
    )
    query = StrictCharField(required=False, allow_blank=False, max_length=MAX_INDEX_CHARS)
    filter = FilterField(required=False)
    limit = SearchLimitField(required=False)
    offset = SearchOffsetField(required=False)


# --- Response shapes (documentation; selectors build the dicts) -------------------------------------------------


class MemoryWriteResponse(serializers.Serializer):
    id = serializers.UUIDField()
    namespace = serializers.ListField(child=serializers.CharField())
    key = serializers.CharField()
    attributes = serializers.DictField(allow_null=True)
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(allow_null=True)


class MemoryResponse(MemoryWriteResponse):
    value = serializers.DictField()


class MemorySearchItem(serializers.Serializer):
    id = serializers.UUIDField()
    namespace = serializers.ListField(child=serializers.CharField())
    key = serializers.CharField()
    value = serializers.DictField()
    attributes = serializers.DictField(allow_null=True)
    score = serializers.FloatField(allow_null=True, help_text="Cosine similarity in [0, 1]; null in attribute mode")
    created_at = serializers.DateTimeField()


class MemorySearchResponse(serializers.Serializer):
    items = MemorySearchItem(many=True)


class NamespacesResponse(serializers.Serializer):
    namespaces = serializers.ListField(child=serializers.ListField(child=serializers.CharField()))


class MemoryEventItem(serializers.Serializer):
    id = serializers.UUIDField()
    namespace = serializers.ListField(child=serializers.CharField())
    key = serializers.CharField()
    kind = serializers.ChoiceField(choices=["add", "update", "delete", "expired"])
    occurred_at = serializers.DateTimeField()
    value = serializers.DictField(allow_null=True)
    attributes = serializers.DictField(allow_null=True)


class MemoryEventsResponse(serializers.Serializer):
    events = MemoryEventItem(many=True)
    after_cursor = serializers.CharField(allow_null=True)
