"""apps.retrieval.indexing through both indexers: a row that always fails (its text fails to embed, its content cannot be
decrypted) is retried with backoff, then quarantined, and never blocks the rows around it; operators see it (log
line with the row id and never its content, metrics, /readyz) and retry it with ``manage.py indexing retry``; and the
periodic run indexes everything written while Redis was down.

Issue 21 items 11 (indexer side), 12 and 14 (indexer side); issue 24 (one indexing framework)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from functools import partial
from io import StringIO

import pytest
from django.core.management import call_command
from prometheus_client import REGISTRY

from apps.conversations import indexer as conversation_indexer
from apps.conversations import tasks as conversation_tasks
from apps.encryption import crypto
from apps.memories import indexer as memory_indexer
from apps.memories import tasks as memory_tasks
from apps.memories.models import IndexStatus, Memory
from apps.retrieval import indexing, leases
from apps.retrieval.embeddings import EmbeddingError, get_provider
from tests.concurrency import run_concurrently
from tests.conversations.support import append_ok, new_id, search, sql

pytestmark = pytest.mark.django_db

POISON = "poison"
NS = ["user", "bob", "indexing"]


@pytest.fixture
def embedded(monkeypatch) -> Counter[str]:
    """The embedder refuses every request holding a text with "poison" in it (as an endpoint refusing one input
    does) and embeds the rest; returns how often each text was embedded successfully."""
    provider = get_provider()
    original = provider.embed_documents
    done: Counter[str] = Counter()
    lock = threading.Lock()

    def embed(texts: list[str]) -> list[list[float]]:
        if any(POISON in text for text in texts):
            raise EmbeddingError("input rejected")
        vectors = original(texts)
        with lock:
            done.update(texts)
        return vectors

    monkeypatch.setattr(provider, "embed_documents", embed)
    return done


@pytest.fixture
def bob(client_for):
    return client_for("bob")


@pytest.fixture
def log(caplog):
    caplog.set_level(logging.WARNING, logger="apps.retrieval.indexing")
    return caplog


def put(client, key: str, text: str) -> str:
    response = client.put("/v1/memories", {"namespace": NS, "key": key, "value": {"text": text},
                                           "index": {"text": text}}, format="json")  # fmt: skip
    assert response.status_code == 200, response.content
    return key


def memory_keys(client, query: str) -> set[str]:
    body = {"namespace_prefix": NS, "query": query, "search_type": "semantic", "limit": 50}  # what was embedded
    response = client.post("/v1/memories/search", body, format="json")
    assert response.status_code == 200, response.content
    return {item["key"] for item in response.json()["items"]}


def entry_ids(client, query: str, search_type: str = "semantic") -> set[str]:
    return {item["entryId"] for item in search(client, query, searchType=search_type, limit=50)["data"]}


def entry_state(entry_id: str) -> tuple:
    return sql(
        "SELECT index_failures, index_error, index_retry_at > now(), index_quarantined_at IS NOT NULL "
        "FROM conversation_entries WHERE id = %s",
        [entry_id],
    )[0]


def backoff_over(table: str) -> None:
    """Fast-forward every failed row's backoff, as if its retry time had come."""
    sql(f"UPDATE {table} SET index_retry_at = now() - interval '1 second' WHERE index_retry_at IS NOT NULL")


def failures_counted(indexer: str, reason: str) -> float:
    return REGISTRY.get_sample_value("indexer_row_failures_total", {"indexer": indexer, "reason": reason}) or 0.0


def quarantine_lines(log, row_id: str) -> list[logging.LogRecord]:
    return [record for record in log.records if getattr(record, "row_id", None) == row_id
            and record.levelno == logging.ERROR]  # fmt: skip


def assert_no_content_logged(log, *words: str) -> None:
    for record in log.records:
        rendered = record.getMessage() + repr(record.__dict__)
        assert not any(word in rendered for word in words), rendered


# --- A text that always fails to embed --------------------------------------------------------------------------


