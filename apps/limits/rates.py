"""Per-user request rates in Valkey, shared by every web process and host: ``check_rate(principal, kind)``.

GCRA (the generic cell rate algorithm, a token bucket that stores one timestamp per key): a user's bucket of a
kind holds ``burst`` tokens and refills at ``per_minute``. One Lua script checks every kind a request takes (its
``requests`` token and, for an expensive operation, one of that class) against Valkey's own clock and takes them
only if all are there: one round trip, atomic, and the same clock for every host.

Leases: a request that takes only a ``requests`` token may take up to RATE_LIMIT_LEASE of them at once, when the
bucket holds at least twice that many, and keep the rest in this process for the user's next requests (for at most
a second). Most requests then skip the round trip. Nothing is ever admitted that was not taken from the shared
bucket, so a user never gets more than the limit; near the limit (fewer than twice the lease left) every request
takes exactly one token, so the boundary stays exact. The cost: tokens another process leased and has not used
yet (at most RATE_LIMIT_LEASE - 1 per process and user, for a second) are not available to this one.

Valkey down, frozen or slow: **fail open**. The call gives up after RATE_LIMIT_TIMEOUT_SECONDS (50 ms) and the
request goes on unlimited; the failure opens the process's Redis circuit (apps.core.redis_client.guarded, shared
with the indexer wake-ups and the event publisher), so until a background ping is answered again no request path
of the process asks Valkey: a frozen Valkey costs one timeout per process, not one per request. Availability over
enforcement: the quotas, which bound what a user can store, are PostgreSQL's and stay enforced. Each failure is
counted (``rate_limit_unavailable_total``) and logged.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

import redis
from django.conf import settings
from django.core.signals import setting_changed
from redis.backoff import NoBackoff
from redis.retry import Retry

from apps.core import errors, metrics
from apps.core.redis_client import RedisUnavailable, guarded
from apps.limits import config
from apps.limits.definitions import REQUESTS

logger = logging.getLogger(__name__)

# KEYS: one bucket per kind. ARGV[1]: the tokens wanted (a lease, > 1, only if each bucket keeps as many after);
# then for each key its emission interval (microseconds per token) and its capacity (burst * emission). A bucket's
# value is its theoretical arrival time (TAT, microseconds); it expires when full. Returns {tokens taken, 0, 0}, or
# {0, microseconds until every bucket has one token, 1-based index of the bucket furthest from it}.
_GCRA = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000000 + tonumber(now_parts[2])
local want = tonumber(ARGV[1])
local tats, emissions, capacities = {}, {}, {}
for i = 1, #KEYS do
    emissions[i] = tonumber(ARGV[2 * i])
    capacities[i] = tonumber(ARGV[2 * i + 1])
    local tat = tonumber(redis.call('GET', KEYS[i]) or now)
    if tat < now then tat = now end
    tats[i] = tat
end
local function fits(tokens)
    for i = 1, #KEYS do
        if tats[i] + emissions[i] * tokens - capacities[i] > now then return false end
    end
    return true
end
local take = 0
if want > 1 and fits(2 * want) then
    take = want
elseif fits(1) then
    take = 1
else
    local wait, which = 0, 0
    for i = 1, #KEYS do
        local allowed_at = tats[i] + emissions[i] - capacities[i]
        if allowed_at - now > wait then wait, which = allowed_at - now, i end
    end
    return {0, math.ceil(wait), which}
end
for i = 1, #KEYS do
    local tat = tats[i] + emissions[i] * take
    redis.call('SET', KEYS[i], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
end
return {take, 0, 0}
"""

# How long tokens taken ahead stay usable in this process.
_LEASE_SECONDS = 1.0
_MAX_LEASED_USERS = 10_000

_lock = threading.Lock()
_script: Any = None
_skip_until = 0.0
_leases: dict[str, tuple[int, float]] = {}  # user id -> (requests tokens left, usable until)


def check_rate(principal: Any, kind: str | None = None) -> None:
    """Take one ``requests`` token (and one of ``kind`` when given) from the caller's buckets, or raise 429
    ``rate_limited`` with ``Retry-After``. ``principal``: an apps.identity.principal.Principal (or anything with a
    ``user_id``). The same call serves the REST hook (apps.limits.throttling) and the MCP tools."""
    kinds = (REQUESTS,) if kind is None or kind == REQUESTS else (REQUESTS, kind)
    check_kinds(principal.user_id, kinds)


