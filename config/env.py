"""Typed readers for environment variables, so settings fail loudly on a malformed value instead of guessing."""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be true or false, got {raw!r}")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def database_from_url(url: str, conn_max_age: int) -> dict:
    """Django DATABASES entry from a libpq URL; psycopg parses it, so socket hosts (`?host=/path`) work too."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(url)
    return {
        "ENGINE": "apps.core.db",  # Django's postgresql backend, health check without a round trip
        "NAME": params.pop("dbname", "memory_service"),
        "USER": params.pop("user", ""),
        "PASSWORD": params.pop("password", ""),
        "HOST": params.pop("host", ""),
        "PORT": params.pop("port", ""),
        # Only the statements apps.core.db.prepared runs are prepared (it passes prepare=True): psycopg's automatic
        # preparing after N runs stays out of reach, and Django's default (None) would disable preparing entirely.
        "OPTIONS": {"prepare_threshold": 2**31 - 1, **params},
        "CONN_MAX_AGE": conn_max_age,
        "CONN_HEALTH_CHECKS": True,
    }
