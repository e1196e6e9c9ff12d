"""HTTP endpoints of the memory store. Thin: validate, call a service or selector, shape the response."""

from __future__ import annotations

from datetime import UTC, datetime

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core import errors, pagination
from apps.core.requests import validated
from apps.core.serializers import cursor_parameter, error_responses, limit_parameter
from apps.memories import config, responses, search, selectors, serializers, services
from apps.memories.models import EventKind

# Query schemas as strict as the validation behind them (serializers.MemoryAddressSerializer, _segments): the fuzzer
# holds the server to them in both directions.
_SEGMENTS = {"type": "array", "items": serializers.SEGMENT_SCHEMA}
_NS_PARAM = OpenApiParameter(
    "ns",
    serializers.ADDRESS_NAMESPACE_SCHEMA,
    required=True,
    description=f"One per namespace segment, in order (at most {config.MAX_NAMESPACE_DEPTH}, the ceiling of the "
    "configured namespace depth: records written before the setting was lowered stay reachable)",
)
_KEY_PARAM = OpenApiParameter(
    "key", serializers.KEY_SCHEMA, required=True, description=serializers.KEY_SCHEMA["description"]
)


def _address(request: Request) -> tuple[list[str], str]:
    ns, key = request.query_params.getlist("ns"), request.query_params.get("key")
    if serializers.plainly_valid_address(ns, key):
        return ns, key
    data: dict = {"ns": ns}
    if key is not None:
        data["key"] = key
    address = validated(serializers.MemoryAddressSerializer, data)
    return address["ns"], address["key"]


class MemoriesView(APIView):
    @extend_schema(
        tags=["memories"],
        summary="Upsert a memory",
        description="Creates or replaces the memory at (namespace, key). Every write is a new version with a new id. "
        "The value is encrypted at rest and never echoed. Indexing for semantic search is asynchronous: each `index` "
        "field (up to 256 fields, 256 KiB of text in all) is embedded, a field longer than the model's input window "
        "as overlapping chunks covering all of it.",
        request=serializers.MemoryWriteSerializer,
        responses={200: responses.MemoryWriteResponse, **error_responses(400, 401, 403, 413)},
    )
    def put(self, request: Request) -> Response:
        data = validated(serializers.MemoryWriteSerializer, request.data)
        result = services.put_memory(
            request.user,
            namespace=data["namespace"],
            key=data["key"],
            value=data["value"],
            index=data.get("index"),
            ttl_seconds=data.get("ttl_seconds"),
        )
        return Response(responses.MemoryWriteResponse.from_object(result))

    @extend_schema(
        tags=["memories"],
        summary="Read one memory",
        parameters=[_NS_PARAM, _KEY_PARAM],
        responses={200: responses.MemoryResponse, **error_responses(400, 401, 403, 404, 500)},
    )
    def get(self, request: Request) -> Response:
        namespace, key = _address(request)
        return Response(selectors.get_memory(request.user, namespace=namespace, key=key))

    @extend_schema(
        tags=["memories"],
        summary="Delete one memory",
        description="Idempotent: 204 whenever the caller is authorized, whether or not a record existed.",
        parameters=[_NS_PARAM, _KEY_PARAM],
        responses={204: None, **error_responses(400, 401, 403)},
    )
    def delete(self, request: Request) -> Response:
        namespace, key = _address(request)
        services.delete_memory(request.user, namespace=namespace, key=key)
        return Response(status=204)


class MemorySearchView(APIView):
    rate_kinds = {"post": "searches"}  # apps.limits.throttling
    @extend_schema(
        tags=["memories"],
        summary="Attribute-filter or semantic search",
        description="Without `query`: attribute filter over the primary store, newest first, `score` null, paged "
        "by `offset` (0..10000). With `query`: semantic search (cosine similarity in [0, 1], best first; a memory "
        "scores by its best index field, or best chunk of a long field, and appears once). The "
        "filter policy narrows `namespace_prefix` and adds its attribute filter.",
        request=serializers.MemorySearchSerializer,
        responses={200: responses.MemorySearchResponse, **error_responses(400, 401, 503)},
    )
    def post(self, request: Request) -> Response:
        data = serializers.plainly_valid_search(request.data)
        if data is None:
            data = validated(serializers.MemorySearchSerializer, request.data)
        limit = pagination.parse_limit(data.get("limit"), serializers.SEARCH_LIMIT)
        offset = pagination.parse_offset(data.get("offset"))
        if "query" in data or "queries" in data:
            items = search.search(request.user, **search.arguments(data), limit=limit, offset=offset)
        else:
            items = selectors.search_by_attributes(
                request.user,
                namespace_prefix=data["namespace_prefix"],
                filter=data.get("filter"),
                limit=limit,
                offset=offset,
            )
        return Response(responses.MemorySearchResponse.render(items=items))


