"""The per-process hub against a private Valkey that the test restarts: open streams get ``invalidate`` once Redis
is back (events published meanwhile are gone), then keep receiving; the hub's reader ends with its last subscriber."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from apps.events import hub as hub_module
from apps.events import streams
from apps.runtime.embedded_services import RestartableValkey


@pytest.fixture
def valkey(tmp_path, settings):
    server = RestartableValkey(tmp_path)
    server.start()
    settings.REDIS_URL = server.url
    settings.SSE_BUFFER_EVENTS = 64
    settings.SSE_KEEPALIVE_SECONDS = 30
    yield server
    server.stop()


async def _next_event(subscriber: hub_module.Subscriber, timeout: float = 10.0) -> hub_module.Item:
    while True:
        item = await asyncio.wait_for(subscriber.next(), timeout)
        if item is not hub_module.KEEPALIVE_ITEM:
            return item


def test_redis_restart_invalidates_open_streams_and_delivery_resumes(valkey):
    async def scenario() -> None:
        hub = hub_module.get_hub()
        subscriber = hub_module.Subscriber(user_id="hub-user", kinds=None)
        await hub.register(subscriber)
        client = redis.Redis.from_url(valkey.url)
        payload = streams.encode_event("created", "entry", {"conversationId": "c", "entryId": "before"})
        client.eval(*streams.append_args("hub-user", "e", payload))
        assert (await _next_event(subscriber)).payload == payload

        valkey.stop()  # the hub's connection is gone with it: it must reconnect whenever Redis is back
        valkey.start()
        assert (await _next_event(subscriber)).payload == streams.stream_event("invalidate")

        after = streams.encode_event("created", "entry", {"conversationId": "c", "entryId": "after"})
        redis.Redis.from_url(valkey.url).eval(*streams.append_args("hub-user", "e", after))
        assert (await _next_event(subscriber)).payload == after

        task = hub.task
        hub.unregister(subscriber)
        await asyncio.wait_for(asyncio.shield(task), 2)  # well under the reader's 5 s block
        assert hub.task is None  # no reader left behind

    asyncio.run(scenario())


def test_buffer_overflow_evicts_only_the_stuck_subscriber(valkey, settings):
    settings.SSE_BUFFER_EVENTS = 4

    async def scenario() -> None:
        hub = hub_module.get_hub()
        stuck = hub_module.Subscriber(user_id="hub-user-2", kinds=None)
        reading = hub_module.Subscriber(user_id="hub-user-2", kinds=None)
        await hub.register(stuck)
        await hub.register(reading)
        client = redis.Redis.from_url(valkey.url)
        received = []
        for index in range(20):
            payload = streams.encode_event("created", "entry", {"conversationId": "c", "entryId": f"e{index}"})
            client.eval(*streams.append_args("hub-user-2", "e", payload))
            received.append((await _next_event(reading)).payload)
        assert len(received) == 20
        assert stuck.closing == "slow_consumer"
        final = await _next_event(stuck)
        assert final.close_reason == "slow_consumer"
        assert final.payload == streams.stream_event("evicted", "slow_consumer")
        hub.unregister(stuck)
        hub.unregister(reading)

    asyncio.run(scenario())


def test_a_user_id_no_redis_key_can_hold_never_poisons_the_reader(valkey):
    """Issue 21.6, defence in depth (authentication refuses such ids first): a stream for a user id with a lone
    surrogate fails alone; streams registered afterwards in the same process are served."""

    async def scenario() -> None:
        hub = hub_module.get_hub()
        poisoned = hub_module.Subscriber(user_id="bad\ud800", kinds=None)
        with pytest.raises(UnicodeError):
            await hub.register(poisoned)
        assert "bad\ud800" not in hub.subscribers

        subscriber = hub_module.Subscriber(user_id="hub-user-3", kinds=None)
        await asyncio.wait_for(hub.register(subscriber), 10)
        payload = streams.encode_event("created", "entry", {"conversationId": "c", "entryId": "after"})
        redis.Redis.from_url(valkey.url).eval(*streams.append_args("hub-user-3", "e", payload))
        assert (await _next_event(subscriber)).payload == payload
        hub.unregister(subscriber)

    asyncio.run(scenario())


def test_after_a_redis_restart_a_publishers_owed_invalidate_is_not_sent_twice(valkey):
    """The hub's own invalidate after the restart already covers events the publishers missed before it; one they
    missed after it (the client may have refetched before that write) is still delivered, resumable."""

    async def scenario() -> None:
        hub = hub_module.get_hub()
        subscriber = hub_module.Subscriber(user_id="hub-user-4", kinds=None)
        await hub.register(subscriber)
        missed_before = int(time.time() * 1000)
        await asyncio.sleep(0.6)  # more than the clock margin between the missed write and the restart
        valkey.stop()
        valkey.start()
        assert (await _next_event(subscriber)).payload == streams.INVALIDATE
        client = redis.Redis.from_url(valkey.url)
        client.eval(*streams.append_args("hub-user-4", "i", str(missed_before)))
        missed_after = int(time.time() * 1000) + 1000
        client.eval(*streams.append_args("hub-user-4", "i", str(missed_after)))
        owed = await _next_event(subscriber)
        assert owed.payload == streams.INVALIDATE and owed.entry_id  # the later one, with its stream id
        after = streams.encode_event("created", "entry", {"conversationId": "c", "entryId": "after"})
        client.eval(*streams.append_args("hub-user-4", "e", after))
        assert (await _next_event(subscriber)).payload == after
        hub.unregister(subscriber)

    asyncio.run(scenario())
