"""The event stream against the production web stack (tests.live_service): two servers on a Valkey of this module's
own, with fast clocks.

The stream is asynchronous and spans processes, so these tests never go through Django's test client: every call
is HTTP to a live server (two of them for cross-process fan-out), and writes commit (``transactional_db``) so the
servers see them. The Valkey is the module's own so that a test can restart it under the running servers.

Negative checks ("nothing more arrives") never wait out a timeout: ``SSEClient.assert_silent`` appends a marker
event to the user's stream and expects it to be the next event, once the events that could have gone wrong were
published (``User.wait_published``).
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from apps.events import publisher, streams
from apps.runtime.embedded_services import RestartableValkey
from tests.conftest import TEST_API_KEY, _mint
from tests.live_service import LiveService

# Fast clocks so keepalive and eviction are observable within a test; the servers and this process share the Redis
# key prefix.
SSE_ENV = {
    "SSE_KEEPALIVE_SECONDS": "0.5",
    "SSE_RETENTION_SECONDS": "2",
    "SSE_MAX_CONNECTIONS_PER_USER": "3",
    "SSE_BUFFER_EVENTS": "32",
    "SSE_EVICTION_GRACE_SECONDS": "30",
    "SSE_REDIS_PREFIX": f"ssetest{os.getpid()}:",
}
# A small send buffer on the servers' sockets: a client that stops reading back-pressures its server after ~100 kB
# instead of the megabytes loopback autotuning would absorb (the slow-consumer test needs a few thousand events,
# not 40,000).
SEND_BUFFER = 32768


@pytest.fixture(scope="module")
def event_valkey(tmp_path_factory) -> Iterator[RestartableValkey]:
    valkey = RestartableValkey(tmp_path_factory.mktemp("valkey"))
    valkey.start()
    try:
        yield valkey
    finally:
        valkey.stop()


@pytest.fixture(scope="module")
def web_servers(django_db_setup, django_db_blocker, event_valkey) -> Iterator[tuple[LiveService, LiveService]]:
    """Two web processes on different ports, same database and Redis."""
    env = {**SSE_ENV, "REDIS_URL": event_valkey.url, "WSGI_THREADS": "16"}
    with django_db_blocker.unblock():
        servers = [LiveService(extra_env=env, send_buffer=SEND_BUFFER) for _ in range(2)]
    try:
        LiveService.start_all(servers)
        yield servers[0], servers[1]
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def server(web_servers, event_valkey, transactional_db, settings) -> LiveService:
    """The first server; this process publishes (publisher.publish, a marker) into the keys the servers read."""
    settings.REDIS_URL = event_valkey.url
    for name, value in SSE_ENV.items():
        setattr(settings, name, float(value) if "." in value else (int(value) if value.isdigit() else value))
    return web_servers[0]


@pytest.fixture
def fresh_publisher(monkeypatch) -> None:
    """The publisher's memory of a Redis failure (users owed an ``invalidate``, the recovery under way) starts empty
    and is put back afterwards, so no test sees another's."""
    monkeypatch.setattr(publisher, "_missed", {})
    monkeypatch.setattr(publisher, "_recovering", False)
    # A recovery thread an earlier test left running sees the generation change and ends.
    monkeypatch.setattr(publisher, "_generation", publisher._generation + 1)


@dataclass
class User:
    name: str
    token: str
    server: LiveService

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def call(self, method: str, path: str, body: Any = None, *, on: LiveService | None = None):
        return (on or self.server).request(method, path, body, self.headers)

    def create_conversation(self) -> str:
        status, body = self.call("POST", "/v1/conversations", {"title": "events"})
        assert status == 201, body
        return body["id"]

    def append(self, conversation_id: str, text: str = "hello", *, on: LiveService | None = None) -> dict:
        status, body = self.call(
            "POST",
            f"/v1/conversations/{conversation_id}/entries",
            {"content": [{"role": "USER", "text": text}]},
            on=on,
        )
        assert status == 201, body
        return body

    def share(self, conversation_id: str, other: User, level: str = "reader") -> None:
        status, body = self.call(
            "POST", f"/v1/conversations/{conversation_id}/memberships", {"userId": other.name, "accessLevel": level}
        )
        assert status == 201, body

    def stream(self, query: str = "", *, on: LiveService | None = None, **kwargs) -> SSEClient:
        return SSEClient(on or self.server, f"/v1/events{query}", self.headers, **kwargs)

    def received(self) -> list[dict]:
        """Every event in the user's Redis stream (what was published to the user, whatever any client read)."""
        from apps.core.redis_client import get_client

        return [json.loads(fields[b"e"]) for _id, fields in get_client().xrange(streams.stream_key(self.name)) if b"e" in fields]

    def wait_published(self, condition: Callable[[list[dict]], bool], timeout: float = 10.0) -> None:
        """Wait until the events published to this user satisfy ``condition``: a write's events go out after its
        response (apps.events.middleware), so a test asserting that another user got nothing first waits for them."""
        deadline = time.monotonic() + timeout
        while not condition(events := self.received()):
            assert time.monotonic() < deadline, f"not published in time: {events}"
            time.sleep(0.02)


