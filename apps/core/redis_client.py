"""The process-wide Redis client (one connection pool per process, thread-safe), and an asyncio client per event
loop for ASGI-native code (the event stream): asyncio connections belong to the loop that opened them."""

from __future__ import annotations

import asyncio
import threading
import weakref

import redis
import redis.asyncio
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

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


@receiver(setting_changed)
def _reset(*, setting: str, **_kwargs) -> None:
    global _client
    if setting == "REDIS_URL":
        _client = None
        _async_clients.clear()
