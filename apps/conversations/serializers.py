"""Request validation of the conversation endpoints (camelCase, as the interface says): the bodies, whose
serializers reject unknown fields (D1), and the query parameters. Response shapes: apps.conversations.responses;
the append body's exact schema: apps.conversations.openapi."""

from __future__ import annotations

import json
import re
from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.conversations.models import Channel
from apps.core import errors
from apps.core.pagination import CURSOR_SCHEMA, LimitBounds
from apps.core.serializers import (
    JsonObjectField,
    NonBlankCharField,
    StrictCharField,
    StrictChoiceField,
    StrictSerializer,
    StrictUUIDField,
    body_limit_field,
    json_value_problem,
)

ROLES = ("USER", "AI")
MAX_CONTENT_TYPE_CHARS = 128
# D10: "history", or "history/<flavour>" for a client's richer item format (history/vercelai, history/lc4j).
HISTORY_CONTENT_TYPE_PATTERN = r"^history(/[!-~]+)?$"
_HISTORY_CONTENT_TYPE = re.compile(HISTORY_CONTENT_TYPE_PATTERN)
MAX_QUERY_CHARS = 500
# Each list's limit bounds (the interface's limits table), named by its view (and by the MCP tool that mirrors it).
CONVERSATIONS_LIMIT = LimitBounds(default=20, maximum=200)
ENTRIES_LIMIT = LimitBounds(default=50, maximum=200)
FORKS_LIMIT = LimitBounds(default=50, maximum=200)
SEARCH_LIMIT = LimitBounds(default=20, maximum=200)  # in the request body
UNINDEXED_LIMIT = LimitBounds(default=100, maximum=200)
ADMIN_CONVERSATIONS_LIMIT = LimitBounds(default=100, maximum=1000)
ADMIN_ENTRIES_LIMIT = LimitBounds(default=50, maximum=1000)
ADMIN_FORKS_LIMIT = LimitBounds(default=50, maximum=1000)
ADMIN_SEARCH_LIMIT = LimitBounds(default=20, maximum=1000)  # in the request body
# An entry's lookup key (D11): printable ASCII without spaces, so it is safe in a URL query and in logs as is.
ENTRY_KEY_MAX_CHARS = 256
ENTRY_KEY_PATTERN = r"^[!-~]+$"
_ENTRY_KEY = re.compile(ENTRY_KEY_PATTERN)
ENTRY_KEY_RULE = f"1 to {ENTRY_KEY_MAX_CHARS} printable ASCII characters, no spaces"


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


class TitleField(StrictCharField):
    def __init__(self, **kwargs: Any) -> None:
        # max_length documents the limit in OpenAPI; to_internal_value checks the live setting.
        super().__init__(
            allow_blank=True, trim_whitespace=False, max_length=settings.CONVERSATION_TITLE_MAX_CHARS, **kwargs
        )

    def to_internal_value(self, data: Any) -> str:
        title = super().to_internal_value(data)
        if len(title) > settings.CONVERSATION_TITLE_MAX_CHARS:
            raise serializers.ValidationError(f"must be at most {settings.CONVERSATION_TITLE_MAX_CHARS} characters")
        return title


@extend_schema_field({"type": "object", "additionalProperties": True})
class MetadataField(JsonObjectField):
    def to_internal_value(self, data: Any) -> dict:
        if not isinstance(data, dict):
            self.fail("invalid")
        # jsonb holds any integer but no NUL character.
        problem = json_value_problem(data, int64=False)
        if problem:
            raise serializers.ValidationError(problem)
        metadata = data
        if _json_bytes(metadata) > settings.CONVERSATION_METADATA_MAX_BYTES:
            raise serializers.ValidationError(f"must be at most {settings.CONVERSATION_METADATA_MAX_BYTES} bytes as JSON")
        return metadata


class ConversationCreateSerializer(StrictSerializer):
    """POST /v1/conversations body. Unknown fields are rejected."""

    id = StrictUUIDField(required=False, help_text="Client-chosen id; an existing id is 409")
    title = TitleField(required=False)
    metadata = MetadataField(required=False)


class ConversationUpdateSerializer(StrictSerializer):
    """PATCH /v1/conversations/{id} body: the fields to change. Unknown fields are rejected."""

    title = TitleField(required=False)
    metadata = MetadataField(required=False)


