"""MemoryServiceStore (a LangGraph BaseStore) against the live service: batches in op order, LangGraph's indexing
paths turned into the memory's index, value filters applied client-side across pages, namespace wildcards that
never widen the answer, TTL in minutes and its refresh, semantic search with scores."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from langgraph.store.base import GetOp, ListNamespacesOp, MatchCondition, PutOp, SearchOp
from memory_service import Client
from memory_service.langgraph import MemoryServiceStore

from apps.memories.models import Memory
from tests.clients.conftest import user_token
from tests.live_service import LiveService

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_tables_after_module")]


def make_store(live_service: LiveService, user: str = "bob", **kwargs) -> MemoryServiceStore:
    """A store on the service's namespaces as they are (``namespace_prefix=()``): the tests below name
    ``("user", "bob", ...)`` themselves; the default prefix has its own tests at the end."""
    kwargs.setdefault("namespace_prefix", ())
    return MemoryServiceStore(live_service.base_url, token=user_token(live_service, user), **kwargs)


def run_subtree() -> tuple[str, str, str]:
    return ("user", "bob", uuid.uuid4().hex[:12])


def indexed_content(namespace: tuple[str, ...], key: str, django_db_blocker) -> dict | None:
    """What the service stored as the active version's index (plaintext, by design)."""
    with django_db_blocker.unblock():
        return Memory.objects.get(namespace=list(namespace), key=key, state="active").indexed_content


def test_put_get_delete_and_items(live_service: LiveService) -> None:
    ns = run_subtree()
    with make_store(live_service) as store:
        assert store.get(ns, "missing") is None
        before = datetime.now(UTC)
        store.put(ns, "coffee", {"likes": "flat white", "shots": 2})
        item = store.get(ns, "coffee")
        assert (item.namespace, item.key, item.value) == (ns, "coffee", {"likes": "flat white", "shots": 2})
        assert item.created_at == item.updated_at and item.created_at >= before - timedelta(seconds=5)
        assert item.created_at.tzinfo is not None
        store.delete(ns, "coffee")
        assert store.get(ns, "coffee") is None

    async def scenario() -> None:
        async with make_store(live_service) as store:
            await store.aput(ns, "tea", {"likes": "green"})
            assert (await store.aget(ns, "tea")).value == {"likes": "green"}
            assert [i.key for i in await store.asearch(ns)] == ["tea"]
            assert await store.alist_namespaces(prefix=ns) == [ns]
            await store.adelete(ns, "tea")
            assert await store.aget(ns, "tea") is None

    asyncio.run(scenario())


def test_batch_runs_concurrently_with_results_in_op_order(live_service: LiveService) -> None:
    """100 gets in one batch come back in op order (missing keys None); a batch's reads see the store before its
    writes, and of two puts to one key the last wins, as in LangGraph's stores."""
    ns = run_subtree()
    with make_store(live_service, max_concurrency=32) as store:
        store.batch([PutOp(ns, f"k{i}", {"i": i}) for i in range(100)])
        keys = [f"k{i}" for i in range(100)]
        keys[7] = "absent"
        results = store.batch([GetOp(ns, key) for key in keys])
        assert [None if r is None else r.value["i"] for r in results] == [None if i == 7 else i for i in range(100)]
        mixed = store.batch([
            PutOp(ns, "k1", {"i": "new"}),
            GetOp(ns, "k1"),
            SearchOp(ns, filter={"i": 5}),
            PutOp(ns, "k2", {"i": "first"}),
            PutOp(ns, "k2", {"i": "second"}),
            ListNamespacesOp(match_conditions=(MatchCondition("prefix", ns),)),
        ])
        assert mixed[0] is None and mixed[3] is None and mixed[4] is None
        assert mixed[1].value == {"i": 1}  # read before the batch's put
        assert [item.key for item in mixed[2]] == ["k5"]
        assert mixed[5] == [ns]
        assert store.get(ns, "k1").value == {"i": "new"}
        assert store.get(ns, "k2").value == {"i": "second"}

    async def scenario() -> list:
        async with make_store(live_service, max_concurrency=8) as store:
            return await store.abatch([GetOp(ns, key) for key in keys])

    assert [None if r is None else r.value["i"] for r in asyncio.run(scenario())] == [
        None if i == 7 else ("new" if i == 1 else ("second" if i == 2 else i)) for i in range(100)
    ]