def test_a_memory_that_always_fails_to_embed_is_quarantined_and_the_rest_is_indexed(
    bob, embedded, monkeypatch, settings, api, log
):
    settings.INDEXING_MAX_ATTEMPTS = 3
    put(bob, "before", "harbour crane at dawn")
    put(bob, "bad", f"harbour {POISON} pill")
    put(bob, "after", "harbour ferry timetable")
    counted = failures_counted("memory", "embedding")

    report = memory_indexer.run_cycle()
    # The batch failed as a whole; the provider embeds a probe, so the batch was halved to find the one row.
    assert (report.indexed, report.failed, report.quarantined, report.stalled) == (2, 1, 0, False)
    assert memory_keys(bob, "harbour") == {"before", "after"}
    bad = Memory.objects.get(key="bad")
    assert (bad.index_status, bad.index_failures, bad.index_quarantined_at) == (IndexStatus.PENDING, 1, None)
    assert bad.index_error == "embedding error=EmbeddingError"

    put(bob, "later", "harbour pilot boat")
    report = memory_indexer.run_cycle()  # the bad row waits out its backoff; new rows go by
    assert (report.indexed, report.failed) == (1, 0)

    for _attempt in (2, 3):
        backoff_over("memories")
        report = memory_indexer.run_cycle()
    assert (report.indexed, report.failed, report.quarantined) == (0, 1, 1)
    bad.refresh_from_db()
    assert bad.index_failures == 3 and bad.index_quarantined_at is not None
    assert failures_counted("memory", "embedding") == counted + 3

    backoff_over("memories")
    assert memory_indexer.run_cycle().failed == 0  # quarantined: never taken again by itself
    assert Memory.objects.get(key="bad").index_failures == 3

    readiness = api.get("/readyz").json()["indexer"]
    assert (readiness["backlog"], readiness["quarantined"]) == (0, 1)
    assert 'indexer_quarantined_rows{indexer="memory"} 1.0' in api.get("/metrics").content.decode()
    (line,) = quarantine_lines(log, str(bad.id))
    assert (line.indexer, line.reason, line.failures) == ("memory", "embedding", 3)
    assert_no_content_logged(log, POISON, "harbour")

    out = StringIO()
    call_command("indexing", "quarantined", stdout=out)
    assert f"memory {bad.id} failures=3" in out.getvalue() and POISON not in out.getvalue()

    monkeypatch.undo()  # the provider accepts the text now
    call_command("indexing", "retry", "--indexer", "memory", stdout=StringIO())
    assert memory_indexer.run_cycle().indexed == 1
    assert memory_keys(bob, "harbour") == {"before", "after", "later", "bad"}
    bad.refresh_from_db()
    assert (bad.index_failures, bad.index_error, bad.index_retry_at, bad.index_quarantined_at) == (0, None, None, None)
    assert api.get("/readyz").json()["indexer"]["quarantined"] == 0


def test_an_entry_that_always_fails_to_embed_is_quarantined_and_the_rest_is_indexed(
    bob, client_for, embedded, settings, api
):
    settings.INDEXING_MAX_ATTEMPTS = 2
    good = {append_ok(bob, new_id(), f"lighthouse keeper log {n}")["id"] for n in range(3)}
    cid = new_id()
    bad = append_ok(bob, cid, f"lighthouse {POISON} entry")["id"]

    report = conversation_indexer.run_cycle()
    assert (report.indexed, report.failed, report.quarantined) == (3, 1, 0)
    assert entry_ids(bob, "lighthouse keeper") == good
    assert entry_state(bad) == (1, "embedding error=EmbeddingError", True, False)

    backoff_over("conversation_entries")
    assert conversation_indexer.run_cycle().quarantined == 1
    assert entry_state(bad)[::3] == (2, True)
    backoff_over("conversation_entries")
    assert conversation_indexer.run_cycle().failed == 0
    readiness = api.get("/readyz").json()["conversation_indexer"]
    assert (readiness["backlog"], readiness["quarantined"]) == (0, 1)

    # New index text for the entry (POST /v1/conversations/index) starts with no failure counted.
    indexer_role = client_for("ivan", roles=("user", "indexer"))
    body = [{"conversationId": cid, "entryId": bad, "indexedContent": "lighthouse beacon repaired"}]
    assert indexer_role.post("/v1/conversations/index", body, format="json").status_code == 200
    assert entry_state(bad) == (0, None, None, False)
    assert conversation_indexer.run_cycle().indexed == 1
    assert entry_ids(bob, "beacon repaired") == {bad}


