"""The one publishing hook of the live event stream (D8).

Every service that creates, updates or deletes a conversation, an entry or a membership calls ``publish`` inside
its write transaction. ``publish`` resolves the recipients there (so call it before deleting the rows they are
resolved from, e.g. before deleting a conversation or a membership) and sends after commit; a failed publish never
fails the write, and nothing is sent for a transaction that rolls back.

Sending is one pipelined round trip to Redis per committed event: one append (XADD to the recipient's stream and
PUBLISH on its channel, apps.events.streams.append_args) per recipient. When Redis cannot be reached the write still succeeds; the recipients are remembered and get
an ``invalidate`` event with the next successful publish, so their clients refetch instead of silently missing the
event. After a failure publishing pauses for ``SSE_PUBLISH_BACKOFF_SECONDS`` so a dead Redis does not add a
connect timeout to every write.
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
from apps.core.redis_client import get_client
from apps.events import streams
from apps.sharing.access import AccessLevel, conversation_members

logger = logging.getLogger(__name__)

# Users who missed an event while Redis was unreachable (bounded: past this, the overflow is only logged).
_MISSED_LIMIT = 10_000
_lock = threading.Lock()
_missed: set[str] = set()
_paused_until = 0.0

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
    global _paused_until
    if time.monotonic() < _paused_until:
        _remember(recipients)
        return
    with _lock:
        missed = list(_missed)
        _missed.clear()
    try:
        pipe = get_client().pipeline(transaction=False)
        invalidate = streams.stream_event("invalidate")
        for user in missed:
            pipe.eval(*streams.append_args(user, "e", invalidate))
        for user in recipients:
            pipe.eval(*streams.append_args(user, "e", payload))
        pipe.execute()
    except redis.RedisError as exc:
        _paused_until = time.monotonic() + settings.SSE_PUBLISH_BACKOFF_SECONDS
        _remember(missed)
        _remember(recipients)
        metrics.SSE_PUBLISH_FAILURES.inc()
        # Never the payload: ids only, but the log line need not carry them either.
        logger.warning(
            "event publish failed", extra={"kind": kind, "recipients": len(recipients), "error": type(exc).__name__}
        )
        return
    if missed:
        logger.info("invalidate sent after publish failures", extra={"recipients": len(missed)})


def _remember(users: list[str]) -> None:
    with _lock:
        room = _MISSED_LIMIT - len(_missed)
        if len(users) > room:
            logger.error("too many users missed events to remember; some clients will not be told to refetch")
        _missed.update(users[: max(room, 0)])


def reset_for_tests() -> None:
    global _paused_until
    with _lock:
        _missed.clear()
    _paused_until = 0.0
