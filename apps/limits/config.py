"""A user's effective limits: the admin's override where there is one (models.UserLimits), else the setting.

Overrides are read per user at most once per LIMITS_CACHE_SECONDS per process, so the limiter's fixed cost per
request is a dictionary lookup; an override saved in this process applies at once, in the others within that time.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

from apps.limits.definitions import QUOTAS, RATES

# A bounded cache: past this many users it starts over (a cold entry costs one primary-key lookup).
_MAX_CACHED_USERS = 10_000
_NOTHING: dict[str, int] = {}

_lock = threading.Lock()
_cache: dict[str, tuple[float, dict[str, int]]] = {}


def overrides(user_id: str) -> dict[str, int]:
    """The fields an admin set for ``user_id`` (field name → value); empty when none."""
    now = time.monotonic()
    cached = _cache.get(user_id)
    if cached is not None and cached[0] > now:
        return cached[1]
    found = _load(user_id)
    with _lock:
        if len(_cache) >= _MAX_CACHED_USERS:
            _cache.clear()
        _cache[user_id] = (now + settings.LIMITS_CACHE_SECONDS, found)
    return found


def _load(user_id: str) -> dict[str, int]:
    from apps.limits.models import UserLimits

    row: dict[str, Any] | None = UserLimits.objects.filter(user_id=user_id).values().first()
    if row is None:
        return _NOTHING
    return {name: value for name, value in row.items() if isinstance(value, int) and not isinstance(value, bool)}


def setting(name: str) -> int:
    return getattr(settings, name)


def rate(user_id: str, kind: str) -> tuple[int, int]:
    """(per minute, burst) of ``kind`` for ``user_id``."""
    definition = RATES[kind]
    own = overrides(user_id)
    per_minute = own.get(definition.per_minute_field) or getattr(settings, definition.per_minute_setting)
    burst = own.get(definition.burst_field) or getattr(settings, definition.burst_setting)
    return per_minute, burst


def quota(user_id: str, name: str) -> int:
    own = overrides(user_id).get(name)
    return own if own is not None else getattr(settings, QUOTAS[name].setting)


def clear_cache(user_id: str | None = None) -> None:
    with _lock:
        if user_id is None:
            _cache.clear()
        else:
            _cache.pop(user_id, None)


def _on_setting_changed(*, setting: str, **_kwargs: Any) -> None:
    if setting == "LIMITS_CACHE_SECONDS":
        clear_cache()


setting_changed.connect(_on_setting_changed, dispatch_uid="apps.limits.config.setting_changed")
