"""The Python client's pure parts, without a server: the SSE parser, error decoding, request encoding and the OAuth
grant's request (as the identity provider sees it)."""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import parse_qs

import httpx
import pytest
from memory_service import (
    APIError,
    Entry,
    Me,
    Memory,
    NotFoundError,
    OAuthToken,
    SearchResult,
    ServerError,
    StreamEvent,
    ValidationError,
)
from memory_service import _operations as ops
from memory_service._base import ClientConfig, Close, Read, RetryPolicy, Send, Sleep, Token, exchange
from memory_service._sse import SSEParser, decode
from memory_service.errors import error_from_response


def test_sse_parser_follows_the_event_stream_format() -> None:
    parser = SSEParser()
    lines = [": keepalive", "", "id: 5-0", 'data: {"event": "created", "kind": "entry",', 'data:  "data": {"a": 1}}',
             "", 'data: {"event": "invalidate", "kind": "stream", "data": {}}', "", "data: not json", "", "retry: 5"]
    raw = [event for line in lines if (event := parser.feed(line)) is not None]
    events = [decode(item) for item in raw]
    assert events[0] == StreamEvent("created", "entry", {"a": 1}, "5-0")
    assert events[1] is not None and events[1].is_invalidate and events[1].id is None  # no id: of its own
    assert events[2] is None  # not the service's JSON: skipped
    evicted = StreamEvent.from_json({"event": "evicted", "kind": "stream", "data": {"reason": "slow_consumer"}})
    assert evicted.is_evicted and evicted.reason == "slow_consumer"


def test_errors_from_the_d1_body_and_from_anything_else() -> None:
    body = b'{"code": "validation_error", "error": "Bad.", "requestId": "r1", "details": {"fields": {"key": "x"}}}'
    error = error_from_response(400, httpx.Headers({"X-Request-ID": "r1"}), body)
    assert isinstance(error, ValidationError) and isinstance(error, APIError)
    assert (error.code, error.message, error.request_id, error.fields) == ("validation_error", "Bad.", "r1", {"key": "x"})
    denied = error_from_response(403, httpx.Headers(), b'{"code": "forbidden", "error": "No.", "requestId": "r", "reason": "policy"}')
    assert denied.reason == "policy"
    proxy = error_from_response(502, httpx.Headers({"x-request-id": "p"}), b"<html>Bad gateway</html>")
    assert isinstance(proxy, ServerError) and (proxy.code, proxy.request_id) == ("http_502", "p")
    assert isinstance(error_from_response(404, httpx.Headers(), b""), NotFoundError)


def test_answers_are_read_by_their_fields() -> None:
    """camelCase keys (snake_case for memories), timestamps parsed, nested models built; a field with a default may
    be absent, one that may be None is None when absent, any other must be there; unknown keys are ignored."""
    entry = {"id": "e", "conversationId": "c", "userId": "u", "channel": "history", "contentType": "history",
             "content": [{"role": "USER"}], "createdAt": "2026-01-02T03:04:05Z", "new": "ignored"}
    hit = SearchResult.from_json({"conversationId": "c", "conversationTitle": "t", "entryId": "e", "score": 0.5,
                                  "highlights": "**t**", "entry": entry})
    assert hit.entry.created_at == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC) and hit.entry.content_type == "history"
    memory = Memory.from_json({"id": "m", "namespace": ["user", "bob"], "key": "k", "value": {}, "attributes": None,
                               "created_at": "2026-01-02T03:04:05+00:00"})
    assert (memory.namespace, memory.expires_at) == (("user", "bob"), None)
    assert Me.from_json({"userId": "bob"}) == Me("bob", None, (), False, False, False)
    with pytest.raises(KeyError):
        Entry.from_json({"id": "e"})


def test_requests_are_encoded_as_the_schema_says() -> None:
    call = ops.list_memory_events(namespace=("user", "bob"), kinds=["add", "update"],
                                  after=datetime(2026, 1, 2, tzinfo=UTC), limit=5)
    assert call.params == [("ns", "user"), ("ns", "bob"), ("kinds", "add,update"),
                           ("after", "2026-01-02T00:00:00+00:00"), ("limit", "5")]
    assert ops.get_memory(["a", "b"], "k/1").params == [("ns", "a"), ("ns", "b"), ("key", "k/1")]
    assert ops.remove_membership("c1", "a/b").path == "/v1/conversations/c1/memberships/a%2Fb"
    assert ops.admin_list_conversations(include_deleted=False).params == [("includeDeleted", "false")]
    body = ops.append_entry("c", [{"role": "USER", "text": "hi"}], content_type="history/lc4j").json
    assert body == {"contentType": "history/lc4j", "content": [{"role": "USER", "text": "hi"}]}
    with pytest.raises(TypeError):
        ops.put_memory("user", "k", {})
    with pytest.raises(TypeError):
        ops.append_entry("c", {"role": "USER", "text": "hi"})  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ops.download_signed("/v1/attachments/123")
    assert ops.upload_attachment(b"x", expires_in=90).params == [("expiresIn", "90")]
    with pytest.raises(ValueError, match="transfer_id"):
        ops.get_transfer("")
    downloads = [ops.download_attachment("a/1", if_none_match='"e"'),
                 ops.admin_download_attachment("a/1", if_none_match='"e"'),
                 ops.download_signed("/v1/attachments/download/t/f.txt", if_none_match='"e"')]
    assert [call.path for call in downloads] == [
        "/v1/attachments/a%2F1", "/v1/admin/attachments/a%2F1", "/v1/attachments/download/t/f.txt"]
    assert [call.authenticated for call in downloads] == [True, True, False]  # a signed link sends no credentials
    for call in downloads:
        assert (call.method, call.idempotent, call.accept, call.follow_redirects) == ("GET", True, {304}, True)
        assert call.headers == {"Accept": "*/*", "If-None-Match": '"e"'}
    assert ops.download_attachment("a").headers == {"Accept": "*/*"}


