"""The rate limiter while Valkey is down or frozen (issue 28 item 2): requests are let through (fail open), a
frozen Valkey costs one short timeout per process (the shared Redis circuit opens; never a stalled request), and
limiting comes back by itself once the circuit's ping is answered. A Valkey of this module's own, stopped (SIGTERM) and frozen (SIGSTOP) for real."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from apps.core import redis_client
from apps.runtime.embedded_services import RestartableValkey
from tests.limits.conftest import sample

pytestmark = pytest.mark.django_db

PROBE = 0.2


@pytest.fixture(scope="module")
def limiter_valkey(tmp_path_factory) -> Iterator[RestartableValkey]:
    valkey = RestartableValkey(tmp_path_factory.mktemp("limits-valkey"))
    valkey.start()
    try:
        yield valkey
    finally:
        if valkey.process is not None and valkey.process.poll() is None:
            os.kill(valkey.process.pid, signal.SIGCONT)
        valkey.stop()


@pytest.fixture
def tight(settings, limiter_valkey) -> RestartableValkey:
    """Two requests per user at once, then one a minute, counted in the module's Valkey."""
    if limiter_valkey.process is None or limiter_valkey.process.poll() is not None:
        limiter_valkey.start()
    settings.REDIS_URL = limiter_valkey.url
    settings.RATE_LIMIT_REQUESTS_PER_MINUTE = 1
    settings.RATE_LIMIT_REQUESTS_BURST = 2
    settings.REDIS_CIRCUIT_PROBE_SECONDS = PROBE
    settings.RATE_LIMIT_TIMEOUT_SECONDS = 0.05  # production's (the test settings allow a loaded machine more)
    return limiter_valkey


def _wait_closed() -> None:
    deadline = time.monotonic() + 10
    while redis_client.breaker.is_open and time.monotonic() < deadline:
        time.sleep(PROBE / 4)
    assert not redis_client.breaker.is_open


def _timed_statuses(client, count: int) -> tuple[list[int], list[float]]:
    statuses, seconds = [], []
    for _ in range(count):
        started = time.monotonic()
        statuses.append(client.get("/v1/me").status_code)
        seconds.append(time.monotonic() - started)
    return statuses, seconds


def test_while_valkey_is_stopped_requests_pass_and_limiting_resumes_when_it_is_back(
    tight, client_for, fresh_user
) -> None:
    client = client_for(fresh_user())
    assert _timed_statuses(client, 3)[0] == [200, 200, 429]
    failures = sample("rate_limit_unavailable_total")
    tight.stop()
    statuses, seconds = _timed_statuses(client, 20)
    assert statuses == [200] * 20  # fail open
    assert max(seconds) < 0.5, seconds
    assert sample("rate_limit_unavailable_total") == failures + 1  # one try, then the open circuit
    assert redis_client.breaker.is_open
    tight.start()  # empty, as a Valkey without persistence comes back
    _wait_closed()
    assert _timed_statuses(client, 3)[0] == [200, 200, 429]


def test_a_frozen_valkey_never_stalls_requests(tight, client_for, fresh_user) -> None:
    client = client_for(fresh_user())
    assert _timed_statuses(client, 3)[0] == [200, 200, 429]
    failures = sample("rate_limit_unavailable_total")
    os.kill(tight.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        statuses, seconds = _timed_statuses(client, 20)
        elapsed = time.monotonic() - started
    finally:
        os.kill(tight.process.pid, signal.SIGCONT)
    assert statuses == [200] * 20
    # The first request waited RATE_LIMIT_TIMEOUT_SECONDS (50 ms); the others did not ask Valkey at all.
    assert max(seconds) < 0.5 and elapsed < 1.5, (seconds, elapsed)
    assert sample("rate_limit_unavailable_total") == failures + 1
    # Thawed with its state: the user's bucket is still empty once the circuit has closed.
    _wait_closed()
    assert client.get("/v1/me").status_code == 429
