"""MemoryServiceCheckpointSaver against the live service: LangGraph's own conformance suite, long threads read from
their end at a cost that does not grow with them, large states split across entries, concurrent writers, per-user
thread ids that no other user can take, and the privacy of context entries."""

from __future__ import annotations

import asyncio
import operator
import uuid
from functools import partial
from typing import Annotated, TypedDict

import httpx
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import ProgressCallbacks
from langgraph.graph import END, START, StateGraph
from memory_service import Client, ConversationTakenError, NotFoundError, PermissionDeniedError
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


def test_a_long_thread_reads_right_from_its_end(live_service: LiveService) -> None:
    """150 checkpoints with two put_writes each: 450 context entries, more than two pages of the service's 200. The
    latest checkpoint, its values (two of them unchanged since the first checkpoint) and its writes all come back
    (reading only the first page, the upstream saver's bug, would resume from step 74), and so does every
    checkpoint of a full list."""
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
        entries = list(client.iter_entries(conversation_id_for("long thread", "bob"), channel="context"))
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
        entries = list(client.iter_entries(conversation_id_for("big state", "bob"), channel="context"))
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
        assert client.get_conversation(conversation_id_for(thread_id, "bob")).owner_user_id == "bob"


def test_threads_are_conversations_and_checkpoints_are_private_context(live_service: LiveService) -> None:
    """A non-UUID thread id maps to a stable conversation id of the user's (a UUID thread id is the conversation id);
    the checkpoints are context entries: not in the history, invisible without the API key, and another user's
    saver finds no such thread of theirs (their "chat-7" is another conversation)."""
    with make_saver(live_service) as saver:
        put_chain(saver, "chat-7", 2)
        own_id = str(uuid.uuid4())
        put_chain(saver, own_id, 1)
    conversation_id = conversation_id_for("chat-7", "bob")
    assert conversation_id == str(uuid.uuid5(uuid.uuid5(THREAD_NAMESPACE, "bob"), "chat-7"))
    assert conversation_id != conversation_id_for("chat-7", "charlie")
    assert conversation_id_for(own_id, "bob") == conversation_id_for(own_id, "charlie") == own_id
    with sdk_client(live_service, api_key=None) as no_key:
        assert no_key.get_conversation(conversation_id).owner_user_id == "bob"
        assert list(no_key.iter_entries(conversation_id)) == []  # history only: the checkpoints are context
        with pytest.raises(PermissionDeniedError):
            no_key.list_entries(conversation_id, channel="context")
        assert no_key.get_conversation(own_id).id == own_id
    with pytest.raises(ValueError, match="api_key"):
        MemoryServiceCheckpointSaver(live_service.base_url, token=user_token(live_service, "bob"))
    with make_saver(live_service, "charlie") as other:
        assert other.get_tuple({"configurable": {"thread_id": "chat-7", "checkpoint_ns": ""}}) is None
        with pytest.raises(ConversationTakenError):  # bob's UUID thread is a conversation charlie cannot see
            other.get_tuple({"configurable": {"thread_id": own_id, "checkpoint_ns": ""}})


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


# --- Thread ids that no other user can take (issue 28) -------------------------------------------------------------


def test_a_thread_id_another_user_took_first_is_refused_and_never_written(live_service: LiveService) -> None:
    """Charlie creates the conversation bob's thread id maps to, then even makes bob a writer: bob's saver refuses
    it by name, reads nothing from it and appends nothing; told to share (allow_shared=True), it uses it."""
    thread_id = f"support-chat-{uuid.uuid4().hex[:8]}"
    taken = conversation_id_for(thread_id, "bob")
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    with sdk_client(live_service, "charlie") as charlie:
        charlie.create_conversation(id=taken)
        # Charlie plants a "checkpoint" through the same application (API-key client) bob's saver uses.
        with make_saver(live_service, "charlie", allow_shared=True) as planter:
            put_chain(planter, thread_id, 1)  # charlie's thread of that name is his own conversation...
        charlie.append_entry(taken, [{"kind": "planted"}], channel="context", content_type="langgraph-checkpoint")
        with make_saver(live_service) as saver:
            with pytest.raises(ConversationTakenError, match="another user") as caught:
                put_chain(saver, thread_id, 1)  # a conversation bob cannot even see
            assert (caught.value.thread_id, caught.value.conversation_id) == (thread_id, taken)
            with pytest.raises(ConversationTakenError):
                saver.get_tuple(config)
            charlie.add_membership(taken, "bob", "writer")
            for attempt in (saver, make_saver(live_service)):
                with pytest.raises(ConversationTakenError, match="belongs to 'charlie'"):
                    put_chain(attempt, thread_id, 1)
                with pytest.raises(ConversationTakenError):
                    attempt.put_writes({"configurable": {**config["configurable"], "checkpoint_id": "x"}},
                                       [("ch", 1)], "task")
                with pytest.raises(ConversationTakenError):
                    list(attempt.list(config))
        entries = list(charlie.iter_entries(taken, channel="context"))
        assert [entry.content for entry in entries] == [[{"kind": "planted"}]]  # bob appended nothing
        assert [c.id for c in charlie.iter_conversations(mode="all") if c.id == taken] == [taken]
        with make_saver(live_service, allow_shared=True) as sharing:
            stored = put_chain(sharing, thread_id, 1)
            assert sharing.get_tuple(stored[0]).metadata["step"] == 0
    with make_saver(live_service) as saver:  # bob's saver lists only bob's own threads
        assert all(t.config["configurable"]["thread_id"] != thread_id for t in saver.list(None))