def test_a_failure_of_a_replaced_text_is_not_counted_against_the_new_text(bob, client_for, monkeypatch):
    """Issue 28 item 12: the old index text fails to embed while ``POST /v1/conversations/index`` replaces it. The
    failure is the old text's: the new one starts clean (no failure, no backoff) and is indexed by the next cycle."""
    cid = new_id()
    entry = append_ok(bob, cid, f"lantern {POISON} text")["id"]
    indexer_role = client_for("ivan", roles=("user", "indexer"))
    provider = get_provider()
    original = provider.embed_documents

    def embed(texts: list[str]) -> list[list[float]]:
        if any(POISON in text for text in texts):
            # The replacement commits between the cycle's read of the row and its failure.
            body = [{"conversationId": cid, "entryId": entry, "indexedContent": "lantern wick trimmed"}]
            assert indexer_role.post("/v1/conversations/index", body, format="json").status_code == 200
            raise EmbeddingError("input rejected")
        return original(texts)

    monkeypatch.setattr(provider, "embed_documents", embed)
    assert conversation_indexer.run_cycle(max_batches=1).failed == 1
    assert entry_state(entry) == (0, None, None, False)
    assert conversation_indexer.run_cycle().indexed == 1
    assert entry_ids(bob, "lantern wick trimmed") == {entry}


# --- Content the key ring cannot decrypt ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage, key_id",
    [
        # A botched rotation: sealed under a key id the ring no longer has.
        (lambda blob: crypto.header_for("retired-key") + os.urandom(40), "retired-key"),
        # A damaged row: the bytes are not an envelope at all.
        (lambda blob: b"\x00garbage", None),
    ],
    ids=["unknown-key-id", "damaged"],
)
def test_an_entry_that_cannot_be_decrypted_is_quarantined_and_the_rest_is_indexed(
    bob, settings, api, log, damage, key_id
):
    settings.INDEXING_MAX_ATTEMPTS = 2
    first = append_ok(bob, new_id(), "lighthouse keeper one")["id"]
    bad = append_ok(bob, new_id(), "lighthouse keeper secret words")["id"]
    last = append_ok(bob, new_id(), "lighthouse keeper two")["id"]
    (original,) = sql("SELECT content FROM conversation_entries WHERE id = %s", [bad])[0]
    sql("UPDATE conversation_entries SET content = %s WHERE id = %s", [damage(bytes(original)), bad])
    counted = failures_counted("conversation", "decrypt")

    report = conversation_indexer.run_cycle()  # the bad entry is the middle one of the batch
    assert (report.indexed, report.failed, report.quarantined) == (2, 1, 0)
    assert entry_ids(bob, "lighthouse keeper", "fulltext") == {first, last}
    assert entry_ids(bob, "lighthouse keeper") == {first, last}
    assert entry_state(bad) == (1, f"decrypt key_id={key_id}", True, False)
    (failed,) = [record for record in log.records if getattr(record, "row_id", None) == bad]
    assert (failed.indexer, failed.reason, failed.key_id, failed.levelno) == (
        "conversation", "decrypt", key_id, logging.WARNING)

    backoff_over("conversation_entries")
    assert conversation_indexer.run_cycle().quarantined == 1
    assert failures_counted("conversation", "decrypt") == counted + 2
    (line,) = quarantine_lines(log, bad)
    assert line.key_id == key_id
    assert_no_content_logged(log, "secret", "lighthouse")
    backoff_over("conversation_entries")
    assert conversation_indexer.run_cycle().failed == 0  # not retried by itself
    assert api.get("/readyz").json()["conversation_indexer"]["quarantined"] == 1

    # The operator puts the key back (here: the original envelope) and retries that one entry.
    sql("UPDATE conversation_entries SET content = %s WHERE id = %s", [bytes(original), bad])
    out = StringIO()
    call_command("indexing", "retry", "--indexer", "conversation", "--id", bad, stdout=out)
    assert "conversation: 1 quarantined row(s) back in the queue" in out.getvalue()
    assert conversation_indexer.run_cycle().indexed == 1
    assert entry_ids(bob, "secret words") == {bad}
    assert entry_state(bad) == (0, None, None, False)


