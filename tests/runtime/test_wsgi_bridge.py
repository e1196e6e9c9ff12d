"""The WSGI-in-ASGI bridge (apps.runtime.wsgi_bridge): the messages the server gets, in order, for every response shape.

The unit tests drive the ASGI app with plain WSGI apps; the live ones send real requests to the production stack
(gunicorn + uvicorn worker + config.asgi), including the shapes that take a2wsgi's own path.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from apps.runtime.wsgi_bridge import PRELOAD_BODY_BYTES, CoalescingWSGIMiddleware, body_limit, chunked_body_max_bytes


def _run(
    app, *, body_messages: list[dict] | None = None, headers: list[tuple[bytes, bytes]] | None = None, sent: list[dict] | None = None,
    path: str = "/x",
) -> tuple[list[dict], int]:
    """One HTTP request through the bridge; returns the messages sent to the server (also collected in ``sent``,
    for a request that raises) and how many receive() calls the application made."""
    incoming = list(body_messages if body_messages is not None else [{"type": "http.request", "body": b""}])
    sent = [] if sent is None else sent
    receives = 0

    async def receive() -> dict:
        nonlocal receives
        receives += 1
        if incoming:
            return incoming.pop(0)
        await asyncio.sleep(3600)  # a real server's receive blocks until the client disconnects
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers or [],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
    }  # fmt: skip
    bridge = CoalescingWSGIMiddleware(app, workers=4)
    try:
        asyncio.run(bridge(scope, receive, send))
    finally:
        bridge.executor.shutdown(wait=True)
    return sent, receives


class _Response(list):
    """What Django's WSGIHandler returns: an iterable response object with ``streaming`` and ``close``."""

    def __init__(self, chunks, *, streaming: bool) -> None:
        super().__init__(chunks)
        self.streaming = streaming
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()


def _echo_app(streaming: bool, chunks_out: list[bytes] | None = None, seen: dict | None = None):
    def app(environ, start_response):
        body = environ["wsgi.input"].read()
        if seen is not None:
            seen["body"] = body
            seen["length"] = environ.get("CONTENT_LENGTH")
        start_response("201 Created", [("Content-Type", "text/plain"), ("X-Len", str(len(body)))])
        response = _Response(chunks_out if chunks_out is not None else [body], streaming=streaming)
        if seen is not None:
            seen["response"] = response
        return response

    return app


def _length(n: int) -> list[tuple[bytes, bytes]]:
    return [(b"content-length", str(n).encode())]


def test_an_in_memory_response_goes_out_as_start_then_one_final_body() -> None:
    seen: dict = {}
    sent, receives = _run(
        _echo_app(False, seen=seen),
        body_messages=[{"type": "http.request", "body": b"hel", "more_body": True}, {"type": "http.request", "body": b"lo"}],
        headers=_length(5),
    )
    assert sent == [
        {"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"text/plain"), (b"x-len", b"5")]},
        {"type": "http.response.body", "body": b"hello"},
    ]
    assert seen["body"] == b"hello"
    assert receives == 2  # both body messages read on the loop, none by the request thread
    assert seen["response"].closed.is_set()


def test_a_streaming_response_is_sent_chunk_by_chunk_and_ends_with_an_empty_body() -> None:
    sent, _ = _run(_echo_app(True, chunks_out=[b"a", b"b"]), headers=_length(0))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body", "http.response.body", "http.response.body"]
    assert [m.get("body") for m in sent[1:]] == [b"a", b"b", b""]
    assert [m.get("more_body", False) for m in sent[1:]] == [True, True, False]


def test_a_generator_application_that_starts_its_response_when_iterated_still_starts_first() -> None:
    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])  # runs at the first next(), not at the call
        yield b"one"
        yield b"two"

    sent, _ = _run(app, headers=_length(0))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body", "http.response.body", "http.response.body"]
    assert [m.get("body") for m in sent[1:]] == [b"one", b"two", b""]


