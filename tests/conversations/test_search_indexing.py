"""The conversation search index under concurrency and crashes: 32 real HTTP clients on POST .../index, 32 indexer
workers on one backlog, one indexer task per burst of appends, and a real Celery worker killed mid-batch whose
entries another worker indexes within 30 s (work leases are session advisory locks, apps.retrieval.leases)."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from functools import partial

import pytest

from apps.conversations import indexer, tasks
from apps.retrieval import leases
from tests.celery_workers import broker_url, kill_group, start_worker, wait_for
from tests.concurrency import run_concurrently
from tests.conversations.support import (
    CONVERSATIONS,
    append_ok,
    assert_no_5xx,
    count,
    new_id,
    sql,
)

pytestmark = pytest.mark.django_db(transaction=True)

SEARCH = f"{CONVERSATIONS}/search"
INDEX = f"{CONVERSATIONS}/index"
CLIENTS = 32


def found(client, query: str, search_type: str = "fulltext", limit: int = 200) -> set[str]:
    response = client.post(SEARCH, {"query": query, "searchType": search_type, "limit": limit}, format="json")
    assert response.status_code == 200, response.content
    return {item["entryId"] for item in response.json()["data"]}


@pytest.mark.slow
def test_32_concurrent_index_writers_leave_one_consistent_text_per_entry(client_for, http):
    bob = client_for("bob")
    cid = new_id()
    entries = [append_ok(bob, cid, f"entry {index}")["id"] for index in range(40)]
    clients = [http(f"indexer{index}", roles=("user", "indexer")) for index in range(CLIENTS)]

    def batch(client, number: int):
        # Overlapping batches in different orders: row locks must be taken in one order (no deadlock, no 5xx).
        chosen = entries[(number // 2) % 8:] if number % 2 else list(reversed(entries))[: 30 + number % 10]
        body = [{"conversationId": cid, "entryId": entry, "indexedContent": f"writer{number} text"} for entry in chosen]
        return client.post(INDEX, body)

    responses = run_concurrently([lambda c=client, n=number: batch(c, n) for number, client in enumerate(clients)])
    assert_no_5xx(responses)
    assert sorted({r.status_code for r in responses}) == [200], [r.text[:200] for r in responses if r.status_code != 200]
    rows = dict(sql("SELECT id::text, indexed_content FROM conversation_entries WHERE conversation_id = %s", [cid]))
    assert set(rows) == set(entries)
    assert all(text is not None and text.startswith("writer") for text in rows.values())
    # Each entry is indexed once per cycle whatever the writers did, and its vectors match its final text.
    report = indexer.run_cycle()
    assert report.indexed == 40
    assert count("conversation_entry_vectors v JOIN conversation_entries e ON e.id = v.entry_id",
                 "e.conversation_id = %s", [cid]) == 40
    assert count("conversation_entries", "conversation_id = %s AND embedding_pending", [cid]) == 0
    # The conversation's best hit for one writer's word is an entry that writer's text ended up on.
    for number in range(CLIENTS):
        expected = {entry for entry, text in rows.items() if text == f"writer{number} text"}
        if expected:
            hits = found(bob, f"writer{number}", "semantic")
            assert len(hits) == 1 and hits <= expected, (number, hits)


@pytest.mark.slow
def test_32_concurrent_indexer_workers_never_embed_an_entry_twice(client_for, monkeypatch):
    from apps.retrieval.embeddings import get_provider

    bob = client_for("bob")
    cid = new_id()
    for index in range(160):
        append_ok(bob, cid, f"harbour note number {index}")
    provider = get_provider()
    original = provider.embed_documents
    embedded: Counter[str] = Counter()
    lock = threading.Lock()

    def recording(texts):
        with lock:
            embedded.update(texts)
        time.sleep(0.02)  # long enough for other workers to look at the same entries meanwhile
        return original(texts)

    monkeypatch.setattr(provider, "embed_documents", recording)
    reports = run_concurrently([partial(indexer.run_cycle, batch_size=5)] * CLIENTS)
    assert sum(report.indexed for report in reports) == 160
    assert len(embedded) == 160 and max(embedded.values()) == 1
    assert count("conversation_entries", "conversation_id = %s AND (embedding_pending OR indexed_content IS NULL)",
                 [cid]) == 0
    assert leases.held_by_others(leases.CONVERSATION_INDEXING) == 0
    assert count("conversation_entry_vectors", "conversation_id = %s", [cid]) == 160
    assert len(found(bob, "harbour note")) == 1  # one result per conversation


def test_a_burst_of_appends_requests_one_indexer_task(client_for, indexer_wakeups):
    from apps.core.redis_client import get_client

    sent = indexer_wakeups
    get_client().delete(indexer.INDEXER._requested_key())
    bob = client_for("bob")
    cid = new_id()
    for index in range(30):
        append_ok(bob, cid, f"burst {index}")
    assert sent == [indexer.INDEXER.task_name]
    # The task clears the flag before it claims: an append after it starts asks again.
    tasks.index_conversation_entries()
    append_ok(bob, cid, "after the run")
    assert len(sent) == 2
    get_client().delete(indexer.INDEXER._requested_key())


@pytest.mark.live
@pytest.mark.slow
def test_a_worker_killed_mid_batch_loses_nothing_and_its_entries_are_indexed_within_30s(client_for, tmp_path):
    bob = client_for("bob")
    # One entry per conversation: search returns one result per conversation.
    entries = {append_ok(bob, new_id(), f"lighthouse keeper diary entry {index}")["id"] for index in range(20)}
    mine = "id = ANY(%s::uuid[])"
    broker = broker_url()
    workers = []
    try:
        # Worker 1 claims the whole batch at its first beat tick, then embeds "slowly" (a 5-minute model).
        slow, slow_log = start_worker(
            tmp_path, "slow", broker, EMBEDDING_HASH_DELAY_SECONDS="300", CONVERSATION_INDEXING_INTERVAL="2"
        )
        workers.append(slow)
        wait_for(lambda: leases.held_by_others(leases.CONVERSATION_INDEXING) == 20, 90, "worker 1 to claim",
                  [slow_log])

        # Worker 2, healthy, default schedule: while worker 1 lives it leaves the claimed entries alone.
        healthy, healthy_log = start_worker(tmp_path, "healthy", broker)
        workers.append(healthy)
        wait_for(
            lambda: re.search(rb"index_conversation_entries\[[^]]*\] succeeded", healthy_log.read_bytes()),
            90, "worker 2 to run a cycle", [healthy_log],
        )
        assert count("conversation_entries", f"{mine} AND indexed_content IS NOT NULL", [list(entries)]) == 0
        assert found(bob, "lighthouse keeper") == set()

        kill_group(slow)  # kill -9 worker 1 (main process, pool child and beat) mid-batch
        recovery = wait_for(
            lambda: found(bob, "lighthouse keeper diary") == entries and found(bob, "lighthouse", "semantic") == entries,
            30, "every entry to become searchable after the kill", [slow_log, healthy_log],
        )
        print(f"recovered {recovery:.1f}s after kill -9")
        assert count("conversation_entries", f"{mine} AND (embedding_pending OR indexed_content IS NULL)",
                     [list(entries)]) == 0
    finally:
        for process in workers:
            kill_group(process)
        import redis

        redis.Redis.from_url(broker).flushdb()