def test_32_concurrent_puts_and_deletes_in_one_batch(live_service: LiveService) -> None:
    """A batch of 64 puts on 32 threads, then 32 deletes and 32 rewrites at once: every write lands."""
    ns = run_subtree()
    with make_store(live_service, max_concurrency=32) as store:
        store.batch([PutOp(ns, f"k{i}", {"i": i}) for i in range(64)])
        store.batch([PutOp(ns, f"k{i}", None if i % 2 else {"i": -i}) for i in range(64)])
        items = {item.key: item.value for item in store.search(ns, limit=100)}
    assert items == {f"k{i}": {"i": -i} for i in range(0, 64, 2)}


def test_index_paths_as_langgraph_stores_pick_them(live_service: LiveService, django_db_blocker) -> None:
    """The store's fields (default ["$"]: the whole value), a put's own JSON paths ("[*]" gives path.0, path.1...),
    index=False, and a store without indexing, as the memory's index."""
    ns = run_subtree()
    value = {"title": "Lisbon", "tags": ["trams", "pastéis"], "meta": {"author": {"name": "bob"}}, "n": 3}
    with make_store(live_service) as store:
        store.put(ns, "whole", value)
        store.put(ns, "paths", value, index=["title", "tags[*]", "meta.author.name", "n", "missing"])
        store.put(ns, "last", value, index=["tags[-1]"])
        store.put(ns, "none", value, index=False)
    with make_store(live_service, index={"fields": ["meta"]}) as store:
        store.put(ns, "store-fields", value)
    with make_store(live_service, index=False) as store:
        store.put(ns, "store-off", value, index=["title"])
    assert indexed_content(ns, "whole", django_db_blocker) == {
        "$": '{"meta": {"author": {"name": "bob"}}, "n": 3, "tags": ["trams", "pastéis"], "title": "Lisbon"}'
    }
    assert indexed_content(ns, "paths", django_db_blocker) == {
        "title": "Lisbon", "tags[*].0": "trams", "tags[*].1": "pastéis", "meta.author.name": "bob", "n": "3",
    }
    assert indexed_content(ns, "last", django_db_blocker) == {"tags[-1]": "pastéis"}
    assert indexed_content(ns, "none", django_db_blocker) is None
    assert indexed_content(ns, "store-fields", django_db_blocker) == {"meta": '{"author": {"name": "bob"}}'}
    assert indexed_content(ns, "store-off", django_db_blocker) is None


def test_value_filters_are_applied_to_decrypted_values_across_pages(live_service: LiveService) -> None:
    """250 items (three of the service's pages): LangGraph's operators on values, ``offset`` counting matches."""
    ns = run_subtree()
    with make_store(live_service, max_concurrency=16) as store:
        store.batch([
            PutOp(ns, f"k{i:03}", {"i": i, "odd": bool(i % 2), "name": f"n{i:03}", "meta": {"tier": i % 3},
                                   "pair": [i % 2, 0]})
            for i in range(250)
        ])
        wanted = {"odd": True, "i": {"$gte": 100}}
        everything = store.search(ns, filter=wanted, limit=1000)
        assert sorted(item.value["i"] for item in everything) == list(range(101, 250, 2))
        assert len({item.key for item in everything}) == 75
        page = store.search(ns, filter=wanted, limit=20, offset=5)
        assert [item.key for item in page] == [item.key for item in everything[5:25]]
        assert all(item.score is None for item in page)

        def keys(**kwargs) -> set[int]:
            return {item.value["i"] for item in store.search(ns, limit=1000, **kwargs)}

        assert keys(filter={"i": {"$lt": 3}}) == {0, 1, 2}
        assert keys(filter={"i": {"$gt": 246, "$ne": 248}}) == {247, 249}
        assert keys(filter={"i": {"$lte": 1, "$eq": 1}}) == {1}
        assert keys(filter={"name": {"$gte": "n247"}}) == {247, 248, 249}
        assert keys(filter={"meta": {"tier": 2}, "i": {"$lt": 9}}) == {2, 5, 8}
        assert keys(filter={"pair": [1, 0], "i": {"$lt": 6}}) == {1, 3, 5}
        assert keys(filter={"odd": 1}) == set()  # JSON: true is not 1
        assert keys(filter={"name": {"$gt": 5}}) == set()  # a string is not ordered against a number
        assert keys(filter={"absent": {"$ne": 1}, "i": 4}) == {4}
        with pytest.raises(ValueError, match="unsupported filter operator"):
            store.search(ns, filter={"i": {"$in": [1]}})


