"""The process-wide Redis client (one connection pool per process, thread-safe)."""

from __future__ import annotations

import threading

import redis
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

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


@receiver(setting_changed)
def _reset(*, setting: str, **_kwargs) -> None:
    global _client
    if setting == "REDIS_URL":
        _client = None