def _int_param(request: Request, name: str, minimum: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)  # "" included: an empty value is malformed (D1), not absent
    except ValueError:
        raise errors.validation_error({name: f"must be an integer >= {minimum}"}) from None
    if value < minimum:
        raise errors.validation_error({name: f"must be an integer >= {minimum}"})
    return value


def _max_depth_param(request: Request) -> int | None:
    # Any depth beyond the deepest possible namespace truncates nothing; capping keeps the SQL slice bound an int4.
    value = _int_param(request, "max_depth", 1)
    return None if value is None else min(value, 2**31 - 1)


def _segments(request: Request, name: str) -> list[str]:
    segments = request.query_params.getlist(name)
    for segment in segments:
        if not segment or "\x00" in segment:
            raise errors.validation_error({name: "segments must be non-empty strings"})
        # No stored namespace has a longer segment (D4): a longer one is a malformed request, as on writes.
        if len(segment) > serializers.MAX_SEGMENT_CHARS:
            raise errors.validation_error({name: f"segments must be at most {serializers.MAX_SEGMENT_CHARS} characters"})
    return segments


class NamespacesView(APIView):
    @extend_schema(
        tags=["memories"],
        summary="List namespaces",
        description="Namespaces holding at least one active record, sorted. `prefix` and `suffix` are repeated "
        "once per segment; `max_depth` truncates each result from the root (after suffix matching), then results "
        "are de-duplicated.",
        parameters=[
            OpenApiParameter("prefix", _SEGMENTS, description="One per segment, in order"),
            OpenApiParameter("suffix", _SEGMENTS, description="One per segment, in order"),
            OpenApiParameter("max_depth", {"type": "integer", "minimum": 1}, description=">= 1"),
        ],
        responses={200: responses.NamespacesResponse, **error_responses(400, 401)},
    )
    def get(self, request: Request) -> Response:
        namespaces = selectors.list_namespaces(
            request.user,
            prefix=_segments(request, "prefix"),
            suffix=_segments(request, "suffix"),
            max_depth=_max_depth_param(request),
        )
        return Response(responses.NamespacesResponse.render(namespaces=namespaces))


def _timestamp_param(request: Request, name: str) -> datetime | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        value = datetime.fromisoformat(raw)  # "" included: an empty value is malformed (D1), not absent
        # In UTC now: 9999-12-31T23:59-01:00 parses but lies beyond the last representable instant.
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
    except (ValueError, OverflowError):
        raise errors.validation_error({name: "must be an ISO 8601 timestamp"}) from None


# What _kinds_param takes in one value: known kinds, comma-separated, blanks around them and empty items ignored.
_KIND = "(?:" + "|".join(EventKind.values) + ")"
_KINDS_PATTERN = rf"^\s*(?:{_KIND}\s*)?(?:,\s*(?:{_KIND}\s*)?)*$"


def _kinds_param(request: Request) -> list[str] | None:
    kinds = [kind.strip() for raw in request.query_params.getlist("kinds") for kind in raw.split(",") if kind.strip()]
    unknown = sorted(set(kinds) - set(EventKind.values))
    if unknown:
        raise errors.validation_error({"kinds": f"unknown kind(s): {', '.join(unknown)}; use add, update, delete, expired"})
    return kinds or None


class MemoryEventsView(APIView):
    @extend_schema(
        tags=["memories"],
        summary="Memory event timeline",
        description="Events in timeline order: each address's events in the order its writes happened, and an "
        "event after every event whose write had finished before its own began. `after_cursor` in the response is "
        "never null: it points after the last event returned, or, on an empty page, at the end of the timeline as "
        "read, so a client keeps polling with it and never misses an event that commits later (an event becomes "
        "readable once every write that began before it has finished: milliseconds). Scoped like reads.",
        parameters=[
            OpenApiParameter("ns", _SEGMENTS, description="Namespace prefix, one per segment"),
            OpenApiParameter(
                "kinds",
                {"type": "array", "items": {"type": "string", "pattern": _KINDS_PATTERN}},
                description="add, update, delete, expired; repeated or comma-separated",
            ),
            OpenApiParameter("after", OpenApiTypes.DATETIME, description="Strict lower bound on occurred_at"),
            OpenApiParameter("before", OpenApiTypes.DATETIME, description="Strict upper bound on occurred_at"),
            cursor_parameter("after_cursor"),
            limit_parameter(serializers.EVENTS_LIMIT),
        ],
        responses={200: responses.MemoryEventsResponse, **error_responses(400, 401)},
    )
    def get(self, request: Request) -> Response:
        query = selectors.EventQuery(
            namespace_prefix=_segments(request, "ns"),
            kinds=_kinds_param(request),
            after=_timestamp_param(request, "after"),
            before=_timestamp_param(request, "before"),
            after_cursor=request.query_params.get("after_cursor") or None,
            limit=pagination.parse_limit(request.query_params.get("limit"), serializers.EVENTS_LIMIT),
        )
        return Response(selectors.list_events(request.user, query))
