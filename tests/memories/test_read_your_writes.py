"""Read your writes by meaning (D11, apps.memories.fresh): a semantic search issued after a PUT or DELETE returned
reflects it, with no indexer run in between. The indexer is run here only where a test says so.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from functools import partial
from urllib.parse import urlencode

import pytest
import requests
from django.utils import timezone

from apps.memories import fresh, indexer
from apps.memories.models import IndexStatus, Memory, MemoryVector
from apps.retrieval.embeddings import EmbeddingError, get_provider
from tests.concurrency import run_concurrently
from tests.memories.conftest import semantic_items

pytestmark = pytest.mark.django_db

NS = ["user", "bob", "ryw"]
LONG = "a kayak trip along the fjords in june, " + "with a tent, a stove and a map " * 8  # > 200 characters


def put(client, key, text, *, namespace=NS, index=None, **extra):
    body = {"namespace": namespace, "key": key, "value": {"text": text}, **extra}
    body["index"] = {"text": text} if index is None else index
    response = client.put("/v1/memories", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def delete(client, key, namespace=NS):
    response = client.delete(f"/v1/memories?{urlencode([*(('ns', segment) for segment in namespace), ('key', key)])}")
    assert response.status_code == 204, response.content


# These tests are about the vectors' side: search by meaning only (the words: tests/memories/test_hybrid_search.py).
def search(client, query, prefix=NS, **extra):
    return semantic_items(client, query, prefix, **extra)


@pytest.fixture(params=["pending", "indexed"])
def before(request):
    """Whether the version a write replaces or deletes was still waiting for the indexer or had its vectors."""
    return request.param


@pytest.fixture
def embedded(monkeypatch) -> list[str]:
    """Every document text a search embeds along with its query (the provider's embed_with_documents)."""
    provider = get_provider()
    seen: list[str] = []
    original = provider.embed_with_documents

    def recording(queries, documents):
        seen.extend(documents)
        return original(queries, documents)

    monkeypatch.setattr(provider, "embed_with_documents", recording)
    return seen


def pending(key: str) -> bool:
    return Memory.objects.get(key=key, state="active").index_status == IndexStatus.PENDING


def test_a_search_right_after_a_put_finds_it_by_meaning(bob, plan):
    put(bob, "budget", "the quarterly budget review is on friday")
    put(bob, "garden", "tomatoes grow best in full sun")
    assert indexer.run_cycle().indexed == 2
    put(bob, "router", "the router is in the hallway closet")
    assert pending("router")

    items = search(bob, "where is the router, hallway or closet")
    assert items[0]["key"] == "router"
    assert items[0]["value"] == {"text": "the router is in the hallway closet"}
    assert {item["key"] for item in items} == {"router", "budget", "garden"}
    assert 0 < items[0]["score"] <= 1
    scores = [item["score"] for item in items]
    assert scores == sorted(scores, reverse=True)
    # Nothing was written by the search; once the indexer has the version it ranks and scores the same.
    assert pending("router") and not MemoryVector.objects.filter(memory__key="router").exists()
    assert indexer.run_cycle().indexed == 1
    again = search(bob, "where is the router, hallway or closet")
    assert [item["key"] for item in again] == [item["key"] for item in items]
    assert again[0]["score"] == pytest.approx(items[0]["score"], abs=1e-6)


def test_offset_and_limit_count_the_pending_versions(bob, plan):
    for index in range(3):
        put(bob, f"indexed-{index}", f"apples oranges {'pears ' * index}")
    indexer.run_cycle()
    for index in range(3, 6):
        put(bob, f"pending-{index}", f"apples oranges {'pears ' * index}")
    ranked = [item["key"] for item in search(bob, "apples oranges pears pears pears pears pears", limit=6)]
    assert len(ranked) == 6
    assert [item["key"] for item in search(bob, "apples oranges pears pears pears pears pears", limit=2, offset=2)] == (
        ranked[2:4]
    )


def test_a_replaced_memory_is_found_by_its_new_text_not_its_old(bob, plan, before):
    put(bob, "fruit", "crunchy green apples in a bowl")
    put(bob, "snack", "crunchy green apples")
    if before == "indexed":
        indexer.run_cycle()
    put(bob, "snack", "salted roasted peanuts")

    new = search(bob, "salted roasted peanuts")
    assert new[0]["key"] == "snack" and new[0]["value"] == {"text": "salted roasted peanuts"}
    old = search(bob, "crunchy green apples")
    assert old[0]["key"] == "fruit"
    assert all(item["value"] != {"text": "crunchy green apples"} for item in old)
    assert [item["key"] for item in old].count("snack") <= 1


def test_a_deleted_memory_is_not_found(bob, plan, before, embedded):
    put(bob, "island", "volcano eruption on the island")
    put(bob, "gone", "volcano eruption on the island tonight")
    if before == "indexed":
        indexer.run_cycle()
    delete(bob, "gone")
    assert [item["key"] for item in search(bob, "volcano eruption tonight")] == ["island"]
    assert "volcano eruption on the island tonight" not in embedded  # a deleted version is no longer waiting


def test_a_long_index_text_is_found_once_indexed(bob, embedded):
    put(bob, "kayak", LONG)
    assert search(bob, "kayak trip along the fjords") == []
    assert embedded == []  # longer than MEMORY_SEARCH_PENDING_MAX_CHARS: left to the indexer
    assert indexer.run_cycle().indexed == 1
    assert [item["key"] for item in search(bob, "kayak trip along the fjords")] == ["kayak"]


def test_the_length_counts_every_field(bob, settings):
    settings.MEMORY_SEARCH_PENDING_MAX_CHARS = 40
    put(bob, "two", "", index={"a": "lighthouse keeper", "b": "on a rocky coast, at dawn"})  # 42 characters
    put(bob, "one", "", index={"a": "lighthouse keeper", "b": "rocky coast"})
    assert [item["key"] for item in search(bob, "lighthouse keeper on a rocky coast")] == ["one"]


def test_a_pending_version_of_another_user_or_scope_is_never_embedded_or_returned(bob, client_for, embedded):
    charlie = client_for("charlie")
    put(charlie, "tarts", "charlie's secret recipe for lemon tarts", namespace=["user", "charlie", "ryw"])
    put(bob, "elsewhere", "bob's lemon tarts, outside the searched prefix", namespace=["user", "bob", "other"])
    put(bob, "mine", "bob's lemon tarts")

    assert [item["key"] for item in search(bob, "lemon tarts")] == ["mine"]
    assert embedded == ["bob's lemon tarts"]
    # bob asking for charlie's subtree is narrowed to his own by the filter policy: charlie's text is never read.
    assert {item["key"] for item in search(bob, "lemon tarts", prefix=["user", "charlie"])} == set()
    assert [item["key"] for item in search(bob, "lemon tarts", prefix=["user", "bob"])] == ["mine", "elsewhere"]
    assert "charlie's secret recipe for lemon tarts" not in embedded
    assert [item["key"] for item in search(charlie, "lemon tarts", prefix=["user"])] == ["tarts"]


def test_an_expired_pending_version_is_not_found(bob):
    put(bob, "brief", "a short lived note about parking")
    Memory.objects.filter(key="brief").update(expires_at=timezone.now() - timedelta(seconds=1))
    assert search(bob, "note about parking") == []


def test_the_newest_pending_versions_up_to_the_limit_are_found(bob, settings):
    settings.MEMORY_SEARCH_PENDING_LIMIT = 2
    for key in ("first", "second", "third"):
        put(bob, key, f"a note about the harbour, the {key} one")
    assert {item["key"] for item in search(bob, "note about the harbour")} == {"second", "third"}
    indexer.run_cycle()
    assert {item["key"] for item in search(bob, "note about the harbour")} == {"first", "second", "third"}


def test_the_setting_at_zero_leaves_every_version_to_the_indexer(bob, settings, embedded):
    settings.MEMORY_SEARCH_PENDING_LIMIT = 0
    put(bob, "quiet", "a note about the harbour")
    assert search(bob, "note about the harbour") == []
    assert embedded == []


def test_a_version_is_embedded_once_per_process(bob, embedded):
    put(bob, "cached", "the spare key is under the blue flowerpot")
    for _ in range(3):
        assert search(bob, "spare key flowerpot")[0]["key"] == "cached"
    assert embedded == ["the spare key is under the blue flowerpot"]


def test_a_failure_to_embed_pending_versions_never_fails_the_search(bob, monkeypatch):
    put(bob, "indexed", "the spare key is under the blue flowerpot")
    indexer.run_cycle()
    put(bob, "waiting", "the spare key is under the red flowerpot")
    provider = get_provider()

    def broken(queries, documents):
        raise EmbeddingError("the model failed on this batch")

    monkeypatch.setattr(provider, "embed_with_documents", broken)
    assert [item["key"] for item in search(bob, "spare key flowerpot")] == ["indexed"]
    monkeypatch.undo()
    assert {item["key"] for item in search(bob, "spare key flowerpot")} == {"indexed", "waiting"}


def test_a_version_the_indexer_failed_on_is_left_to_the_indexer(bob, embedded):
    put(bob, "failing", "a text the model once failed on")
    Memory.objects.filter(key="failing").update(index_failures=1, index_retry_at=timezone.now() + timedelta(hours=1))
    assert search(bob, "text the model failed on") == []
    assert embedded == []


def test_a_pending_version_found_twice_appears_once(bob, monkeypatch):
    """The indexer may store the vectors between the search's two reads: the version is then in both lists."""
    put(bob, "raced", "the meeting moved to thursday")
    nearest = fresh.vector_index.nearest_memories

    def indexed_meanwhile(**kwargs):
        indexer.run_cycle()
        return nearest(**kwargs)

    monkeypatch.setattr(fresh.vector_index, "nearest_memories", indexed_meanwhile)
    assert [item["key"] for item in search(bob, "meeting moved to thursday")] == ["raced"]


@pytest.mark.django_db(transaction=True)  # the live service sees only committed rows
def test_concurrent_clients_each_find_their_own_write_at_once(bob_http):
    """32 clients at once, each PUTting a memory and searching for it straight after: each finds its own, first."""
    base, headers = bob_http
    run = uuid.uuid4().hex[:8]
    words = "amber birch cedar dune ember fjord grove heath inlet juniper kelp larch moss nettle oak pine".split()

    def remember_then_recall(index: int) -> tuple[list[str], str]:
        namespace = ["user", "bob", f"ryw-{run}", f"client-{index}"]
        text = f"client {index} keeps the {words[index % 16]} {words[index // 16]} notebook"
        with requests.Session() as session:
            written = session.put(
                f"{base}/v1/memories", json={"namespace": namespace, "key": "note", "value": {"text": text},
                                             "index": {"text": text}}, headers=headers, timeout=60,
            )  # fmt: skip
            assert written.status_code == 200, written.text
            found = session.post(
                f"{base}/v1/memories/search", json={"namespace_prefix": namespace, "query": text}, headers=headers,
                timeout=60,
            )  # fmt: skip
            assert found.status_code == 200, found.text
            return [item["value"]["text"] for item in found.json()["items"]], text

    results = run_concurrently([partial(remember_then_recall, index) for index in range(32)])
    for texts, text in results:
        assert texts == [text]
    assert Memory.objects.filter(namespace__2=f"ryw-{run}", index_status=IndexStatus.PENDING).count() == 32
