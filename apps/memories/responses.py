"""Response shapes of the memory endpoints (snake_case, as the interface says): each declaration renders its body
(``Shape.render``) and documents it in the schema (apps.core.shapes)."""

from __future__ import annotations

from rest_framework import serializers

from apps.core.shapes import Marker, Shape
from apps.encryption import crypto


def _value_error() -> Marker:
    return Marker(
        of="value",
        when=crypto.UNDECRYPTABLE,
        value=crypto.UNDECRYPTABLE_MARKER,
        help_text="Present only when value is null because the stored value does not decrypt with the service's "
        "keys (a key missing from MEMORY_ENCRYPTION_KEYS, or a damaged row). The other items are served.",
    )


class MemoryWriteResponse(Shape):
    id = serializers.UUIDField()
    namespace = serializers.ListField(child=serializers.CharField())
    key = serializers.CharField()
    attributes = serializers.DictField(allow_null=True)
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(allow_null=True)


class MemoryResponse(Shape):
    id = serializers.UUIDField()
    namespace = serializers.ListField(child=serializers.CharField())
    key = serializers.CharField()
    value = serializers.DictField()
    attributes = serializers.DictField(allow_null=True)
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(allow_null=True)


class MemorySearchItem(Shape):
    id = serializers.UUIDField()
    namespace = serializers.ListField(child=serializers.CharField())
    key = serializers.CharField()
    value = serializers.DictField(allow_null=True, help_text="null only with value_error")
    value_error = _value_error()
    attributes = serializers.DictField(allow_null=True)
    score = serializers.FloatField(
        allow_null=True,
        help_text="In [0, 1], higher is better (apps.memories.search: similarity, BM25 or both by search_type; "
        "reciprocal-rank fusion with queries); null in attribute mode",
    )
    created_at = serializers.DateTimeField()
    matched_queries = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="Only with queries: the purposes (the text where a purpose is absent) of the questions that found it",
    )


class MemorySearchResponse(Shape):
    items = MemorySearchItem(many=True)


class NamespacesResponse(Shape):
    namespaces = serializers.ListField(child=serializers.ListField(child=serializers.CharField()))


class MemoryEventItem(Shape):
    id = serializers.UUIDField()
    namespace = serializers.ListField(child=serializers.CharField())
    key = serializers.CharField()
    kind = serializers.ChoiceField(choices=["add", "update", "delete", "expired"])
    occurred_at = serializers.DateTimeField()
    value = serializers.DictField(allow_null=True, help_text="null for delete and expired events, or with value_error")
    value_error = _value_error()
    attributes = serializers.DictField(allow_null=True)


class MemoryEventsResponse(Shape):
    events = MemoryEventItem(many=True)
    after_cursor = serializers.CharField(help_text="Never null: pass it back to continue, even after an empty page")
