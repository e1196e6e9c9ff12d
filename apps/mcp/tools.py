"""The MCP tools (D11): each one the REST operation it names, acting as the caller through the same serializers,
services, selectors and policies; no rule lives here.

A tool is its arguments (a serializer: validation and the ``inputSchema``), the REST response serializer it answers
with (the ``outputSchema``; the answer is the REST body itself) and a handler that calls the app's service or
selector as the REST view does. Arguments are named as the REST fields (D11): memory tools in snake_case as the
memory API, conversation tools in snake_case too (``conversation_id``, ``after_cursor``), while their results keep
the conversation API's camelCase bodies (``afterCursor`` of a page is passed back as ``after_cursor``).

Where a tool's arguments differ from the REST body they stand for (the conversation tools), the handler builds that
body and validates it once more with the REST serializer (``validated_as``), so its cross-field rules and size
limits apply unchanged, and a refusal names the tool's argument.

``call`` runs in a request thread (apps.mcp.server), between Django's request signals, like a REST view.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.conversations import responses as conversation_responses
from apps.conversations import search as conversation_search
from apps.conversations import selectors as conversation_selectors
from apps.conversations import serializers as conversation_serializers
from apps.conversations import services as conversation_services
from apps.conversations.models import Channel
from apps.core import errors, pagination
from apps.core.pagination import CURSOR_SCHEMA
from apps.core.serializers import (
    NonBlankCharField,
    StrictCharField,
    StrictChoiceField,
    StrictIntegerField,
    StrictSerializer,
    StrictUUIDField,
    body_limit_field,
)
from apps.core.shapes import page_of
from apps.identity.principal import Principal
from apps.mcp import schema
from apps.memories import config as memory_config
from apps.memories import responses as memory_responses
from apps.memories import search as memory_search
from apps.memories import selectors as memory_selectors
from apps.memories import serializers as memory_serializers
from apps.memories import services as memory_services
from apps.memories.models import EventKind

Handler = Callable[[Principal, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Tool:
    name: str
    title: str
    description: str
    arguments: type[serializers.Serializer]
    result: type[serializers.Serializer]
    handler: Handler
    read_only: bool
    destructive: bool = False
    idempotent: bool = False
    # REST field -> argument, for refusals that name the REST field (the body the handler built, a cursor).
    names: Mapping[str, str] = field(default_factory=dict)
    # Arguments the handler checks itself before the serializer (the fast path of get/delete); see _address.
    fast_arguments: Callable[[Mapping[str, Any]], dict[str, Any] | None] | None = field(default=None, repr=False)

    def annotations(self) -> dict[str, Any]:
        """MCP tool annotations: hints for the client (whether to ask the user first), never a security boundary."""
        hints: dict[str, Any] = {"title": self.title, "readOnlyHint": self.read_only, "openWorldHint": False}
        if not self.read_only:
            hints["destructiveHint"] = self.destructive
            hints["idempotentHint"] = self.idempotent
        return hints

    def input_schema(self, namespace_depth: int | None = None) -> dict[str, Any]:
        """The arguments' JSON Schema; a namespace to write is capped at ``namespace_depth`` (the setting in force),
        else at the ceiling of that setting."""
        return schema.with_namespace_depth(
            schema.serializer_schema(self.arguments, "request"), namespace_depth or memory_config.MAX_NAMESPACE_DEPTH
        )

    def output_schema(self) -> dict[str, Any]:
        return schema.tool_schema(self.result, "response")


# --- Validation -----------------------------------------------------------------------------------------------------


def validated_as(serializer_class: type[serializers.Serializer], data: Any) -> dict[str, Any]:
    """``data`` validated by ``serializer_class``; a refusal is D1's 400 naming the fields (or the serializer's own
    413)."""
    serializer = serializer_class(data=data)
    try:
        serializer.is_valid(raise_exception=True)
    except serializers.ValidationError as exc:
        raise errors.from_exception(exc) from None
    return serializer.validated_data


def renamed(error: errors.ApiError, names: Mapping[str, str]) -> errors.ApiError:
    """``error`` with the REST field names of its ``details.fields`` replaced by the tool's argument names (a REST
    serializer's refusal, or a cursor the selector refused as ``afterCursor``)."""
    fields = (error.details or {}).get("fields")
    if names and isinstance(fields, dict):
        error.details["fields"] = {_renamed(name, names): problem for name, problem in fields.items()}
    return error


