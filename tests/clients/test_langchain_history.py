"""MemoryServiceChatMessageHistory against the live service: every LangChain message kind round-trips through
history entries, other clients' entries read as human/AI messages, and the history is the conversation's."""

from __future__ import annotations

import asyncio
import uuid
from functools import partial

import pytest
from langchain_core.messages import AIMessage, ChatMessage, HumanMessage, SystemMessage, ToolMessage
from memory_service import Client, ConversationTakenError, NotFoundError
from memory_service.langchain import MemoryServiceChatMessageHistory, conversation_id_for

from tests.clients.conftest import user_token
from tests.concurrency import run_concurrently
from tests.live_service import LiveService

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_tables_after_module")]


def make_history(
    live_service: LiveService, session_id: str, user: str = "bob", **kwargs
) -> MemoryServiceChatMessageHistory:
    return MemoryServiceChatMessageHistory(session_id, live_service.base_url, token=user_token(live_service, user),
                                           **kwargs)


def test_every_message_kind_round_trips(live_service: LiveService) -> None:
    session = f"session {uuid.uuid4()}"
    sent = [
        SystemMessage("You plan trips.", id="s1"),
        HumanMessage("Plan a trip to Lisbon", id="h1"),
        AIMessage("", tool_calls=[{"name": "weather", "args": {"city": "Lisbon"}, "id": "call-1"}],
                  response_metadata={"model": "fake"}, id="a1"),
        ToolMessage("22°C and sunny", tool_call_id="call-1", name="weather", id="t1"),
        AIMessage([{"type": "text", "text": "Three days, "}, {"type": "text", "text": "trams included."}], id="a2"),
        ChatMessage("a custom role", role="critic"),
        HumanMessage("Thanks!", additional_kwargs={"lang": "en"}),
    ]
    history = make_history(live_service, session)
    history.add_messages(sent)
    assert history.messages == sent
    with Client(live_service.base_url, token=user_token(live_service, "bob")) as client:
        conversation_id = conversation_id_for(session, "bob")
        assert client.get_conversation(conversation_id).title == ""  # the first entry, the system prompt, has no text
        entries = list(client.iter_entries(conversation_id))
        # Runs of one role are one entry: system | human | ai, tool, ai, critic | human.
        assert [[item["role"] for item in entry.content] for entry in entries] == [
            ["AI"], ["USER"], ["AI", "AI", "AI", "AI"], ["USER"],
        ]
        assert {entry.content_type for entry in entries} == {"history/langchain"}
        assert "text" not in entries[0].content[0]  # a system prompt is neither searched nor the title
        assert [item.get("text") for item in entries[2].content] == [
            None, "22°C and sunny", "Three days, trams included.", "a custom role",
        ]
        # Entries another client wrote (role and text only) read as human and AI messages.
        client.append_entry(conversation_id, [{"role": "USER", "text": "from elsewhere"}, {"role": "AI", "text": "ok"}])
    assert history.messages[-2:] == [HumanMessage("from elsewhere"), AIMessage("ok")]


def test_async_and_clear(live_service: LiveService) -> None:
    session = str(uuid.uuid4())  # a UUID session id is the conversation id

    async def scenario() -> None:
        history = make_history(live_service, session)
        assert await history.aget_messages() == []
        await history.aadd_messages([HumanMessage("hi"), AIMessage("hello")])
        history.add_user_message("and sync")
        assert [m.text for m in await history.aget_messages()] == ["hi", "hello", "and sync"]
        assert history.conversation_id == session
        await history.aclear()
        assert await history.aget_messages() == []
        await history.aclose()

    asyncio.run(scenario())
    history = make_history(live_service, session)
    history.clear()  # already gone: nothing to do
    titled = make_history(live_service, f"titled {uuid.uuid4()}")
    titled.add_messages([HumanMessage("Plan a trip to Lisbon"), AIMessage("Three days?")])
    with Client(live_service.base_url, token=user_token(live_service, "bob")) as client:
        assert client.get_conversation(titled.conversation_id).title == "Plan a trip to Lisbon"
    with pytest.raises(NotFoundError):
        history.add_user_message("a deleted conversation's id is never reused")


def test_members_share_the_history_when_told_to(live_service: LiveService) -> None:
    """A history shared with charlie is his to read (and, as a writer, to add to) only with allow_shared=True;
    otherwise it is someone else's conversation, refused by name."""
    session = str(uuid.uuid4())
    make_history(live_service, session).add_messages([HumanMessage("shared plan")])
    with Client(live_service.base_url, token=user_token(live_service, "bob")) as client:
        client.add_membership(session, "charlie", "reader")
    with pytest.raises(ConversationTakenError, match="bob"):
        _ = make_history(live_service, session, "charlie").messages
    shared = make_history(live_service, session, "charlie", allow_shared=True)
    assert shared.messages == [HumanMessage("shared plan")]
    with pytest.raises(ConversationTakenError):  # a reader: sharing lets him read, not write
        shared.add_user_message("mine too?")
    with Client(live_service.base_url, token=user_token(live_service, "bob")) as client:
        client.update_membership(session, "charlie", "writer")
    make_history(live_service, session, "charlie", allow_shared=True).add_user_message("mine too")
    assert [m.text for m in make_history(live_service, session).messages] == ["shared plan", "mine too"]


def test_32_concurrent_writers_to_one_history(live_service: LiveService) -> None:
    """32 histories on one new session append at once: the conversation is created once and no message is lost;
    each writer's two messages stay in its order."""
    session = f"busy {uuid.uuid4()}"

    def writer(index: int, history: MemoryServiceChatMessageHistory) -> None:
        with history:
            history.add_messages([HumanMessage(f"q{index}"), AIMessage(f"a{index}")])

    run_concurrently([partial(writer, index, make_history(live_service, session)) for index in range(32)])
    texts = [message.text for message in make_history(live_service, session).messages]
    assert sorted(texts) == sorted([f"q{i}" for i in range(32)] + [f"a{i}" for i in range(32)])
    assert all(texts.index(f"q{i}") < texts.index(f"a{i}") for i in range(32))


def test_a_session_id_another_user_took_first_is_refused_and_never_written(live_service: LiveService) -> None:
    """Charlie creates the conversation bob's session id maps to (derived ids are predictable), even makes bob a
    writer: bob's history refuses it by name and appends nothing; charlie's own session of that name is another
    conversation."""
    session = f"support-chat-{uuid.uuid4().hex[:8]}"
    taken = conversation_id_for(session, "bob")
    with Client(live_service.base_url, token=user_token(live_service, "charlie")) as charlie:
        charlie.create_conversation(id=taken, title="charlie's trap")
        history = make_history(live_service, session)
        with pytest.raises(ConversationTakenError, match="another user") as caught:
            history.add_messages([HumanMessage("my card number is ...")])
        assert (caught.value.conversation_id, caught.value.owner_user_id) == (taken, None)
        charlie.add_membership(taken, "bob", "writer")
        for attempt in (make_history(live_service, session), history):
            with pytest.raises(ConversationTakenError, match="belongs to 'charlie'"):
                attempt.add_user_message("still not")
            with pytest.raises(ConversationTakenError):
                _ = attempt.messages
        assert list(charlie.iter_entries(taken)) == []
    mine = make_history(live_service, session, "charlie")
    mine.add_user_message("charlie's own")
    assert mine.conversation_id != taken
