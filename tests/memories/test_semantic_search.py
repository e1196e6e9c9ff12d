"""Semantic search (query mode) through HTTP, with the indexer run as the worker would run it.

Most tests use the lexical hashing embedder (test settings) so they are fast and exact about ranking by shared
words; `test_real_model_*` uses the shipped all-MiniLM-L6-v2 for real paraphrase ranking.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.memories import indexer
from apps.memories.models import IndexStatus, Memory, MemoryVector
from apps.retrieval.embeddings import EmbeddingError
from tests.memories.conftest import semantic_items

pytestmark = pytest.mark.django_db

NS = ["user", "bob", "notes"]


def put(client, key, text, *, namespace=NS, index=None, **extra):
    body = {"namespace": namespace, "key": key, "value": {"text": text}, **extra}
    body["index"] = {"text": text} if index is None else index
    response = client.put("/v1/memories", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()


# These tests are about the vectors' side: search by meaning only (the words: tests/memories/test_hybrid_search.py).
def search(client, query, prefix=("user", "bob"), **extra):
    return semantic_items(client, query, prefix, **extra)


def test_results_are_ranked_with_scores_in_unit_interval(bob, plan):
    put(bob, "pasta", "cooking pasta with tomato sauce and basil")
    put(bob, "stocks", "the stock market fell sharply on inflation fears")
    put(bob, "soccer", "the soccer final ended with a late goal")
    assert indexer.run_cycle().indexed == 3

    items = search(bob, "tomato sauce for pasta")
    assert items[0]["key"] == "pasta"
    assert set(items[0]) == {"id", "namespace", "key", "value", "attributes", "score", "created_at"}
    assert items[0]["value"] == {"text": "cooking pasta with tomato sauce and basil"}
    scores = [item["score"] for item in items]
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 <= score <= 1.0 for score in scores)
    assert scores[0] > scores[-1]


def test_unindexed_memories_never_appear(bob):
    put(bob, "indexed", "gardening tomatoes in spring")
    put(bob, "no-index", "gardening tomatoes in spring", index={})  # indexing disabled for this version
    indexer.run_cycle()
    # Written after the cycle, and too long for a search to embed it itself (apps.memories.fresh): not embedded yet.
    put(bob, "pending", "gardening tomatoes in spring, " + "and more " * 25)
    keys = [item["key"] for item in search(bob, "gardening tomatoes")]
    assert keys == ["indexed"]
    assert Memory.objects.get(key="no-index").index_status == IndexStatus.NONE


def test_offset_and_limit_apply_to_the_ranked_list(bob, plan):
    for index in range(6):
        put(bob, f"k{index}", f"apples oranges {'pears ' * index}")
    indexer.run_cycle()
    full = search(bob, "pears", limit=6)
    assert len(full) == 6
    page = search(bob, "pears", limit=2, offset=2)
    assert [item["key"] for item in page] == [item["key"] for item in full[2:4]]


def test_best_field_counts_and_a_memory_appears_once(bob, plan):
    put(bob, "multi", "x", index={"title": "quantum physics lecture", "body": "notes about cooking"})
    put(bob, "other", "y", index={"title": "cooking dinner tonight"})
    indexer.run_cycle()
    assert MemoryVector.objects.filter(memory__key="multi").count() == 2
    items = search(bob, "quantum physics")
    assert [item["key"] for item in items].count("multi") == 1
    assert items[0]["key"] == "multi"


def test_delete_hides_at_once_and_vectors_go_on_next_cycle(bob, plan):
    put(bob, "gone", "volcano eruption in iceland")
    indexer.run_cycle()
    assert search(bob, "volcano eruption")[0]["key"] == "gone"
    assert bob.delete("/v1/memories?ns=user&ns=bob&ns=notes&key=gone").status_code == 204
    assert search(bob, "volcano eruption") == []  # primary-store check, before the indexer ran
    assert MemoryVector.objects.filter(memory__key="gone").exists()
    assert indexer.run_cycle().removed == 1
    assert not MemoryVector.objects.filter(memory__key="gone").exists()


def test_a_page_holds_the_live_matches_right_after_deletes(bob, plan):
    # Issue 21.15: the deleted versions' vectors are still in memory_vectors (the indexer has not run since), and
    # they are the nearest; they must not take the page's places.
    put(bob, "best", "harbour crane cargo ship container")
    put(bob, "second", "harbour crane cargo ship")
    put(bob, "third", "harbour crane")
    put(bob, "unrelated", "violin concerto in d minor")
    indexer.run_cycle()
    assert [item["key"] for item in search(bob, "harbour crane cargo ship container", limit=3)] == [
        "best", "second", "third"
    ]
    for key in ("best", "second"):
        assert bob.delete(f"/v1/memories?ns=user&ns=bob&ns=notes&key={key}").status_code == 204
    assert MemoryVector.objects.filter(memory__key__in=["best", "second"]).count() == 2  # not removed yet
    items = search(bob, "harbour crane cargo ship container", limit=2)
    assert [item["key"] for item in items] == ["third", "unrelated"]
    assert search(bob, "harbour crane cargo ship container", limit=1)[0]["key"] == "third"


def test_a_page_holds_the_live_matches_right_after_updates(bob, plan):
    # The same for superseded versions: their successors have no vectors yet (or none at all, without index).
    for key, text in (("a", "glacier ice core sample"), ("b", "glacier ice core"), ("c", "glacier ice")):
        put(bob, key, text)
    indexer.run_cycle()
    put(bob, "a", "x", index={})
    put(bob, "b", "y", index={})
    assert [item["key"] for item in search(bob, "glacier ice core sample", limit=2)] == ["c"]


def test_a_delete_wakes_the_indexer_to_remove_its_vectors(bob, indexer_wakeups, django_capture_on_commit_callbacks):
    from apps.core.redis_client import get_client
    from apps.memories import tasks

    put(bob, "doomed", "sand dune migration")
    indexer.run_cycle()
    get_client().delete(indexer.INDEXER._requested_key())
    calls = indexer_wakeups
    with django_capture_on_commit_callbacks(execute=True):
        assert bob.delete("/v1/memories?ns=user&ns=bob&ns=notes&key=absent").status_code == 204
    assert calls == []  # nothing was deleted: nothing to remove
    with django_capture_on_commit_callbacks(execute=True):
        assert bob.delete("/v1/memories?ns=user&ns=bob&ns=notes&key=doomed").status_code == 204
    assert calls == [indexer.INDEXER.task_name]
    tasks.index_pending_memories.run()
    assert not MemoryVector.objects.filter(memory__key="doomed").exists()
    get_client().delete(indexer.INDEXER._requested_key())


def test_a_delete_of_a_memory_without_vectors_leaves_the_indexer_asleep(
    bob, indexer_wakeups, django_capture_on_commit_callbacks
):
    from apps.core.redis_client import get_client

    put(bob, "plain", "never indexed", index={})
    put(bob, "waiting", "not embedded yet")  # pending: the delete makes it `removed`, the indexer never embeds it
    get_client().delete(indexer.INDEXER._requested_key())
    calls = indexer_wakeups
    for key in ("plain", "waiting"):
        with django_capture_on_commit_callbacks(execute=True):
            assert bob.delete(f"/v1/memories?ns=user&ns=bob&ns=notes&key={key}").status_code == 204
    assert calls == []  # no vectors to remove: no task, and no Redis round trip for the wake-up flag
    assert indexer.run_cycle().indexed == 0
    assert not MemoryVector.objects.exists()
    get_client().delete(indexer.INDEXER._requested_key())


def test_a_text_without_direction_is_no_match(bob, plan):
    # Issue 21.19: the hashing embedder maps a text without words to the zero vector, whose cosine distance is
    # NaN in pgvector; NaN must never score 1.0 (nor take a place on the page).
    put(bob, "words", "penguin colony on the ice shelf")
    put(bob, "punctuation", "x", index={"text": "!!! ???"})
    indexer.run_cycle()
    items = search(bob, "penguin colony", limit=10)
    assert [item["key"] for item in items] == ["words"]
    assert 0 < items[0]["score"] <= 1
    assert search(bob, "?!", limit=10) == []  # a query without direction matches nothing


def test_expired_memory_disappears_before_and_after_the_sweep(bob):
    put(bob, "brief", "meteor shower tonight", ttl_seconds=3600)
    indexer.run_cycle()
    assert [item["key"] for item in search(bob, "meteor shower")] == ["brief"]
    past = timezone.now() - timedelta(seconds=1)
    Memory.objects.filter(key="brief").update(expires_at=past)
    MemoryVector.objects.filter(memory__key="brief").update(expires_at=past)
    assert search(bob, "meteor shower") == []
    from apps.memories.services import expire_due_memories

    assert expire_due_memories() == 1
    indexer.run_cycle()
    assert not MemoryVector.objects.filter(memory__key="brief").exists()


def test_update_replaces_the_vectors(bob):
    put(bob, "topic", "medieval castles and knights")
    indexer.run_cycle()
    put(bob, "topic", "electric cars and batteries")
    indexer.run_cycle()
    # Nearest-neighbour search has no threshold, so the memory may still come back, but only as its new version.
    assert all(item["value"] == {"text": "electric cars and batteries"} for item in search(bob, "medieval castles"))
    items = search(bob, "electric batteries")
    assert items[0]["key"] == "topic"
    assert items[0]["value"] == {"text": "electric cars and batteries"}
    active = Memory.objects.get(key="topic", state="active")
    assert set(MemoryVector.objects.values_list("memory_id", flat=True)) == {active.id}


def test_selective_prefix_still_fills_the_page(bob, plan):
    # Many near matches outside the narrow prefix must not crowd out the few inside it.
    for index in range(120):
        put(bob, f"crowd{index}", "ocean waves and surfing", namespace=["user", "bob", "crowd"])
    for index in range(3):
        put(bob, f"rare{index}", f"ocean waves {index}", namespace=["user", "bob", "rare"])
    while indexer.run_cycle().indexed:
        pass
    items = search(bob, "ocean waves and surfing", prefix=("user", "bob", "rare"), limit=3)
    assert sorted(item["key"] for item in items) == ["rare0", "rare1", "rare2"]


def test_selective_attribute_filter_still_fills_the_page(client_for, settings, tmp_path, plan):
    (tmp_path / "attributes.rego").write_text(
        "package memories.attributes\nimport rego.v1\n"
        'attributes := {"namespace": input.namespace[0], "sub": input.namespace[1], "kind": input.value.kind}\n'
    )
    settings.SERVICE_POLICY_DIR = str(tmp_path)
    bob = client_for("bob")
    for index in range(100):
        bob.put("/v1/memories", {"namespace": NS, "key": f"c{index}", "value": {"kind": "common"},
                                 "index": {"t": "mountain hiking trail"}}, format="json")
    for index in range(2):
        bob.put("/v1/memories", {"namespace": NS, "key": f"r{index}", "value": {"kind": "rare"},
                                 "index": {"t": f"mountain hiking {index}"}}, format="json")
    while indexer.run_cycle().indexed:
        pass
    items = search(bob, "mountain hiking trail", filter={"kind": "rare"}, limit=5)
    assert sorted(item["key"] for item in items) == ["r0", "r1"]


def test_non_admin_semantic_search_is_scoped_to_own_subtree(client_for, plan):
    bob, charlie, alice = client_for("bob"), client_for("charlie"), client_for("alice")
    put(bob, "b", "secret recipe for chocolate cake")
    put(charlie, "c", "secret recipe for chocolate cake", namespace=["user", "charlie", "notes"])
    indexer.run_cycle()
    # Another user's subtree yields nothing (filter.rego: a disjoint prefix matches no namespace) ...
    assert search(charlie, "chocolate cake", prefix=("user", "bob")) == []
    # ... and a wider request is narrowed to the caller's own subtree.
    assert [item["key"] for item in search(charlie, "chocolate cake", prefix=())] == ["c"]
    # The admin keeps the requested prefix.
    assert [item["key"] for item in search(alice, "chocolate cake", prefix=("user", "bob"))] == ["b"]


def test_a_provider_outage_stops_the_cycle_and_leaves_rows_pending(bob, monkeypatch):
    from apps.retrieval.embeddings import get_provider

    put(bob, "flaky", "northern lights photography")
    put(bob, "other", "aurora borealis")
    provider = get_provider()
    calls = []

    def broken(texts):
        calls.append(texts)
        raise EmbeddingError("provider down")

    monkeypatch.setattr(provider, "embed_documents", broken)
    report = indexer.run_cycle()
    assert report.stalled and report.failed == 2 and report.indexed == 0
    assert len(calls) == 2  # the batch, then the probe that tells an outage from a poison row: no row-by-row retries
    for row in Memory.objects.all():
        # Nothing is the rows' fault: no failure counted, no backoff; the next cycle takes them again.
        assert row.index_status == IndexStatus.PENDING
        assert (row.index_attempts, row.index_failures, row.index_retry_at, row.index_quarantined_at) == (1, 0, None, None)
    assert not MemoryVector.objects.exists()
    monkeypatch.undo()
    assert indexer.run_cycle().indexed == 2
    assert Memory.objects.get(key="flaky").index_status == IndexStatus.INDEXED


@pytest.fixture
def other_worker():
    """A second database session standing in for another worker process: its claims are its own, and closing it
    is what PostgreSQL sees when that process is killed."""
    import psycopg
    from django.db import connection

    connection.ensure_connection()
    session = psycopg.connect(**connection.get_connection_params(), autocommit=True)
    yield session
    session.close()


def test_claims_of_a_live_worker_are_respected_and_die_with_its_connection(bob, other_worker):
    from apps.retrieval import leases

    put(bob, "a", "river delta ecology")
    put(bob, "b", "desert dune formation")
    ids = list(Memory.objects.order_by("created_at").values_list("id", flat=True))
    # The other worker claims the batch, then dies before writing vectors.
    assert leases.try_take(leases.MEMORY_INDEXING, ids, cursor=other_worker.cursor()) == ids
    assert leases.held_by_others(leases.MEMORY_INDEXING) == 2
    assert indexer.run_cycle().indexed == 0  # its claims keep this worker off while it lives
    other_worker.close()  # kill -9: the kernel closes its socket, PostgreSQL ends the session and its locks
    from tests.conftest import wait_until_released

    wait_until_released(leases.MEMORY_INDEXING)  # the backend exits a moment after the socket closes
    assert indexer.run_cycle().indexed == 2  # no lease to wait for
    assert MemoryVector.objects.count() == 2
    assert Memory.objects.filter(index_retry_at__isnull=False).count() == 0


def test_claims_split_a_batch_between_workers(bob, other_worker):
    from apps.retrieval import leases

    for index in range(5):
        put(bob, f"k{index}", f"topic {index}")
    ids = list(Memory.objects.order_by("created_at").values_list("id", flat=True))
    theirs = leases.try_take(leases.MEMORY_INDEXING, ids, limit=3, cursor=other_worker.cursor())
    assert theirs == ids[:3]
    mine = {row[0] for row in indexer.INDEXER.claim(10)}
    assert mine == set(ids[3:])  # the rows the other worker holds are skipped, not waited for
    indexer.INDEXER.release(mine)
    assert leases.held_by_others(leases.MEMORY_INDEXING) == 3


def test_claims_are_released_after_a_cycle_and_after_a_failure(bob, other_worker, monkeypatch):
    from apps.retrieval import leases
    from apps.retrieval.embeddings import get_provider

    put(bob, "ok", "glacier retreat")
    indexer.run_cycle()
    put(bob, "fails", "tidal energy")
    monkeypatch.setattr(get_provider(), "embed_documents", lambda texts: (_ for _ in ()).throw(RuntimeError("bug")))
    with pytest.raises(RuntimeError):
        indexer.run_cycle()
    monkeypatch.undo()
    # This session holds nothing any more: another session can claim every row.
    ids = list(Memory.objects.values_list("id", flat=True))
    assert sorted(leases.try_take(leases.MEMORY_INDEXING, ids, cursor=other_worker.cursor())) == sorted(ids)


def test_superseded_while_embedding_gets_no_vectors(bob, monkeypatch):
    put(bob, "race", "first version text")
    from apps.retrieval.embeddings import get_provider

    provider = get_provider()
    original = provider.embed_documents

    def embed_then_update(texts):
        vectors = original(texts)
        put(bob, "race", "second version text")  # a PUT lands while the worker is embedding
        return vectors

    monkeypatch.setattr(provider, "embed_documents", embed_then_update)
    indexer.run_cycle(max_batches=1)
    monkeypatch.undo()
    old = Memory.objects.get(key="race", state="superseded")
    assert not MemoryVector.objects.filter(memory=old).exists()
    indexer.run_cycle()
    assert search(bob, "second version")[0]["value"] == {"text": "second version text"}


def test_backlog_is_visible_in_readyz_and_metrics(bob, api):
    put(bob, "waiting", "pending text")
    body = api.get("/readyz").json()
    assert body["indexer"]["backlog"] == 1
    assert body["checks"]["embedder"] == "ok"
    metrics = api.get("/metrics").content.decode()
    assert "memory_indexer_backlog 1.0" in metrics
    indexer.run_cycle()
    assert api.get("/readyz").json()["indexer"]["backlog"] == 0


def test_indexing_is_requested_once_per_burst_after_commit(bob, indexer_wakeups, django_capture_on_commit_callbacks):
    from apps.core.redis_client import get_client
    from apps.memories import tasks

    get_client().delete(indexer.INDEXER._requested_key())
    calls = indexer_wakeups
    with django_capture_on_commit_callbacks(execute=True):
        put(bob, "soon", "searchable within a second")
    assert calls == [indexer.INDEXER.task_name]
    with django_capture_on_commit_callbacks(execute=True):
        put(bob, "never", "no index", index={})  # nothing to embed: no request
        put(bob, "burst", "another indexed write while a task is already waiting")
    assert calls == [indexer.INDEXER.task_name]
    # The worker clears the request when it starts, so the next write asks again.
    tasks.index_pending_memories.run()
    with django_capture_on_commit_callbacks(execute=True):
        put(bob, "later", "written after the worker started")
    assert calls == [indexer.INDEXER.task_name] * 2
    get_client().delete(indexer.INDEXER._requested_key())


def test_reindex_command_moves_vectors_to_the_new_model(bob, settings):
    from io import StringIO

    from django.core.management import call_command

    put(bob, "r1", "alpine lakes")
    put(bob, "r2", "coral reefs")
    indexer.run_cycle()
    assert set(MemoryVector.objects.values_list("model", flat=True)) == {"hash:256"}
    settings.EMBEDDING_DIMENSIONS = 128
    out = StringIO()
    call_command("reindex_memories", "--no-progress", stdout=out)
    assert set(MemoryVector.objects.values_list("model", flat=True)) == {"hash:128"}
    assert search(bob, "coral reefs")[0]["key"] == "r2"
    again = StringIO()
    call_command("reindex_memories", "--no-progress", stdout=again)  # resumable: nothing left to do
    assert "Marked 0 version(s)" in again.getvalue()


@pytest.mark.model
def test_real_model_ranks_a_paraphrase_first(bob, settings):
    settings.EMBEDDING_PROVIDER = "local"
    put(bob, "cooking", "Boil the spaghetti for nine minutes, then toss it with garlic and olive oil.")
    put(bob, "finance", "Shares of technology companies dropped after the central bank raised interest rates.")
    put(bob, "sport", "The striker scored twice in the second half to win the championship match.")
    assert indexer.run_cycle().indexed == 3
    items = search(bob, "how do I prepare noodles for dinner?")
    assert items[0]["key"] == "cooking"
    assert items[0]["score"] > items[1]["score"]
    items = search(bob, "stock prices fell because of monetary policy")
    assert items[0]["key"] == "finance"
    items = search(bob, "football game result")
    assert items[0]["key"] == "sport"


@pytest.mark.parametrize(
    ("threshold", "expected_setting"),
    [(2000, "'max_parallel_workers_per_gather', '0'"), (2, "'hnsw.iterative_scan', 'relaxed_order'")],
)
def test_plan_follows_the_scope_size(bob, settings, threshold, expected_setting):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for index in range(3):
        put(bob, f"k{index}", f"harbour lights {index}")
    indexer.run_cycle()
    settings.MEMORY_VECTOR_EXACT_SCAN_THRESHOLD = threshold
    with CaptureQueriesContext(connection) as queries:
        assert len(search(bob, "harbour lights")) == 3
    settings_sql = [query["sql"] for query in queries.captured_queries if "set_config(" in query["sql"]]
    assert len(settings_sql) == 1 and expected_setting in settings_sql[0], settings_sql


def test_scope_size_is_counted_once_per_cache_period(bob, settings):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.memories import vector_index

    put(bob, "k", "lighthouse keeper")
    indexer.run_cycle()
    vector_index._scope_sizes.clear()
    settings.MEMORY_VECTOR_SCOPE_SIZE_CACHE_SECONDS = 30
    with CaptureQueriesContext(connection) as queries:
        search(bob, "lighthouse")
        search(bob, "keeper")
    probes = [q for q in queries.captured_queries if "SELECT count(*) FROM (SELECT 1 FROM memory_vectors" in q["sql"]]
    assert len(probes) == 1
    vector_index._scope_sizes.clear()


FILLER = "The quarterly report lists office supplies, printer toner and meeting room bookings. "


def test_a_long_field_is_embedded_as_overlapping_chunks_covering_all_of_it(bob, settings, plan):
    settings.EMBEDDING_MAX_INPUT_CHARS = 400  # the hash embedder has no window of its own; give it one
    # Numbered lines: no piece of the text repeats, so each chunk's position in it is unique.
    text = "".join(f"Line {i}. {FILLER}" for i in range(30)) + "Volcanic glass obsidian was traded across the islands."
    put(bob, "long", "x", index={"body": text, "title": "office notes"})
    put(bob, "short", "y", index={"body": "office supplies and printer toner for the quarterly report"})
    indexer.run_cycle()

    chunks = MemoryVector.objects.filter(memory__key="long", field="body").order_by("chunk")
    numbers = list(chunks.values_list("chunk", flat=True))
    assert numbers == list(range(len(numbers))) and len(numbers) > 5
    assert MemoryVector.objects.filter(memory__key="long", field="title").count() == 1
    from apps.retrieval.embeddings import get_provider

    pieces = get_provider().chunk(text)
    assert len(pieces) == len(numbers)
    assert all(len(piece) <= 400 for piece in pieces)
    # Overlapping and in order: every piece starts inside the previous one, the last ends where the text ends.
    position = 0
    for piece in pieces:
        start = text.index(piece, max(0, position - 400))
        assert start <= position
        position = start + len(piece)
    assert position == len(text)

    items = search(bob, "obsidian volcanic glass traded")
    assert items[0]["key"] == "long"  # found by its last chunk
    assert [item["key"] for item in items].count("long") == 1  # one result per memory, however many chunks


@pytest.mark.model
def test_real_model_finds_a_match_at_the_end_of_a_long_field(bob, settings):
    settings.EMBEDDING_PROVIDER = "local"
    filler = FILLER * 150
    assert len(filler) > 12_000
    ending = "My grandmother's secret for her apple pie is a pinch of cardamom in the filling."
    put(bob, "long", "x", index={"text": filler + ending})
    put(bob, "office", "y", index={"text": "Order more printer toner and book the meeting room for the report."})
    put(bob, "travel", "z", index={"text": "The train to Lyon leaves at seven from platform four."})
    put(bob, "pets", "w", index={"text": "Our cat refuses to eat dry food during the summer."})
    assert indexer.run_cycle().indexed == 4
    assert MemoryVector.objects.filter(memory__key="long").count() > 10

    items = search(bob, "which spice does grandma put in her apple pie?")
    # Measured: long 0.24, then pets 0.11, office 0.07 (the filler's best is far below its last chunk).
    assert items[0]["key"] == "long"
    assert items[0]["score"] > items[1]["score"] + 0.05


@pytest.mark.model
def test_real_model_chunks_fit_the_window_and_cover_the_text(settings):
    settings.EMBEDDING_PROVIDER = "local"
    from apps.retrieval.embeddings import get_provider, minilm

    provider = get_provider()
    text = "  " + "".join(f"Zürich 東京 naïve café, line {i} of numbers and words; " for i in range(400)) + "the end.  "
    pieces = provider.chunk(text)
    files = minilm.ModelFiles(minilm.model_path())
    tokenizer = files.tokenizer(truncate=False)
    assert len(pieces) > 1
    for piece in pieces:  # each piece fits the model's window once [CLS] and [SEP] are added
        assert len(tokenizer.encode(piece).ids) <= files.max_seq_length
    assert pieces[0].startswith(text[:50]) and pieces[-1].endswith(text[-50:])
    position = 0
    for piece in pieces:
        start = text.index(piece, max(0, position - len(piece)))
        assert start <= position  # no gap: overlapping or adjacent
        position = start + len(piece)
    assert position == len(text)
    assert provider.chunk("short text") == ["short text"]


def test_a_batch_stops_at_the_text_budget_but_the_cycle_goes_on(bob, settings):
    settings.MEMORY_INDEXING_BATCH_TEXT_BYTES = 3000
    for index in range(4):
        put(bob, f"big{index}", "x", index={"text": f"chapter {index} " + "words " * 400})  # ~2.4 KB each
    put(bob, "huge", "x", index={"text": "saga " * 2000})  # alone over the budget: still taken, alone
    assert indexer.run_cycle(max_batches=1).indexed == 1  # one version per batch here
    assert indexer.run_cycle().indexed == 4  # batch after batch until nothing is left
    assert not Memory.objects.filter(index_status=IndexStatus.PENDING).exists()
    assert MemoryVector.objects.filter(memory__key="huge").count() == 1  # the hash model has no window
