"""One beat for any number of beat processes (issue 32.3): a leader lock in Redis, renewed while held.

Every host of a multi-host deployment may run the Procfile's ``beat`` (and `make run` runs one per instance); each
would send every periodic task on its own, so N beats sent each task N times. This scheduler (``CELERY_BEAT_SCHEDULER``)
sends only while it holds the lock ``BEAT_LEADER_LOCK_KEY`` in the broker's Redis: taken with ``SET NX PX``, renewed
every third of ``BEAT_LEADER_LOCK_TTL_SECONDS`` by the holder only (compare-and-set on a random token), released on a
clean stop. The other beats stand by and try again at the same pace; a leader killed outright is replaced within
the TTL plus one try (about 20 s by default), and the new leader's first tick sends whatever is due at once.

Redis, not a PostgreSQL advisory lock: beat already depends on the broker and nothing else (config.beat never sets
Django up nor connects to the database), and a beat that cannot reach Redis cannot send anything either. A leader
that stalls longer than the TTL (a frozen VM) may overlap with its successor for one renewal interval; the tasks
it sends are idempotent (leases, SKIP LOCKED sweeps), so such an overlap costs a repeated run, never a wrong result.
"""

from __future__ import annotations

import logging
import secrets
import socket
import time
from typing import Any

from celery.beat import PersistentScheduler
from django.conf import settings

logger = logging.getLogger(__name__)

# Renew only our own lock: the token is ours only while no other beat took the lock after it expired.
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


class LeaderLock:
    """A lease on one Redis key: ``hold()`` takes or renews it and says whether this process holds it now."""

    def __init__(self, url: str, key: str, ttl_seconds: float, timeout_seconds: float = 2.0) -> None:
        import redis

        self.key = key
        self.ttl_ms = max(int(ttl_seconds * 1000), 1000)
        self.renew_every = self.ttl_ms / 3000
        self.token = f"{socket.gethostname()}:{secrets.token_hex(8)}"
        self._client = redis.Redis.from_url(url, socket_timeout=timeout_seconds, socket_connect_timeout=timeout_seconds)
        self._renew = self._client.register_script(_RENEW)
        self._release = self._client.register_script(_RELEASE)
        self.leading = False
        self._checked_at = float("-inf")
        self._unreachable = False
        self._standby_logged = False

    def hold(self) -> bool:
        now = time.monotonic()
        if now - self._checked_at < self.renew_every:
            return self.leading  # renewed (or refused) less than a third of the TTL ago: still true
        self._checked_at = now
        was_leading = self.leading
        try:
            if self.leading:
                self.leading = bool(self._renew(keys=[self.key], args=[self.token, self.ttl_ms]))
            if not self.leading:
                self.leading = bool(self._client.set(self.key, self.token, nx=True, px=self.ttl_ms))
        except Exception as exc:  # Redis down or slow: nothing can be sent anyway; stand by and retry
            if not self._unreachable:
                logger.warning("beat leader lock unreachable; standing by", extra={"error": type(exc).__name__})
            self._unreachable = True
            self.leading = False
            return False
        self._unreachable = False
        if self.leading and not was_leading:
            logger.info("beat leading: this process sends the periodic tasks", extra={"lock": self.key})
            self._standby_logged = False
        elif was_leading and not self.leading:
            logger.warning("beat leadership lost to another beat; standing by", extra={"lock": self.key})
            self._standby_logged = True
        elif not self.leading and not self._standby_logged:
            logger.info(
                "beat standing by: another beat holds the leader lock", extra={"lock": self.key, "holder": self._holder()}
            )
            self._standby_logged = True
        return self.leading

    def _holder(self) -> str | None:
        try:
            value = self._client.get(self.key)
        except Exception:
            return None
        return value.decode(errors="replace").rsplit(":", 1)[0] if value else None

    def release(self) -> None:
        """Hand the lock over at once on a clean stop, instead of after the TTL."""
        if not self.leading:
            return
        self.leading = False
        try:
            self._release(keys=[self.key], args=[self.token])
        except Exception as exc:  # it expires by itself within the TTL
            logger.warning("beat leader lock not released", extra={"error": type(exc).__name__})
        finally:
            self._client.close()


class LeaderScheduler(PersistentScheduler):
    """Celery beat's default scheduler (the schedule file keeps the last run times) that sends only while it leads."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        app = kwargs["app"] if "app" in kwargs else args[0]
        url = app.conf.broker_url
        self.leader = LeaderLock(
            url if isinstance(url, str) else url[0],
            settings.BEAT_LEADER_LOCK_KEY,
            settings.BEAT_LEADER_LOCK_TTL_SECONDS,
        )
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if not self.leader.hold():
            return self.leader.renew_every
        # Never sleep past the next renewal: the lock would lapse while this beat still leads.
        return min(super().tick(*args, **kwargs), self.leader.renew_every)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.leader.release()