def test_an_empty_streaming_response_still_starts_before_it_ends() -> None:
    sent, _ = _run(_echo_app(True, chunks_out=[]), headers=_length(0))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[1]["body"] == b""


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(_length(PRELOAD_BODY_BYTES + 1), id="larger-than-memory"),
        pytest.param([(b"transfer-encoding", b"chunked")], id="chunked"),
    ],
)
def test_every_acceptable_body_is_read_before_the_application_starts(headers) -> None:
    """Issue 21.8: a request thread never waits on the network for a body (a slow client would hold it): the
    application gets the body already read, not a2wsgi's stream that blocks on receive()."""
    from a2wsgi.wsgi import Body

    payload = b"x" * (PRELOAD_BODY_BYTES + 1)
    half = len(payload) // 2
    seen: dict = {}
    echo = _echo_app(False, seen=seen)

    def app(environ, start_response):
        seen["streamed"] = isinstance(environ["wsgi.input"], Body)
        return echo(environ, start_response)

    sent, receives = _run(
        app,
        body_messages=[
            {"type": "http.request", "body": payload[:half], "more_body": True},
            {"type": "http.request", "body": payload[half:]},
        ],
        headers=headers,
    )
    assert seen["streamed"] is False
    assert seen["body"] == payload and seen["length"] == str(len(payload))
    assert receives == 2
    assert sent[0]["status"] == 201
    assert b"".join(m.get("body", b"") for m in sent[1:]) == payload


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param([(b"content-length", b"nonsense")], id="malformed-length"),
        pytest.param(_length(2 * 1024 * 1024 + 1), id="past-the-endpoint-limit"),
    ],
)
def test_a_body_the_application_refuses_unread_is_left_to_it(headers) -> None:
    """The application answers these from the header alone (400, 413): the bridge reads nothing for them."""

    def app(environ, start_response):
        start_response("413 Payload Too Large", [("Content-Type", "application/json")])
        return _Response([b"{}"], streaming=False)

    sent, receives = _run(app, body_messages=[], headers=headers)
    assert receives == 0
    assert sent[0]["status"] == 413


@pytest.mark.parametrize(
    "headers", [pytest.param(_length(10), id="declared"), pytest.param([(b"transfer-encoding", b"chunked")], id="chunked")]
)
def test_a_client_gone_before_its_body_is_complete_runs_nothing(headers) -> None:
    called = []

    def app(environ, start_response):
        called.append(True)
        start_response("200 OK", [])
        return _Response([b""], streaming=False)

    sent, _ = _run(
        app,
        body_messages=[{"type": "http.request", "body": b"abc", "more_body": True}, {"type": "http.disconnect"}],
        headers=headers,
    )
    assert called == [] and sent == []


def test_a_chunked_body_arrives_whole_with_the_length_it_turned_out_to_have() -> None:
    seen: dict = {}
    _, receives = _run(
        _echo_app(False, seen=seen),
        body_messages=[{"type": "http.request", "body": b"abc", "more_body": True}, {"type": "http.request", "body": b"de"}],
        headers=[(b"transfer-encoding", b"chunked")],
    )
    assert seen["body"] == b"abcde"
    assert seen["length"] == "5"  # Django reads exactly CONTENT_LENGTH bytes: without it the body would be lost
    assert receives == 2


@pytest.mark.parametrize("path", ["/v1/memories", "/v1/attachments"])
def test_a_chunked_body_past_the_endpoints_limit_is_cut_one_byte_past_it(settings, path) -> None:
    """The application then refuses it as too large (its own 413), and the bridge never holds more than that."""
    settings.REQUEST_MAX_BODY_BYTES = 100
    settings.ATTACHMENT_MAX_BYTES = 10
    limit = body_limit(path)
    assert limit == (100 if path == "/v1/memories" else chunked_body_max_bytes())
    seen: dict = {}
    _run(
        _echo_app(False, seen=seen),
        body_messages=[{"type": "http.request", "body": b"z" * limit, "more_body": True}] * 3,
        headers=[(b"transfer-encoding", b"chunked")],
        path=path,
    )
    assert seen["length"] == str(limit + 1)
    assert len(seen["body"]) == limit + 1


