"""``GET /v1/events``: the live event stream (D8) as an ASGI-native Channels consumer.

Served by config.asgi next to the REST API on the same port (apps.events.routing). Per connection:

1. Authenticate exactly like every REST endpoint (apps.identity.authentication, run in a worker thread: it may
   read the API-key table or fetch the issuer's keys); errors are D1 JSON bodies.
2. Subscribe to the process's hub (apps.events.hub) *before* anything is replayed, so no entry falls between the
   replay and the live feed; the per-connection floor (the last replayed id) drops the overlap.
3. Claim a slot of the user's ``SSE_MAX_CONNECTIONS_PER_USER`` in Redis; the oldest streams beyond the limit get a
   close message through the user's stream, wherever they are served.
4. Replay after ``Last-Event-ID`` when it is still retained, else send one ``invalidate``.
5. Write events as they come, a ``: keepalive`` comment after ``SSE_KEEPALIVE_SECONDS`` of silence; end after an
   ``evicted`` event (slow consumer, connection limit, the caller's token expired). A client disconnect cancels the writer; every exit
   unsubscribes and releases the slot.

The clean-up after a stream (``_release``) is synchronous and runs once, whatever ends the stream: the writer may be
cancelled again while it cleans up (a cancel of the consumer's task reaches the writer it awaits), and an ``await``
in that clean-up let the second cancel skip the rest. After bursts of clients dropping their streams, the
``sse_connections`` gauge counted 84 streams with none open (issue 28 item 10). The slot's removal from Redis runs
on its own task, not awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from urllib.parse import parse_qs

import redis
from channels.db import database_sync_to_async
from channels.generic.http import AsyncHttpConsumer
from django.conf import settings

from apps.core import errors, metrics
from apps.core.logging import request_id_for, reset_request_id, set_request_id
from apps.core.redis_client import get_async_client
from apps.events import streams
from apps.events.hub import KEEPALIVE_ITEM, Item, Subscriber, get_hub
from apps.events.streams import kind_of
from apps.identity.authentication import authenticate_credentials

logger = logging.getLogger(__name__)
access_log = logging.getLogger("apps.access")

_ROUTE = "/v1/events"
_REPLAY_PAGE = 500
# Events already queued for a stream go out in one write (up to this many): one send per burst, not per event.
_COALESCE_EVENTS = 64

# Atomically: register the connection with a global sequence number, then pop the oldest beyond the limit.
_CLAIM_SLOT = """
local seq = redis.call('INCR', KEYS[2])
redis.call('ZADD', KEYS[1], seq, ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
local excess = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[2])
if excess > 0 then
  return redis.call('ZPOPMIN', KEYS[1], excess)
