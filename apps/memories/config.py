"""Operator settings with a short in-process cache: an admin change applies within
SERVICE_SETTINGS_CACHE_SECONDS, without a restart and without a query per request."""

from __future__ import annotations

import threading
import time

from django.conf import settings

from apps.memories.models import MAX_NAMESPACE_DEPTH, ServiceSettings

_lock = threading.Lock()
_cached: tuple[float, int] | None = None


def namespace_max_depth() -> int:
    """The configured maximum depth for new writes (never above MAX_NAMESPACE_DEPTH, whatever an older row says)."""
    global _cached
    now = time.monotonic()
    cached = _cached
    if cached is not None and now - cached[0] < settings.SERVICE_SETTINGS_CACHE_SECONDS:
        return cached[1]
    row = ServiceSettings.objects.order_by("id").first()
    depth = row.memory_episodic_namespace_max_depth if row and row.memory_episodic_namespace_max_depth else None
    value = min(depth or settings.MEMORY_EPISODIC_NAMESPACE_MAX_DEPTH, MAX_NAMESPACE_DEPTH)
    with _lock:
        _cached = (now, value)
    return value


def clear_cache() -> None:
    global _cached
    _cached = None