_open_streams: list[SSEClient] = []


@pytest.fixture(autouse=True)
def _close_streams() -> Iterator[None]:
    """Every stream a test opened is closed when it ends, passed or failed, so none leaks into the next test."""
    yield
    while _open_streams:
        _open_streams.pop().close()


@pytest.fixture
def make_user(server) -> Any:
    def make(prefix: str = "u") -> User:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        return User(name, _mint(name, roles=("user",)), server)

    return make


@dataclass
class Message:
    """One parsed SSE block: ``data`` decoded JSON (None for a comment), ``id`` when sent, ``raw`` as sent."""

    id: str | None
    data: dict[str, Any] | None
    comment: str | None = None
    raw: str = ""
    received_at: float = field(default_factory=time.monotonic)


class SSEClient:
    """A raw streaming HTTP client: a thread reads the chunked response and queues parsed SSE blocks."""

    def __init__(
        self,
        server: LiveService,
        path: str,
        headers: dict[str, str],
        *,
        last_event_id: str | None = None,
        receive_buffer: int | None = None,
        read: bool = True,
    ) -> None:
        _open_streams.append(self)
        self.messages: queue.Queue[Message | None] = queue.Queue()
        self.closed = threading.Event()
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        if receive_buffer is not None:
            # A small receive window makes a client that stops reading back-pressure the server quickly.
            # (set before connecting, so the window advertised in the handshake is already small).
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            sock.settimeout(30)
            sock.connect(("127.0.0.1", server.port))
            self.conn.sock = sock
        request_headers = {"Accept": "text/event-stream", **headers}
        if last_event_id is not None:
            request_headers["Last-Event-ID"] = last_event_id
        self.conn.request("GET", path, headers=request_headers)
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.content_type = self.response.getheader("Content-Type", "")
        if self.status != 200:
            self.body = json.loads(self.response.read())
            self.conn.close()
            self.closed.set()
            return
        self.thread = threading.Thread(target=self._read, daemon=True)
        if read:
            self.thread.start()

    def start_reading(self) -> None:
        self.thread.start()

    def _read(self) -> None:
        event_id: str | None = None
        data: list[str] = []
        comment: str | None = None
        raw: list[str] = []
        try:
            while True:
                line_bytes = self.response.readline()
                if not line_bytes:
                    break
                line = line_bytes.decode()
                raw.append(line)
                line = line.rstrip("\n")
                if line == "":
                    if data:
                        self.messages.put(Message(event_id, json.loads("\n".join(data)), raw="".join(raw)))
                    elif comment is not None:
                        self.messages.put(Message(None, None, comment, raw="".join(raw)))
                    event_id, data, comment, raw = None, [], None, []
                elif line.startswith(":"):
                    comment = line[1:].strip()
                elif line.startswith("id:"):
                    event_id = line[3:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip())
        except (OSError, http.client.HTTPException, ValueError, AttributeError):
            pass
        finally:
            self.closed.set()
            self.messages.put(None)

    def next(self, timeout: float = 5.0, *, events_only: bool = True) -> Message | None:
        """The next message (skipping keepalives unless ``events_only`` is False); None when the stream ended."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no message in time")
            try:
                message = self.messages.get(timeout=remaining)
            except queue.Empty:
                raise TimeoutError("no message in time") from None
            if message is None:
                self.messages.put(None)  # stay at end of stream for later calls
                return None
            if events_only and message.data is None:
                continue
            return message

    def events(self, count: int, timeout: float = 5.0) -> list[Message]:
        return [self.next(timeout) for _ in range(count)]

    def received(self) -> list[Message]:
        """The events already read and not yet taken (keepalives skipped), without waiting."""
        taken = []
        while True:
            try:
                message = self.messages.get_nowait()
            except queue.Empty:
                return taken
            if message is None:
                self.messages.put(None)
                return taken
            if message.data is not None:
                taken.append(message)

    def close(self) -> None:
        try:
            if self.conn.sock is not None:
                self.conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.conn.close()
        self.closed.wait(5)


@pytest.fixture
def api_key() -> str:
    return TEST_API_KEY


def assert_silent(user: str, *clients: SSEClient) -> None:
    """Nothing arrives on ``clients`` (streams of ``user``) before a marker appended to the user's stream now: Redis
    keeps one order per user. Call it once the writes whose events must not arrive were published (their events to
    another user were seen, ``User.wait_published``): they went out in the same pipeline."""
    from apps.core.redis_client import get_client

    # Of kind "stream", which passes every ``kinds`` filter.
    marker = {"event": "marker", "kind": "stream", "data": {"marker": uuid.uuid4().hex}}
    get_client().eval(*streams.append_args(user, "e", json.dumps(marker)))
    for client in clients:
        message = client.next()
        assert message is not None and message.data == marker, message and message.data


def wait_until(condition: Callable[[], Any], timeout: float = 10.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