def test_namespace_wildcards_and_max_depth_never_widen(live_service: LiveService) -> None:
    root = run_subtree()
    made = [(*root, "a", "x"), (*root, "b", "x"), (*root, "b", "y"), (*root, "c")]
    with make_store(live_service) as store:
        store.batch([PutOp(ns, "k", {"v": 1}) for ns in made])
        assert store.list_namespaces(prefix=root) == sorted(made)
        assert store.list_namespaces(prefix=(*root, "*", "x")) == [(*root, "a", "x"), (*root, "b", "x")]
        assert store.list_namespaces(prefix=(*root, "*")) == sorted(made)
        assert store.list_namespaces(suffix=("b", "*")) == [(*root, "b", "x"), (*root, "b", "y")]
        assert store.list_namespaces(prefix=root, suffix=("*", "x")) == [(*root, "a", "x"), (*root, "b", "x")]
        assert store.list_namespaces(suffix=("x",)) == [(*root, "a", "x"), (*root, "b", "x")]
        assert store.list_namespaces(prefix=(*root, "*", "x"), max_depth=4) == [(*root, "a"), (*root, "b")]
        assert store.list_namespaces(prefix=root, max_depth=4) == [(*root, "a"), (*root, "b"), (*root, "c")]
        assert store.list_namespaces(prefix=root, max_depth=4, offset=1, limit=1) == [(*root, "b")]
        assert store.list_namespaces(prefix=(*root, "*", "*", "*")) == []
        two_prefixes = store.batch([ListNamespacesOp(match_conditions=(
            MatchCondition("prefix", (*root, "b")), MatchCondition("prefix", (*root, "*", "y")),
        ))])[0]
        assert two_prefixes == [(*root, "b", "y")]


def test_ttl_in_minutes_and_refresh_on_read_when_asked(live_service: LiveService) -> None:
    ns = run_subtree()
    with make_store(live_service) as store, Client(live_service.base_url, token=user_token(live_service, "bob")) as client:
        store.put(ns, "short", {"v": 1}, ttl=0.5)
        first = client.get_memory(ns, "short")
        assert first.expires_at - first.created_at == timedelta(seconds=30)
        store.get(ns, "short")  # reads do not refresh unless asked (a refresh is a write)
        assert client.get_memory(ns, "short").id == first.id
        refreshed = store.get(ns, "short", refresh_ttl=True)
        again = client.get_memory(ns, "short")
        assert again.id != first.id and again.value == {"v": 1}
        assert again.expires_at - again.created_at == timedelta(seconds=30) and again.expires_at > first.expires_at
        assert refreshed.value == {"v": 1}
        store.search(ns, refresh_ttl=True)
        assert client.get_memory(ns, "short").id != again.id
        store.put(ns, "forever", {"v": 2})
        store.get(ns, "forever", refresh_ttl=True)  # nothing to refresh: no write
        assert client.get_memory(ns, "forever").expires_at is None
    with make_store(live_service, ttl={"default_ttl": 2, "refresh_on_read": True}) as store, \
            Client(live_service.base_url, token=user_token(live_service, "bob")) as client:
        store.put(ns, "defaulted", {"v": 3})
        written = client.get_memory(ns, "defaulted")
        assert written.expires_at - written.created_at == timedelta(minutes=2)
        store.get(ns, "defaulted")
        assert client.get_memory(ns, "defaulted").id != written.id
        with pytest.raises(ValueError, match="ttl"):
            store.put(ns, "bad", {"v": 4}, ttl=-1)


@pytest.mark.django_db(transaction=True)  # the live service writes: the tables are emptied afterwards
def test_semantic_search_with_scores_offset_and_filters(live_service: LiveService) -> None:
    """Found by meaning as soon as put, as in LangGraph's own stores: no wait, and no indexer runs here (the
    service's search reads your writes, README "Read your writes")."""
    from apps.memories.models import IndexStatus, Memory

    ns = run_subtree()
    with make_store(live_service) as store:
        store.put(ns, "coffee", {"text": "bob drinks a flat white every morning", "kind": "drink"})
        assert store.search(ns, query="flat white coffee")[0].key == "coffee"  # the line after the put
        store.put(ns, "tea", {"text": "bob drinks green tea in the afternoon", "kind": "drink"})
        store.put(ns, "lisbon", {"text": "bob plans a trip to lisbon", "kind": "travel"})
        store.put(ns, "hidden", {"text": "flat white coffee morning"}, index=False)
        ranked = store.search(ns, query="flat white coffee morning")
        assert ranked[0].key == "coffee"
        assert {item.key for item in ranked} == {"coffee", "tea", "lisbon"}
        assert all(0 <= item.score <= 1 for item in ranked)
        assert [item.score for item in ranked] == sorted((item.score for item in ranked), reverse=True)
        assert [item.key for item in store.search(ns, query="flat white coffee morning", offset=1)] == [
            item.key for item in ranked[1:]
        ]
        drinks = store.search(ns, query="trip to lisbon", filter={"kind": "drink"}, limit=1)
        assert len(drinks) == 1 and drinks[0].value["kind"] == "drink"
    with make_store(live_service, index=False) as store:  # no semantic search: a query is ignored, as in LangGraph
        assert {item.key for item in store.search(ns, query="coffee")} == {"coffee", "tea", "lisbon", "hidden"}
    # None of them had been embedded by an indexer: the search embedded them itself.
    assert Memory.objects.filter(namespace=list(ns), state="active", index_status=IndexStatus.PENDING).count() == 3


