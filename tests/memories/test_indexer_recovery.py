"""The indexer under concurrency and crashes, with real threads and real Celery worker processes.

Work leases are session-level advisory locks held by each worker's database connection (apps.retrieval.leases): live workers
never embed the same version at once, and a worker killed mid-batch frees its rows the moment PostgreSQL sees its
connection close, so another worker's next cycle takes them (issue 7, item 4: within 30 s, not after a timeout).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import Counter
from functools import partial
from pathlib import Path

import pytest

from apps.memories import indexer
from apps.memories.models import IndexStatus, Memory
from apps.retrieval import leases
from tests.celery_workers import broker_url, kill_group, start_worker, wait_for
from tests.concurrency import run_concurrently

pytestmark = pytest.mark.django_db(transaction=True)

NS = ["user", "bob", "crash"]


def put(client, key: str, text: str) -> None:
    body = {"namespace": NS, "key": key, "value": {"text": text}, "index": {"text": text}}
    response = client.put("/v1/memories", body, format="json")
    assert response.status_code == 200, response.content


def searchable_keys(client, query: str) -> set[str]:
    response = client.post(
        "/v1/memories/search", {"namespace_prefix": NS, "query": query, "search_type": "semantic", "limit": 100},
        format="json",
    )
    assert response.status_code == 200, response.content
    return {item["key"] for item in response.json()["items"]}


@pytest.mark.slow
def test_32_concurrent_workers_never_embed_a_version_twice(client_for, monkeypatch):
    from apps.retrieval.embeddings import get_provider

    bob = client_for("bob")
    for index in range(160):
        put(bob, f"k{index}", f"note number {index} about harbours")
    provider = get_provider()
    original = provider.embed_documents
    embedded: Counter[str] = Counter()
    lock = threading.Lock()

    def recording(texts):
        with lock:
            embedded.update(texts)
        time.sleep(0.02)  # long enough for the other workers to look at the same rows meanwhile
        return original(texts)

    monkeypatch.setattr(provider, "embed_documents", recording)
    reports = run_concurrently([partial(indexer.run_cycle, batch_size=5)] * 32)
    assert sum(report.indexed for report in reports) == 160
    assert len(embedded) == 160 and max(embedded.values()) == 1  # every version embedded exactly once
    assert not Memory.objects.exclude(index_status=IndexStatus.INDEXED).exists()
    assert leases.held_by_others(leases.MEMORY_INDEXING) == 0
    assert len(searchable_keys(bob, "harbours")) == 100


@pytest.mark.live
@pytest.mark.slow
def test_a_worker_killed_mid_batch_loses_nothing_and_its_rows_are_taken_within_30s(client_for, tmp_path, settings):
    settings.MEMORY_SEARCH_PENDING_LIMIT = 0  # a search shows what the workers stored, none of what is still waiting
    bob = client_for("bob")
    for index in range(20):
        put(bob, f"m{index}", f"lighthouse keeper diary entry {index}")
    broker = broker_url()
    workers: list[subprocess.Popen] = []
    try:
        # Worker 1 claims the whole batch at its first beat tick, then embeds "slowly" (a 5-minute model).
        slow, slow_log = start_worker(
            tmp_path, "slow", broker, EMBEDDING_HASH_DELAY_SECONDS="300", MEMORY_EPISODIC_INDEXING_INTERVAL="2"
        )
        workers.append(slow)
        wait_for(
            lambda: Memory.objects.filter(index_attempts=1).count() == 20, 90, "worker 1 to claim", [slow_log]
        )

        # Worker 2, healthy, with the default schedule: while worker 1 lives it leaves the claimed rows alone.
        healthy, healthy_log = start_worker(tmp_path, "healthy", broker)
        workers.append(healthy)
        wait_for(lambda: b"succeeded" in healthy_log.read_bytes(), 90, "worker 2 to run a cycle", [healthy_log])
        assert Memory.objects.filter(index_status=IndexStatus.INDEXED).count() == 0
        assert searchable_keys(bob, "lighthouse keeper") == set()

        kill_group(slow)  # kill -9 worker 1 (its threads and beat) mid-batch
        recovery = wait_for(
            lambda: searchable_keys(bob, "lighthouse keeper diary") == {f"m{index}" for index in range(20)},
            30, "every memory to become searchable after the kill", [slow_log, healthy_log],
        )
        print(f"recovered {recovery:.1f}s after kill -9")
        assert not Memory.objects.exclude(index_status=IndexStatus.INDEXED).exists()
        assert Memory.objects.get(key="m0").index_attempts == 2  # claimed twice: by the dead worker, then by worker 2
    finally:
        for process in workers:
            kill_group(process)
        import redis

        redis.Redis.from_url(broker).flushdb()


def _pool_children(pid: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().split(")")[-1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            children.append(int(stat.parent.name))
    return children


@pytest.mark.live
@pytest.mark.slow
def test_a_killed_pool_process_has_its_task_redelivered_and_its_rows_claimed_again_at_once(client_for, tmp_path):
    """kill -9 of the pool process only: the worker hands the task back to the broker (task_reject_on_worker_lost
    with acks_late), a new pool process runs it, and it can claim the rows at once because the dead process's
    claims went with its connection. No beat runs here, so nothing but the redelivery can start that second run."""
    from config.celery import app

    bob = client_for("bob")
    for index in range(5):
        put(bob, f"p{index}", f"tide pool creature {index}")
    broker = broker_url()
    worker = None
    try:
        # The prefork pool (a supported alternative to the Procfile's threads): its pool process can die alone.
        worker, log = start_worker(
            tmp_path, "pool", broker, beat=False, pool="prefork", EMBEDDING_HASH_DELAY_SECONDS="300"
        )
        with app.connection_for_write(url=broker) as conn:
            app.send_task("apps.memories.tasks.index_pending_memories", connection=conn)
        wait_for(lambda: Memory.objects.filter(index_attempts=1).count() == 5, 90, "the first claim", [log])
        pool = _pool_children(worker.pid)
        assert len(pool) == 1, pool
        os.kill(pool[0], signal.SIGKILL)  # mid-batch: the pool process sleeps in the "model"
        redelivered = wait_for(
            lambda: Memory.objects.filter(index_attempts=2).count() == 5, 30, "the redelivered task's claim", [log]
        )
        print(f"redelivered and re-claimed {redelivered:.1f}s after kill -9 of the pool process")
        assert redelivered < 30
        assert worker.poll() is None  # the worker itself lives on with a new pool process
        assert _pool_children(worker.pid) and _pool_children(worker.pid) != pool
    finally:
        if worker is not None:
            kill_group(worker)
        import redis

        redis.Redis.from_url(broker).flushdb()
