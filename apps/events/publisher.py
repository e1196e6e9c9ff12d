"""The one publishing hook of the live event stream (D8).

A service that creates, updates or deletes a conversation, an entry or a membership records what happened inside its
write transaction: ``publish`` for one event, ``publish_all`` for the events of one write. Nothing is resolved or
sent then, and nothing at all for a transaction that rolls back (Django's ``on_commit``, so an event recorded in a
savepoint that rolls back goes with it). After commit, the write's events have their recipients resolved together,
in one query, and are sent in one pipelined round trip to Redis: inside a web request once the response has been
handed to the server (request_finished), with every other write of the request; outside requests (a task, a
command), at commit. A failed resolution or send never fails the write.

Recipients are resolved when the events are published, right after commit (D8): conversation and entry events go to every member of the
conversation's fork tree, membership events to the affected user (``data["userId"]``) and the tree's owners and
managers. Who those are is the sharing app's knowledge, which it lends through ``register_audience`` (this app
imports no other): a tree deleted by the write answers with the members it had when it was deleted.

Sending is one pipelined round trip to Redis per delivery: one script call per event and batch of recipients
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
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, NamedTuple

import redis
from django.conf import settings
from django.db import transaction

from apps.core import metrics
from apps.core.redis_client import breaker, get_client, guarded
from apps.events import streams

logger = logging.getLogger(__name__)

# Users who missed an event while Redis was unreachable, with the wall-clock ms of the newest they missed (bounded:
# past this, the overflow is only logged).
_MISSED_LIMIT = 10_000
_lock = threading.Lock()
_missed: dict[str, int] = {}
_recovering = False
_generation = 0  # bumped to end a running recovery thread (the tests' fresh_publisher fixture does)
_FIRST_RETRY_SECONDS = 0.5


# --- Recipients -----------------------------------------------------------------------------------------------


# Who hears about a conversation: (every member of its fork tree, those of them who are owners or managers, who
# also hear about memberships).
Audience = tuple[frozenset[str], frozenset[str]]
AudienceResolver = Callable[[list[str]], dict[str, Audience]]
_audience: AudienceResolver | None = None
_NOBODY: Audience = (frozenset(), frozenset())


def register_audience(resolver: AudienceResolver) -> None:
    """Called once by the app that owns memberships (apps.sharing, at start-up): until then nobody receives
    anything (deny by default)."""
    global _audience
    _audience = resolver


class _Event(NamedTuple):
    conversation_id: str
    kind: str
    affected_user: str | None  # a membership event's userId
    payload: bytes


# --- Recording ----------------------------------------------------------------------------------------------------


def publish(event: str, kind: str, data: dict[str, Any]) -> None:
    """Record one event of the current write; see ``publish_all``."""
    publish_all([(event, kind, data)])


def publish_all(events: Iterable[tuple[str, str, dict[str, Any]]]) -> None:
    """Record the events of the current write, delivered after it commits. Each is ``(event, kind, data)``:
    ``event`` created | updated | deleted; ``kind`` conversation | entry | membership; ``data`` ids only
    (``conversationId`` always; ``entryId``, ``userId``, ``accessLevel`` where they apply), never entry content."""
    recorded = []
    for event, kind, data in events:
        if event not in streams.EVENTS or kind not in streams.KINDS or "conversationId" not in data:
            # A programming error at a call site, not a runtime failure: surface it in tests.
            raise ValueError(f"publish({event!r}, {kind!r}, ...) does not follow the event contract")
        affected = str(data["userId"]) if kind == "membership" and data.get("userId") else None
        recorded.append(_Event(str(data["conversationId"]), kind, affected, streams.encode_event(event, kind, data)))
    if recorded:
        transaction.on_commit(partial(_committed, recorded), robust=True)


# Recipients are resolved at commit (one query per write, outside its transaction: no lock is held meanwhile). Inside
# a web request, the send then waits until the response has been handed to the server (request_finished): the
# caller's response does not wait for the Redis round trip, nor for this process's event loop fanning the event out
# to the streams open here (bench/events.py: that was most of what 500 listeners added to an append's latency).
# apps.events.middleware.DeferPublishMiddleware opens the deferral per request (a streamed response flushes at once:
# its request may last long). Outside requests (Celery tasks, commands) the send goes at commit too. Either way only
# after commit, in commit order. (Resolving after the response as well was tried: the longer gap between a response
# and its send let a client's next write, served by another thread, reach the streams first.)
_request = threading.local()


def _committed(events: list[_Event]) -> None:
    batch = _resolve(events)
    pending = getattr(_request, "pending", None)
    if pending is None:
        if batch:
            _send(batch)
    else:
        pending.extend(batch)


def defer_until_flush() -> None:
    """From now on this thread's deliveries wait for ``flush`` (called at the end of the request)."""
    flush()  # left by a request that never finished in this thread (not expected; never dropped)
    _request.pending = []


def request_finished(**_kwargs: Any) -> None:
    flush()


def flush() -> None:
    pending = getattr(_request, "pending", None)
    _request.pending = None
    if pending:
        try:
            _send(pending)
        except Exception:
            # Never the caller's problem: its response is already out.
            logger.exception("event publish failed", extra={"events": len(pending)})


# --- Delivery -----------------------------------------------------------------------------------------------------


def _resolve(events: Sequence[_Event]) -> list[tuple[list[str], bytes, str]]:
    """``(recipients, payload, kind)`` of each committed event that has any, resolved in one query."""
    try:
        audiences = _audience([*dict.fromkeys(event.conversation_id for event in events)]) if _audience else {}
    except Exception as exc:  # the database failed after the commit: the write stands, its events are lost
        metrics.SSE_PUBLISH_FAILURES.inc(len(events))
        logger.warning("event recipients could not be resolved", extra={"events": len(events), "error": type(exc).__name__})
        return []
    batch = []
    for event in events:
        members, managers = audiences.get(event.conversation_id, _NOBODY)
        if event.kind == "membership":
            recipients = set(managers)
            if event.affected_user:
                recipients.add(event.affected_user)
        else:
            recipients = set(members)
        if recipients:
            batch.append((sorted(recipients), event.payload, event.kind))
    return batch


def _send(batch: list[tuple[list[str], bytes, str]]) -> None:
    """Append each ``(recipients, payload, kind)`` of ``batch`` to its recipients' streams, in one round trip."""
    recipients = sorted({user for users, _payload, _kind in batch for user in users})
    kinds = ",".join(sorted({kind for _users, _payload, kind in batch}))
    with _lock:
        if _recovering:
            # The recovery thread owns Redis until it finds nothing owed (checked under this lock): these events
            # become owed invalidates too.
            _remember(recipients)
            return
        missed = _take_missed()
    try:
        with guarded():  # while Redis does not answer, a write does not wait on it (apps.core.redis_client)
            pipe = get_client().pipeline(transaction=False)
            _append_invalidates(pipe, missed)
            for users, payload, _kind in batch:
                for args in streams.fan_out_args(users, "e", payload):  # one call per batch of users, not per user
                    pipe.eval(*args)
            pipe.execute()
    except Exception as exc:
        # Whatever failed (Redis, or anything else), the invalidates this send took stay owed, and so do its own
        # events: the recovery thread delivers them.
        with _lock:
            _restore_missed(missed)
            _remember(recipients)
        _start_recovery()
        metrics.SSE_PUBLISH_FAILURES.inc(len(batch))
        # Never the payload: ids only, but the log line need not carry them either.
        logger.warning(
            "event publish failed",
            extra={"kind": kinds, "recipients": len(recipients), "error": type(exc).__name__},
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

