"""The LangGraph and LangChain adapters' pure parts, without a server: value filters and namespace patterns, the
checkpointer's entry packing and log rules, thread ids, the flow drivers and the per-loop async client."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest
from memory_service import AsyncClient, Client, NotFoundError
from memory_service import _operations as ops
from memory_service._flow import Clients, arun, run
from memory_service._ids import THREAD_NAMESPACE, conversation_id_for
from memory_service.langgraph import _filters
from memory_service.langgraph.checkpoint import _Log, _pack, _records
from memory_service.langgraph.store import _ttl_seconds
from memory_service.models import Entry


def test_value_filters_follow_langgraph_operators() -> None:
    value = {"n": 5, "s": "m", "flag": True, "nested": {"a": {"b": 1}, "c": 2}, "list": [1, {"x": 2}], "none": None}
    passing = [
        {"n": 5}, {"n": {"$eq": 5}}, {"n": {"$ne": 4}}, {"n": {"$gt": 4, "$lt": 6}}, {"n": {"$gte": 5.0, "$lte": 5}},
        {"s": {"$gt": "a"}}, {"flag": True}, {"nested": {"a": {"b": 1}}}, {"nested": {"c": {"$gte": 2}}},
        {"list": [1, {"x": 2}]}, {"none": None}, {"absent": None}, {"absent": {"$ne": 1}}, {},
    ]
    failing = [
        {"n": 4}, {"n": {"$gt": 5}}, {"n": "5"}, {"n": {"$gt": "4"}}, {"s": {"$lt": 1}}, {"flag": 1}, {"n": True},
        {"nested": {"a": {"b": 2}}}, {"nested": 1}, {"list": [1]}, {"absent": {"$gt": 0}}, {"none": {"$lt": 1}},
        {"n": 5, "s": "x"},
    ]
    for filter in passing:
        assert _filters.matches(value, filter), filter
    for filter in failing:
        assert not _filters.matches(value, filter), filter
    _filters.check_filter({"n": {"$gt": 1}, "nested": {"a": {"b": {"$ne": 1}}}})
    with pytest.raises(ValueError, match=r"\$in"):
        _filters.check_filter({"nested": {"a": {"$in": [1]}}})


def test_namespace_patterns() -> None:
    ns = ("user", "bob", "a", "x")
    assert _filters.namespace_matches(ns, "prefix", ("user", "*", "a"))
    assert _filters.namespace_matches(ns, "suffix", ("*", "x"))
    assert not _filters.namespace_matches(ns, "suffix", ("a",))
    assert not _filters.namespace_matches(ns, "prefix", ("user", "bob", "a", "x", "*"))  # longer than the namespace
    assert _filters.literal_head(("user", "*", "a")) == ["user"]
    assert _filters.literal_tail(("a", "*", "x", "y")) == ["x", "y"]
    assert _filters.literal_head(("*",)) == [] == _filters.literal_tail(("*",))


def test_ttl_minutes_become_whole_seconds() -> None:
    assert _ttl_seconds(None) is None
    assert (_ttl_seconds(1), _ttl_seconds(0.5), _ttl_seconds(0.001), _ttl_seconds(1.01)) == (60, 30, 1, 61)
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            _ttl_seconds(bad)


def test_thread_ids_map_to_conversation_ids_per_user() -> None:
    own = uuid.uuid4()
    assert conversation_id_for(str(own), "bob") == str(own) == conversation_id_for(own, "charlie")
    assert conversation_id_for(str(own).upper(), "bob") == str(own)  # one conversation, however the UUID is spelled
    bobs = conversation_id_for("chat-42", "bob")
    assert bobs == str(uuid.uuid5(uuid.uuid5(THREAD_NAMESPACE, "bob"), "chat-42")) == conversation_id_for("chat-42", "bob")
    assert bobs != conversation_id_for("chat-43", "bob")
    # Two users' thread ids never name one conversation, nor does the old shared derivation.
    assert bobs != conversation_id_for("chat-42", "charlie")
    assert bobs != str(uuid.uuid5(THREAD_NAMESPACE, "chat-42"))
    with pytest.raises(ValueError):
        conversation_id_for("chat-42", "")


def entry(content: list[dict]) -> Entry:
    return Entry(id=str(uuid.uuid4()), conversation_id="c", user_id="bob", channel="context",
                 content_type="langgraph-checkpoint", content=content, created_at=None)  # type: ignore[arg-type]


def test_records_are_packed_within_the_budget_and_joined_on_read() -> None:
    records = [
        {"kind": "blob", "ns": "", "channel": "big", "version": "1", "type": "msgpack", "data": "A" * 50_000},
        {"kind": "blob", "ns": "", "channel": "small", "version": "1", "type": "msgpack", "data": "b"},
        {"kind": "checkpoint", "ns": "", "id": "c1", "parent": None, "type": "msgpack", "data": "C" * 9000},
    ]
    entries = _pack(records, 8192)
    assert len(entries) > 6
    for content in entries:
        assert len(json.dumps(content, separators=(",", ":")).encode()) <= 8192
    assert entries[-1][-1]["kind"] == "checkpoint"  # the checkpoint comes last: its blobs are in before it
    assert _records([entry(content) for content in entries]) == records
    assert _pack(records[1:2], 8192) == [records[1:2]]  # small records stay whole, in one entry


def test_parts_of_concurrent_writers_interleave_and_incomplete_ones_are_dropped() -> None:
    a = _pack([{"kind": "blob", "ns": "", "channel": "a", "version": "1", "type": "t", "data": "a" * 20_000}], 8192)
    b = _pack([{"kind": "blob", "ns": "", "channel": "b", "version": "1", "type": "t", "data": "b" * 20_000}], 8192)
    interleaved = [entry(content) for pair in zip(a, b, strict=True) for content in pair]
    joined = _records(interleaved)
    assert [(r["channel"], r["data"]) for r in joined] == [("a", "a" * 20_000), ("b", "b" * 20_000)]
    assert _records(interleaved[:-1]) == joined[:1]  # b's last part missing: b is left out, not half read


def test_the_log_keeps_langgraph_savers_rules() -> None:
    def write(task: str, idx: int, data: str) -> dict:
        return {"kind": "write", "ns": "", "checkpoint": "c1", "task": task, "path": "", "idx": idx,
                "channel": "ch", "type": "t", "data": data}

    def blob(data: str) -> dict:
        return {"kind": "blob", "ns": "", "channel": "x", "version": "1", "type": "t", "data": data}

    log = _Log.build([
        blob("first"), {"kind": "checkpoint", "ns": "", "id": "c1", "thread": "t", "type": "t", "data": ""},
        blob("second"), {"kind": "checkpoint", "ns": "", "id": "c2", "thread": "t", "type": "t", "data": ""},
        write("t1", 0, "kept"), write("t1", 0, "retry"), write("t1", -1, "error 1"), write("t1", -1, "error 2"),
    ])
    writes = log.writes[("", "c1")]
    assert writes[("t1", 0)]["data"] == "kept"  # a regular write is kept once (an idempotent retry adds nothing)
    assert writes[("t1", -1)]["data"] == "error 2"  # a special write (error, interrupt) is replaced
    # Each checkpoint reads a channel version as it was when it was put.
    assert log.blob("", "x", "1", log.checkpoints[("", "c1")].seq)["data"] == "first"
    assert log.blob("", "x", "1", log.checkpoints[("", "c2")].seq)["data"] == "second"
    assert log.blob("", "x", "2", 99) is None


def test_flows_run_on_both_clients_and_exceptions_reach_the_flow() -> None:
    """One flow, driven by the blocking and the awaited client; a 404 is thrown into the flow, which decides."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("key") == "missing":
            return httpx.Response(404, json={"code": "not_found", "error": "no", "requestId": "r1"})
        return httpx.Response(200, json={"id": "1", "namespace": ["user", "bob"], "key": "k", "value": {"v": 1},
                                         "attributes": None, "created_at": "2026-01-01T00:00:00+00:00",
                                         "expires_at": None})

    def flow():
        found = yield ops.get_memory(("user", "bob"), "k")
        try:
            yield ops.get_memory(("user", "bob"), "missing")
        except NotFoundError as exc:
            return found.value, exc.request_id
        return None

    transport = httpx.MockTransport(handler)
    with Client("http://service", http_client=httpx.Client(transport=transport)) as client:
        assert run(client, flow()) == ({"v": 1}, "r1")

    async def scenario() -> tuple:
        async with AsyncClient("http://service", http_client=httpx.AsyncClient(transport=transport)) as client:
            return await arun(client, flow())

    assert asyncio.run(scenario()) == ({"v": 1}, "r1")


def test_a_made_async_client_belongs_to_its_event_loop() -> None:
    clients = Clients(None, None, "http://service")

    async def current() -> AsyncClient:
        first = clients.async_
        assert clients.async_ is first  # one per loop
        return first

    one = asyncio.run(current())
    two = asyncio.run(current())  # a new loop: a new client (the old one's connections belong to a closed loop)
    assert one is not two
    assert clients.sync is clients.sync
    clients.close()
    with pytest.raises(TypeError):
        Clients(None, None, None)
