"""The web server's edges (issue 21.8, 21.9), against the production stack (gunicorn + apps.runtime.http_server's worker +
config.asgi) with short deadlines: slow clients hold no thread and are cut off in time, and requests the server
cannot take (a URL too long, headers too large, not HTTP at all) get D1's JSON, not uvicorn's text/plain."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from tests.live_service import LiveService

# One web server of its own (edge_service), with short deadlines the tests wait out.
pytestmark = pytest.mark.live

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 3.0  # the body's grace
BODY_MIN_RATE = 20_000  # bytes per second, on average, after the grace
BODY_MAX_SECONDS = 8.0
SLOW_CLIENTS = 40


@pytest.fixture(scope="module")
def edge_service(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[LiveService]:
    from django.db import connection

    service = LiveService(
        db_settings=connection.settings_dict,
        log_path=tmp_path_factory.mktemp("edges") / "web.log",
        extra_env={
            "REQUEST_HEADER_TIMEOUT_SECONDS": str(HEADER_TIMEOUT),
            "REQUEST_BODY_TIMEOUT_SECONDS": str(BODY_TIMEOUT),
            "REQUEST_BODY_MIN_BYTES_PER_SECOND": str(BODY_MIN_RATE),
            "REQUEST_BODY_MAX_SECONDS": str(BODY_MAX_SECONDS),
            "REQUEST_MAX_HEADER_BYTES": "8192",
            "WSGI_THREADS": "4",  # far fewer threads than slow clients
        },
    )
    service.start()
    try:
        yield service
    finally:
        service.stop()


def connect(service: LiveService, timeout: float) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", service.port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The whole response (the server closes after it); raises socket.timeout if it does not come in time."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {name.lower(): value for name, value in headers.items()}, body


def assert_d1(status: int, headers: dict[str, str], body: bytes, expected: int, code: str) -> None:
    assert status == expected, body
    assert headers["content-type"] == "application/json"
    error = json.loads(body)
    assert set(error) == {"code", "error", "requestId"} and error["code"] == code
    assert error["requestId"] == headers["x-request-id"]


def slow_request(path: str = "/dev-idp/token", length: int = 300_000) -> bytes:
    """Headers declaring a body over the old in-memory limit (256 KiB), and its first byte."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {length}\r\n\r\nx"
    ).encode()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_slow_bodies_stall_nothing_and_are_cut_off_in_time(edge_service):
    """40 clients declaring large bodies and sending a byte every half second: /healthz and an authenticated
    request still answer at once (each body is read on the event loop, never by a request thread), and every slow
    client gets a 408 within the body deadline."""
    token = edge_service.token("bob")
    slow = [connect(edge_service, timeout=BODY_TIMEOUT + 5) for _ in range(SLOW_CLIENTS)]
    started = time.monotonic()
    for sock in slow:
        sock.sendall(slow_request())
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.5):
            for sock in slow:
                try:
                    sock.sendall(b"x")
                except OSError:
                    pass

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        # Well inside the body deadline: before the bodies were read on the loop, these waited for a thread.
        base = edge_service.base_url
        assert requests.get(f"{base}/healthz", timeout=1.5).status_code == 200
        me = requests.get(f"{base}/v1/me", headers={"Authorization": f"Bearer {token}"}, timeout=1.5)
        assert me.status_code == 200 and me.json()["userId"] == "bob"
        form = {"grant_type": "password", "client_id": "nobody", "client_secret": "x", "username": "u", "password": "p"}
        assert requests.post(f"{base}/dev-idp/token", data=form, timeout=1.5).status_code in (400, 401)
        assert time.monotonic() - started < BODY_TIMEOUT  # all of it while the slow bodies were still coming
        for sock in slow:
            status, headers, body = read_response(sock)
            assert_d1(status, headers, body, 408, "request_timeout")
            assert json.loads(body)["error"] == "The request body did not arrive in time."
        assert time.monotonic() - started < BODY_TIMEOUT + 3
    finally:
        stop.set()
        trickler.join()
        for sock in slow:
            sock.close()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_half_sent_headers_and_idle_connections_are_closed_in_time(edge_service):
    half_headers = connect(edge_service, timeout=HEADER_TIMEOUT + 5)
    half_headers.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Request-ID: slow-1\r\n")
    idle = connect(edge_service, timeout=HEADER_TIMEOUT + 5)
    started = time.monotonic()
    with half_headers, idle:
        status, headers, body = read_response(half_headers)
        assert_d1(status, headers, body, 408, "request_timeout")
        assert json.loads(body)["error"] == "The request headers did not arrive in time."
        status, headers, body = read_response(idle)
        assert_d1(status, headers, body, 408, "request_timeout")
    assert time.monotonic() - started < HEADER_TIMEOUT + 3


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_keep_alive_connection_serves_requests_slower_than_the_header_deadline_in_all(edge_service):
    """The header deadline runs per request, from its first byte: a connection used for longer is fine."""
    with requests.Session() as session:
        for _ in range(3):
            assert session.get(f"{edge_service.base_url}/healthz", timeout=5).status_code == 200
            time.sleep(HEADER_TIMEOUT / 2)  # idle between requests, within gunicorn's keep-alive (2 s)