@extend_schema_field(
    {
        "type": "array",
        "minItems": 1,
        "items": {"type": "object", "additionalProperties": True},
        "description": "history items: {role: USER|AI, text?: string, attachmentId?: uuid, "
        "attachments?: [{attachmentId?: uuid, ...}], ...any other fields}; context items: any JSON objects",
    }
)
class ContentField(serializers.Field):
    """The content array. Its per-channel rules need the channel, so EntryAppendSerializer.validate finishes it."""

    def to_internal_value(self, data: Any) -> list:
        if not isinstance(data, list) or not data:
            raise serializers.ValidationError("must be a non-empty array of objects")
        if len(data) > settings.CONVERSATION_ENTRY_MAX_ITEMS:
            raise serializers.ValidationError(f"must have at most {settings.CONVERSATION_ENTRY_MAX_ITEMS} items")
        for item in data:
            if not isinstance(item, dict):
                raise serializers.ValidationError("must be a non-empty array of objects")
        # Stored encrypted, so any JSON will do that encodes as UTF-8 and renders back (finite numbers).
        problem = json_value_problem(data, int64=False, nul=False)
        if problem:
            raise serializers.ValidationError(problem)
        return data

    def to_representation(self, value: list) -> list:
        return value


class EntryAppendSerializer(StrictSerializer):
    """POST /v1/conversations/{id}/entries body (its OpenAPI shape: EntryAppendSchema). Unknown fields are
    rejected."""

    channel = serializers.ChoiceField(choices=Channel.values, required=False, default=Channel.HISTORY)
    contentType = StrictCharField(required=False, allow_blank=False, max_length=MAX_CONTENT_TYPE_CHARS)
    content = ContentField()
    indexedContent = StrictCharField(required=False, allow_null=True, allow_blank=True, trim_whitespace=False)
    forkedAtConversationId = StrictUUIDField(required=False)
    forkedAtEntryId = StrictUUIDField(required=False)
    key = StrictCharField(required=False, trim_whitespace=False, max_length=ENTRY_KEY_MAX_CHARS)

    def validate_key(self, value: str) -> str:
        if not _ENTRY_KEY.match(value):
            raise serializers.ValidationError(f"must be {ENTRY_KEY_RULE}")
        return value

    def validate_indexedContent(self, value: str | None) -> str | None:
        if value is not None and len(value.encode("utf-8", "surrogatepass")) > settings.CONVERSATION_INDEXED_CONTENT_MAX_BYTES:
            raise serializers.ValidationError(f"must be at most {settings.CONVERSATION_INDEXED_CONTENT_MAX_BYTES} bytes")
        if value is not None and json_value_problem(value):
            raise serializers.ValidationError(json_value_problem(value))
        return value

    def validate(self, data: dict) -> dict:
        channel = data["channel"]
        content_type = data.get("contentType")
        if channel == Channel.HISTORY:
            if content_type is None:
                data["contentType"] = "history"
            elif not _HISTORY_CONTENT_TYPE.match(content_type):
                raise serializers.ValidationError(
                    {"contentType": "must be 'history' or 'history/<flavour>' on the history channel"}
                )
            for index, item in enumerate(data["content"]):
                problem = _history_item_problem(item)
                if problem:
                    raise serializers.ValidationError({f"content[{index}]": problem})
        else:
            if "indexedContent" in data:
                # Search is shared by every member; a context entry is private to its API-key client (D5), so it is
                # never indexed: no index text, no vectors, nothing a search could return.
                raise serializers.ValidationError(
                    {"indexedContent": "only history entries are indexed; context entries are never searchable"}
                )
            if content_type is None:
                data["contentType"] = channel
        if ("forkedAtConversationId" in data) != ("forkedAtEntryId" in data):
            missing = "forkedAtEntryId" if "forkedAtConversationId" in data else "forkedAtConversationId"
            raise serializers.ValidationError({missing: "forkedAtConversationId and forkedAtEntryId go together"})
        if _json_bytes(data["content"]) > settings.CONVERSATION_ENTRY_MAX_CONTENT_BYTES:
            raise errors.payload_too_large(
                f"content exceeds {settings.CONVERSATION_ENTRY_MAX_CONTENT_BYTES} bytes serialized as JSON"
            )
        return data


def _history_item_problem(item: dict) -> str | None:
    """Items are client data (D10), stored and returned as sent: only the fields the service reads are checked,
    ``role``, ``text`` (the search index text and the title) and the attachment references."""
    if item.get("role") not in ROLES:
        return "role must be USER or AI"
    if "text" in item and not isinstance(item["text"], str):
        return "text must be a string"
    if "attachmentId" in item and not _is_uuid(item["attachmentId"]):
        return "attachmentId must be a UUID string"
    if "attachments" in item:
        attachments = item["attachments"]
        if not isinstance(attachments, list) or not all(isinstance(ref, dict) for ref in attachments):
            return "attachments must be an array of objects"
        for position, ref in enumerate(attachments):
            if "attachmentId" in ref and not _is_uuid(ref["attachmentId"]):
                return f"attachments[{position}].attachmentId must be a UUID string"
    return None