end
return {}
"""


class EventStreamConsumer(AsyncHttpConsumer):
    # No channel layer: a per-connection channel would be one more Redis poller per client; the hub fans out.
    channel_layer_alias = "__sse_has_no_channel_layer__"

    async def __call__(self, scope, receive, send) -> None:
        self._finished = asyncio.Event()
        self._writer: asyncio.Task | None = None
        self._expiry: asyncio.TimerHandle | None = None
        self._subscriber: Subscriber | None = None  # registered with the hub, holding a slot, counted: _release
        self._opened_at = 0.0
        self._closed_by = "client"

        async def receive_or_finished():
            # When the writer ends the stream itself, the consumer must stop too; uvicorn only reports a
            # disconnect for a completed response once asked, so the writer's end counts as one.
            incoming = asyncio.ensure_future(receive())
            finished = asyncio.ensure_future(self._finished.wait())
            done, _ = await asyncio.wait({incoming, finished}, return_when=asyncio.FIRST_COMPLETED)
            if incoming in done:
                finished.cancel()
                return incoming.result()
            incoming.cancel()
            return {"type": "http.disconnect"}

        await super().__call__(scope, receive_or_finished, send)

    async def http_request(self, message) -> None:
        # Channels' version stops the consumer when handle() returns; the stream outlives it.
        if message.get("more_body"):
            return
        await self.handle(b"")

    async def disconnect(self) -> None:
        writer = self._writer
        if writer is not None and not writer.done():
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                # Shielded: were this task cancelled now, the writer would be cancelled again mid clean-up.
                await asyncio.shield(writer)
        self._release()  # a writer cancelled before it ever ran cleaned up nothing

    async def handle(self, body: bytes) -> None:
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in self.scope["headers"]}
        self.request_id = request_id_for(headers.get("x-request-id", ""))
        token = set_request_id(self.request_id)
        try:
            await self._start(headers)
        except Exception as exc:
            # Like the REST API: the one error model (a database outage is a 503), a JSON 500 with the request id
            # for anything unexpected, never a bare server error page.
            error = errors.from_exception(exc)
            if error is None:
                logger.exception("event stream failed to start")
                error = errors.ApiError(500, "Internal server error.")
            await self._send_error(error)
        finally:
            reset_request_id(token)

    async def _start(self, headers: dict[str, str]) -> None:
        if self.scope["method"] != "GET":
            raise errors.ApiError(405, f"Method {self.scope['method']} is not allowed.", headers={"Allow": "GET"})
        authenticated = await database_sync_to_async(authenticate_credentials, thread_sensitive=False)(
            headers.get("authorization", ""), headers.get("x-api-key")
        )
        if authenticated is None:
            raise errors.unauthenticated()
        principal = authenticated[0]
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        try:
            kinds = streams.parse_kinds(query["kinds"][-1] if "kinds" in query else None)
        except ValueError as exc:
            raise errors.validation_error({"kinds": str(exc)}) from None

        subscriber = Subscriber(user_id=principal.user_id, kinds=kinds, on_close=self._arm_eviction_deadline)
        expires_in = _token_lifetime(principal.raw_claims)
        hub = get_hub()
        try:
            await hub.register(subscriber)
            evicted = await get_async_client().eval(
                _CLAIM_SLOT,
                2,
                streams.connections_key(subscriber.user_id),
                streams.sequence_key(),
                subscriber.connection_id,
                settings.SSE_MAX_CONNECTIONS_PER_USER,
                streams.slot_ttl(),
            )
        except redis.RedisError as exc:
            hub.unregister(subscriber)
            logger.warning("event stream cannot reach Redis", extra={"error": type(exc).__name__, "detail": str(exc)})
            raise errors.unavailable("The event stream is temporarily unavailable.") from None
        await self.send_headers(
            status=200,
            headers=[
                (b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no"),  # proxies (nginx) must not buffer the stream
                (b"x-request-id", self.request_id.encode()),
            ],
        )
        await self.send_body(b"", more_body=True)
        self._subscriber, self._opened_at = subscriber, time.perf_counter()
        metrics.SSE_CONNECTIONS.inc()  # from here on, counted until _release
        loop = asyncio.get_running_loop()
        if expires_in is not None:
            # The stream lives no longer than the token it was opened with (a REST call with it would be a 401
            # from then on): one ``evicted`` event with reason ``token_expired``, then the end; the client
            # reconnects with a fresh token (and Last-Event-ID, losing nothing).
            self._expiry = loop.call_later(expires_in, subscriber.close, "token_expired")
        self._writer = loop.create_task(
            self._stream(subscriber, evicted[0::2], headers.get("last-event-id", "").strip()), name="sse-writer"
        )

    def _arm_eviction_deadline(self) -> None:
        """An evicted client may be stuck not reading (its writer blocked on a full socket): past the grace period
        the writer is cancelled, which unsubscribes it and ends the response without the final event."""

        def abort() -> None:
            if self._writer is not None and not self._writer.done():
                logger.info("evicted client did not read its last event; dropped")
                self._writer.cancel()

        asyncio.get_running_loop().call_later(settings.SSE_EVICTION_GRACE_SECONDS, abort)

    async def _send_error(self, error: errors.ApiError) -> None:
        response_headers = [(b"content-type", b"application/json"), (b"x-request-id", self.request_id.encode())]
        response_headers += [(name.lower().encode(), value.encode()) for name, value in error.headers.items()]
        await self.send_response(error.status, json.dumps(errors.body(error)).encode(), headers=response_headers)
        access_log.info("request", extra={"method": self.scope["method"], "route": _ROUTE, "status": error.status})
        self._finished.set()

    async def _stream(self, subscriber: Subscriber, evicted: list[bytes], last_event_id: str) -> None:
        client = get_async_client()
        try:
            if evicted:
                await _close_connections(client, subscriber.user_id, [member.decode() for member in evicted])
            floor = await self._replay(client, subscriber, last_event_id) if last_event_id else None
            while True:
                item = await subscriber.next()
                if item is KEEPALIVE_ITEM:
                    # (the hub refreshes the user's slot set, once per process and user)
                    await self.send_body(streams.KEEPALIVE, more_body=True)
                    continue
                if floor is not None and item.entry_id is not None:
                    if streams.entry_id_key(item.entry_id) <= floor:
                        continue  # already replayed
                    floor = None
                if item.close_reason is not None:
                    self._closed_by = item.close_reason
                    metrics.SSE_DISCONNECTS.labels(item.close_reason).inc()
                    await self._write_final(item)
                    return
                more = []
                for event in subscriber.take_ready_events(_COALESCE_EVENTS):
                    if floor is not None and event.entry_id is not None:
                        if streams.entry_id_key(event.entry_id) <= floor:
                            continue  # already replayed
                        floor = None
                    more.append(event)
                block = item.block or streams.sse_block(item.payload, item.entry_id)
                if more:
                    block = b"".join([block, *(event.block for event in more)])
                await self.send_body(block, more_body=True)
                metrics.SSE_EVENTS_SENT.inc(1 + len(more))
        finally:
            self._release()

    def _release(self) -> None:
        """Everything a stream holds, given back once and without an ``await`` (see the module docstring)."""
        subscriber, self._subscriber = self._subscriber, None
        if subscriber is None:
            return
        if self._expiry is not None:
            self._expiry.cancel()
        get_hub().unregister(subscriber)
        try:
            removal = asyncio.ensure_future(
                get_async_client().zrem(streams.connections_key(subscriber.user_id), subscriber.connection_id)
            )
        except RuntimeError:  # no running loop any more (shutdown): the slot expires with its key
            metrics.SSE_CONNECTIONS.dec()
        else:
            # Counted gone once nothing of it is left, its slot in the per-user limit included. A done callback runs
            # however the removal ends (done, failed, cancelled).
            removal.add_done_callback(_slot_released)
        token = set_request_id(self.request_id)
        access_log.info(
            "request",
            extra={
                "method": "GET",
                "route": _ROUTE,
                "status": 200,
                "duration_ms": round((time.perf_counter() - self._opened_at) * 1000, 2),
                "closed_by": self._closed_by,
            },
        )
        reset_request_id(token)
        self._finished.set()

    async def _write_final(self, item: Item) -> None:
        """The ``evicted`` event, then the end of the response (bounded by the deadline armed at eviction)."""
        await self.send_body(streams.sse_block(item.payload), more_body=True)
        await self.send_body(b"", more_body=False)

    async def _replay(self, client, subscriber: Subscriber, last_event_id: str) -> tuple[int, int] | None:
        """Send what the client missed after ``last_event_id``; returns the last id sent (the floor below which
        live entries are duplicates), or None after an ``invalidate``."""
        key = streams.stream_key(subscriber.user_id)
        if streams.resumable(last_event_id):
            try:
                entries = await client.xrange(key, min=last_event_id, max="+", count=_REPLAY_PAGE)
            except redis.RedisError:
                entries = []
        else:
            entries = []
        if not entries or entries[0][0].decode() != last_event_id:
            # Trimmed past retention, expired, from another Redis, or not an id we issued: refetch.
            await self.send_body(streams.sse_block(streams.stream_event("invalidate")), more_body=True)
            return None
        floor = streams.entry_id_key(last_event_id)
        more = len(entries) == _REPLAY_PAGE
        entries = entries[1:]
        while entries:
            for raw_id, fields in entries:
                # Control messages in the history were addressed to older connections: skip them.
                payload = streams.payload_of(fields)
                if payload is not None and subscriber.wants(kind_of(payload)):
                    await self.send_body(streams.sse_block(payload, raw_id.decode()), more_body=True)
                    metrics.SSE_EVENTS_SENT.inc()
            last = entries[-1][0].decode()
            floor = streams.entry_id_key(last)
            if not more:
                break
            entries = await client.xrange(key, min=f"({last}", max="+", count=_REPLAY_PAGE)
            more = len(entries) == _REPLAY_PAGE
        return floor


def _slot_released(removal: asyncio.Future) -> None:
    """The stream is gone. A slot Redis could not remove expires with the user's slot set (streams.slot_ttl)."""
    metrics.SSE_CONNECTIONS.dec()
    error = None if removal.cancelled() else removal.exception()
    if error is not None:
        logger.info("could not release an event stream's slot; it expires", extra={"error": type(error).__name__})


def _token_lifetime(claims: dict) -> float | None:
    """Seconds until the token stops being accepted (its ``exp`` plus the leeway every endpoint allows)."""
    exp = claims.get("exp")
    if not isinstance(exp, int | float) or isinstance(exp, bool):
        return None
    return max(0.0, float(exp) + settings.OIDC_LEEWAY_SECONDS - time.time())


async def _close_connections(client, user_id: str, connection_ids: list[str]) -> None:
    """Tell the user's oldest streams (any process) to end, through the user's stream their hubs read."""
    pipe = client.pipeline(transaction=False)
    for connection_id in connection_ids:
        pipe.eval(*streams.append_args(user_id, "c", json.dumps({"close": connection_id})))
    with contextlib.suppress(redis.RedisError):
        await pipe.execute()
