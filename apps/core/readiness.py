"""Readiness checks for /readyz. Each domain registers what it depends on (the policy engine, the embedder);
core registers the database and Redis."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.db import connection

logger = logging.getLogger(__name__)

# name -> callable raising on failure. Registered by the AppConfig.ready() of each app.
_CHECKS: dict[str, Callable[[], None]] = {}
# name -> callable returning operator information shown beside the checks (e.g. the indexer backlog).
_INFO: dict[str, Callable[[], dict]] = {}


def register(name: str, check: Callable[[], None]) -> None:
    _CHECKS[name] = check


def register_info(name: str, info: Callable[[], dict]) -> None:
    _INFO[name] = info


def run_info() -> dict[str, dict]:
    results: dict[str, dict] = {}
    for name, info in _INFO.items():
        try:
            results[name] = info()
        except Exception as exc:  # information is best effort; the checks decide readiness
            results[name] = {"error": type(exc).__name__}
    return results


def run_checks() -> dict[str, str]:
    results: dict[str, str] = {}
    for name, check in _CHECKS.items():
        try:
            check()
            results[name] = "ok"
        except Exception as exc:  # a readiness probe reports every failure instead of raising
            logger.warning("readiness check failed", extra={"check": name, "error": type(exc).__name__})
            results[name] = f"failed: {type(exc).__name__}"
    return results


def check_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def check_redis() -> None:
    import redis

    timeout = settings.READINESS_TIMEOUT_SECONDS
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        client.ping()
    finally:
        client.close()
