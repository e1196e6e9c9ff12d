"""One reader of Redis per process (per event loop) for every open stream in it.

A blocking ``XREAD`` per connection would hold one Redis connection per client; instead the hub issues one
``XREAD BLOCK`` over the streams of every user with an open connection here and fans each entry out to that user's
subscribers through small in-memory buffers. A new user's stream is added by waking the blocked read through a
per-hub wake stream. When the last subscriber leaves, the hub task ends and closes its Redis connection, so an idle
process holds no reader at all.

A subscriber that falls ``SSE_BUFFER_EVENTS`` behind is marked evicted instead of slowing the hub (and so every
other client). When Redis fails, the hub retries with backoff and, once it reads again, gives every subscriber an
``invalidate`` event: events published meanwhile may be gone.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from django.conf import settings

from apps.core.redis_client import get_async_client, new_async_connection
from apps.events import streams

logger = logging.getLogger(__name__)

# Entries read per stream and XREAD call: bounds one call's work; more arrive with the next call. Never more than a
# subscriber's buffer holds, so one burst cannot evict a client whose writer had no chance to run yet.
_MAX_READ_COUNT = 512
_BLOCK_MS = 5000
_RETRY_BACKOFF = (0.1, 0.2, 0.5, 1.0, 2.0)


@dataclass
class Item:
    """What a stream writes next: an event (``entry_id`` set when resumable) or the end of the stream."""

    payload: bytes | None
    entry_id: str | None = None
    close_reason: str | None = None


@dataclass(eq=False)
class Subscriber:
    user_id: str
    kinds: frozenset[str] | None
    connection_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    buffer: collections.deque[Item] = field(default_factory=collections.deque)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    closing: str | None = None
    last_activity: float = field(default_factory=time.monotonic)
    # Called once when the stream is told to end (the consumer arms its eviction deadline here).
    on_close: Callable[[], None] | None = None

    def wants(self, kind: str) -> bool:
        return self.kinds is None or kind == streams.STREAM_KIND or kind in self.kinds

    def deliver(self, entry_id: str, kind: str, payload: bytes) -> None:
        if self.closing is not None or not self.wants(kind):
            return
        if len(self.buffer) >= settings.SSE_BUFFER_EVENTS:
            self.close("slow_consumer")
            return
        self.buffer.append(Item(payload, entry_id))
        self.ready.set()

    def invalidate(self) -> None:
        if self.closing is None:
            self.buffer.append(Item(streams.stream_event("invalidate")))
            self.ready.set()

    def close(self, reason: str) -> None:
        """End the stream after one ``evicted`` event; whatever was still buffered is dropped."""
        if self.closing is None:
            self.closing = reason
            self.buffer.clear()
            self.buffer.append(Item(streams.stream_event("evicted", reason), close_reason=reason))
            self.ready.set()
            if self.on_close is not None:
                self.on_close()

    def keepalive_due(self, now: float) -> None:
        """Queue a keepalive when nothing was queued for SSE_KEEPALIVE_SECONDS (called by the hub's ticker, so an
        idle stream costs no timer of its own)."""
        if self.closing is None and not self.buffer and now - self.last_activity >= settings.SSE_KEEPALIVE_SECONDS:
            self.buffer.append(KEEPALIVE_ITEM)
            self.ready.set()

    async def next(self) -> Item:
        while not self.buffer:
            self.ready.clear()
            await self.ready.wait()
        self.last_activity = time.monotonic()
        return self.buffer.popleft()


# Not an event: the writer sends a keepalive comment for it.
KEEPALIVE_ITEM = Item(None)


class Hub:
    def __init__(self) -> None:
        self.subscribers: dict[str, set[Subscriber]] = {}
        self.positions: dict[str, str] = {}  # user -> id of the last entry read from the user's stream
        self.wake_key = f"{streams.prefix()}w:{uuid.uuid4().hex}"
        self.task: asyncio.Task | None = None
        self.generation = 0  # bumped when the reader must stop; a reader only runs for its own generation
        self._background: set[asyncio.Task] = set()

    async def register(self, subscriber: Subscriber) -> None:
        """Start delivering the user's entries after the stream's current end. Raises ``redis.RedisError`` when
        Redis is unreachable (the caller answers 503 before any byte of the stream)."""
        user = subscriber.user_id
        new_user = user not in self.subscribers
        if new_user:
            last = await get_async_client().xrevrange(streams.stream_key(user), count=1)
            # A concurrent register of the same user may have won the await: keep its (equal or earlier) position.
            self.positions.setdefault(user, last[0][0].decode() if last else "0-0")
        self.subscribers.setdefault(user, set()).add(subscriber)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run(self.generation), name="sse-hub")
        elif new_user:
            await self._wake()

    def unregister(self, subscriber: Subscriber) -> None:
        users = self.subscribers.get(subscriber.user_id)
        if users is None:
            return
        users.discard(subscriber)
        if not users:
            del self.subscribers[subscriber.user_id]
            self.positions.pop(subscriber.user_id, None)
        if not self.subscribers and self.task is not None:
            # The reader ends and closes its connection, so an idle process holds nothing in Redis. Not by
            # cancelling it (redis-py finishes a blocked read first, up to the block timeout): a new generation
            # retires it and the wake stream unblocks its read at once.
            self.generation += 1
            self.task = None
            wake = asyncio.get_running_loop().create_task(self._wake())
            self._background.add(wake)
            wake.add_done_callback(self._background.discard)

    async def _wake(self) -> None:
        # Twice: after a Redis restart the first attempt may take a dead pooled connection (and drop it).
        for _attempt in range(2):
            try:
                await get_async_client().xadd(self.wake_key, {"w": b"1"}, maxlen=1, approximate=False)
                await get_async_client().expire(self.wake_key, 3600)
                return
            except redis.RedisError:
                continue  # if Redis is down the reader is failing too; it re-reads its state when it recovers

    async def _tick(self) -> None:
        """Keepalives for every idle subscriber of this process, checked a few times per interval."""
        period = max(0.05, settings.SSE_KEEPALIVE_SECONDS / 4)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for subscribers in list(self.subscribers.values()):
                for subscriber in list(subscribers):
                    subscriber.keepalive_due(now)

    async def _run(self, generation: int) -> None:
        connection = new_async_connection(
            name=f"sse-hub:{os.getpid()}:{self.wake_key[-8:]}", socket_timeout=_BLOCK_MS / 1000 + 5
        )
        failures = 0
        read_count = max(1, min(_MAX_READ_COUNT, settings.SSE_BUFFER_EVENTS))
        ticker = asyncio.get_running_loop().create_task(self._tick(), name="sse-keepalive")
        try:
            while self.subscribers and generation == self.generation:
                keys = {streams.stream_key(user): position for user, position in self.positions.items()}
                keys[self.wake_key] = "$"
                try:
                    result = await connection.xread(keys, count=read_count, block=_BLOCK_MS)
                except redis.RedisError as exc:
                    if failures == 0:
                        logger.warning("event stream reader lost Redis", extra={"error": type(exc).__name__})
                    await asyncio.sleep(_RETRY_BACKOFF[min(failures, len(_RETRY_BACKOFF) - 1)])
                    failures += 1
                    continue
                if failures:
                    logger.info("event stream reader reconnected to Redis")
                    failures = 0
                    for subscribers in self.subscribers.values():
                        for subscriber in subscribers:
                            subscriber.invalidate()
                self._dispatch(result or [])
                # Let the writers drain what was just handed to them before reading more.
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            pass
        finally:
            ticker.cancel()
            await connection.aclose()

    def _dispatch(self, result: list) -> None:
        prefix = streams.stream_key("")
        for raw_key, entries in result:
            key = raw_key.decode()
            if not key.startswith(prefix):
                continue  # the wake stream
            user = key[len(prefix) :]
            if user not in self.positions:
                continue  # every subscriber left while the read was in flight
            for raw_id, fields in entries:
                entry_id = raw_id.decode()
                self.positions[user] = entry_id
                dispatch_entry(self.subscribers.get(user, ()), entry_id, fields)


def dispatch_entry(subscribers, entry_id: str, fields: dict[bytes, bytes]) -> None:
    payload = fields.get(b"e")
    if payload is not None:
        kind = streams.kind_of(payload)
        for subscriber in list(subscribers):
            subscriber.deliver(entry_id, kind, payload)
        return
    control = fields.get(b"c")
    if control is not None:
        target = json.loads(control).get("close")
        for subscriber in list(subscribers):
            if subscriber.connection_id == target:
                subscriber.close("connection_limit")


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Hub] = weakref.WeakKeyDictionary()


def get_hub() -> Hub:
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        hub = _hubs[loop] = Hub()
    return hub