def test_a_request_without_a_body_never_waits_for_one() -> None:
    seen: dict = {}
    sent, receives = _run(_echo_app(False, seen=seen), body_messages=[])  # receive() would block for an hour
    assert seen["body"] == b""
    assert receives == 0
    assert sent[0]["status"] == 201


def test_an_application_error_reaches_the_server_and_nothing_is_sent() -> None:
    def app(environ, start_response):
        raise RuntimeError("boom")

    sent: list[dict] = []
    with pytest.raises(RuntimeError, match="boom"):
        _run(app, headers=_length(0), sent=sent)
    assert sent == []


# --- The live stack ------------------------------------------------------------------------------------------------


def _request(live_service, method: str, path: str, body: bytes | None = None, headers: dict | None = None, *, chunked: bool = False):
    host, port = live_service.base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body if not chunked else iter([body[: len(body) // 2], body[len(body) // 2 :]]),
                     headers=headers or {}, encode_chunked=chunked)  # fmt: skip
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("shape", ["small", "large", "chunked"])  # chunked: a 400 (empty body) before the bridge
def test_writes_of_every_body_shape_land_over_the_live_stack(live_service, shape) -> None:
    token = live_service.token("bob")
    # "large" is past the preload limit: it takes a2wsgi's streaming body path.
    text = "y" * (PRELOAD_BODY_BYTES + 1000 if shape == "large" else 100)
    key = f"bridge-{shape}-{uuid.uuid4().hex[:8]}"
    body = json.dumps({"namespace": ["user", "bob", "bridge"], "key": key, "value": {"text": text}}).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    status, _, _ = _request(live_service, "PUT", "/v1/memories", body, headers, chunked=shape == "chunked")
    assert status == 200
    status, response_headers, payload = _request(
        live_service, "GET", f"/v1/memories?ns=user&ns=bob&ns=bridge&key={key}", headers={"Authorization": f"Bearer {token}"}
    )
    assert status == 200
    assert json.loads(payload)["value"] == {"text": text}
    assert response_headers["content-length"] == str(len(payload))
    assert "x-request-id" in response_headers


@pytest.mark.django_db(transaction=True)
def test_32_concurrent_clients_each_get_their_own_response(live_service) -> None:
    """Responses queued without waiting must never cross between requests: each client reads back its own key."""
    token = live_service.token("bob")
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    run = uuid.uuid4().hex[:8]

    def client(i: int) -> list[str]:
        problems = []
        for round_ in range(5):
            key = f"c{i}-{round_}"
            body = json.dumps({"namespace": ["user", "bob", f"bridge-{run}"], "key": key, "value": {"i": i, "r": round_}})
            status, _, _ = _request(live_service, "PUT", "/v1/memories", body.encode(), headers)
            if status != 200:
                problems.append(f"PUT {key}: {status}")
                continue
            status, _, payload = _request(
                live_service, "GET", f"/v1/memories?ns=user&ns=bob&ns=bridge-{run}&key={key}", headers=headers
            )
            if status != 200 or json.loads(payload)["value"] != {"i": i, "r": round_}:
                problems.append(f"GET {key}: {status} {payload[:100]!r}")
        return problems

    with ThreadPoolExecutor(max_workers=32) as pool:
        problems = [p for result in pool.map(client, range(32)) for p in result]
    assert problems == []


def test_lifespan_is_acknowledged_start_and_stop() -> None:
    from apps.runtime.wsgi_bridge import acknowledge_lifespan

    incoming = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[dict] = []

    async def receive() -> dict:
        return incoming.pop(0)

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(acknowledge_lifespan(receive, send))
    assert sent == [{"type": "lifespan.startup.complete"}, {"type": "lifespan.shutdown.complete"}]
