"""Request validation of the memory endpoints (snake_case, as the interface says): bodies (unknown fields are
rejected, D1) and addresses. Response shapes: apps.memories.responses."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.core.pagination import LimitBounds
from apps.core.serializers import (
    NO_NUL_PATTERN,
    JsonObjectField,
    StrictCharField,
    StrictIntegerField,
    StrictSerializer,
    body_limit_field,
    text_problem,
)
from apps.memories import config, filters
from apps.memories.openapi import DEPTH_MARKER

MAX_SEGMENT_CHARS = 256
MAX_KEY_BYTES = 1024
# D4: a client that indexes every string leaf of a value (LangGraph's store does) must never be refused. Fields
# longer than the model's input window are embedded as overlapping chunks (EmbeddingProvider.chunk).
MAX_INDEX_FIELDS = 256
MAX_INDEX_TEXT_BYTES = 256 * 1024  # UTF-8 bytes of all field values together
MAX_QUERY_CHARS = 8192
# The lists' limit bounds (the interface's limits table), named by their views (and the MCP tools that mirror them).
SEARCH_LIMIT = LimitBounds(default=10, maximum=100)  # POST /v1/memories/search, in the body
EVENTS_LIMIT = LimitBounds(default=50, maximum=200)  # GET /v1/memories/events


def _segment_field() -> StrictCharField:
    """One namespace segment, in an address and in a search prefix: non-empty, at most MAX_SEGMENT_CHARS, kept as
    sent. _plainly_valid_segment is its fast path: keep the two together."""
    return StrictCharField(max_length=MAX_SEGMENT_CHARS, allow_blank=False, trim_whitespace=False)


def _plainly_valid_segment(segment: str) -> bool:
    """True when _segment_field() accepts ``segment`` unchanged (its rules, and StrictCharField's: no NUL or lone
    surrogate), checked without building it. Shared by both fast paths."""
    return bool(segment) and len(segment) <= MAX_SEGMENT_CHARS and text_problem(segment) is None


# A key wherever one is named (the PUT body, the GET and DELETE query). JSON Schema counts characters: 1024 is the
# most characters any key can have, and the description states the byte limit.
KEY_SCHEMA = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_KEY_BYTES,
    "pattern": NO_NUL_PATTERN,
    "description": f"At most {MAX_KEY_BYTES} bytes in UTF-8",
}


@extend_schema_field(KEY_SCHEMA)
class MemoryKeyField(StrictCharField):
    """A memory's key, the same in every operation that names one (PUT, GET, DELETE): non-empty, at most
    MAX_KEY_BYTES in UTF-8, kept as sent."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_blank=False, trim_whitespace=False, **kwargs)

    def to_internal_value(self, data: Any) -> str:
        key = super().to_internal_value(data)
        if len(key.encode()) > MAX_KEY_BYTES:
            raise serializers.ValidationError(f"must be at most {MAX_KEY_BYTES} bytes")
        return key


# A namespace segment wherever one is named (addresses, prefixes, suffixes).
SEGMENT_SCHEMA = {"type": "string", "minLength": 1, "maxLength": MAX_SEGMENT_CHARS, "pattern": NO_NUL_PATTERN}
# A namespace to write (PUT): its maxItems is the depth setting in force (apps.memories.openapi).
NAMESPACE_SCHEMA = {"type": "array", "items": SEGMENT_SCHEMA, "minItems": 1, DEPTH_MARKER: True}
# A namespace to read or delete (GET, DELETE): up to the setting's ceiling, so that a record written before the
# setting was lowered stays reachable.
ADDRESS_NAMESPACE_SCHEMA = {
    "type": "array",
    "items": SEGMENT_SCHEMA,
    "minItems": 1,
    "maxItems": config.MAX_NAMESPACE_DEPTH,
}


