"""One reader of Redis per process (per event loop) for every open stream in it.

Each append to a user's stream is also published on the user's channel (apps.events.streams.append_args). The hub
holds one Pub/Sub connection subscribed to the channels of the users with an open stream here and fans each entry
out to their subscribers through small in-memory buffers. Redis pushes every entry once per process and the process
sends Redis nothing per event: no read command per event, as a blocking ``XREAD`` loop over every user's stream
needs (bench/events.py: that loop was the event loop's largest cost with 500 streams open, and the event loop shares
the GIL with the REST threads). When the last subscriber leaves, the hub task ends and closes its connection, so an
idle process holds no reader at all.

A user's feed starts where the user's stream ended when its first stream here registered: the hub reads that
position, subscribes, waits for the subscription to be confirmed, then reads what was appended in between from the
stream, holding channel messages back meanwhile; entries are delivered once, in id order.

A subscriber that falls ``SSE_BUFFER_EVENTS`` behind is marked evicted instead of slowing the hub (and so every
other client). When Redis fails, the hub reconnects with backoff and, once subscribed again, gives every subscriber
an ``invalidate`` event: events published meanwhile may be gone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
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

# Entries handled between two yields to the writers (at most a quarter of a subscriber's buffer), and read per
# catch-up XRANGE.
_MAX_READ_COUNT = 512
_RETRY_BACKOFF = (0.1, 0.2, 0.5, 1.0, 2.0)


@dataclass(frozen=True)
class Item:
    """What a stream writes next: an event (``entry_id`` set when resumable) or the end of the stream. One Item per
    event is shared by every subscriber it goes to, with its SSE block encoded once (``block``)."""

    payload: bytes | None
    entry_id: str | None = None
    close_reason: str | None = None
    block: bytes | None = None

    @classmethod
    def event(cls, payload: bytes, entry_id: str | None = None) -> Item:
        return cls(payload, entry_id, block=streams.sse_block(payload, entry_id))


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

    def deliver(self, item: Item, kind: str) -> None:
        if self.closing is not None or not self.wants(kind):
            return
        if len(self.buffer) >= settings.SSE_BUFFER_EVENTS:
            self.close("slow_consumer")
            return
        self.buffer.append(item)
        self.ready.set()

    def invalidate(self) -> None:
        if self.closing is None:
            self.buffer.append(_INVALIDATE)
            self.ready.set()

    def close(self, reason: str) -> None:
        """End the stream after one ``evicted`` event; whatever was still buffered is dropped."""
        if self.closing is None:
            self.closing = reason
            self.buffer.clear()
            event = streams.stream_event("evicted", reason)
            self.buffer.append(Item(event, close_reason=reason, block=streams.sse_block(event)))
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

    def take_ready_events(self, limit: int) -> list[Item]:
        """Further events already queued behind the one just taken (so a burst goes out in one write); stops at
        anything that is not a plain event (a keepalive, the final event)."""
        taken: list[Item] = []
        buffer = self.buffer
        while buffer and len(taken) < limit:
            item = buffer[0]
            if item.block is None or item.close_reason is not None:
                break
            taken.append(buffer.popleft())
        return taken


# Not an event: the writer sends a keepalive comment for it.
KEEPALIVE_ITEM = Item(None)
_INVALIDATE = Item.event(streams.stream_event("invalidate"))


_SUBSCRIBE_TIMEOUT = 5.0
_IDLE_PING_SECONDS = 5.0  # a silent connection is probed, so a Redis that vanished without a FIN is noticed


class Hub:
    def __init__(self) -> None:
        self.subscribers: dict[str, set[Subscriber]] = {}
        self.positions: dict[str, str] = {}  # user -> id of the last entry delivered (or the feed's start)
        self.catching_up: dict[str, list[tuple[str, dict[bytes, bytes]]]] = {}  # messages held per user meanwhile
        self.task: asyncio.Task | None = None
        self.generation = 0  # bumped when the reader must stop; a reader only runs for its own generation
        self.name = f"sse-hub:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._pubsub = None  # the running reader's PubSub, once subscribed
        self._ready: asyncio.Event | None = None
        self._confirmations: dict[bytes, list[asyncio.Future]] = {}
        self._background: set[asyncio.Task] = set()

    async def register(self, subscriber: Subscriber) -> None:
        """Start delivering the user's entries after the stream's current end. Raises ``redis.RedisError`` when
        Redis is unreachable (the caller answers 503 before any byte of the stream)."""
        user = subscriber.user_id
        # (a user whose start failed, leaving another of its subscribers registered, is started again)
        new_user = user not in self.positions and user not in self.catching_up
        self.subscribers.setdefault(user, set()).add(subscriber)
        if self.task is None or self.task.done():
            self._ready = asyncio.Event()
            self.task = asyncio.get_running_loop().create_task(self._run(self.generation), name="sse-hub")
        if new_user:
            try:
                await self._start_user(user)
            except BaseException:
                # Whatever failed (Redis, or a user id no Redis key can hold), the subscriber must not stay: the
                # reader subscribes every registered user's channel each time it (re)connects, and one that can
                # never be subscribed would keep it from serving anybody (issue 21.6).
                self.unregister(subscriber)
                raise

    async def _start_user(self, user: str) -> None:
        self.catching_up[user] = []
        try:
            client = get_async_client()
            key = streams.stream_key(user)
            last = await client.xrevrange(key, count=1)
            position = last[0][0].decode() if last else "0-0"
            await self._subscribe(user)
            # Appended between reading the position and the subscription: from the stream itself.
            entries = await client.xrange(key, min=f"({position}", max="+", count=_MAX_READ_COUNT)
        except BaseException:
            self.catching_up.pop(user, None)
            raise
        held = self.catching_up.pop(user, [])
        if user not in self.subscribers:
            return  # every subscriber left meanwhile
        self.positions[user] = position
        for raw_id, fields in entries:
            self._deliver(user, raw_id.decode(), fields)
        for entry_id, fields in held:
            self._deliver(user, entry_id, fields)

    async def _subscribe(self, user: str) -> None:
        """Subscribe to the user's channel and wait until Redis confirmed it (from then on nothing is missed)."""
        assert self._ready is not None
        try:
            await asyncio.wait_for(self._ready.wait(), _SUBSCRIBE_TIMEOUT)
        except TimeoutError:
            raise redis.ConnectionError("the event stream reader cannot reach Redis") from None
        pubsub = self._pubsub
        if pubsub is None:
            raise redis.ConnectionError("the event stream reader is reconnecting")
        channel = streams.channel_key(user).encode()
        confirmed = asyncio.get_running_loop().create_future()
        self._confirmations.setdefault(channel, []).append(confirmed)
        await pubsub.subscribe(channel)
        try:
            await asyncio.wait_for(confirmed, _SUBSCRIBE_TIMEOUT)
        except TimeoutError:
            raise redis.TimeoutError("no subscription confirmation from Redis") from None

    def unregister(self, subscriber: Subscriber) -> None:
        users = self.subscribers.get(subscriber.user_id)
        if users is None:
            return
        users.discard(subscriber)
        if not users:
            del self.subscribers[subscriber.user_id]
            self.positions.pop(subscriber.user_id, None)
            if self.subscribers:
                self._spawn(self._unsubscribe(subscriber.user_id))
        if not self.subscribers and self.task is not None:
            # The reader ends and closes its connection, so an idle process holds nothing in Redis.
            self.generation += 1
            self.task.cancel()
            self.task = None
            self._pubsub = None

    async def _unsubscribe(self, user: str) -> None:
        pubsub = self._pubsub
        if pubsub is None or user in self.subscribers:
            return  # reconnecting (it subscribes only current users), or the user came back meanwhile
        with contextlib.suppress(redis.RedisError, OSError):
            await pubsub.unsubscribe(streams.channel_key(user))

    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _tick(self) -> None:
        """Keepalives for every idle subscriber of this process, checked a few times per interval; and, once per
        interval, one round trip refreshing the expiry of the open-stream sets of every user with a stream here."""
        period = max(0.05, settings.SSE_KEEPALIVE_SECONDS / 4)
        refreshed = time.monotonic()
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for subscribers in list(self.subscribers.values()):
                for subscriber in list(subscribers):
                    subscriber.keepalive_due(now)
            if now - refreshed >= settings.SSE_KEEPALIVE_SECONDS and self.subscribers:
                refreshed = now
                pipe = get_async_client().pipeline(transaction=False)
                for user in list(self.subscribers):
                    pipe.expire(streams.connections_key(user), streams.slot_ttl())
                with contextlib.suppress(redis.RedisError):
                    await pipe.execute()

    async def _run(self, generation: int) -> None:
        failures = 0
        burst = max(1, min(_MAX_READ_COUNT, settings.SSE_BUFFER_EVENTS // 4))
        ticker = asyncio.get_running_loop().create_task(self._tick(), name="sse-keepalive")
        try:
            while self.subscribers and generation == self.generation:
                connection = new_async_connection(name=self.name, socket_timeout=_IDLE_PING_SECONDS + 5)
                pubsub = connection.pubsub()
                try:
                    channels = [streams.channel_key(user) for user in self.subscribers]
                    await pubsub.subscribe(*channels)
                    if generation != self.generation:
                        return
                    self._pubsub = pubsub
                    assert self._ready is not None
                    self._ready.set()
                    if failures:
                        logger.info("event stream reader reconnected to Redis")
                        failures = 0
                        # Whatever was published while disconnected is not coming: tell every client to refetch,
                        # and take the next entries as they come (a restarted Redis numbers them afresh).
                        for user in self.positions:
                            self.positions[user] = "0-0"
                        for subscribers in self.subscribers.values():
                            for subscriber in subscribers:
                                subscriber.invalidate()
                    handled = 0
                    while self.subscribers and generation == self.generation:
                        message = await pubsub.get_message(ignore_subscribe_messages=False, timeout=_IDLE_PING_SECONDS)
                        if message is None:
                            await pubsub.ping()
                            continue
                        self._handle(message)
                        handled += 1
                        if handled % burst == 0:
                            # A burst is read from the buffer without ever waiting: let the writers drain what was
                            # just handed to them, so one burst cannot evict a client that had no chance to write.
                            await asyncio.sleep(0)
                except Exception as exc:  # Redis down, or anything else: the reader retries and never dies
                    if generation != self.generation:
                        return
                    if not isinstance(exc, redis.RedisError | OSError):
                        logger.exception("event stream reader failed")
                    if self._ready is not None:
                        self._ready.clear()
                    self._pubsub = None
                    for waiting in self._confirmations.values():
                        for future in waiting:
                            if not future.done():
                                future.set_exception(redis.ConnectionError("the event stream reader lost Redis"))
                    self._confirmations.clear()
                    if failures == 0:
                        logger.warning("event stream reader lost Redis", extra={"error": type(exc).__name__})
                    await asyncio.sleep(_RETRY_BACKOFF[min(failures, len(_RETRY_BACKOFF) - 1)])
                    failures += 1
                finally:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()
                    with contextlib.suppress(Exception):
                        await connection.aclose()
        except asyncio.CancelledError:
            pass
        finally:
            ticker.cancel()

    def _handle(self, message: dict) -> None:
        kind = message["type"]
        if kind == "message":
            channel = message["channel"]
            channel = channel.decode() if isinstance(channel, bytes) else channel
            user = channel[len(streams.channel_key("")) :]
            entry_id, fields = streams.parse_published(message["data"])
            held = self.catching_up.get(user)
            if held is not None:
                held.append((entry_id, fields))
            else:
                self._deliver(user, entry_id, fields)
        elif kind == "subscribe":
            channel = message["channel"]
            channel = channel if isinstance(channel, bytes) else channel.encode()
            waiting = self._confirmations.get(channel)
            if waiting:
                future = waiting.pop(0)
                if not waiting:
                    del self._confirmations[channel]
                if not future.done():
                    future.set_result(None)

    def _deliver(self, user: str, entry_id: str, fields: dict[bytes, bytes]) -> None:
        """Hand one entry to the user's subscribers, once: entries at or before the user's position are dropped."""
        position = self.positions.get(user)
        if position is None:
            return  # every subscriber of the user left
        if streams.entry_id_key(entry_id) <= streams.entry_id_key(position):
            return
        self.positions[user] = entry_id
        dispatch_entry(self.subscribers.get(user, ()), entry_id, fields)


def dispatch_entry(subscribers, entry_id: str, fields: dict[bytes, bytes]) -> None:
    payload = fields.get(b"e")
    if payload is not None:
        # Decoded (its kind) and encoded (its SSE block) once per process, whatever the number of subscribers.
        kind = streams.kind_of(payload)
        item = Item.event(payload, entry_id)
        for subscriber in list(subscribers):
            subscriber.deliver(item, kind)
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
