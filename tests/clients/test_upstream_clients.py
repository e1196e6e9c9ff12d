"""The upstream project's clients (chirino/memory-service: its TypeScript SDK for the Vercel AI SDK and its Python
LangChain package) work against us as D10 decides: their requests replayed byte for byte over HTTP.

What they send, from their sources: every request carries ``X-API-Key`` (empty when no key is configured:
``"X-API-Key": config.apiKey`` with ``apiKey ?? ""``); history entries are ``{"channel": "history",
"contentType": "history/vercelai" | "history", "content": [{"role", "text"?, "events"?}]}`` (the TypeScript SDK
leaves ``text`` out when there is none, ``JSON.stringify`` dropping ``undefined``); items may reference files as
``attachments: [{"attachmentId": ...}]``; downloads revalidate with ``If-None-Match``.
"""

from __future__ import annotations

import http.client
import json
import uuid
from typing import Any

import pytest

from tests.live_service import LiveService

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_tables_after_module")]


class Upstream:
    """A raw HTTP client sending exactly their headers: Authorization plus an empty X-API-Key."""

    def __init__(self, live_service: LiveService, user: str) -> None:
        self.port = int(live_service.base_url.rsplit(":", 1)[1])
        self.headers = {"Authorization": f"Bearer {live_service.token(user)}", "X-API-Key": ""}

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            all_headers = {**self.headers, **(headers or {})}
            payload = None
            if body is not None:
                payload = body if isinstance(body, bytes) else json.dumps(body).encode()
                all_headers.setdefault("Content-Type", "application/json")
            connection.request(method, path, body=payload, headers=all_headers)
            response = connection.getresponse()
            return response.status, {name.lower(): value for name, value in response.getheaders()}, response.read()
        finally:
            connection.close()


def test_their_typescript_sdks_turns_are_stored_as_sent(live_service: LiveService) -> None:
    ts = Upstream(live_service, "bob")
    conversation_id = str(uuid.uuid4())
    user_turn = {"channel": "history", "contentType": "history", "content": [{"role": "USER", "text": "Weather?"}]}
    status, _, body = ts.request("POST", f"/v1/conversations/{conversation_id}/entries", user_turn)
    assert status == 201, body
    # appendHistoryEventsEntry: the AI's turn as coalesced stream events, history/vercelai, no text.
    events = [
        {"type": "text-delta", "id": "0", "delta": "Sunny"},
        {"type": "tool-call", "toolCallId": "c1", "toolName": "weather", "input": {"city": "Lisbon"}},
        {"type": "finish", "finishReason": "stop", "totalUsage": {"inputTokens": 12, "outputTokens": 3}},
    ]
    ai_turn = {"channel": "history", "contentType": "history/vercelai",
               "content": [{"role": "AI", "events": events}], "indexedContent": "Sunny"}
    status, _, body = ts.request("POST", f"/v1/conversations/{conversation_id}/entries", ai_turn)
    assert status == 201, body
    stored = json.loads(body)
    assert (stored["contentType"], stored["content"]) == ("history/vercelai", ai_turn["content"])

    status, _, body = ts.request("GET", f"/v1/conversations/{conversation_id}/entries")
    assert status == 200
    listed = json.loads(body)["data"]
    assert [(e["contentType"], e["content"]) for e in listed] == [
        ("history", user_turn["content"]), ("history/vercelai", ai_turn["content"])
    ]


def test_their_python_packages_turns_and_attachments(live_service: LiveService) -> None:
    py = Upstream(live_service, "bob")
    upload = (
        b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n"
        b"Content-Type: text/plain\r\n\r\nattached\r\n--b--\r\n"
    )
    status, _, body = py.request("POST", "/v1/attachments", upload, {"Content-Type": "multipart/form-data; boundary=b"})
    assert status == 201, body
    attachment = json.loads(body)
    conversation_id = str(uuid.uuid4())
    # _append_history with events, and an item referencing the upload the way their Attachment type does.
    turn = {"channel": "history", "contentType": "history",
            "content": [{"role": "AI", "text": "Here it is",
                         "events": [{"eventType": "PartialResponse", "chunk": "Here it is"}],
                         "attachments": [{"attachmentId": attachment["id"], "contentType": "text/plain",
                                          "name": "a.txt"}]}]}
    status, _, body = py.request("POST", f"/v1/conversations/{conversation_id}/entries", turn)
    assert status == 201, body
    assert json.loads(body)["content"] == turn["content"]

    # A reader of the conversation may fetch the linked file, and revalidating it keeps its caching headers.
    status, _, body = py.request("POST", f"/v1/conversations/{conversation_id}/memberships",
                                 {"userId": "charlie", "accessLevel": "reader"})
    assert status == 201, body
    reader = Upstream(live_service, "charlie")
    status, headers, body = reader.request("GET", f"/v1/attachments/{attachment['id']}")
    assert (status, body) == (200, b"attached")
    status, revalidated, body = reader.request(
        "GET", f"/v1/attachments/{attachment['id']}", headers={"If-None-Match": headers["etag"]}
    )
    assert (status, body) == (304, b"")
    assert (revalidated["cache-control"], revalidated["etag"]) == (headers["cache-control"], headers["etag"])


def test_the_event_stream_takes_their_empty_api_key(live_service: LiveService) -> None:
    client = Upstream(live_service, "bob")
    connection = http.client.HTTPConnection("127.0.0.1", client.port, timeout=30)
    try:
        connection.request("GET", "/v1/events?kinds=entry", headers={**client.headers, "Accept": "text/event-stream"})
        response = connection.getresponse()
        assert response.status == 200
        assert response.getheader("Content-Type").startswith("text/event-stream")
    finally:
        connection.close()