def test_two_users_with_one_thread_id_have_two_threads(live_service: LiveService) -> None:
    thread_id = f"shared-name-{uuid.uuid4().hex[:8]}"
    with make_saver(live_service) as bob, make_saver(live_service, "charlie") as charlie:
        put_chain(bob, thread_id, 2)
        put_chain(charlie, thread_id, 3)
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        assert bob.get_tuple(config).metadata["step"] == 1
        assert charlie.get_tuple(config).metadata["step"] == 2


# --- Reads from the end -------------------------------------------------------------------------------------------


def test_pending_writes_put_later_and_values_left_out_are_found(live_service: LiveService) -> None:
    """Writes for an older checkpoint put after newer ones (a run resumed from the past) belong to it, whether it
    is read by id or listed; a channel whose value a put left out of channel_values comes from the put of its
    version, as in LangGraph's savers."""
    thread_id = f"late {uuid.uuid4()}"
    with make_saver(live_service) as saver:
        stored = put_chain(saver, thread_id, 3)
        saver.put_writes(stored[0], [("count", 99)], "late-task")
        assert saver.get_tuple(stored[0]).pending_writes == [("late-task", "count", 99)]
        assert saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}).pending_writes == []
        listed = {t.metadata["step"]: t.pending_writes for t in saver.list({"configurable": {"thread_id": thread_id}},
                                                                          limit=3)}
        assert listed == {2: [], 1: [], 0: [("late-task", "count", 99)]}
        # A put that leaves "fixed" and "notes" out of channel_values (their versions unchanged).
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"count": 3}
        checkpoint["channel_versions"] = {"count": f"{4:032}.0", "fixed": f"{1:032}.0", "notes": f"{1:032}.0"}
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "",
                                   "checkpoint_id": stored[-1]["configurable"]["checkpoint_id"]}}
        last = saver.put(config, checkpoint, {"source": "loop", "step": 3}, {"count": f"{4:032}.0"})
        for read in (saver.get_tuple(last), saver.get_tuple({"configurable": {"thread_id": thread_id}})):
            assert read.checkpoint["channel_values"] == {"count": 3, "fixed": "set once", "notes": ["a", "b"]}


class Counting(httpx.HTTPTransport):
    """Counts the requests sent, and the entries the service answered, per kind of call."""

    def __init__(self) -> None:
        super().__init__()
        self.requests = 0
        self.entries = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.requests += 1
        if request.method == "GET" and request.url.path.endswith("/entries"):
            response.read()
            self.entries += len(response.json()["data"])
        return response


def costs(live_service: LiveService, thread_id: str, stored: list[dict]) -> dict[str, tuple[int, int]]:
    """(requests, entries read) of each kind of call on a thread, on a saver that has checked the thread already
    (its one ownership check per thread is not a cost of the thread's length)."""
    transport = Counting()
    client = Client(live_service.base_url, token=user_token(live_service, "bob"), api_key=TEST_API_KEY,
                    http_client=httpx.Client(transport=transport))
    latest = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    middle = stored[len(stored) // 2]
    calls = {
        "get_tuple latest": lambda saver: saver.get_tuple(latest),
        "get_tuple by id": lambda saver: saver.get_tuple(middle),
        "list(limit=5)": lambda saver: list(saver.list(latest, limit=5)),
        "put": lambda saver: put_chain(saver, thread_id, 1, after=list(stored)),
    }
    found = {}
    with client, MemoryServiceCheckpointSaver(client=client) as saver:
        saver.get_tuple(latest)
        for name, call in calls.items():
            before = (transport.requests, transport.entries)
            result = call(saver)
            found[name] = (transport.requests - before[0], transport.entries - before[1])
            if name == "list(limit=5)":
                assert len(result) == 5
    return found


def test_reads_and_writes_cost_the_same_at_10_and_at_300_checkpoints(live_service: LiveService) -> None:
    """Each checkpoint with a put_writes: 20 entries against 600 (three pages of the service's 200). get_tuple of the
    latest, of a checkpoint by id, list(limit=5) and put send as many requests and read as many entries on both
    (before: every read paged through the whole thread)."""
    short, long = f"short {uuid.uuid4()}", f"long {uuid.uuid4()}"
    stored: dict[str, list[dict]] = {short: [], long: []}
    with make_saver(live_service) as saver:
        for thread_id, steps in ((short, 10), (long, 300)):
            for step in range(steps):  # as a graph does: a step's writes, then the next checkpoint
                stored[thread_id] = put_chain(saver, thread_id, 1, after=stored[thread_id])
                saver.put_writes(stored[thread_id][-1], [("count", step + 1)], f"task-{step}")
    stored_short, stored_long = stored[short], stored[long]
    at_10, at_300 = costs(live_service, short, stored_short), costs(live_service, long, stored_long)
    assert at_10 == at_300, (at_10, at_300)
    assert at_300["get_tuple latest"][0] == 1 and at_300["get_tuple by id"][0] == 1
    assert at_300["put"] == (1, 0)
    assert at_300["list(limit=5)"][1] <= 20