@extend_schema_field(NAMESPACE_SCHEMA)
class NamespaceField(serializers.ListField):
    """An ordered list of non-empty strings. A write's (``writes=True``) is at most the configured depth
    (memory.episodic.namespace.max_depth, which an operator may change at run time); an address to read or delete
    at most config.MAX_NAMESPACE_DEPTH, the ceiling of that setting, so that records written under a higher setting
    stay readable and deletable after it is lowered."""

    def __init__(self, *, writes: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("child", _segment_field())
        self.writes = writes
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> list[str]:
        if not isinstance(data, list):
            raise serializers.ValidationError("must be an array of strings")
        segments = super().to_internal_value(data)
        max_depth = config.namespace_max_depth() if self.writes else config.MAX_NAMESPACE_DEPTH
        if len(segments) > max_depth:
            raise serializers.ValidationError(f"depth must be at most {max_depth}")
        return segments


@extend_schema_field(
    {
        "type": "object",
        "additionalProperties": {"type": "string"},
        "propertyNames": {"minLength": 1},
        "maxProperties": MAX_INDEX_FIELDS,
        "description": (
            f"Text to embed for semantic search, by field name: at most {MAX_INDEX_FIELDS} fields and "
            f"{MAX_INDEX_TEXT_BYTES // 1024} KiB (UTF-8) of text in all. A field longer than the embedding model's "
            "input window is embedded as overlapping chunks covering all of it; a memory scores by its best chunk. "
            "Absent or empty: the memory is not semantically searchable."
        ),
    }
)
class IndexField(serializers.DictField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("child", StrictCharField(allow_blank=True, trim_whitespace=False))
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> dict[str, str]:
        if not isinstance(data, dict):
            raise serializers.ValidationError("must be an object of string values")
        if len(data) > MAX_INDEX_FIELDS:
            raise serializers.ValidationError(f"at most {MAX_INDEX_FIELDS} fields")
        if any(not name or "\x00" in name for name in data):
            raise serializers.ValidationError("field names must be non-empty strings without NUL")
        index = super().to_internal_value(data)
        total = 0
        for text in index.values():
            problem = text_problem(text)
            if problem:
                raise serializers.ValidationError(problem)
            total += len(text.encode("utf-8"))
        if total > MAX_INDEX_TEXT_BYTES:
            raise serializers.ValidationError(
                f"at most {MAX_INDEX_TEXT_BYTES // 1024} KiB ({MAX_INDEX_TEXT_BYTES} bytes UTF-8) of text in all fields"
            )
        return index


@extend_schema_field({"type": "integer", "minimum": 0, "maximum": settings.MEMORY_MAX_TTL_SECONDS})
class TtlSecondsField(StrictIntegerField):
    """Seconds to live, 0 = no expiry; the maximum (MEMORY_MAX_TTL_SECONDS) is checked by the serializer."""


class MemoryWriteSerializer(StrictSerializer):
    """PUT /v1/memories body. Unknown fields are rejected."""

    namespace = NamespaceField(writes=True, min_length=1)
    key = MemoryKeyField()
    value = JsonObjectField()
    index = IndexField(required=False)
    ttl_seconds = TtlSecondsField(required=False, min_value=0)

    def validate_ttl_seconds(self, ttl: int) -> int:
        if ttl > settings.MEMORY_MAX_TTL_SECONDS:
            raise serializers.ValidationError(f"must be at most {settings.MEMORY_MAX_TTL_SECONDS}")
        return ttl


class MemoryAddressSerializer(StrictSerializer):
    """The query of GET and DELETE: ns repeated once per segment, and key. Unknown fields are rejected. The depth is
    not capped by the current setting (only writes are): a record stays reachable when the setting is lowered."""

    ns = NamespaceField(min_length=1)
    key = MemoryKeyField()


def plainly_valid_address(ns: list[str], key: str | None) -> bool:
    """True when MemoryAddressSerializer would accept ``ns`` and ``key`` unchanged, checked without building it.

    The serializer costs 80 us per GET (issue 12) to accept what nearly every request sends; False sends the
    request through it, so every refusal keeps the serializer's error body. Its rules: a key, non-empty; one to
    config.MAX_NAMESPACE_DEPTH segments, each non-empty and at most MAX_SEGMENT_CHARS; a key of at most
    MAX_KEY_BYTES in UTF-8; no NUL or lone surrogate."""
    return (
        bool(key)
        and text_problem(key) is None
        and len(key.encode()) <= MAX_KEY_BYTES
        and 0 < len(ns) <= config.MAX_NAMESPACE_DEPTH
        and all(_plainly_valid_segment(segment) for segment in ns)
    )


# The filter forms apps.memories.filters.parse_filter takes (D4): per attribute, a scalar (equality) or an object of
# operators. JSON Schema cannot say "an integer within 64 bits" of a free number, nor that a timestamp's date exists.
_SCALAR = {"anyOf": [{"type": "string", "pattern": NO_NUL_PATTERN}, {"type": "number"}, {"type": "boolean"}], "nullable": True}
_RANGE_BOUND = {"anyOf": [{"type": "number"}, {"type": "string", "format": "date-time", "pattern": filters.RFC3339.pattern}]}
FILTER_SCHEMA = {
    "type": "object",
    "description": "Attribute filter: per attribute a scalar (equality) or an object of operators: `in` (a non-empty "
    "array of scalars), `gt`, `gte`, `lt`, `lte` (a number or an RFC 3339 timestamp; several allowed), `eq`; each "
    f"also with a `$` prefix. All conditions must hold. At most {filters.MAX_ATTRIBUTES} attributes of at most "
    f"{filters.MAX_OPERATORS} operators each, and {filters.MAX_IN_VALUES} `in` values in all.",
    "maxProperties": filters.MAX_ATTRIBUTES,
    "propertyNames": {"minLength": 1, "pattern": NO_NUL_PATTERN},
    "additionalProperties": {
        "anyOf": [
            _SCALAR,
            {
                "type": "object",
                "minProperties": 1,
                "maxProperties": filters.MAX_OPERATORS,
                "additionalProperties": False,
                "properties": {
                    **{name: _SCALAR for name in ("eq", "$eq")},
                    **{
                        name: {"type": "array", "minItems": 1, "maxItems": filters.MAX_IN_VALUES, "items": _SCALAR}
                        for name in ("in", "$in")
                    },
                    **{name: _RANGE_BOUND for op in ("gt", "gte", "lt", "lte") for name in (op, f"${op}")},
                },
            },
        ]
    },
}


@extend_schema_field(FILTER_SCHEMA)
class FilterField(serializers.JSONField):
    """Validated by apps.memories.filters (one compiler for both search modes)."""


@extend_schema_field({"type": "integer", "minimum": 0, "maximum": 10000, "default": 0})
class SearchOffsetField(serializers.JSONField):
    """Validated by apps.core.pagination.parse_offset."""


SEARCH_TYPES = ("auto", "semantic", "fulltext")
MAX_QUERIES = 8
MAX_PURPOSE_CHARS = 200
MAX_PER_QUERY_LIMIT = 100


class SearchQuerySerializer(StrictSerializer):
    """One question of a multi-query search (D11)."""

    text = StrictCharField(allow_blank=False, max_length=MAX_QUERY_CHARS)
    purpose = StrictCharField(
        required=False,
        allow_blank=False,
        max_length=MAX_PURPOSE_CHARS,
        help_text="Names the question in each item's matched_queries (the text does where it is absent)",
    )


class MemorySearchSerializer(StrictSerializer):
    """POST /v1/memories/search body. Unknown fields are rejected."""

    namespace_prefix = serializers.ListField(child=_segment_field())
    query = StrictCharField(required=False, allow_blank=False, max_length=MAX_QUERY_CHARS)
    queries = SearchQuerySerializer(
        many=True,
        required=False,
        allow_empty=False,
        max_length=MAX_QUERIES,
        help_text="Several questions at once (D11), exclusive with query: each is ranked alone, the lists are fused "
        "by reciprocal rank, and each item says in matched_queries which questions found it",
    )
    per_query_limit = StrictIntegerField(
        required=False,
        min_value=1,
        max_value=MAX_PER_QUERY_LIMIT,
        help_text="With queries: how many results each question contributes before fusion (default: limit)",
    )
    search_type = serializers.ChoiceField(
        choices=SEARCH_TYPES,
        required=False,
        help_text="With query or queries: auto (default; meaning and words together), semantic (meaning only) or "
        "fulltext (words only)",
    )
    filter = FilterField(required=False)
    limit = body_limit_field(SEARCH_LIMIT)(required=False)
    offset = SearchOffsetField(required=False)

    def validate(self, data: dict) -> dict:
        if "query" in data and "queries" in data:
            raise serializers.ValidationError({"queries": "query and queries are exclusive: send one of them"})
        if "per_query_limit" in data and "queries" not in data:
            raise serializers.ValidationError({"per_query_limit": "applies only to a search with queries"})
        if "search_type" in data and "query" not in data and "queries" not in data:
            raise serializers.ValidationError({"search_type": "applies only to a search with query or queries"})
        return data


_SEARCH_FIELDS = frozenset(("namespace_prefix", "query", "filter", "limit", "offset"))


def plainly_valid_search(data: Any) -> dict | None:
    """The search body as MemorySearchSerializer would return it, when it plainly passes, else None.

    The serializer costs about a seventh of an attribute search's CPU (issue 12) to accept what nearly every
    request sends; None sends the body through it, so every refusal keeps the serializer's error body. Its rules:
    an object of known fields; namespace_prefix a list of non-empty strings of at most MAX_SEGMENT_CHARS; query,
    when present, non-blank text of at most MAX_QUERY_CHARS (the serializer would strip surrounding whitespace:
    such a query goes through it); limit, when present, a JSON integer (its bounds are checked later, by
    parse_limit); filter and offset any non-null JSON (checked later by their own code). No string with NUL or a
    lone surrogate."""
    if type(data) is not dict or not data.keys() <= _SEARCH_FIELDS:
        return None
    prefix = data.get("namespace_prefix")
    if type(prefix) is not list or not all(
        type(segment) is str and _plainly_valid_segment(segment) for segment in prefix
    ):
        return None
    if "query" in data:
        query = data["query"]
        if not (
            type(query) is str
            and query
            and len(query) <= MAX_QUERY_CHARS
            and query == query.strip()
            and text_problem(query) is None
        ):
            return None
    if any(data.get(name, 0) is None for name in ("filter", "limit", "offset")):
        return None
    if type(data.get("limit", 0)) is not int:  # "5" is a string: body types are strict
        return None
    return data