def _renamed(field_name: str, names: Mapping[str, str]) -> str:
    # "content[0]" and "ns.1" keep their suffix: only the leading field name is the argument's. The first match wins.
    for source, target in names.items():
        if field_name == source or field_name.startswith((f"{source}[", f"{source}.")):
            return target + field_name[len(source) :]
    return field_name


def _arguments_object(arguments: Any) -> dict[str, Any]:
    if arguments is None:
        return {}
    if not isinstance(arguments, dict):
        raise errors.validation_error({"arguments": "must be an object"})
    return arguments


# --- Memory tools ---------------------------------------------------------------------------------------------------


def _segments_field(**kwargs: Any) -> serializers.ListField:
    """Namespace segments to match (a prefix or a suffix): as many as asked, each as an address's segment."""
    return serializers.ListField(
        child=StrictCharField(
            max_length=memory_serializers.MAX_SEGMENT_CHARS, allow_blank=False, trim_whitespace=False
        ),
        **kwargs,
    )


class MemoryAddressArguments(StrictSerializer):
    """get_memory, delete_memory: a namespace up to the ceiling of the depth setting (records written before it was
    lowered stay reachable, as over REST) and a key."""

    namespace = memory_serializers.NamespaceField(min_length=1)
    key = memory_serializers.MemoryKeyField()


def _address(arguments: Mapping[str, Any]) -> dict[str, Any] | None:
    """The address as MemoryAddressArguments would return it when it plainly passes (the REST GET's fast path,
    memory_serializers.plainly_valid_address), else None: the serializer then decides, with its error body."""
    namespace, key = arguments.get("namespace"), arguments.get("key")
    if (
        arguments.keys() == {"namespace", "key"}
        and type(namespace) is list
        and all(type(segment) is str for segment in namespace)
        and type(key) is str
        and memory_serializers.plainly_valid_address(namespace, key)
    ):
        return {"namespace": namespace, "key": key}
    return None


def put_memory(principal: Principal, data: dict[str, Any]) -> dict[str, Any]:
    result = memory_services.put_memory(
        principal,
        namespace=data["namespace"],
        key=data["key"],
        value=data["value"],
        index=data.get("index"),
        ttl_seconds=data.get("ttl_seconds"),
    )
    return memory_responses.MemoryWriteResponse.from_object(result)


def get_memory(principal: Principal, data: dict[str, Any]) -> dict[str, Any]:
    return memory_selectors.get_memory(principal, namespace=data["namespace"], key=data["key"])


class DeleteMemoryResult(serializers.Serializer):
    namespace = serializers.ListField(child=serializers.CharField())
    key = serializers.CharField()
    deleted = serializers.BooleanField(
        help_text="Always true: no memory is left at the address. Idempotent, as DELETE /v1/memories: it does not "
        "say whether one was there"
    )


def delete_memory(principal: Principal, data: dict[str, Any]) -> dict[str, Any]:
    memory_services.delete_memory(principal, namespace=data["namespace"], key=data["key"])
    return {"namespace": data["namespace"], "key": data["key"], "deleted": True}


# The fields of MemorySearchSerializer that search_memories passes on. The serializer is the tool's arguments (and
# schema), so a field added to the REST body appears in the tool at once; until it is handled here too it is
# refused, never silently dropped (tests/mcp/test_units.py fails meanwhile).
SEARCH_FIELDS_HANDLED = frozenset(
    {"namespace_prefix", "query", "queries", "per_query_limit", "search_type", "filter", "limit", "offset"}
)


