"""HTTP endpoints of conversations, entries, forks and their admin views. Thin: parse, call a service or selector,
shape the response. Path ids are checked here (a malformed UUID is 400, D1) so routes can match any segment."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.conversations import responses, selectors, serializers, services
from apps.conversations import search as conversation_search
from apps.conversations.openapi import entry_key_schema
from apps.core import audit, pagination
from apps.core.requests import flag_param, page_params, path_uuid, user_id_param, validated, window_params
from apps.core.serializers import NO_NUL_PATTERN, USER_ID_SCHEMA, cursor_parameter, error_responses, limit_parameter
from apps.core.shapes import page_of
from apps.identity.permissions import IsAuditor, IsIndexer, RoleChecked

CONVERSATION_ID = OpenApiParameter("conversationId", OpenApiTypes.UUID, OpenApiParameter.PATH)
AFTER_CURSOR = cursor_parameter()
CHANNEL = OpenApiParameter(
    "channel",
    str,
    enum=["history", "context"],
    description="Omitted: history entries plus the calling API-key client's own context entries",
)
# D11: entry lists read from either end. The cursors are the envelope's; tail and both cursors exclude each other.
BEFORE_CURSOR = OpenApiParameter(
    "beforeCursor",
    pagination.CURSOR_SCHEMA,
    description="A page's beforeCursor: the entries just before that page, still oldest first (opaque; absent or "
    "empty: not this mode). Not with afterCursor or tail=true (400).",
)
ENTRIES_AFTER_CURSOR = OpenApiParameter(
    "afterCursor",
    pagination.CURSOR_SCHEMA,
    description="A page's afterCursor: the entries just after that page (opaque; absent or empty: the first page). "
    "Not with beforeCursor or tail=true (400).",
)
TAIL = OpenApiParameter(
    "tail",
    bool,
    description="true: the newest page (the last `limit` entries), still oldest first; walk back with its "
    "beforeCursor. Not with afterCursor or beforeCursor (400).",
)
ENTRY_KEY = OpenApiParameter(
    "key",
    entry_key_schema("Only the entries appended with this key (absent or empty: every entry)", min_length=0),
)
ENTRIES_DESCRIPTION = (
    "Oldest first, from either end: the first page, a page after `afterCursor`, a page before `beforeCursor`, or "
    "the newest page (`tail=true`); every page is oldest first and carries `afterCursor` (the page after it) and "
    "`beforeCursor` (the page before it), each null when there is none. `key` keeps only the entries appended with "
    "that key. A fork shows its parent's entries before the fork point, then its own. "
)
# Not conversation ids: the collection's own routes (POST /v1/conversations/search, GET .../unindexed, POST .../index).
ID_SEGMENT = r"(?!search$|unindexed$|index$)[^/]+"


class ConversationViewSet(RoleChecked, viewsets.ViewSet):
    # apps.limits.throttling; creating takes its "creates" token in the services (an append may create).
    rate_kinds = {"search": "searches"}
    lookup_field = "conversationId"
    lookup_value_regex = ID_SEGMENT

    @extend_schema(
        tags=["conversations"],
        summary="List the caller's conversations",
        description="Only conversations the caller is a member of, newest first by updatedAt. `mode`: `all` "
        "(every conversation of every tree), `roots` (root conversations only), `latest-fork` (default: one per "
        "fork tree, the most recently updated). `query` filters titles (case-insensitive substring).",
        parameters=[
            OpenApiParameter("mode", str, enum=list(serializers.LIST_MODES)),
            OpenApiParameter(
                "query",
                {"type": "string", "maxLength": serializers.MAX_QUERY_CHARS, "pattern": NO_NUL_PATTERN},
                description="Case-insensitive title substring",
            ),
            AFTER_CURSOR,
            limit_parameter(serializers.CONVERSATIONS_LIMIT),
        ],
        responses={200: page_of(responses.ConversationListItem), **error_responses(400, 401)},
    )
    def list(self, request: Request) -> Response:
        params = request.query_params
        mode = serializers.list_mode(params.get("mode"))
        query = serializers.title_query(params.get("query"))
        cursor, limit = page_params(request, serializers.CONVERSATIONS_LIMIT)
        return Response(selectors.list_conversations(request.user, mode=mode, query=query, cursor=cursor, limit=limit))

    @extend_schema(
        tags=["conversations"],
        summary="Create a conversation",
        description="The caller becomes its owner. A client-chosen `id` that already exists is 409.",
        request=serializers.ConversationCreateSerializer,
        responses={201: responses.ConversationResponse, **error_responses(400, 401, 409)},
    )
    def create(self, request: Request) -> Response:
        data = validated(serializers.ConversationCreateSerializer, request.data)
        body = services.create_conversation(
            request.user, conversation_id=data.get("id"), title=data.get("title"), metadata=data.get("metadata")
        )
        return Response(body, status=201)

    @extend_schema(
        tags=["conversations"],
        summary="Get a conversation",
        parameters=[CONVERSATION_ID],
        responses={200: responses.ConversationResponse, **error_responses(400, 401, 403, 404)},
    )
    def retrieve(self, request: Request, conversationId: str) -> Response:
        return Response(selectors.get_conversation(request.user, path_uuid(conversationId, "conversationId")))

    @extend_schema(
        tags=["conversations"],
        summary="Update a conversation's title or metadata",
        description="Writer or above.",
        parameters=[CONVERSATION_ID],
        request=serializers.ConversationUpdateSerializer,
        responses={200: responses.ConversationResponse, **error_responses(400, 401, 403, 404)},
    )
    def partial_update(self, request: Request, conversationId: str) -> Response:
        conversation_id = path_uuid(conversationId, "conversationId")
        data = validated(serializers.ConversationUpdateSerializer, request.data)
        return Response(
            services.update_conversation(
                request.user, conversation_id, title=data.get("title"), metadata=data.get("metadata")
            )
        )

    @extend_schema(
        tags=["conversations"],
        summary="Delete a conversation",
        description="Owner only. Deleting a root deletes its whole fork tree with memberships and pending "
        "transfers; deleting a fork deletes it and the forks below it.",
        parameters=[CONVERSATION_ID],
        responses={204: None, **error_responses(400, 401, 403, 404)},
    )
    def destroy(self, request: Request, conversationId: str) -> Response:
        services.delete_conversation(request.user, path_uuid(conversationId, "conversationId"))
        return Response(status=204)

    @extend_schema(
        tags=["conversations"],
        summary="List a conversation's entries",
        description=ENTRIES_DESCRIPTION + "context entries are visible only to the API-key client that wrote them "
        "(channel=context without a client is 403).",
        parameters=[CONVERSATION_ID, CHANNEL, ENTRIES_AFTER_CURSOR, BEFORE_CURSOR, TAIL, ENTRY_KEY,
                    limit_parameter(serializers.ENTRIES_LIMIT)],
        responses={200: page_of(responses.EntryResponse, both_ways=True), **error_responses(400, 401, 403, 404)},
    )
    @action(detail=True, methods=["get"], url_path="entries")
    def entries(self, request: Request, conversationId: str) -> Response:
        conversation_id = path_uuid(conversationId, "conversationId")
        channel = serializers.channel_param(request.query_params.get("channel"))
        key = serializers.entry_key_param(request.query_params.get("key"))
        window = window_params(request, serializers.ENTRIES_LIMIT)
        return Response(selectors.list_entries(request.user, conversation_id, channel=channel, window=window, key=key))

    @extend_schema(
        tags=["conversations"],
        summary="Append an entry",
        description="Writer or above. An unknown conversation id creates the conversation, owned by the caller and "
        "titled from the first 40 characters of the first text (untitled when that first entry is a context entry: "
        "titles are read by every member); with forkedAtConversationId + forkedAtEntryId it "
        "creates a fork that sees the parent's entries before that entry (400 when the parent does not exist, the "
        "entry is not one of its history entries, or the id already exists with another fork point). "
        "context entries need an API-key client, are private to it, and are never indexed or searched "
        "(indexedContent on a context entry is 400).",
        parameters=[CONVERSATION_ID],
        request=serializers.EntryAppendSerializer,
        responses={201: responses.EntryResponse, **error_responses(400, 401, 403, 404, 413)},
    )
    @entries.mapping.post
    def append_entry(self, request: Request, conversationId: str) -> Response:
        conversation_id = path_uuid(conversationId, "conversationId")
        data = validated(serializers.EntryAppendSerializer, request.data)
        return Response(services.append_entry(request.user, conversation_id, data), status=201)

    @extend_schema(
        tags=["conversations"],
        summary="Search the caller's conversations",
        description="Over history entries' index text, in conversations the caller is a member of (decided in the "
        "query: pages are full). `searchType`: `auto` (default; full-text and semantic scores fused, "
        "CONVERSATION_SEARCH_SEMANTIC_WEIGHT * similarity + the rest * full-text score, over each method's best "
        "CONVERSATION_SEARCH_FUSION_DEPTH conversations; full-text alone while the embedding provider is down), "
        "`fulltext` (BM25: entries holding any of the query's English-stemmed words, rare words weighing more, "
        "counted over the caller's own conversations; the last bare word also as a prefix; `\"a phrase\"` must "
        "be present, `-word` must be absent) or `semantic` (503 while the embedding provider is down). "
        "One result per conversation, its best entry; `score` is in [0, 1], higher is better; `highlights` wraps matched terms in `**`. "
        "Pass `afterCursor` with the same query and searchType for the next page (another search's cursor is "
        "400). Entries are searchable once indexed: at once with `indexedContent`, otherwise within seconds "
        "(background indexer).",
        request=serializers.SearchSerializer,
        responses={200: page_of(responses.SearchResult), **error_responses(400, 401, 503)},
    )
    @action(detail=False, methods=["post"], url_path="search")
    def search(self, request: Request) -> Response:
        data = validated(serializers.SearchSerializer, request.data)
        limit = pagination.parse_limit(data.get("limit"), serializers.SEARCH_LIMIT)
        return Response(
            conversation_search.search(
                conversation_search.SearchScope(request.user.user_id),
                query=data["query"],
                search_type=data["searchType"],
                limit=limit,
                cursor=data.get("afterCursor") or None,
            )
        )

    @extend_schema(
        tags=["conversations"],
        summary="List history entries without index text (indexer role)",
        description="History entries of live conversations that have no index text yet, oldest first, for an "
        "external indexer that sets it with POST /v1/conversations/index. Indexer or admin role (403 otherwise).",
        parameters=[AFTER_CURSOR, limit_parameter(serializers.UNINDEXED_LIMIT)],
        responses={200: page_of(responses.UnindexedItem), **error_responses(400, 401, 403)},
    )
    @action(detail=False, methods=["get"], url_path="unindexed", permission_classes=[IsIndexer])
    def unindexed(self, request: Request) -> Response:
        cursor, limit = page_params(request, serializers.UNINDEXED_LIMIT)
        self.authorize(request)
        return Response(conversation_search.unindexed(cursor=cursor, limit=limit))

    @extend_schema(
        tags=["conversations"],
        summary="Set entries' search index text (indexer role)",
        description=f"A JSON array of 1 to {settings.CONVERSATION_INDEX_MAX_ITEMS} items. "
        "Replaces each named history entry's index text (full-text searchable at once; vectors follow "
        "from the background indexer). All or nothing: an item whose entry is not a history entry of that "
        "conversation makes the whole batch 404 (`details.entryIds`). Indexer or admin role (403 otherwise).",
        request=serializers.index_items_serializer(),
        responses={200: responses.IndexResponse, **error_responses(400, 401, 403, 404)},
    )
    @action(detail=False, methods=["post"], url_path="index", permission_classes=[IsIndexer])
    def index(self, request: Request) -> Response:
        items = validated(serializers.index_items_serializer, request.data)
        self.authorize(request)
        return Response(responses.IndexResponse.render(indexed=services.index_entries(items)))

    @extend_schema(
        tags=["conversations"],
        summary="List the conversation's fork tree",
        description="Every conversation of the tree, the root included, oldest first.",
        parameters=[CONVERSATION_ID, AFTER_CURSOR, limit_parameter(serializers.FORKS_LIMIT)],
        responses={200: page_of(responses.ForkItem), **error_responses(400, 401, 403, 404)},
    )
    @action(detail=True, methods=["get"], url_path="forks")
    def forks(self, request: Request, conversationId: str) -> Response:
        conversation_id = path_uuid(conversationId, "conversationId")
        cursor, limit = page_params(request, serializers.FORKS_LIMIT)
        return Response(selectors.forks(request.user, conversation_id, cursor=cursor, limit=limit))


class AdminConversationViewSet(RoleChecked, viewsets.ViewSet):
    """Auditor or admin role (403 for others); every call is audit-logged before it answers."""

    permission_classes = [IsAuditor]
    rate_kinds = {"search": "searches"}  # apps.limits.throttling
    lookup_field = "conversationId"
    lookup_value_regex = ID_SEGMENT

    @extend_schema(
        tags=["admin"],
        summary="List all conversations",
        description="Newest first by updatedAt. `userId` filters by owner; deleted conversations only with "
        "`includeDeleted=true`.",
        parameters=[
            OpenApiParameter("userId", USER_ID_SCHEMA, description="Owner filter"),
            OpenApiParameter("includeDeleted", bool),
            AFTER_CURSOR,
            limit_parameter(serializers.ADMIN_CONVERSATIONS_LIMIT),
        ],
        responses={200: page_of(responses.AdminConversation), **error_responses(400, 401, 403)},
    )
    def list(self, request: Request) -> Response:
        user_id = user_id_param(request.query_params.get("userId"), "userId")
        include_deleted = flag_param(request.query_params.get("includeDeleted"), "includeDeleted")
        cursor, limit = page_params(request, serializers.ADMIN_CONVERSATIONS_LIMIT)
        self.authorize(request)
        audit.record(
            request.user,
            "admin.conversations.list",
            params={"userId": user_id, "includeDeleted": include_deleted, "limit": limit, "afterCursor": bool(cursor)},
        )
        return Response(
            selectors.admin_list_conversations(
                user_id=user_id, include_deleted=include_deleted, cursor=cursor, limit=limit
            )
        )

    @extend_schema(
        tags=["admin"],
        summary="Get any conversation (deleted ones too, with deletedAt)",
        parameters=[CONVERSATION_ID],
        responses={200: responses.AdminConversation, **error_responses(400, 401, 403, 404)},
    )
    def retrieve(self, request: Request, conversationId: str) -> Response:
        conversation_id = path_uuid(conversationId, "conversationId")
        self.authorize(request)
        audit.record(request.user, "admin.conversations.get", target_id=str(conversation_id))
        return Response(selectors.admin_get_conversation(conversation_id))

    @extend_schema(
        tags=["admin"],
        summary="List any conversation's entries (all channels)",
        description=ENTRIES_DESCRIPTION + "Every channel of every client (channel filters).",
        parameters=[CONVERSATION_ID, CHANNEL, ENTRIES_AFTER_CURSOR, BEFORE_CURSOR, TAIL, ENTRY_KEY,
                    limit_parameter(serializers.ADMIN_ENTRIES_LIMIT)],
        responses={200: page_of(responses.EntryResponse, both_ways=True), **error_responses(400, 401, 403, 404)},
    )
    @action(detail=True, methods=["get"], url_path="entries")
    def entries(self, request: Request, conversationId: str) -> Response:
        conversation_id = path_uuid(conversationId, "conversationId")
        channel = serializers.channel_param(request.query_params.get("channel"))
        key = serializers.entry_key_param(request.query_params.get("key"))
        window = window_params(request, serializers.ADMIN_ENTRIES_LIMIT)
        self.authorize(request)
        audit.record(
            request.user,
            "admin.conversations.entries",
            target_id=str(conversation_id),
            params={"channel": channel, "limit": window.limit, "afterCursor": bool(window.after),
                    "beforeCursor": bool(window.before), "tail": window.tail, "key": key},
        )
        return Response(selectors.admin_list_entries(conversation_id, channel=channel, window=window, key=key))

    @extend_schema(
        tags=["admin"],
        summary="List any conversation's fork tree (deleted forks too)",
        parameters=[CONVERSATION_ID, AFTER_CURSOR, limit_parameter(serializers.ADMIN_FORKS_LIMIT)],
        responses={200: page_of(responses.ForkItem), **error_responses(400, 401, 403, 404)},
    )
    @action(detail=True, methods=["get"], url_path="forks")
    def forks(self, request: Request, conversationId: str) -> Response:
        conversation_id = path_uuid(conversationId, "conversationId")
        cursor, limit = page_params(request, serializers.ADMIN_FORKS_LIMIT)
        self.authorize(request)
        audit.record(
            request.user,
            "admin.conversations.forks",
            target_id=str(conversation_id),
            params={"limit": limit, "afterCursor": bool(cursor)},
        )
        return Response(selectors.admin_forks(conversation_id, cursor=cursor, limit=limit))

    @extend_schema(
        tags=["admin"],
        summary="Search all conversations",
        description="As POST /v1/conversations/search over every live conversation, whoever its members are. "
        "Audit-logged.",
        request=serializers.AdminSearchSerializer,
        responses={200: page_of(responses.SearchResult), **error_responses(400, 401, 403, 503)},
    )
    @action(detail=False, methods=["post"], url_path="search")
    def search(self, request: Request) -> Response:
        data = validated(serializers.AdminSearchSerializer, request.data)
        limit = pagination.parse_limit(data.get("limit"), serializers.ADMIN_SEARCH_LIMIT)
        self.authorize(request)
        audit.record(
            request.user,
            "admin.conversations.search",
            params={"query": data["query"], "searchType": data["searchType"], "limit": limit,
                    "afterCursor": bool(data.get("afterCursor"))},
        )
        return Response(
            conversation_search.search(
                conversation_search.SearchScope(None),
                query=data["query"],
                search_type=data["searchType"],
                limit=limit,
                cursor=data.get("afterCursor") or None,
            )
        )
