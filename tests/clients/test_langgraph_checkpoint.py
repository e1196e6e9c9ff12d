"""MemoryServiceCheckpointSaver against the live service: LangGraph's own conformance suite, long threads read to
their last page, large states split across entries, concurrent writers, and the privacy of context entries."""

from __future__ import annotations

import asyncio
import operator
import uuid
from functools import partial
from typing import Annotated, TypedDict

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import ProgressCallbacks
from langgraph.graph import END, START, StateGraph
from memory_service import Client, NotFoundError, PermissionDeniedError
from memory_service._ids import THREAD_NAMESPACE
from memory_service.langgraph import MemoryServiceCheckpointSaver, conversation_id_for

from tests.clients.conftest import user_token
from tests.concurrency import run_concurrently
from tests.conftest import TEST_API_KEY
from tests.live_service import LiveService

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_tables_after_module")]


class State(TypedDict):
    items: Annotated[list[str], operator.add]


def make_saver(live_service: LiveService, user: str = "bob", **kwargs) -> MemoryServiceCheckpointSaver:
    kwargs.setdefault("api_key", TEST_API_KEY)
    return MemoryServiceCheckpointSaver(live_service.base_url, token=user_token(live_service, user), **kwargs)


def sdk_client(live_service: LiveService, user: str = "bob", **kwargs) -> Client:
    kwargs.setdefault("api_key", TEST_API_KEY)
    return Client(live_service.base_url, token=user_token(live_service, user), **kwargs)


def test_the_langgraph_checkpoint_conformance_suite_passes(live_service: LiveService) -> None:
    """langgraph-checkpoint-conformance: every base capability and every extended one the saver implements."""

    @checkpointer_test(name="MemoryServiceCheckpointSaver")
    async def memory_service_saver():
        saver = make_saver(live_service)
        yield saver
        await saver.aclose()

    report = asyncio.run(validate(memory_service_saver, progress=ProgressCallbacks.verbose()))
    report.print_report()
    failures = {name: result.failures for name, result in report.results.items() if result.failures}
    assert report.passed_all_base(), failures
    assert report.passed_all(), failures
    detected = {name for name, result in report.results.items() if result.detected}
    assert detected == {"put", "put_writes", "get_tuple", "list", "delete_thread", "copy_thread"}


def put_chain(saver: MemoryServiceCheckpointSaver, thread_id: str, steps: int, after: list[dict] | None = None) -> list[dict]:
    """``steps`` checkpoints as a graph makes them (continuing the chain ``after``): each one changes channel
    ``count`` (the others keep the blobs of the first checkpoint) and points at the previous one."""
    stored = list(after or [])
    parent = stored[-1] if stored else None
    for step in range(len(stored), len(stored) + steps):
        changed = {"count": step} if step else {"count": 0, "fixed": "set once", "notes": ["a", "b"]}
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"count": step, "fixed": "set once", "notes": ["a", "b"]}
        checkpoint["channel_versions"] = {"count": f"{step + 1:032}.0", "fixed": f"{1:032}.0", "notes": f"{1:032}.0"}
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        if parent:
            config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
        parent = saver.put(config, checkpoint, {"source": "loop", "step": step},
                           {c: checkpoint["channel_versions"][c] for c in changed})
        stored.append(parent)
    return stored


def put_writes_concurrently(saver: MemoryServiceCheckpointSaver, stored: list[dict], tasks: int, first: int = 0) -> None:
    """``tasks`` put_writes per checkpoint from ``stored[first]`` on, all at once (their order does not matter; it
    saves the test time)."""

    async def scenario() -> None:
        gate = asyncio.Semaphore(16)

        async def one(step: int, task: int) -> None:
            async with gate:
                await saver.aput_writes(stored[step], [("count", step + 1), ("log", f"step {step}")],
                                        f"task-{step}-{task}")

        await asyncio.gather(*(one(step, task) for step in range(first, len(stored)) for task in range(tasks)))
        await saver.aclose()

    asyncio.run(scenario())