def search_memories(principal: Principal, data: dict[str, Any]) -> dict[str, Any]:
    # MemorySearchView.post, over the same serializer: its branches go here beside the view's (D11's `queries` too).
    unhandled = sorted(set(data) - SEARCH_FIELDS_HANDLED)
    if unhandled:
        raise errors.validation_error({name: "not supported by this tool yet" for name in unhandled})
    limit = pagination.parse_limit(data.get("limit"), memory_serializers.SEARCH_LIMIT)
    offset = pagination.parse_offset(data.get("offset"))
    if "query" in data or "queries" in data:
        items = memory_search.search(principal, **memory_search.arguments(data), limit=limit, offset=offset)
    else:
        items = memory_selectors.search_by_attributes(
            principal, namespace_prefix=data["namespace_prefix"], filter=data.get("filter"), limit=limit, offset=offset
        )
    return {"items": items}


class ListNamespacesArguments(StrictSerializer):
    """GET /v1/memories/namespaces: prefix (here namespace_prefix, D11's name), suffix, max_depth."""

    namespace_prefix = _segments_field(required=False, help_text="Only namespaces starting with these segments")
    suffix = _segments_field(required=False, help_text="Only namespaces ending with these segments")
    max_depth = StrictIntegerField(required=False, min_value=1, help_text="Truncate each namespace to this depth")


def list_namespaces(principal: Principal, data: dict[str, Any]) -> dict[str, Any]:
    max_depth = data.get("max_depth")
    namespaces = memory_selectors.list_namespaces(
        principal,
        prefix=data.get("namespace_prefix", []),
        suffix=data.get("suffix", []),
        # Any depth beyond the deepest namespace truncates nothing; the SQL slice bound is an int4 (as REST).
        max_depth=None if max_depth is None else min(max_depth, 2**31 - 1),
    )
    return {"namespaces": namespaces}


@extend_schema_field({"type": "string", "format": "date-time"})
class TimestampField(serializers.Field):
    """An ISO 8601 timestamp, read as the REST query's (apps.memories.views._timestamp_param): UTC when it names no
    zone."""

    default_error_messages = {"invalid": "must be an ISO 8601 timestamp"}

    def to_internal_value(self, data: Any) -> datetime:
        if not isinstance(data, str):
            self.fail("invalid")
        try:
            value = datetime.fromisoformat(data)
            return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
        except (ValueError, OverflowError):
            self.fail("invalid")


@extend_schema_field(CURSOR_SCHEMA)
class CursorArgument(serializers.Field):
    """An opaque cursor from a previous page; checked by the list's own decoder, as over REST."""

    default_error_messages = {"invalid": "must be a cursor string from a previous page"}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str) or len(data) > pagination.MAX_CURSOR_CHARS:
            self.fail("invalid")
        return data


class ListMemoryEventsArguments(StrictSerializer):
    """GET /v1/memories/events: ns (here namespace_prefix), kinds, after, before, after_cursor, limit."""

    namespace_prefix = _segments_field(required=False, help_text="Only events under these namespace segments")
    kinds = serializers.ListField(child=StrictChoiceField(choices=EventKind.values), required=False)
    after = TimestampField(required=False, help_text="Strict lower bound on occurred_at")
    before = TimestampField(required=False, help_text="Strict upper bound on occurred_at")
    after_cursor = CursorArgument(required=False, help_text="after_cursor of the previous page; never null")
    limit = body_limit_field(memory_serializers.EVENTS_LIMIT)(required=False)


def list_memory_events(principal: Principal, data: dict[str, Any]) -> dict[str, Any]:
    query = memory_selectors.EventQuery(
        namespace_prefix=data.get("namespace_prefix", []),
        kinds=data.get("kinds") or None,
        after=data.get("after"),
        before=data.get("before"),
        after_cursor=data.get("after_cursor") or None,
        limit=pagination.parse_limit(data.get("limit"), memory_serializers.EVENTS_LIMIT),
    )
    return memory_selectors.list_events(principal, query)