def test_an_exchange_is_the_steps_both_clients_perform() -> None:
    """The retry and refresh decisions, without I/O: a 503 is read, closed, waited out (Retry-After) and sent
    again; a 401 invalidates a callable token and asks it again, once."""
    asked: list[str] = []

    class Source:
        def __call__(self) -> str:
            return "unused"

        def invalidate(self) -> None:
            asked.append("invalidate")

    config = ClientConfig("http://service.test", Source(), None, RetryPolicy(max_retries=1), None)
    steps = exchange(config, ops.get_memory(["a"], "k"))
    assert next(steps) == Token()
    send = steps.send("t1")
    assert isinstance(send, Send) and send.request["headers"]["Authorization"] == "Bearer t1"
    unavailable = httpx.Response(503, headers={"Retry-After": "0"})
    assert steps.send(unavailable) == Read(unavailable)
    assert steps.send(b"{}") == Close(unavailable)
    assert steps.send(None) == Sleep(0.0)
    assert steps.send(None) == Token()
    steps.send("t1")
    refused = httpx.Response(401)
    assert steps.send(refused) == Read(refused)
    steps.send(b"")
    assert steps.send(None) == Token() and asked == ["invalidate"]
    steps.send("t2")
    ok = httpx.Response(200, json={})
    assert steps.send(ok) == Read(ok)
    assert steps.send(b"{}") == Close(ok)
    with pytest.raises(StopIteration) as done:
        steps.send(None)
    assert done.value.value is ok


def test_client_credentials_request_shape_and_caching() -> None:
    """What the client-credentials grant sends, and that the token is reused until it is near expiry."""
    seen: list[dict[str, list[str]]] = []

    def idp(request: httpx.Request) -> httpx.Response:
        seen.append(parse_qs(request.content.decode()) | {"auth": [request.headers.get("authorization", "")]})
        return httpx.Response(200, json={"access_token": f"token-{len(seen)}", "expires_in": 3600})

    token = OAuthToken.client_credentials(
        "https://idp.example/token", client_id="svc", client_secret="s3cret", scope="memories",
        audience="memory-service", transport=httpx.MockTransport(idp),
    )
    assert token() == token() == "token-1"
    assert seen == [{"grant_type": ["client_credentials"], "scope": ["memories"], "audience": ["memory-service"],
                     "client_id": ["svc"], "client_secret": ["s3cret"], "auth": [""]}]
    token.invalidate()
    assert token() == "token-2"
    basic = OAuthToken.client_credentials("https://idp.example/token", client_id="s v c", client_secret="a:b",
                                          client_auth="basic", transport=httpx.MockTransport(idp))
    basic()
    assert seen[-1]["auth"] == ["Basic cyt2K2M6YSUzQWI="] and "client_secret" not in seen[-1]
    short = OAuthToken.client_credentials("https://idp.example/token", client_id="svc", client_secret="s3cret",
                                          refresh_margin=3600, transport=httpx.MockTransport(idp))
    assert short() != short()  # within the refresh margin of its expiry: fetched again


def test_an_uploaded_path_is_streamed_and_closed_afterwards(tmp_path, monkeypatch) -> None:
    from pathlib import Path

    from memory_service import Client

    opened = []
    real_open = Path.open

    def recording_open(self, *args, **kwargs):
        handle = real_open(self, *args, **kwargs)
        opened.append(handle)
        return handle

    monkeypatch.setattr(Path, "open", recording_open)
    received: list[bytes] = []

    def service(request: httpx.Request) -> httpx.Response:
        received.append(request.read())
        return httpx.Response(201, json={"id": "a", "href": "/v1/attachments/a", "contentType": "text/plain",
                                         "filename": "f.txt", "size": 5, "sha256": "x", "expiresAt": None,
                                         "status": "ready"})

    path = tmp_path / "f.txt"
    path.write_bytes(b"hello")
    with Client("http://service.test", token="t", http_client=httpx.Client(transport=httpx.MockTransport(service))) as client:
        assert client.upload_attachment(path, content_type="text/plain").filename == "f.txt"
    assert b'filename="f.txt"' in received[0] and b"hello" in received[0]
    assert opened and all(handle.closed for handle in opened)
