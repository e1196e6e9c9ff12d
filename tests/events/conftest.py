"""Real servers for the event stream: uvicorn processes serving config.asgi against the test database and Redis.

The stream is asynchronous and spans processes, so these tests never go through Django's test client: every call
is HTTP to a live server (two of them for cross-process fan-out), and writes commit (``transactional_db``) so the
servers see them.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from tests import live_service
from tests.conftest import TEST_API_KEY, _mint

# Fast clocks so keepalive, retention and eviction are observable within a test; the servers and this process
# share the Redis key prefix (unique per pytest process, so parallel runs and leftovers never mix).
SSE_ENV = {
    "SSE_KEEPALIVE_SECONDS": "0.5",
    "SSE_RETENTION_SECONDS": "2",
    "SSE_MAX_CONNECTIONS_PER_USER": "3",
    "SSE_BUFFER_EVENTS": "32",
    "SSE_EVICTION_GRACE_SECONDS": "30",
    "SSE_REDIS_PREFIX": f"ssetest{os.getpid()}:",
}


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    # The test database's libpq URL; its OPTIONS also hold psycopg connection settings (prepare_threshold) that
    # are no URL parameters.
    database_url = live_service.database_url(connection.settings_dict)
    env = os.environ.copy()
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings.embedded",
            "DATABASE_URL": database_url,
            "REDIS_URL": settings.REDIS_URL,
            "DATA_DIR": str(settings.DATA_DIR),
            "DEV_IDP_ISSUER": settings.DEV_IDP_ISSUER,
            "API_KEYS": settings.API_KEYS,
            "EMBEDDING_PROVIDER": "hash",
            "DEBUG": "false",
            "LOG_LEVEL": "WARNING",
            "WSGI_THREADS": "40",
            **SSE_ENV,
            **(extra or {}),
        }
    )
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return env


class WebServer:
    """One uvicorn process serving config.asgi (the production app: REST through a2wsgi, /v1/events native)."""

    def __init__(self, env: dict[str, str]) -> None:
        # The listening socket is made here and handed over: accepted connections inherit its small, fixed send
        # buffer, so a client that stops reading back-pressures the server after ~100 kB instead of the megabytes
        # loopback autotuning would absorb (the slow-consumer test needs a few thousand events, not 40,000).
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32768)
        listener.bind(("127.0.0.1", 0))
        listener.listen(512)
        self.port = listener.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        command = [
            sys.executable, "-m", "uvicorn", "config.asgi:application", "--fd", str(listener.fileno()),
            "--http", "config.http_server:ServiceHttpProtocol",  # the production protocol (its deadlines)
        ]  # fmt: skip
        self.process = subprocess.Popen(
            [*command, "--log-level", "warning", "--no-access-log"],
            env=env,
            cwd=settings.BASE_DIR,
            pass_fds=(listener.fileno(),),
        )
        listener.close()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}")
            try:
                status, _ = self.request("GET", "/healthz")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("server did not start")

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            payload = json.dumps(body).encode() if body is not None else None
            all_headers = {"Content-Type": "application/json", **(headers or {})}
            conn.request(method, path, body=payload, headers=all_headers)
            response = conn.getresponse()
            raw = response.read()
            return response.status, (json.loads(raw) if raw else None)
        finally:
            conn.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="module")
def web_servers(django_db_setup, django_db_blocker) -> Iterator[tuple[WebServer, WebServer]]:
    """Two web processes on different ports, same database and Redis."""
    with django_db_blocker.unblock():
        env = server_env()
    servers = []
    try:
        servers.append(WebServer(env))
        servers.append(WebServer(env))
        yield servers[0], servers[1]
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(autouse=True)
def _sse_prefix(settings) -> None:
    """This process publishes (publish() called directly) into the same keys the servers read."""
    for name, value in SSE_ENV.items():
        setattr(settings, name, float(value) if "." in value else (int(value) if value.isdigit() else value))


@pytest.fixture
def server(web_servers, transactional_db) -> WebServer:
    return web_servers[0]


@dataclass
class User:
    name: str
    token: str
    server: WebServer

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def call(self, method: str, path: str, body: Any = None, *, on: WebServer | None = None):
        return (on or self.server).request(method, path, body, self.headers)

    def create_conversation(self) -> str:
        status, body = self.call("POST", "/v1/conversations", {"title": "events"})
        assert status == 201, body
        return body["id"]

    def append(self, conversation_id: str, text: str = "hello", *, on: WebServer | None = None) -> dict:
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

    def stream(self, query: str = "", *, on: WebServer | None = None, **kwargs) -> SSEClient:
        return SSEClient(on or self.server, f"/v1/events{query}", self.headers, **kwargs)


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
    """One parsed SSE block: ``data`` decoded JSON (None for a comment), ``id`` when sent."""

    id: str | None
    data: dict[str, Any] | None
    comment: str | None = None
    received_at: float = field(default_factory=time.monotonic)


class SSEClient:
    """A raw streaming HTTP client: a thread reads the chunked response and queues parsed SSE blocks."""

    def __init__(
        self,
        server: WebServer,
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
        try:
            while True:
                raw = self.response.readline()
                if not raw:
                    break
                line = raw.decode().rstrip("\n")
                if line == "":
                    if data:
                        self.messages.put(Message(event_id, json.loads("\n".join(data))))
                    elif comment is not None:
                        self.messages.put(Message(None, None, comment))
                    event_id, data, comment = None, [], None
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

    def quiet(self, seconds: float) -> list[Message]:
        """Every event that arrives within ``seconds`` (keepalives skipped)."""
        received = []
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                message = self.next(remaining)
            except TimeoutError:
                break
            if message is None:
                break
            received.append(message)
        return received

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