def test_a_long_thread_is_read_to_its_last_page(live_service: LiveService) -> None:
    """150 checkpoints with two put_writes each: 450 context entries, three pages of the service's 200. The latest
    checkpoint (on page 2), its blobs (two written by the first checkpoint, on page 1) and its writes (on page 3)
    all come back; reading only the first page (the upstream saver's bug) would resume from step 74."""
    with make_saver(live_service) as saver:
        first_half = put_chain(saver, "long thread", 75)
        put_writes_concurrently(saver, first_half, 2)
        stored = put_chain(saver, "long thread", 75, after=first_half)
        put_writes_concurrently(saver, stored, 2, first=75)
        latest = saver.get_tuple({"configurable": {"thread_id": "long thread", "checkpoint_ns": ""}})
        assert latest is not None
        assert latest.config["configurable"]["checkpoint_id"] == stored[-1]["configurable"]["checkpoint_id"]
        assert latest.metadata["step"] == 149
        assert latest.checkpoint["channel_values"] == {"count": 149, "fixed": "set once", "notes": ["a", "b"]}
        assert sorted(w[0] for w in latest.pending_writes) == ["task-149-0", "task-149-0", "task-149-1", "task-149-1"]
        listed = list(saver.list({"configurable": {"thread_id": "long thread"}}))
        assert [t.metadata["step"] for t in listed] == list(range(149, -1, -1))
        assert [t.checkpoint["channel_values"]["count"] for t in listed[:3]] == [149, 148, 147]
        page = list(saver.list({"configurable": {"thread_id": "long thread"}}, before=stored[100], limit=2,
                               filter={"source": "loop"}))
        assert [t.metadata["step"] for t in page] == [99, 98]
    with sdk_client(live_service) as client:
        entries = list(client.iter_entries(conversation_id_for("long thread"), channel="context"))
    assert len(entries) == 450


def test_a_state_bigger_than_an_entry_spans_several(live_service: LiveService) -> None:
    """A channel value larger than an entry may be (here 8 KiB) is split into parts and joined on read; pending
    writes too."""
    big = {"text": "x" * 30_000, "numbers": list(range(2000))}
    with make_saver(live_service, max_entry_bytes=8192) as saver:
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"big": big, "small": 1}
        checkpoint["channel_versions"] = {"big": 1, "small": 1}
        config = saver.put({"configurable": {"thread_id": "big state", "checkpoint_ns": ""}}, checkpoint,
                           {"source": "input", "step": -1}, {"big": 1, "small": 1})
        saver.put_writes(config, [("big", big)], "task")
        found = saver.get_tuple(config)
    assert found is not None
    assert found.checkpoint["channel_values"] == {"big": big, "small": 1}
    assert found.pending_writes == [("task", "big", big)]
    with sdk_client(live_service) as client:
        entries = list(client.iter_entries(conversation_id_for("big state"), channel="context"))
    assert len(entries) > 4
    assert all(len(str(entry.content)) < 9000 for entry in entries)


def test_32_concurrent_writers_on_one_thread_lose_nothing(live_service: LiveService) -> None:
    """32 savers (each its own connection) put a checkpoint and its writes on one new thread at once: the first
    appends create the conversation exactly once and every checkpoint and write is there afterwards."""
    thread_id = f"concurrent {uuid.uuid4()}"

    def writer(index: int, saver: MemoryServiceCheckpointSaver) -> str:
        with saver:
            checkpoint = empty_checkpoint()
            checkpoint["channel_values"] = {"who": index}
            checkpoint["channel_versions"] = {"who": saver.get_next_version(None, None)}
            config = saver.put({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}, checkpoint,
                               {"source": "loop", "step": index}, checkpoint["channel_versions"])
            saver.put_writes(config, [("out", index)], f"task-{index}")
            return checkpoint["id"]

    ids = run_concurrently([partial(writer, index, make_saver(live_service)) for index in range(32)])
    with make_saver(live_service) as saver:
        listed = list(saver.list({"configurable": {"thread_id": thread_id}}))
    assert sorted(t.checkpoint["id"] for t in listed) == sorted(ids)
    for found in listed:
        index = found.metadata["step"]
        assert found.checkpoint["channel_values"] == {"who": index}
        assert found.pending_writes == [(f"task-{index}", "out", index)]
    with sdk_client(live_service) as client:
        assert client.get_conversation(conversation_id_for(thread_id)).owner_user_id == "bob"


