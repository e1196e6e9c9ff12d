"""The conversation endpoints' OpenAPI details that serializers cannot state: the entry append body as its two
exact shapes. Registered on import (apps.conversations.apps)."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.extensions import OpenApiSerializerExtension

from apps.conversations.models import Channel
from apps.conversations.serializers import (
    ENTRY_KEY_MAX_CHARS,
    ENTRY_KEY_PATTERN,
    HISTORY_CONTENT_TYPE_PATTERN,
    MAX_CONTENT_TYPE_CHARS,
    ROLES,
)
from apps.core.serializers import NO_NUL_PATTERN


class EntryAppendSchema(OpenApiSerializerExtension):
    """The append body as two exact shapes (history / context), so clients and fuzzers know what is accepted."""

    target_class = "apps.conversations.serializers.EntryAppendSerializer"
    priority = 1  # over the generic StrictSerializer extension

    def get_name(self, auto_schema, direction):
        return "EntryAppend"  # + "Request" (COMPONENT_SPLIT_REQUEST)

    def map_serializer(self, auto_schema, direction):
        return entry_append_schema()


def entry_key_schema(description: str, *, min_length: int = 1) -> dict:
    return {
        "type": "string",
        "minLength": min_length,
        "maxLength": ENTRY_KEY_MAX_CHARS,
        "pattern": ENTRY_KEY_PATTERN if min_length else ENTRY_KEY_PATTERN.replace("+", "*"),
        "description": description,
    }


def entry_append_schema() -> dict:
    uuid_schema = {"type": "string", "format": "uuid"}
    indexed_content = {
        "type": ["string", "null"],
        "pattern": NO_NUL_PATTERN,
        "description": f"Search index text, at most {settings.CONVERSATION_INDEXED_CONTENT_MAX_BYTES} bytes",
    }
    common = {
        "forkedAtConversationId": {**uuid_schema, "description": "Only with a new id: fork this conversation"},
        "forkedAtEntryId": {**uuid_schema, "description": "Only with a new id: the fork sees entries before it"},
        "key": entry_key_schema(
            "A lookup key of your choice: GET .../entries?key= lists the entries that carry it (several may). "
            "Stored in plaintext and shown with the entry: no secrets."
        ),
    }
    together = {"forkedAtConversationId": ["forkedAtEntryId"], "forkedAtEntryId": ["forkedAtConversationId"]}
    items = {"minItems": 1, "maxItems": settings.CONVERSATION_ENTRY_MAX_ITEMS}
    history_item = {
        "type": "object",
        "description": "Client data, stored (encrypted) and returned exactly as sent; any other field (events, "
        "type, ...) is kept. text is what search indexes; attachmentId and attachments[].attachmentId link "
        "uploaded attachments to the entry (readable by the conversation's readers, no longer expiring).",
        "properties": {
            "role": {"type": "string", "enum": list(ROLES)},
            "text": {"type": "string"},
            "attachmentId": uuid_schema,
            "attachments": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"attachmentId": uuid_schema},
                    "additionalProperties": True,
                },
            },
        },
        "required": ["role"],
        "additionalProperties": True,
    }
    history = {
        "type": "object",
        "title": "HistoryEntryAppend",
        "properties": {
            "channel": {"type": "string", "const": Channel.HISTORY.value, "default": Channel.HISTORY.value},
            "contentType": {
                "type": "string",
                "pattern": HISTORY_CONTENT_TYPE_PATTERN,
                "maxLength": MAX_CONTENT_TYPE_CHARS,
                "default": "history",
                "description": "history, or history/<flavour> (history/vercelai, history/lc4j, ...)",
            },
            "content": {"type": "array", "items": history_item, **items},
            "indexedContent": indexed_content,
            **common,
        },
        "required": ["content"],
        "additionalProperties": False,
        "dependentRequired": together,
    }
    context = {
        "type": "object",
        "title": "ContextEntryAppend",
        "description": "Needs an API-key client (X-API-Key); visible only to that client. Never indexed or "
        "searched (no indexedContent: 400) and never the source of a conversation's title; an attachment it "
        "references is readable by its uploader and, through the same client, by the conversation's readers.",
        "properties": {
            "channel": {"type": "string", "const": Channel.CONTEXT.value},
            "contentType": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_CONTENT_TYPE_CHARS,
                "pattern": NO_NUL_PATTERN,
                "default": "context",
            },
            "content": {"type": "array", "items": {"type": "object", "additionalProperties": True}, **items},
            **common,
        },
        "required": ["channel", "content"],
        "additionalProperties": False,
        "dependentRequired": together,
    }
    return {
        "oneOf": [history, context],
        "description": f"content serialized as JSON may take at most {settings.CONVERSATION_ENTRY_MAX_CONTENT_BYTES} "
        "bytes (413 beyond)",
    }