def test_the_memory_indexer_never_opens_values(bob):
    """Index text is stored in the clear (D4): a memory whose value cannot be decrypted is still embedded."""
    put(bob, "damaged", "orchard pruning calendar")
    Memory.objects.filter(key="damaged").update(value_ciphertext=b"\x00garbage")
    assert memory_indexer.run_cycle().indexed == 1
    assert Memory.objects.get(key="damaged").index_status == IndexStatus.INDEXED


# --- Concurrency ------------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_32_concurrent_cycles_embed_each_entry_once_and_take_each_poison_row_once(client_for, embedded, monkeypatch):
    provider = get_provider()
    embed = provider.embed_documents
    in_flight: set[str] = set()
    overlaps: list[str] = []
    lock = threading.Lock()

    def slow(texts: list[str]) -> list[list[float]]:
        with lock:
            overlaps.extend(text for text in texts if text in in_flight)
            in_flight.update(texts)
        try:
            time.sleep(0.02)  # long enough for the other workers to look at the same entries meanwhile
            return embed(texts)
        finally:
            with lock:
                in_flight.difference_update(texts)

    monkeypatch.setattr(provider, "embed_documents", slow)
    bob = client_for("bob")
    cid = new_id()
    good = [append_ok(bob, cid, f"breakwater note {n}")["id"] for n in range(60)]
    poisoned = append_ok(bob, cid, f"breakwater {POISON}")["id"]
    undecryptable = append_ok(bob, cid, "breakwater sealed")["id"]
    sql("UPDATE conversation_entries SET content = %s WHERE id = %s", [b"\x00garbage", undecryptable])

    reports = run_concurrently([partial(conversation_indexer.run_cycle, batch_size=5)] * 32)
    assert not overlaps  # "breakwater sealed" and the rest: never two workers on one entry at once
    assert sum(report.indexed for report in reports) == 60
    embedded.pop(indexing.PROBE_TEXT)  # the worker that met the poison row made sure the provider works
    assert set(embedded) == {f"breakwater note {n}" for n in range(60)} and max(embedded.values()) == 1
    # Each poison row was taken by one worker once (then it backs off), and failed alone.
    assert sum(report.failed for report in reports) == 2
    assert entry_state(poisoned)[0] == 1 and entry_state(undecryptable)[0] == 1
    assert sql("SELECT count(*) FROM conversation_entries WHERE id = ANY(%s::uuid[]) AND embedding_pending = false "
               "AND indexed_content IS NOT NULL", [good])[0][0] == 60  # fmt: skip
    assert leases.held_by_others(leases.CONVERSATION_INDEXING) == 0


# --- Redis outage ------------------------------------------------------------------------------------------------


def test_writes_during_a_redis_outage_are_all_indexed_by_the_next_periodic_run(
    bob, settings, django_capture_on_commit_callbacks
):
    """Issue 21 item 14, indexer side: no wake-up gets through while Redis is down, and the periodic task (beat's,
    or one a worker held when Redis went) still runs a cycle that sweeps the whole backlog, batch after batch."""
    settings.MEMORY_EPISODIC_INDEXING_BATCH_SIZE = settings.CONVERSATION_INDEXING_BATCH_SIZE = 5
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there: Redis is down
    cid = new_id()
    with django_capture_on_commit_callbacks(execute=True):  # the wake-ups run, and fail quietly
        keys = {put(bob, f"m{n}", f"tidal surge record {n}") for n in range(12)}
        entries = {append_ok(bob, new_id() if n % 2 else cid, f"tidal surge entry {n}")["id"] for n in range(12)}
    assert Memory.objects.filter(index_status=IndexStatus.PENDING).count() == 12

    assert memory_tasks.index_pending_memories.run() == 12
    assert conversation_tasks.index_conversation_entries.run() == 12
    assert memory_keys(bob, "tidal surge") == keys
    assert sql("SELECT count(*) FROM conversation_entries WHERE id = ANY(%s::uuid[]) AND NOT embedding_pending "
               "AND indexed_content IS NOT NULL", [list(entries)])[0][0] == 12  # fmt: skip