def test_threads_are_conversations_and_checkpoints_are_private_context(live_service: LiveService) -> None:
    """A non-UUID thread id maps to a stable conversation id (a UUID thread id is the conversation id); the
    checkpoints are context entries: not in the history, invisible without the API key, and another user gets a
    403, not the state."""
    with make_saver(live_service) as saver:
        put_chain(saver, "chat-7", 2)
        own_id = str(uuid.uuid4())
        put_chain(saver, own_id, 1)
    conversation_id = conversation_id_for("chat-7")
    assert conversation_id == str(uuid.uuid5(THREAD_NAMESPACE, "chat-7"))
    assert conversation_id_for(own_id) == own_id
    with sdk_client(live_service, api_key=None) as no_key:
        assert no_key.get_conversation(conversation_id).owner_user_id == "bob"
        assert list(no_key.iter_entries(conversation_id)) == []  # history only: the checkpoints are context
        with pytest.raises(PermissionDeniedError):
            no_key.list_entries(conversation_id, channel="context")
        assert no_key.get_conversation(own_id).id == own_id
    with pytest.raises(ValueError, match="api_key"):
        MemoryServiceCheckpointSaver(live_service.base_url, token=user_token(live_service, "bob"))
    with make_saver(live_service, "charlie") as other, pytest.raises(PermissionDeniedError):
        other.get_tuple({"configurable": {"thread_id": "chat-7", "checkpoint_ns": ""}})


def test_a_deleted_thread_is_gone_and_says_so_when_written_again(live_service: LiveService) -> None:
    with make_saver(live_service) as saver:
        stored = put_chain(saver, "to delete", 2)
        saver.delete_thread("to delete")
        assert saver.get_tuple(stored[-1]) is None
        assert list(saver.list({"configurable": {"thread_id": "to delete"}})) == []
        with pytest.raises(NotFoundError) as caught:
            put_chain(saver, "to delete", 1)
    assert "was deleted" in "".join(caught.value.__notes__)


def test_a_graph_resumes_from_the_service(live_service: LiveService) -> None:
    """A LangGraph graph compiled with the saver: state accumulates across invocations of a thread, survives a
    new saver (nothing is cached in the process), and its history is the saver's list."""
    def build():
        builder = StateGraph(State)
        builder.add_node("echo", lambda state: {"items": [f"seen {len(state['items'])}"]})
        builder.add_edge(START, "echo")
        builder.add_edge("echo", END)
        return builder

    config = {"configurable": {"thread_id": f"graph {uuid.uuid4()}"}}
    with make_saver(live_service) as saver:
        graph = build().compile(checkpointer=saver)
        graph.invoke({"items": ["hello"]}, config)
    with make_saver(live_service) as saver:
        graph = build().compile(checkpointer=saver)
        result = graph.invoke({"items": ["again"]}, config)
        assert result["items"] == ["hello", "seen 1", "again", "seen 3"]
        history = list(graph.get_state_history(config))
        assert len(history) == len(list(saver.list(config))) == 6

    async def scenario() -> list[str]:
        async with make_saver(live_service) as saver:
            graph = build().compile(checkpointer=saver)
            return (await graph.ainvoke({"items": ["async"]}, config))["items"]

    assert asyncio.run(scenario())[-2:] == ["async", "seen 5"]


def test_listing_without_a_config_walks_every_thread_the_caller_sees(live_service: LiveService) -> None:
    """``list(None)`` / ``alist(None)``: the checkpoints of every thread of the caller (charlie owns no other
    thread in this module), newest first per thread, under their own thread ids; ``limit`` counts across threads."""
    run_id = uuid.uuid4().hex
    threads = {f"walk-a-{run_id}": 2, f"walk-b-{run_id}": 3}
    with make_saver(live_service, "charlie") as saver:
        stored = {thread_id: put_chain(saver, thread_id, steps) for thread_id, steps in threads.items()}
        listed = list(saver.list(None))
        limited = list(saver.list(None, limit=3))

        async def alist(limit: int | None) -> list:
            try:
                return [found async for found in saver.alist(None, limit=limit)]
            finally:
                await saver.aclose()

        alisted = asyncio.run(alist(None))
        alimited = asyncio.run(alist(3))
    expected = {(config["configurable"]["thread_id"], config["configurable"]["checkpoint_id"])
                for configs in stored.values() for config in configs}
    for found in (listed, alisted):
        assert sorted((t.config["configurable"]["thread_id"], t.checkpoint["id"]) for t in found) == sorted(expected)
        for thread_id in threads:
            steps = [t.metadata["step"] for t in found if t.config["configurable"]["thread_id"] == thread_id]
            assert steps == sorted(steps, reverse=True)
    assert len(limited) == len(alimited) == 3
    assert {t.checkpoint["id"] for t in limited + alimited} <= {checkpoint_id for _, checkpoint_id in expected}