def test_another_user_is_refused_by_the_service_policy(live_service: LiveService) -> None:
    from memory_service import PermissionDeniedError

    ns = run_subtree()
    with make_store(live_service) as store:
        store.put(ns, "mine", {"v": 1})
    with make_store(live_service, "charlie") as store:
        with pytest.raises(PermissionDeniedError):
            store.get(ns, "mine")
        assert store.search(ns) == []  # search is scoped to charlie's own subtree by the policy


# --- The default namespace prefix: the caller's own ("user", <user id>) -----------------------------------------


def test_by_default_items_live_under_the_callers_own_prefix(live_service: LiveService) -> None:
    """LangGraph code written for its own stores (namespaces without the policy's ("user", <id>) head) runs
    unchanged: the store puts them under the caller's own prefix and shows them without it."""
    run = uuid.uuid4().hex[:12]
    ns = (run, "memories")
    with MemoryServiceStore(live_service.base_url, token=user_token(live_service, "bob")) as store:
        store.put(ns, "coffee", {"likes": "flat white"})
        item = store.get(ns, "coffee")
        assert (item.namespace, item.value) == (ns, {"likes": "flat white"})
        assert [(i.namespace, i.key) for i in store.search((run,))] == [(ns, "coffee")]
        assert store.list_namespaces(prefix=(run,)) == [ns]
        assert store.list_namespaces(prefix=(run,), max_depth=1) == [(run,)]
        assert ns in store.list_namespaces(suffix=("memories",))
        assert (run, "memories") in store.list_namespaces(prefix=(run, "*"))
        # Three levels under the prefix (the service's default depth of 5, less 2) are the code's.
        store.put((run, "a", "b"), "deep", {"ok": True})
        assert store.get((run, "a", "b"), "deep").value == {"ok": True}
        with pytest.raises(Exception) as too_deep:
            store.put((run, "a", "b", "c"), "deeper", {"ok": False})
        assert "namespace" in str(too_deep.value)
        store.delete(ns, "coffee")
        assert store.get(ns, "coffee") is None

    with Client(live_service.base_url, token=user_token(live_service, "bob")) as client:
        assert client.get_memory(("user", "bob", run, "a", "b"), "deep").value == {"ok": True}
    with MemoryServiceStore(live_service.base_url, token=user_token(live_service, "charlie")) as other:
        assert other.get((run, "a", "b"), "deep") is None  # charlie's own prefix: not bob's items
        assert other.search((run,)) == []

    async def scenario() -> None:
        async with MemoryServiceStore(live_service.base_url, token=user_token(live_service, "bob")) as store:
            await store.aput((run, "async"), "k", {"v": 1})
            assert (await store.aget((run, "async"), "k")).namespace == (run, "async")

    asyncio.run(scenario())


def test_a_given_prefix_is_used_instead(live_service: LiveService) -> None:
    run = uuid.uuid4().hex[:12]
    with MemoryServiceStore(live_service.base_url, token=user_token(live_service, "bob"),
                            namespace_prefix=("user", "bob", run)) as store:
        store.put(("prefs",), "tea", {"likes": "green"})
        assert store.list_namespaces() == [("prefs",)]
    with Client(live_service.base_url, token=user_token(live_service, "bob")) as client:
        assert client.get_memory(("user", "bob", run, "prefs"), "tea").value == {"likes": "green"}
    with pytest.raises(TypeError):
        MemoryServiceStore(live_service.base_url, token="t", namespace_prefix="user")
