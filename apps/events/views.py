"""``GET /v1/events`` in the URL map: the OpenAPI description of the stream, and a plain-WSGI fallback.

Served through config.asgi (uvicorn, gunicorn + uvicorn workers, daphne for runserver), the path never reaches
this view: apps.events.consumer answers it natively. This view answers only where a request comes in through
Django's WSGI handler itself (Django's test client, a WSGI-only deployment). It authenticates exactly like the
consumer and streams the same events, keepalives and resume, but holds one server thread per client and skips the
connection limit and slow-consumer eviction; deploy the ASGI application for real traffic.
"""

from __future__ import annotations

from collections.abc import Iterator

import redis
from django.conf import settings
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.views import APIView

from apps.core import errors
from apps.core.redis_client import get_client
from apps.core.serializers import error_responses
from apps.events import streams

_DESCRIPTION = """Server-sent events (`text/event-stream`) for the caller's conversations (D8).

Each event is an `id:` line (a resumable position), one `data:` line holding
`{"event": "created|updated|deleted", "kind": "conversation|entry|membership", "data": {...}}` and a blank line.
`data` carries ids only (`conversationId`, `entryId`, `userId`, `accessLevel`), never entry content.

- Conversation and entry events go to every member of the conversation when the change commits; membership events
  to the affected user and the conversation's owners and managers.
- `: keepalive` comment lines arrive every `SSE_KEEPALIVE_SECONDS` (15 s) of silence.
- Reconnect with `Last-Event-ID` to replay what was missed within `SSE_RETENTION_SECONDS` (300 s); past that the
  stream starts with `{"event": "invalidate", "kind": "stream", "data": {}}`: refetch, then follow the stream.
- A user may hold `SSE_MAX_CONNECTIONS_PER_USER` (5) streams; opening another closes the oldest after
  `{"event": "evicted", "kind": "stream", "data": {"reason": "connection_limit"}}`. A client that falls
  `SSE_BUFFER_EVENTS` (256) events behind gets `{"event": "evicted", ..., "data": {"reason": "slow_consumer"}}`
  and is disconnected. Events of kind `stream` carry no `id:` and pass every `kinds` filter.
"""

_EXAMPLE = (
    "id: 1732350000000-0\n"
    'data: {"event":"created","kind":"entry","data":{"conversationId":"3f1c...","entryId":"9a2e..."}}\n\n'
    ": keepalive\n\n"
)


class EventStreamView(APIView):
    @extend_schema(
        tags=["events"],
        summary="Live event stream (server-sent events)",
        description=_DESCRIPTION,
        operation_id="events_stream",
        parameters=[
            OpenApiParameter(
                "kinds",
                OpenApiTypes.STR,
                description="Comma-separated event kinds to receive: conversation, entry, membership (default all)",
                required=False,
            ),
            OpenApiParameter(
                "Last-Event-ID",
                OpenApiTypes.STR,
                location=OpenApiParameter.HEADER,
                description="The last `id:` received, to resume after a disconnect",
                required=False,
            ),
        ],
        responses={
            (200, "text/event-stream"): OpenApiResponse(
                OpenApiTypes.STR,
                description="An endless stream of events",
                examples=[OpenApiExample("events", value=_EXAMPLE, media_type="text/event-stream")],
            ),
            **error_responses(400, 401, 503),
        },
    )
    def get(self, request: Request) -> StreamingHttpResponse:
        try:
            kinds = streams.parse_kinds(request.query_params.get("kinds"))
        except ValueError as exc:
            raise errors.validation_error({"kinds": str(exc)}) from None
        user_id = request.user.user_id
        try:
            last = get_client().xrevrange(streams.stream_key(user_id), count=1)
        except redis.RedisError:
            raise errors.unavailable("The event stream is temporarily unavailable.") from None
        position = last[0][0].decode() if last else "0-0"
        response = StreamingHttpResponse(
            _stream(user_id, kinds, request.headers.get("Last-Event-ID", "").strip(), position),
            content_type="text/event-stream; charset=utf-8",
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response


def _stream(user_id: str, kinds: frozenset[str] | None, last_event_id: str, position: str) -> Iterator[bytes]:
    key = streams.stream_key(user_id)
    client = get_client()

    def wanted(fields: dict[bytes, bytes]) -> bytes | None:
        payload = fields.get(b"e")
        if payload is None:
            return None
        kind = streams.kind_of(payload)
        return payload if kinds is None or kind == streams.STREAM_KIND or kind in kinds else None

    if last_event_id:
        entries = []
        if streams.resumable(last_event_id):
            entries = client.xrange(key, min=last_event_id, max=position if position != "0-0" else "+")
        if not entries or entries[0][0].decode() != last_event_id:
            yield streams.sse_block(streams.stream_event("invalidate"))
        else:
            for raw_id, fields in entries[1:]:
                if (payload := wanted(fields)) is not None:
                    yield streams.sse_block(payload, raw_id.decode())
    keepalive_ms = int(settings.SSE_KEEPALIVE_SECONDS * 1000)
    # Its own connection: a blocking read must not hold one of the shared pool's.
    reader = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=keepalive_ms / 1000 + 5)
    try:
        while True:
            result = reader.xread({key: position}, count=256, block=keepalive_ms)
            if not result:
                yield streams.KEEPALIVE
                continue
            for raw_id, fields in result[0][1]:
                position = raw_id.decode()
                if (payload := wanted(fields)) is not None:
                    yield streams.sse_block(payload, position)
    finally:
        reader.close()