# --- Conversation tools ---------------------------------------------------------------------------------------------


class ListConversationsArguments(StrictSerializer):
    """GET /v1/conversations: mode, query (title substring), after_cursor, limit."""

    mode = StrictChoiceField(choices=conversation_serializers.LIST_MODES, required=False, default="latest-fork")
    query = StrictCharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        max_length=conversation_serializers.MAX_QUERY_CHARS,
        help_text="Case-insensitive title substring",
    )
    after_cursor = CursorArgument(required=False, help_text="afterCursor of the previous page")
    limit = body_limit_field(conversation_serializers.CONVERSATIONS_LIMIT)(required=False)


def list_conversations(principal: Principal, data: dict[str, Any]) -> dict[str, Any]:
    return conversation_selectors.list_conversations(
        principal,
        mode=data["mode"],
        query=conversation_serializers.title_query(data.get("query")),
        cursor=data.get("after_cursor") or None,
        limit=pagination.parse_limit(data.get("limit"), conversation_serializers.CONVERSATIONS_LIMIT),
    )


class CreateConversationArguments(StrictSerializer):
    """POST /v1/conversations: id (here conversation_id), title, metadata."""

    conversation_id = StrictUUIDField(required=False, help_text="Client-chosen id; an existing id is a conflict")
    title = conversation_serializers.TitleField(required=False)
    metadata = conversation_serializers.MetadataField(required=False)


def create_conversation(principal: Principal, data: dict[str, Any]) -> dict[str, Any]:
    body = {name: data[name] for name in ("title", "metadata") if name in data}
    if "conversation_id" in data:
        body["id"] = str(data["conversation_id"])
    body = validated_as(conversation_serializers.ConversationCreateSerializer, body)
    return conversation_services.create_conversation(
        principal, conversation_id=body.get("id"), title=body.get("title"), metadata=body.get("metadata")
    )