def _is_uuid(value: Any) -> bool:
    try:
        StrictUUIDField().to_internal_value(value)
    except serializers.ValidationError:
        return False
    return True


# --- Search (D5) ------------------------------------------------------------------------------------------------

SEARCH_TYPES = ("auto", "fulltext", "semantic")


@extend_schema_field(
    {**CURSOR_SCHEMA, "minLength": 1,
     "description": "The previous page's afterCursor (same query and searchType); null or absent: the first page"}
)
class CursorField(serializers.JSONField):
    """A cursor string or null; apps.core.pagination.decode_cursor checks the string (and refuses anything not made
    by this search)."""

    def to_internal_value(self, data: Any) -> str | None:
        if data is not None and (not isinstance(data, str) or not data):
            raise serializers.ValidationError("malformed cursor")
        return data


class SearchSerializer(StrictSerializer):
    """POST /v1/conversations/search body. Unknown fields are rejected; ``limit`` is checked by the view with
    apps.core.pagination.parse_limit."""

    query = NonBlankCharField(
        max_length=settings.CONVERSATION_SEARCH_QUERY_MAX_CHARS,
        help_text="Words to find (not blank). Full-text: any of the words matches (rare ones weigh more); "
        "\"a quoted phrase\" must be present, -word must be absent; the last bare word also matches as a prefix. "
        "Semantic: embedded as a whole.",
    )
    limit = body_limit_field(SEARCH_LIMIT)(required=False)
    afterCursor = CursorField(required=False, allow_null=True)
    searchType = StrictChoiceField(
        choices=SEARCH_TYPES,
        required=False,
        default="auto",
        help_text="auto (default: full-text and semantic scores fused), fulltext (BM25) or semantic",
    )


class AdminSearchSerializer(SearchSerializer):
    limit = body_limit_field(ADMIN_SEARCH_LIMIT)(required=False)


class IndexItemSerializer(StrictSerializer):
    """One item of POST /v1/conversations/index."""

    conversationId = StrictUUIDField()
    entryId = StrictUUIDField()
    indexedContent = StrictCharField(
        allow_blank=True,
        trim_whitespace=False,
        help_text=f"Replaces the entry's index text; at most {settings.CONVERSATION_INDEXED_CONTENT_MAX_BYTES} bytes",
    )

    def validate_indexedContent(self, value: str) -> str:
        if len(value.encode("utf-8")) > settings.CONVERSATION_INDEXED_CONTENT_MAX_BYTES:
            raise serializers.ValidationError(f"must be at most {settings.CONVERSATION_INDEXED_CONTENT_MAX_BYTES} bytes")
        return value


_SCHEMA_ONLY = object()


def index_items_serializer(data: Any = _SCHEMA_ONLY) -> serializers.ListSerializer:
    """The body of POST /v1/conversations/index: 1..CONVERSATION_INDEX_MAX_ITEMS items (no argument: for the
    OpenAPI schema, whose minItems/maxItems apps.core.openapi.ServiceAutoSchema states)."""
    kwargs = {} if data is _SCHEMA_ONLY else {"data": data}
    return IndexItemSerializer(
        many=True, allow_empty=False, max_length=settings.CONVERSATION_INDEX_MAX_ITEMS, **kwargs
    )


# --- Query parameters (boolean and user id ones: apps.core.requests) ----------------------------------------

LIST_MODES = ("all", "roots", "latest-fork")


def list_mode(raw: str | None) -> str:
    if raw is None or raw == "":
        return "latest-fork"
    if raw not in LIST_MODES:
        raise errors.validation_error({"mode": "must be one of all, roots, latest-fork"})
    return raw


def title_query(raw: str | None) -> str | None:
    if raw is None or raw == "":
        return None
    if len(raw) > MAX_QUERY_CHARS or "\x00" in raw:
        raise errors.validation_error({"query": f"must be at most {MAX_QUERY_CHARS} characters without NUL"})
    return raw


def entry_key_param(raw: str | None) -> str | None:
    """The ``key`` filter of an entry list: absent or empty is no filter."""
    if raw is None or raw == "":
        return None
    if len(raw) > ENTRY_KEY_MAX_CHARS or not _ENTRY_KEY.match(raw):
        raise errors.validation_error({"key": f"must be {ENTRY_KEY_RULE}"})
    return raw


def channel_param(raw: str | None) -> str | None:
    if raw is None or raw == "":
        return None
    if raw not in Channel.values:
        raise errors.validation_error({"channel": "must be history or context"})
    return raw
