"""The process-wide Redis client (one connection pool per process, thread-safe), an asyncio client per event loop
for ASGI-native code (the event stream): asyncio connections belong to the loop that opened them, and the circuit
breaker every Redis call on a request path goes through (:func:`guarded`).

**Circuit breaker.** A Redis that is down answers at once (connection refused), but one that is frozen (SIGSTOP, a
partition) answers nothing, and each call waits out its socket timeout (2 s): every indexed PUT and every append
waited 2 s for as long as the freeze lasted (issue 28 item 6). So after one call fails for want of Redis (a
connection error or a timeout), the circuit opens: calls through :func:`guarded` fail at once with
:class:`RedisUnavailable` (a ``redis.ConnectionError``, so callers handle it as they handle Redis being down) while one
background thread per process pings Redis every REDIS_CIRCUIT_PROBE_SECONDS; the first answer closes the circuit.
What the callers skip meanwhile is caught up as when Redis is down: beat's periodic indexer runs sweep the backlog,
and the event publisher owes its recipients an ``invalidate``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import redis
import redis.asyncio
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_client: redis.Redis | None = None


def get_client() -> redis.Redis:
    global _client
    client = _client
    if client is None:
        with _lock:
            if _client is None:
                _client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
            client = _client
    return client


_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, redis.asyncio.Redis] = weakref.WeakKeyDictionary()


def get_async_client() -> redis.asyncio.Redis:
    """The running loop's asyncio client (its own connection pool). Commands time out like the sync client's, so a
    dead Redis surfaces as an error instead of a hang; blocking reads use :func:`new_async_connection`."""
    loop = asyncio.get_running_loop()
    client = _async_clients.get(loop)
    if client is None:
        # A blocking pool: a burst of stream connects waits (briefly) for a free connection instead of failing with
        # "Too many connections" once the pool is exhausted.
        # One retry, on connection errors only: after a Redis restart every pooled connection is dead, and the
        # first command on each would fail (an event stream answering 503 once) although a fresh connection works.
        # Not on timeouts: a Redis that hangs must surface after socket_timeout, not twice that.
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            settings.REDIS_URL,
            max_connections=64,
            timeout=5,
            socket_timeout=5,
            socket_connect_timeout=2,
            retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        )
        client = _async_clients[loop] = redis.asyncio.Redis(connection_pool=pool)
    return client


def new_async_connection(*, name: str, socket_timeout: float) -> redis.asyncio.Redis:
    """A dedicated single-connection asyncio client (for blocking reads that must not hold a pooled connection);
    ``name`` is set with CLIENT SETNAME so operators (and tests) can see who holds it. Close it with ``aclose()``."""
    return redis.asyncio.Redis.from_url(
        settings.REDIS_URL,
        socket_timeout=socket_timeout,
        socket_connect_timeout=2,
        single_connection_client=True,
        client_name=name,
    )


# --- Circuit breaker ----------------------------------------------------------------------------------------------


class RedisUnavailable(redis.ConnectionError):
    """Raised by :func:`guarded` without touching the network while the circuit is open."""


# What says Redis is not there (as opposed to a command Redis refused, e.g. a script error, which trips nothing).
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, OSError)


class CircuitBreaker:
    """Open after a failure, closed again by the first answer to a background ping (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open_since: float | None = None
        self._generation = 0  # bumped by reset(): a probe of an earlier generation stops

    @property
    def is_open(self) -> bool:
        return self._open_since is not None

    def check(self) -> None:
        if self._open_since is not None:
            raise RedisUnavailable("Redis did not answer; not trying again until it does")

    def trip(self, error: BaseException) -> None:
        with self._lock:
            if self._open_since is not None:
                return
            self._open_since = time.monotonic()
            generation = self._generation
        from apps.core import metrics

        metrics.REDIS_CIRCUIT_OPEN.set(1)
        metrics.REDIS_CIRCUIT_TRIPS.inc()
        logger.warning("Redis did not answer; request paths stop waiting on it until it does",
                       extra={"error": type(error).__name__})  # fmt: skip
        threading.Thread(target=self._probe, args=(generation,), name="redis-circuit-probe", daemon=True).start()

    def _probe(self, generation: int) -> None:
        from django.conf import settings

        while True:
            time.sleep(settings.REDIS_CIRCUIT_PROBE_SECONDS)
            if generation != self._generation:
                return
            try:
                get_client().ping()
            except Exception as exc:  # down, frozen, or anything else: the circuit stays open, the probe goes on
                logger.debug("Redis still does not answer", extra={"error": type(exc).__name__})
                continue
            with self._lock:
                if generation != self._generation:
                    return
                opened, self._open_since = self._open_since, None
            from apps.core import metrics

            metrics.REDIS_CIRCUIT_OPEN.set(0)
            logger.info("Redis answers again", extra={"seconds": round(time.monotonic() - (opened or 0), 1)})
            return

    def answered(self) -> None:
        """Redis answered a call made outside the circuit (the event publisher's own recovery): closed."""
        with self._lock:
            if self._open_since is None:
                return
            self._generation += 1  # the probe stops
            self._open_since = None
        from apps.core import metrics

        metrics.REDIS_CIRCUIT_OPEN.set(0)
        logger.info("Redis answers again")

    def reset(self) -> None:
        """Closed, with no probe running (a new REDIS_URL; tests)."""
        with self._lock:
            self._generation += 1
            self._open_since = None


breaker = CircuitBreaker()


@contextmanager
def guarded(*unreachable: type[BaseException]) -> Iterator[None]:
    """``with guarded(): get_client()...``: raises :class:`RedisUnavailable` at once while the circuit is open, and
    opens it when the block fails for want of Redis (``UNREACHABLE``, plus ``unreachable``: e.g. the broker
    client's own connection errors). Only for short calls on a request path, never for blocking reads."""
    breaker.check()
    try:
        yield
    except (*UNREACHABLE, *unreachable) as exc:
        breaker.trip(exc)
        raise


@receiver(setting_changed)
def _reset(*, setting: str, **_kwargs) -> None:
    global _client
    if setting == "REDIS_URL":
        _client = None
        _async_clients.clear()
        breaker.reset()