@pytest.mark.django_db(transaction=True)
def test_a_url_longer_than_the_parser_takes_is_a_json_414(edge_service):
    with connect(edge_service, timeout=10) as sock:
        sock.sendall(b"GET /v1/me?x=" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert_d1(*read_response(sock), 414, "uri_too_long")
    # Just under the limit the request reaches the application as before.
    url = f"{edge_service.base_url}/healthz?x=" + "a" * (65_535 - len("/healthz?x=") - 100)
    assert requests.get(url, timeout=10).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_headers_too_large_are_a_json_431(edge_service):
    with connect(edge_service, timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Filler: " + b"f" * 10_000 + b"\r\n\r\n")
        assert_d1(*read_response(sock), 431, "headers_too_large")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", [b"X-Filler: ", b"X-" + b"n" * 10_000])
def test_a_header_still_arriving_is_a_json_431_once_too_large(edge_service, name):
    """httptools hands a header over only once it is complete, gathering it meanwhile with bytes += (memory, and a
    copy of all of it per packet): a header past the limit that never ends is refused as it arrives, not left to
    grow until the header deadline."""
    with connect(edge_service, timeout=HEADER_TIMEOUT + 5) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n" + name + b"f" * 20_000)  # no CRLF: unfinished
        assert_d1(*read_response(sock), 431, "headers_too_large")
        assert time.monotonic() - started < HEADER_TIMEOUT / 2  # refused on arrival, not by the deadline (408)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("garbage", [b"HELLO THERE\r\n\r\n", b"GET / HTTP/1.1\r\nBad Header\r\n\r\n"])
def test_a_request_that_is_not_http_is_a_json_400(edge_service, garbage):
    with connect(edge_service, timeout=10) as sock:
        sock.sendall(garbage)
        assert_d1(*read_response(sock), 400, "validation_error")


def send_slowly(sock: socket.socket, body: bytes, bytes_per_second: int, stop_after: float | None = None) -> float:
    """Send ``body`` in 4 KB pieces at about ``bytes_per_second``; returns the seconds it took (or stops early,
    quietly, when the server has closed)."""
    started = time.monotonic()
    piece = 4096
    for offset in range(0, len(body), piece):
        try:
            sock.sendall(body[offset : offset + piece])
        except OSError:
            break
        if stop_after is not None and time.monotonic() - started > stop_after:
            break
        time.sleep(max(0.0, started + (offset + piece) / bytes_per_second - time.monotonic()))
    return time.monotonic() - started


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_body_that_keeps_coming_at_the_minimum_rate_is_taken_however_long_it_takes(edge_service):
    """Issue 28 item 7: the body deadline was a total (a 10 MiB upload needed 1.4 Mbit/s at the defaults). A body
    arriving at twice the minimum rate takes longer than the grace, and is taken."""
    body = json.dumps({"namespace": ["user", "bob", "slow"], "key": "upload", "value": {"text": "x" * 180_000}}).encode()
    head = (
        f"PUT /v1/memories HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {edge_service.token('bob')}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with connect(edge_service, timeout=BODY_MAX_SECONDS + 5) as sock:
        sock.sendall(head)
        took = send_slowly(sock, body, 2 * BODY_MIN_RATE)
        status, _headers, answer = read_response(sock)
    assert took > BODY_TIMEOUT + 1  # longer than the old total deadline
    assert status == 200, answer


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_no_body_takes_longer_than_the_cap_however_fast_it_comes(edge_service):
    with connect(edge_service, timeout=BODY_MAX_SECONDS + 10) as sock:
        started = time.monotonic()
        sock.sendall(slow_request(length=1_500_000))
        send_slowly(sock, b"x" * 1_500_000, 2 * BODY_MIN_RATE, stop_after=BODY_MAX_SECONDS + 3)
        assert_d1(*read_response(sock), 408, "request_timeout")
        assert BODY_MAX_SECONDS - 0.5 < time.monotonic() - started < BODY_MAX_SECONDS + 4


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_client_still_sending_after_its_408_reads_the_answer_not_a_reset(edge_service):
    """A client that keeps uploading after the body deadline (it has not read the 408 yet) must still find the 408:
    a server that closes at once answers those late bytes with a reset, and the reset throws away the 408 waiting,
    unread, in the client's socket."""
    import select

    sock = connect(edge_service, timeout=BODY_TIMEOUT + 5)
    with sock:
        sock.sendall(slow_request())
        readable, _, _ = select.select([sock], [], [], BODY_TIMEOUT + 5)  # the 408 has arrived, unread
        assert readable
        for _ in range(5):  # the upload goes on, as a client that is busy sending reads nothing yet
            sock.sendall(b"x" * 1024)
            time.sleep(0.05)
        time.sleep(0.2)  # long enough for a reset to come back

        assert_d1(*read_response(sock), 408, "request_timeout")
