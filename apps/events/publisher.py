"""The one publishing hook of the live event stream (D8).

Every service that creates, updates or deletes a conversation, an entry or a membership calls ``publish`` inside
its write transaction. ``publish`` resolves the recipients there (so call it before deleting the rows they are
resolved from, e.g. before deleting a conversation or a membership) and sends after commit; a failed publish never
fails the write, and nothing is sent for a transaction that rolls back.

Sending is one pipelined round trip to Redis per committed event: one script call per batch of recipients
(apps.events.streams.fan_out_args: for each recipient an XADD to its stream and a PUBLISH on its channel). When Redis cannot be reached the write still
succeeds; the recipients are remembered and get an ``invalidate`` event as soon as Redis answers again, so their
clients refetch instead of silently missing the event. After a failure, writes only remember their recipients (a
dead Redis adds no connect timeout to them) while one background thread per process tries Redis again, after
0.5 s and then at doubling intervals up to ``SSE_PUBLISH_BACKOFF_SECONDS``, and delivers the owed ``invalidate``s
the moment it succeeds, whether or not anything is written afterwards. Each carries the time of the newest event it
stands for, so a stream whose reader already told its client to refetch after that time is not told again
(apps.events.hub): after an outage, an open stream gets one ``invalidate``.
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial
from typing import Any

import redis
from django.conf import settings
from django.db import transaction

from apps.core import metrics
from apps.core.redis_client import breaker, get_client, guarded
from apps.events import streams
from apps.sharing.access import AccessLevel, conversation_members

logger = logging.getLogger(__name__)

# Users who missed an event while Redis was unreachable, with the wall-clock ms of the newest they missed (bounded:
# past this, the overflow is only logged).
_MISSED_LIMIT = 10_000
_lock = threading.Lock()
_missed: dict[str, int] = {}
_recovering = False
_generation = 0  # bumped to end a running recovery thread (the tests' fresh_publisher fixture does)
_FIRST_RETRY_SECONDS = 0.5

_MEMBERSHIP_WATCHERS = {AccessLevel.OWNER.value, AccessLevel.MANAGER.value}


def publish(event: str, kind: str, data: dict[str, Any]) -> None:
    """``event``: created | updated | deleted; ``kind``: conversation | entry | membership; ``data``: ids only
    (``conversationId`` always; ``entryId``, ``userId``, ``accessLevel`` where they apply), never entry content.

    Conversation and entry events go to every member of the conversation's fork tree; membership events to the
    affected user (``data["userId"]``) and the tree's owners and managers (D8).
    """
    if event not in streams.EVENTS or kind not in streams.KINDS or "conversationId" not in data:
        # A programming error at a call site, not a runtime failure: surface it in tests.
        raise ValueError(f"publish({event!r}, {kind!r}, ...) does not follow the event contract")
    members = conversation_members(str(data["conversationId"]))
    if kind == "membership":
        recipients = {user for user, level in members if level in _MEMBERSHIP_WATCHERS}
        if data.get("userId"):
            recipients.add(str(data["userId"]))
    else:
        recipients = {user for user, _level in members}
    if not recipients:
        return
    payload = streams.encode_event(event, kind, data)
    transaction.on_commit(partial(_send_or_defer, sorted(recipients), payload, kind), robust=True)


# Inside a web request, sends wait until the response has been handed to the server (request_finished): the
# caller's response does not wait for the Redis round trip, nor for this process's event loop fanning the event out
# to the streams open here (bench/events.py: that was most of what 500 listeners added to an append's latency).
# apps.events.middleware.DeferPublishMiddleware opens the deferral per request (a streamed response flushes at once:
# its request may last long). Outside requests (Celery tasks, commands) they go at once. Either way only after
# commit, in commit order.
_request = threading.local()


def _send_or_defer(recipients: list[str], payload: bytes, kind: str) -> None:
    pending = getattr(_request, "pending", None)
    if pending is None:
        _send(recipients, payload, kind)
    else:
        pending.append((recipients, payload, kind))


def defer_until_flush() -> None:
    """From now on this thread's sends wait for ``flush`` (called at the end of the request)."""
    flush()  # left by a request that never finished in this thread (not expected; never dropped)
    _request.pending = []


