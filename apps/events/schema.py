"""``GET /v1/events`` in the OpenAPI schema.

The stream is served by the ASGI consumer (apps.events.consumer), which config.asgi routes before Django's URL map
is consulted, so there is no Django view for drf-spectacular to describe. This postprocessing hook (registered in
SPECTACULAR_SETTINGS, before apps.core.openapi.document_errors, which adds the D1 error bodies) adds the operation.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

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


def add_event_stream(result: dict[str, Any], generator, request, public) -> dict[str, Any]:
    result.setdefault("paths", {})["/v1/events"] = {
        "get": {
            "operationId": "events_stream",
            "summary": "Live event stream (server-sent events)",
            "description": _DESCRIPTION,
            "tags": ["events"],
            "parameters": [
                {
                    "in": "header",
                    "name": "Last-Event-ID",
                    "schema": {"type": "string"},
                    "description": "The last `id:` received, to resume after a disconnect",
                },
                {
                    "in": "query",
                    "name": "kinds",
                    "schema": {"type": "string"},
                    "description": "Comma-separated event kinds to receive: conversation, entry, membership "
                    "(default all)",
                },
            ],
            "responses": {
                "200": {
                    "description": "An endless stream of events",
                    "content": {
                        "text/event-stream": {
                            "schema": {"type": "string"},
                            "examples": {"Events": {"summary": "events", "value": _EXAMPLE}},
                        }
                    },
                },
                # D1's error body and description: apps.core.openapi.document_errors fills them in.
                "400": {},
                "401": {},
                "503": {},
            },
            "security": settings.SPECTACULAR_SETTINGS["SECURITY"],
        }
    }
    return result