def check_class(principal: Any, kind: str) -> None:
    """Take one token of ``kind`` alone, for a service whose caller's hook already took the request's
    ``requests`` token (an append that turns out to create a conversation)."""
    check_kinds(principal.user_id, (kind,))


def check_kinds(user_id: str, kinds: tuple[str, ...]) -> None:
    """Take one token of each of ``kinds`` (all or none), or raise 429."""
    if not settings.RATE_LIMITS_ENABLED:
        return
    leasing = kinds == (REQUESTS,)
    if leasing and _take_leased(user_id):
        return
    keys: list[str] = []
    args: list[int] = [1]
    prefix = settings.RATE_LIMIT_REDIS_PREFIX
    for kind in kinds:
        per_minute, burst = config.rate(user_id, kind)
        emission = 60_000_000 // per_minute or 1
        # The user's id as a hash tag: a user's buckets share a cluster slot, so one script may touch them all.
        keys.append(f"{prefix}{{{user_id}}}:{kind}")
        args += [emission, emission * burst]
        if leasing:
            args[0] = max(1, min(settings.RATE_LIMIT_LEASE, burst // 20))
    try:
        with guarded():
            taken, wait_us, which = _gcra()(keys=keys, args=args)
    except RedisUnavailable:
        return  # the circuit is open: a failure was counted and logged when it opened
    except redis.RedisError as exc:
        metrics.RATE_LIMIT_UNAVAILABLE.inc()
        logger.warning("rate limiter unavailable; requests pass unlimited until Valkey answers again",
                       extra={"error": type(exc).__name__})  # fmt: skip
        return
    if taken:
        if taken > 1:
            _lease(user_id, int(taken) - 1)
        return
    kind = kinds[int(which) - 1]
    metrics.RATE_LIMITED.labels(kind).inc()
    retry_after = max(1, math.ceil(int(wait_us) / 1_000_000))
    raise errors.ApiError(
        429,
        f"Too many requests ({kind}); retry after {retry_after} s.",
        code="rate_limited",
        details={"rate": kind, "retryAfterSeconds": retry_after},
        headers={"Retry-After": str(retry_after)},
    )


def _take_leased(user_id: str) -> bool:
    with _lock:
        lease = _leases.get(user_id)
        if lease is None:
            return False
        left, until = lease
        if until < time.monotonic():
            del _leases[user_id]
            return False
        if left <= 1:
            del _leases[user_id]
        else:
            _leases[user_id] = (left - 1, until)
        return True


def _lease(user_id: str, tokens: int) -> None:
    with _lock:
        if len(_leases) >= _MAX_LEASED_USERS:
            _leases.clear()  # tokens dropped, never given twice
        left, until = _leases.get(user_id, (0, 0.0))
        now = time.monotonic()
        # Added to what another thread leased meanwhile (its tokens are taken from the bucket too).
        _leases[user_id] = ((left if until >= now else 0) + tokens, now + _LEASE_SECONDS)


def _gcra() -> Any:
    global _script
    script = _script
    if script is None:
        with _lock:
            if _script is None:
                timeout = settings.RATE_LIMIT_TIMEOUT_SECONDS
                # Its own pool: the shared client waits 2 s and retries, far too long for a check on every request.
                client = redis.Redis.from_url(
                    settings.REDIS_URL, socket_timeout=timeout, socket_connect_timeout=timeout,
                    retry=Retry(NoBackoff(), 0),
                )
                _script = client.register_script(_GCRA)
            script = _script
    return script


def reset() -> None:
    """Forget the client and the leased tokens (a setting changed; tests)."""
    global _script
    with _lock:
        _script = None
        _leases.clear()


def _on_setting_changed(*, setting: str, **_kwargs: Any) -> None:
    if setting in ("REDIS_URL", "RATE_LIMIT_TIMEOUT_SECONDS", "RATE_LIMITS_ENABLED",
                   "RATE_LIMIT_LEASE") or setting.startswith("RATE_LIMIT_REQUESTS_"):
        reset()


setting_changed.connect(_on_setting_changed, dispatch_uid="apps.limits.rates.setting_changed")