def request_finished(**_kwargs: Any) -> None:
    flush()


def flush() -> None:
    pending = getattr(_request, "pending", None)
    _request.pending = None
    for recipients, payload, kind in pending or ():
        try:
            _send(recipients, payload, kind)
        except Exception:
            # Never the caller's problem: its response is already out.
            logger.exception("event publish failed", extra={"kind": kind})


def _send(recipients: list[str], payload: bytes, kind: str) -> None:
    with _lock:
        if _recovering:
            # The recovery thread owns Redis until it finds nothing owed (checked under this lock): this event
            # becomes an owed invalidate too.
            _remember(recipients)
            return
        missed = _take_missed()
    try:
        with guarded():  # while Redis does not answer, a write does not wait on it (apps.core.redis_client)
            pipe = get_client().pipeline(transaction=False)
            _append_invalidates(pipe, missed)
            for args in streams.fan_out_args(recipients, "e", payload):  # one call per batch of users, not per user
                pipe.eval(*args)
            pipe.execute()
    except Exception as exc:
        # Whatever failed (Redis, or anything else), the invalidates this send took stay owed, and so does its own
        # event: the recovery thread delivers them.
        with _lock:
            _restore_missed(missed)
            _remember(recipients)
        _start_recovery()
        metrics.SSE_PUBLISH_FAILURES.inc()
        # Never the payload: ids only, but the log line need not carry them either.
        logger.warning(
            "event publish failed",
            extra={"kind": kind, "recipients": len(recipients), "error": type(exc).__name__},
            exc_info=not isinstance(exc, redis.RedisError),
        )
        return
    if missed:
        logger.info("invalidate sent after publish failures", extra={"recipients": len(missed)})


def _append_invalidates(pipe, missed: dict[str, int]) -> None:
    for user, newest_ms in missed.items():
        pipe.eval(*streams.append_args(user, "i", str(newest_ms)))


# The three helpers below read and write ``_missed``: their callers hold ``_lock``.


def _take_missed() -> dict[str, int]:
    missed = dict(_missed)
    _missed.clear()
    return missed


def _restore_missed(missed: dict[str, int]) -> None:
    for user, newest_ms in missed.items():
        _missed[user] = max(newest_ms, _missed.get(user, 0))


def _remember(users: list[str]) -> None:
    now_ms = int(time.time() * 1000)
    for user in users:
        if user not in _missed and len(_missed) >= _MISSED_LIMIT:
            logger.error("too many users missed events to remember; some clients will not be told to refetch")
            return
        _missed[user] = now_ms


def _start_recovery() -> None:
    """One thread per process delivers the owed invalidates once Redis answers (see the module docstring)."""
    global _recovering
    with _lock:
        if _recovering:
            return
        _recovering = True
    threading.Thread(target=_recover, args=(_generation,), name="sse-publish-recovery", daemon=True).start()


def _recover(generation: int) -> None:
    global _recovering
    delay = _FIRST_RETRY_SECONDS
    while True:
        time.sleep(delay)
        if generation != _generation:
            return
        with _lock:
            missed = _take_missed()
        try:
            pipe = get_client().pipeline(transaction=False)
            _append_invalidates(pipe, missed)
            pipe.ping()
            pipe.execute()
            breaker.answered()
        except Exception as exc:  # Redis down, or anything else: the thread never dies with _recovering still set
            if not isinstance(exc, redis.RedisError):
                logger.exception("event publish recovery failed")
            with _lock:
                _restore_missed(missed)
            delay = min(delay * 2, max(settings.SSE_PUBLISH_BACKOFF_SECONDS, _FIRST_RETRY_SECONDS))
            continue
        with _lock:
            if _missed:  # remembered while the pipeline ran: the next round sends them at once
                delay = 0.0
                continue
            _recovering = False
        logger.info("event publishing recovered; invalidate sent", extra={"recipients": len(missed)})
        return

