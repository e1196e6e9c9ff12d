"""Issue 28 item 6: a frozen Valkey (SIGSTOP: connections stay open, nothing answers) costs a write one socket
timeout, not one per write for as long as the freeze lasts. After one Redis call on a request path fails for want
of Redis, the circuit opens (apps.core.redis_client): indexer wake-ups and event publishing skip Redis at once until
a background ping is answered. Beat's periodic run indexes what was written meanwhile, and the event stream's
recipients get their ``invalidate``, as when Valkey is down."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
import redis

from apps.conversations import tasks as conversation_tasks
from apps.core import redis_client
from apps.events import publisher, streams
from apps.memories import tasks as memory_tasks
from apps.runtime.embedded_services import RestartableValkey
from tests.conversations.support import append_ok, new_id, search, sql

pytestmark = pytest.mark.django_db(transaction=True)

NS = ["user", "bob", "frozen"]


@pytest.fixture
def valkey(tmp_path, settings, monkeypatch) -> Iterator[RestartableValkey]:
    """A Valkey of this test's own, as the service's Redis (and the publisher's memory of failures starts empty)."""
    server = RestartableValkey(tmp_path)
    server.start()
    settings.REDIS_URL = server.url  # a new client, and a closed circuit
    monkeypatch.setattr(publisher, "_missed", {})
    monkeypatch.setattr(publisher, "_recovering", False)
    monkeypatch.setattr(publisher, "_generation", publisher._generation + 1)
    try:
        yield server
    finally:
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


def put(client, key: str, text: str) -> float:
    started = time.monotonic()
    body = {"namespace": NS, "key": key, "value": {"text": text}, "index": {"text": text}}
    response = client.put("/v1/memories", body, format="json")
    assert response.status_code == 200, response.content
    return time.monotonic() - started


def timed_append(client, conversation_id: str, text: str) -> tuple[float, str]:
    started = time.monotonic()
    entry = append_ok(client, conversation_id, text)
    return time.monotonic() - started, entry["id"]


@pytest.mark.slow
def test_writes_wait_on_a_frozen_valkey_once_and_everything_is_indexed_and_told_after(valkey, client_for, settings):
    settings.REDIS_CIRCUIT_PROBE_SECONDS = 0.2
    bob = client_for("bob")
    cid = new_id()
    put(bob, "warm", "before the freeze")
    timed_append(bob, cid, "before the freeze")  # pooled connections to Valkey exist, as in a running service

    assert valkey.process is not None
    os.kill(valkey.process.pid, signal.SIGSTOP)
    try:
        waits, entries = [], []
        for index in range(6):
            waits.append(put(bob, f"m{index}", f"glacier survey note {index}"))
            seconds, entry = timed_append(bob, cid, f"glacier survey entry {index}")
            waits.append(seconds)
            entries.append(entry)
    finally:
        os.kill(valkey.process.pid, signal.SIGCONT)
    print("write latencies while frozen:", [round(wait, 2) for wait in waits])
    # Before: each PUT and each append waited 2 s (the indexer's wake-up; an append also its event), 24 s or more.
    assert waits[0] < 5, waits  # the first one waits out one socket timeout (2 s)
    assert max(waits[1:]) < 1.0, waits  # the others do not wait on Valkey at all (about 20 ms each)

    # Once Valkey answers, the circuit closes by itself.
    assert redis_client.breaker.is_open
    deadline = time.monotonic() + 10
    while redis_client.breaker.is_open and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not redis_client.breaker.is_open
    # Beat's periodic runs index everything written during the freeze (and the two written before it: no worker here).
    assert memory_tasks.index_pending_memories.run() == 7
    assert conversation_tasks.index_conversation_entries.run() == 7
    response = bob.post("/v1/memories/search", {"namespace_prefix": NS, "query": "glacier survey", "limit": 10},
                        format="json")  # fmt: skip
    assert {item["key"] for item in response.json()["items"]} >= {f"m{index}" for index in range(6)}
    assert sql("SELECT count(*) FROM conversation_entries WHERE id = ANY(%s::uuid[]) AND NOT embedding_pending "
               "AND indexed_content IS NOT NULL", [entries])[0][0] == 6  # fmt: skip
    assert {item["conversationId"] for item in search(bob, "glacier survey entry")["data"]} == {cid}
    # The conversation's members are told to refetch (the events of the freeze were not sent).
    client = redis.Redis.from_url(valkey.url)

    def invalidated() -> bool:
        return any(b"i" in fields for _id, fields in client.xrange(streams.stream_key("bob")))

    deadline = time.monotonic() + 10
    while not invalidated() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert invalidated() and not publisher._missed
