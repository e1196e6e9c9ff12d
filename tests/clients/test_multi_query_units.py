"""Multi-query memory search and ``search_type`` in the Python client and the LangGraph store, without a server
(D11, issue 30 item 3): the requests they build and how they read the answers, through httpx's MockTransport."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from langgraph.store.base import GetOp, InvalidNamespaceError, SearchItem
from memory_service import AsyncClient, Client, MemorySearchItem
from memory_service import _operations as ops
from memory_service.langgraph import MatchedSearchItem, MemoryServiceStore, MultiQuerySearchOp

NS = ["user", "bob"]
QUESTIONS = ["what does bob eat", {"text": "bob's travel plans", "purpose": "travel"}]
SENT_QUESTIONS = [{"text": "what does bob eat"}, {"text": "bob's travel plans", "purpose": "travel"}]


def item(key: str, value: dict, matched: list[str] | None, score: float = 0.5) -> dict:
    found = {"id": f"id-{key}", "namespace": NS, "key": key, "value": value, "attributes": {}, "score": score,
             "created_at": "2026-01-02T03:04:05+00:00"}
    if matched is not None:
        found["matched_queries"] = matched
    return found


class Service:
    """A MockTransport handler answering memory searches with ``pages`` in turn, /v1/me as bob (and other GETs with
    404), recording each search body (and each /v1/me as ``{"me": True}``)."""

    def __init__(self, *pages: list[dict]) -> None:
        self.pages = list(pages)
        self.bodies: list[dict] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/me":
            self.bodies.append({"me": True})
            return httpx.Response(200, json={"userId": "bob", "clientId": None, "roles": ["user"]})
        if request.url.path != "/v1/memories/search":
            return httpx.Response(404, json={"code": "not_found", "error": "Not found.", "requestId": "r"})
        self.bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"items": self.pages.pop(0) if self.pages else []})

    def client(self) -> Client:
        return Client("http://service.test", http_client=httpx.Client(transport=httpx.MockTransport(self)))

    def async_client(self) -> AsyncClient:
        return AsyncClient("http://service.test", http_client=httpx.AsyncClient(transport=httpx.MockTransport(self)))


def test_search_requests_carry_queries_per_query_limit_and_search_type() -> None:
    body = ops.search_memories(NS, queries=QUESTIONS, per_query_limit=3, search_type="auto", limit=5).json
    assert body == {"namespace_prefix": NS, "queries": SENT_QUESTIONS, "per_query_limit": 3, "search_type": "auto",
                    "limit": 5}
    assert ops.search_memories(NS, query="SW8629", search_type="fulltext").json == {
        "namespace_prefix": NS, "query": "SW8629", "search_type": "fulltext"}
    # A search that names none of the new fields sends what it sent before them (servers without them accept it).
    assert ops.search_memories(NS, query="coffee", limit=2).json == {"namespace_prefix": NS, "query": "coffee", "limit": 2}
    pages = ops.search_memory_pages(NS, queries=["diet"], search_type="semantic", page_size=50, after_cursor="100")
    assert pages.json == {"namespace_prefix": NS, "queries": [{"text": "diet"}], "search_type": "semantic",
                          "limit": 50, "offset": 100}
    with pytest.raises(ValueError, match="exclude each other"):
        ops.search_memories(NS, query="a", queries=["b"])
    with pytest.raises(TypeError, match="list of questions"):
        ops.search_memories(NS, queries="diet")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="string or"):
        ops.search_memories(NS, queries=[{"purpose": "diet"}])  # type: ignore[list-item]


def test_search_items_read_matched_queries_when_present() -> None:
    multi = MemorySearchItem.from_json(item("k", {"a": 1}, ["diet", "travel"]))
    assert multi.matched_queries == ("diet", "travel") and multi.score == 0.5
    assert MemorySearchItem.from_json(item("k", {"a": 1}, None)).matched_queries is None


def test_both_clients_send_a_multi_query_search_and_read_its_items() -> None:
    answer = [item("salad", {"text": "vegetarian"}, ["what does bob eat"]), item("lisbon", {}, ["travel"])]
    service = Service(answer, answer)
    with service.client() as client:
        found = client.search_memories(NS, queries=QUESTIONS, per_query_limit=2, limit=4)
    assert [(i.key, i.matched_queries) for i in found] == [("salad", ("what does bob eat",)), ("lisbon", ("travel",))]

    async def scenario() -> list[MemorySearchItem]:
        async with service.async_client() as client:
            return await client.search_memories(NS, queries=QUESTIONS, per_query_limit=2, limit=4)

    assert [i.key for i in asyncio.run(scenario())] == ["salad", "lisbon"]
    assert service.bodies == [{"namespace_prefix": NS, "queries": SENT_QUESTIONS, "per_query_limit": 2,
                               "limit": 4}] * 2


def test_the_store_searches_several_questions_and_keeps_search_as_it_was() -> None:
    answer = [item("salad", {"kind": "food"}, ["what does bob eat"], 1.0), item("lisbon", {"kind": "trip"}, ["travel"])]
    service = Service(answer, [item("salad", {"kind": "food"}, None)], answer)
    with service.client() as client, MemoryServiceStore(client=client, namespace_prefix=()) as store:
        found = store.search_queries(("user", "bob"), QUESTIONS, per_query_limit=2, search_type="auto", limit=3)
        assert all(isinstance(i, MatchedSearchItem) for i in found)
        assert [(i.key, i.score, i.matched_queries) for i in found] == [
            ("salad", 1.0, ["what does bob eat"]), ("lisbon", 0.5, ["travel"])]
        assert found[1].dict()["matched_queries"] == ["travel"] and found[1].namespace == ("user", "bob")
        plain = store.search(("user", "bob"), query="coffee")
        assert type(plain[0]) is SearchItem and not hasattr(plain[0], "matched_queries")
        # A value filter is applied here, over the fused list, as for search().
        filtered = store.search_queries(("user", "bob"), ["diet", "travel"], filter={"kind": "trip"})
        assert [i.key for i in filtered] == ["lisbon"]
    assert service.bodies == [
        {"namespace_prefix": NS, "queries": SENT_QUESTIONS, "per_query_limit": 2, "search_type": "auto",
         "limit": 3, "offset": 0},
        {"namespace_prefix": NS, "query": "coffee", "limit": 10, "offset": 0},  # exactly what search() sent before
        {"namespace_prefix": NS, "queries": [{"text": "diet"}, {"text": "travel"}], "limit": 100, "offset": 0},
    ]


def test_the_async_store_and_a_batch_hold_multi_query_ops() -> None:
    answer = [item("lisbon", {}, ["travel"])]
    service = Service(answer, answer)

    async def scenario() -> list:
        async with service.async_client() as client, MemoryServiceStore(async_client=client, namespace_prefix=()) as store:
            return await store.asearch_queries(("user", "bob"), ["travel"], search_type="semantic")

    assert [(i.key, i.matched_queries) for i in asyncio.run(scenario())] == [("lisbon", ["travel"])]
    with service.client() as client, MemoryServiceStore(client=client, namespace_prefix=()) as store:
        got, found = store.batch([GetOp(("user", "bob"), "missing"), MultiQuerySearchOp(("user", "bob"), ("travel",))])
        assert got is None and [i.key for i in found] == ["lisbon"]
        with pytest.raises(InvalidNamespaceError):
            store.search_queries(("user", "a.b"), ["travel"])
        with pytest.raises(TypeError):
            store.search_queries(("user", "bob"), "travel")  # type: ignore[arg-type]
    with service.client() as client, MemoryServiceStore(client=client, index=False, namespace_prefix=()) as store:
        with pytest.raises(ValueError, match="index=False"):
            store.search_queries(("user", "bob"), ["travel"])
    assert [body["search_type"] for body in service.bodies if "search_type" in body] == ["semantic"]


def test_multi_query_search_applies_the_store_prefix_as_search_does() -> None:
    """The store's default namespace prefix (the caller's ("user", <id>) from /v1/me, asked once): search_queries,
    asearch_queries and a batch's MultiQuerySearchOp send (*prefix, *namespace_prefix), exactly as search() does,
    and show results without the prefix."""
    answer = [item("salad", {"kind": "food"}, ["diet"]), item("lisbon", {"kind": "trip"}, ["travel"])]
    for found in answer:
        found["namespace"] = [*NS, "prefs"]
    service = Service(answer, answer, answer, answer)
    with service.client() as client, MemoryServiceStore(client=client) as store:
        found = store.search_queries(("prefs",), ["diet", "travel"], limit=2)
        assert [(i.namespace, i.key, i.matched_queries) for i in found] == [
            (("prefs",), "salad", ["diet"]), (("prefs",), "lisbon", ["travel"])]
        assert [i.dict()["namespace"] for i in found] == [["prefs"], ["prefs"]]
        searched = store.search(("prefs",), query="coffee", limit=2)
        assert [i.namespace for i in searched] == [("prefs",), ("prefs",)]
        (batched,) = store.batch([MultiQuerySearchOp((), ("travel",), limit=1)])
        assert [(i.namespace, i.key) for i in batched] == [(("prefs",), "salad")]

    async def scenario() -> list:
        async with service.async_client() as client, MemoryServiceStore(async_client=client) as store:
            return await store.asearch_queries(("prefs",), ["travel"], limit=1)

    assert [(i.namespace, i.key) for i in asyncio.run(scenario())] == [(("prefs",), "salad")]
    prefixes = [body.get("namespace_prefix") for body in service.bodies if "me" not in body]
    assert prefixes == [[*NS, "prefs"], [*NS, "prefs"], NS, [*NS, "prefs"]]
    assert service.bodies[0] == {"me": True} and sum("me" in body for body in service.bodies) == 2  # once per store
    assert [("queries" in body, "query" in body) for body in service.bodies if "me" not in body] == [
        (True, False), (False, True), (True, False), (True, False)]
