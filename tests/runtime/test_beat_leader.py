"""Any number of beat processes send each periodic task once (issue 32.3): only the holder of the leader lock in the
broker's Redis sends (apps.runtime.beat_leader); the others stand by and one takes over when the leader dies."""

from __future__ import annotations

import signal
import time

import pytest
import redis

from tests.celery_workers import broker_url, kill_group, queued_tasks, start_beat, wait_for

pytestmark = pytest.mark.live  # starts beat processes

INDEX = "apps.memories.tasks.index_pending_memories"


def _origins(client: redis.Redis, task: str) -> list[str]:
    return [origin for name, origin in queued_tasks(client) if name == task]


def test_two_beats_send_each_task_once_and_the_survivor_takes_over(tmp_path) -> None:
    broker = broker_url()
    client = redis.Redis.from_url(broker)
    client.flushdb()
    fast = {"MEMORY_EPISODIC_INDEXING_INTERVAL": "1", "BEAT_LEADER_LOCK_TTL_SECONDS": "2"}
    beats = {}
    try:
        for name in ("beat-a", "beat-b"):
            beats[name] = start_beat(tmp_path, name, broker, **fast)
        logs = [log for _, log in beats.values()]
        wait_for(lambda: all(b"beat: Starting..." in log.read_bytes() for log in logs), 60, "both beats to start", logs)
        time.sleep(1)  # both past their first tick
        client.delete("celery")
        wait_for(lambda: len(_origins(client, INDEX)) >= 4, 30, "four rounds of the 1 s task", logs)
        origins = set(_origins(client, INDEX))
        assert len(origins) == 1, origins  # without the lock, each beat sent every task: two origins
        [leader] = [name for name, (process, _) in beats.items() if f"gen{process.pid}@" in next(iter(origins))]
        survivor = next(name for name in beats if name != leader)
        assert b"beat standing by: another beat holds the leader lock" in beats[survivor][1].read_bytes()
        # Each task once per its interval, not once per beat.
        started = time.monotonic()
        client.delete("celery")
        time.sleep(3)
        sent = len(_origins(client, INDEX))
        assert sent <= (time.monotonic() - started) + 1, sent

        # The leader dies without a word (kill -9): the other takes over within the lock's TTL.
        kill_group(beats[leader][0], signal.SIGKILL)
        client.delete("celery")
        took_over = wait_for(
            lambda: any(f"gen{beats[survivor][0].pid}@" in origin for origin in _origins(client, INDEX)),
            30, "the standby beat to take over", logs,
        )  # fmt: skip
        print(f"took over {took_over:.1f}s after kill -9 of the leader")
        assert took_over < 10
        assert {origin.split("@")[0] for origin in _origins(client, INDEX)} == {f"gen{beats[survivor][0].pid}"}
        assert b"beat leading" in beats[survivor][1].read_bytes()
    finally:
        for process, _ in beats.values():
            kill_group(process, signal.SIGTERM)
        client.flushdb()
        client.close()
