"""Issue 21 item 13: PostgreSQL frozen (SIGSTOP, a network partition) or stopped. The live web stack reaches the test
database through a loopback proxy the test controls (tests/pausable_proxy.py), so the outage is deterministic and
no other test's database is touched: frozen, `/readyz`, a memory GET and a PUT answer 503 ``unavailable`` within
seconds (they used to hang for as long as the freeze lasted); thawed, they answer 200 again without a restart;
stopped, 503 (it used to be 500 ``internal_error``); started again, 200.
"""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from django.db import connection

from tests.live_service import LiveService
from tests.pausable_proxy import PausableProxy

# The live server sees committed data only. It runs in processes of its own, behind a proxy the test freezes and cuts.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live, pytest.mark.slow]

# The defaults (DB_PROBE_AFTER_SECONDS 2 + DB_CONNECT_TIMEOUT_SECONDS 3) answer in about 5 s; the bound leaves room
# for a loaded machine while staying far below the client's own timeout.
WITHIN_SECONDS = 12
NS = ["user", "bob", "outage"]


def _upstream_factory():
    settings_dict = connection.settings_dict
    host, port = settings_dict["HOST"], settings_dict["PORT"] or "5432"

    def connect() -> socket.socket:
        if host.startswith("/"):  # the embedded server listens on a Unix socket only
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(f"{host}/.s.PGSQL.{port}")
            return sock
        return socket.create_connection((host or "127.0.0.1", int(port)))

    return connect


@pytest.fixture
def proxied_service(tmp_path):
    proxy = PausableProxy(_upstream_factory()).start()
    service = LiveService(
        db_settings={**connection.settings_dict, "HOST": "127.0.0.1", "PORT": str(proxy.port)},
        log_path=tmp_path / "web.log",
    )
    service.start()
    try:
        yield service, proxy
    finally:
        proxy.thaw()
        service.stop()
        proxy.stop()


def _calls(service: LiveService, token: str) -> dict[str, requests.Response]:
    """/readyz, a memory GET and a memory PUT, at once (each on its own connection and server thread)."""
    headers = {"Authorization": f"Bearer {token}"}
    base = service.base_url
    query = "&".join(f"ns={segment}" for segment in NS)
    requests_by_name = {
        "readyz": lambda: requests.get(f"{base}/readyz", timeout=60),
        "get": lambda: requests.get(f"{base}/v1/memories?{query}&key=k", headers=headers, timeout=60),
        "put": lambda: requests.put(
            f"{base}/v1/memories", json={"namespace": NS, "key": "k", "value": {"v": time.time()}}, headers=headers,
            timeout=60,
        ),
    }
    with ThreadPoolExecutor(len(requests_by_name)) as pool:
        futures = {name: pool.submit(call) for name, call in requests_by_name.items()}
        return {name: future.result() for name, future in futures.items()}


def _assert_unavailable_within(service: LiveService, token: str) -> None:
    started = time.monotonic()
    responses = _calls(service, token)
    elapsed = time.monotonic() - started
    for name, response in responses.items():
        assert response.status_code == 503, (name, response.status_code, response.text, service.log_tail())
        body = response.json()
        assert body["code"] == "unavailable" and body["requestId"], (name, body)
    assert elapsed < WITHIN_SECONDS, f"503 took {elapsed:.1f} s"


def _wait_until_all_ok(service: LiveService, token: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    statuses: dict[str, int] = {}
    while time.monotonic() < deadline:
        statuses = {name: response.status_code for name, response in _calls(service, token).items()}
        if set(statuses.values()) == {200}:
            return
        time.sleep(0.2)
    pytest.fail(f"the service did not recover by itself: {statuses}\n{service.log_tail()}")


def test_frozen_then_stopped_database_answers_503_within_seconds_and_the_service_recovers(proxied_service):
    service, proxy = proxied_service
    token = service.token("bob")
    _wait_until_all_ok(service, token)  # persistent connections open in the server threads

    proxy.freeze()
    _assert_unavailable_within(service, token)
    proxy.thaw()
    _wait_until_all_ok(service, token)

    proxy.stop()
    _assert_unavailable_within(service, token)
    proxy.start()
    _wait_until_all_ok(service, token)