class StrictBooleanField(serializers.BooleanField):
    """A JSON boolean: no "true", 1 or null (DRF's BooleanField takes them; a tool's arguments are JSON)."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class ListEntriesArguments(StrictSerializer):
    """GET /v1/conversations/{id}/entries: channel, after_cursor, before_cursor, tail (D11), limit."""

    conversation_id = StrictUUIDField()
    channel = StrictChoiceField(
        choices=Channel.values,
        required=False,
        help_text="Omitted: history entries plus the calling API-key client's own context entries",
    )
    after_cursor = CursorArgument(
        required=False, help_text="afterCursor of a page: the entries after it. Not with before_cursor or tail"
    )
    before_cursor = CursorArgument(
        required=False,
        help_text="beforeCursor of a page: the entries before it, still oldest first. Not with after_cursor or tail",
    )
    tail = StrictBooleanField(
        required=False,
        help_text="true: the newest page (the last `limit` entries), still oldest first; walk back with its "
        "beforeCursor. Not with after_cursor or before_cursor",
    )
    limit = body_limit_field(conversation_serializers.ENTRIES_LIMIT)(required=False)


_ENTRIES_NAMES = {"afterCursor": "after_cursor", "beforeCursor": "before_cursor"}


def list_entries(principal: Principal, data: dict[str, Any]) -> dict[str, Any]:
    return conversation_selectors.list_entries(
        principal, data["conversation_id"], channel=data.get("channel"), window=_entry_window(data)
    )


def _entry_window(data: dict[str, Any]) -> pagination.Window:
    """The page of list_entries the arguments ask for, by the REST list's rule (one of after_cursor, before_cursor
    and tail=true at most: a 400 naming them)."""
    return pagination.window_of(
        pagination.parse_limit(data.get("limit"), conversation_serializers.ENTRIES_LIMIT),
        after=data.get("after_cursor"),
        before=data.get("before_cursor"),
        tail=data.get("tail", False),
        names=("after_cursor", "before_cursor", "tail"),
    )


class AppendEntryArguments(StrictSerializer):
    """POST /v1/conversations/{id}/entries with one content item ``{role, text}`` (the upstream MCP server's note
    shape)."""

    conversation_id = StrictUUIDField(help_text="An unknown id creates the conversation, owned by the caller")
    text = StrictCharField(allow_blank=True, trim_whitespace=False, help_text="The entry's text")
    role = StrictChoiceField(choices=conversation_serializers.ROLES, required=False, default="USER")
    channel = StrictChoiceField(
        choices=Channel.values,
        required=False,
        default=Channel.HISTORY,
        help_text="context: private to the calling API-key client (needs X-API-Key), never searched",
    )


def append_entry(principal: Principal, data: dict[str, Any]) -> dict[str, Any]:
    body = {"channel": data["channel"], "content": [{"role": data["role"], "text": data["text"]}]}
    body = validated_as(conversation_serializers.EntryAppendSerializer, body)
    return conversation_services.append_entry(principal, data["conversation_id"], body)


class SearchConversationsArguments(StrictSerializer):
    """POST /v1/conversations/search: query, search_type (searchType), after_cursor (afterCursor), limit."""

    query = NonBlankCharField(
        max_length=settings.CONVERSATION_SEARCH_QUERY_MAX_CHARS,
        help_text="Words to find. Full-text: any word matches, rare ones weigh more; \"quoted phrase\" required, -word "
        "excluded",
    )
    search_type = StrictChoiceField(
        choices=conversation_serializers.SEARCH_TYPES,
        required=False,
        help_text="auto (default: full-text and semantic fused), fulltext or semantic",
    )
    after_cursor = CursorArgument(required=False, help_text="afterCursor of the previous page, same query")
    limit = body_limit_field(conversation_serializers.SEARCH_LIMIT)(required=False)


_SEARCH_NAMES = {"afterCursor": "after_cursor", "searchType": "search_type"}


def search_conversations(principal: Principal, data: dict[str, Any]) -> dict[str, Any]:
    body = {rest: data[argument] for rest, argument in _SEARCH_NAMES.items() if argument in data}
    body.update({name: data[name] for name in ("query", "limit") if name in data})
    body = validated_as(conversation_serializers.SearchSerializer, body)
    return conversation_search.search(
        conversation_search.SearchScope(principal.user_id),
        query=body["query"],
        search_type=body["searchType"],
        limit=pagination.parse_limit(body.get("limit"), conversation_serializers.SEARCH_LIMIT),
        cursor=body.get("afterCursor") or None,
    )


# --- The registry ---------------------------------------------------------------------------------------------------

TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in (
        Tool(
            "put_memory",
            "Save a memory",
            "Create or replace the memory at (namespace, key), as PUT /v1/memories. `value` is any JSON object, "
            "stored encrypted; `index` maps field names to text embedded for semantic search (search_memories with a "
            "query); `ttl_seconds` makes it expire. Under the default policy a caller writes only under "
            "[\"user\", <their user id>, ...].",
            memory_serializers.MemoryWriteSerializer,
            memory_responses.MemoryWriteResponse,
            put_memory,
            read_only=False,
            destructive=True,  # replaces the memory at that address
            idempotent=True,
        ),
        Tool(
            "get_memory",
            "Read a memory",
            "The memory at (namespace, key) with its value, as GET /v1/memories.",
            MemoryAddressArguments,
            memory_responses.MemoryResponse,
            get_memory,
            read_only=True,
            fast_arguments=_address,
        ),
        Tool(
            "delete_memory",
            "Delete a memory",
            "Delete the memory at (namespace, key), as DELETE /v1/memories. Idempotent: it succeeds whether or not a "
            "memory was there.",
            MemoryAddressArguments,
            DeleteMemoryResult,
            delete_memory,
            read_only=False,
            destructive=True,
            idempotent=True,
            fast_arguments=_address,
        ),
        Tool(
            "search_memories",
            "Search memories",
            "Memories under `namespace_prefix` the caller may read, as POST /v1/memories/search. With `query`: "
            "ranked by meaning and words (`score` in [0, 1], best first; `search_type` semantic or fulltext for one "
            "of them); `queries` asks several questions at once and says in `matched_queries` which found each. Without: newest first, by attribute `filter` only. "
            "Page with `limit` and `offset`.",
            memory_serializers.MemorySearchSerializer,
            memory_responses.MemorySearchResponse,
            search_memories,
            read_only=True,
        ),
        Tool(
            "list_namespaces",
            "List memory namespaces",
            "Namespaces holding at least one memory the caller may read, sorted, as GET /v1/memories/namespaces "
            "(`namespace_prefix` is its `prefix`).",
            ListNamespacesArguments,
            memory_responses.NamespacesResponse,
            list_namespaces,
            read_only=True,
        ),
        Tool(
            "list_memory_events",
            "List memory events",
            "The timeline of memory writes (add, update, delete, expired) the caller may read, as GET "
            "/v1/memories/events (`namespace_prefix` is its `ns`). Pass the answer's `after_cursor` back to "
            "continue; it is never null, so polling with it never misses an event.",
            ListMemoryEventsArguments,
            memory_responses.MemoryEventsResponse,
            list_memory_events,
            read_only=True,
        ),
        Tool(
            "list_conversations",
            "List conversations",
            "The caller's conversations, newest first, as GET /v1/conversations. Pass the page's `afterCursor` "
            "as `after_cursor` for the next page.",
            ListConversationsArguments,
            page_of(conversation_responses.ConversationListItem),
            list_conversations,
            names={"afterCursor": "after_cursor"},
            read_only=True,
        ),
        Tool(
            "create_conversation",
            "Create a conversation",
            "A new conversation owned by the caller, as POST /v1/conversations.",
            CreateConversationArguments,
            conversation_responses.ConversationResponse,
            create_conversation,
            names={"id": "conversation_id"},
            read_only=False,
        ),
        Tool(
            "list_entries",
            "List a conversation's entries",
            "A conversation's entries, oldest first, as GET /v1/conversations/{id}/entries. Pass the page's "
            "`afterCursor` as `after_cursor` for the next page; `tail: true` gives the newest page (still oldest "
            "first), and its `beforeCursor` as `before_cursor` the page before it. At most one of the three.",
            ListEntriesArguments,
            page_of(conversation_responses.EntryResponse, both_ways=True),
            list_entries,
            names=_ENTRIES_NAMES,
            read_only=True,
        ),
        Tool(
            "append_entry",
            "Append to a conversation",
            "Append one entry `{role, text}` to a conversation, as POST /v1/conversations/{id}/entries (writer "
            "access or above). An unknown conversation id creates the conversation, owned by the caller.",
            AppendEntryArguments,
            conversation_responses.EntryResponse,
            append_entry,
            names={"content[0].text": "text", "content[0]": "text", "content": "text"},
            read_only=False,
        ),
        Tool(
            "search_conversations",
            "Search conversations",
            "The caller's conversations whose entries match `query`, best first, as POST /v1/conversations/search "
            "(one result per conversation, its best entry). Pass the page's `afterCursor` as `after_cursor`.",
            SearchConversationsArguments,
            page_of(conversation_responses.SearchResult),
            search_conversations,
            names=_SEARCH_NAMES,
            read_only=True,
        ),
    )
}


def call(principal: Principal, tool: Tool, arguments: Any) -> dict[str, Any]:
    """Validate ``arguments`` and run ``tool`` as ``principal``; raises errors.ApiError (D1) on any refusal."""
    arguments = _arguments_object(arguments)
    data = tool.fast_arguments(arguments) if tool.fast_arguments is not None else None
    try:
        if data is None:
            data = validated_as(tool.arguments, arguments)
        return tool.handler(principal, data)
    except errors.ApiError as error:
        raise renamed(error, tool.names) from None
