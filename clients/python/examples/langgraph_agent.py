"""A LangGraph agent whose long-term memory and threads live in Memory Service.

It needs no LLM: the chat model is LangChain's deterministic ``FakeMessagesListChatModel``, scripted to call the
agent's tools, and the tools do the real work against the service:

1. thread A: "Remember that my favourite city is Lisbon" -> the agent saves the fact in the store
   (``MemoryServiceStore``, a memory under ``(<you>, "facts")`` as LangGraph code writes it for any store; the
   service keeps it under the caller's own ``("user", <you>)`` prefix, where its default policy lets you write);
2. thread B, a new thread that shares nothing with A: "Where should I go on holiday?" -> the agent recalls the fact
   from the store;
3. thread C: "Book me a trip there" -> the booking tool asks for approval (``interrupt``) and the run stops; a
   new graph, store and checkpointer (as after a restart) resume the thread from its checkpoint in the service
   (``MemoryServiceCheckpointSaver``) with the answer, and the booking completes.

With ``make run`` running, in another terminal::

    export MEMORY_SERVICE_API_KEY=$(.venv/bin/python manage.py apikeys create --client langgraph-example)
    .venv/bin/python clients/python/examples/langgraph_agent.py

Settings (environment): ``MEMORY_SERVICE_URL`` (default http://localhost:8080), ``MEMORY_SERVICE_USER`` (a dev
identity provider user, default bob; the token comes from the service's dev IdP), ``MEMORY_SERVICE_TOKEN`` (a
bearer token to use instead), ``MEMORY_SERVICE_API_KEY`` (required: checkpoints are context entries, private to an
API-key client).
"""

from __future__ import annotations

import os
import sys
import uuid
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_store
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, interrupt
from memory_service import OAuthToken
from memory_service.langgraph import MemoryServiceCheckpointSaver, MemoryServiceStore


def call(name: str, **args: Any) -> AIMessage:
    """A scripted model turn that calls one tool."""
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": f"call-{uuid.uuid4().hex[:8]}"}])


def facts_namespace(config: RunnableConfig) -> tuple[str, ...]:
    return (config["configurable"]["user_id"], "facts")


def run_tools(state: MessagesState, config: RunnableConfig) -> dict[str, list[AnyMessage]]:
    """The agent's tools; the store is the graph's (MemoryServiceStore)."""
    store = get_store()
    results: list[AnyMessage] = []
    for tool_call in state["messages"][-1].tool_calls:  # type: ignore[union-attr]
        args = tool_call["args"]
        if tool_call["name"] == "remember":
            store.put(facts_namespace(config), args["topic"], {"fact": args["fact"]})
            content = f"saved: {args['fact']}"
        elif tool_call["name"] == "recall":
            facts = [item.value["fact"] for item in store.search(facts_namespace(config))]
            content = "; ".join(facts) or "nothing known"
        elif tool_call["name"] == "book_trip":
            # Stops the run here; the thread's checkpoint in the service holds everything needed to resume.
            answer = interrupt({"question": f"Book a trip to {args['city']}?"})
            content = f"booked a trip to {args['city']}" if answer == "yes" else "not booked"
        else:
            content = f"unknown tool {tool_call['name']}"
        results.append(ToolMessage(content, tool_call_id=tool_call["id"], name=tool_call["name"]))
    return {"messages": results}


def build(model: FakeMessagesListChatModel, store: MemoryServiceStore, saver: MemoryServiceCheckpointSaver) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    builder.add_node("tools", run_tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", lambda state: "tools" if state["messages"][-1].tool_calls else END)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver, store=store)


def main() -> int:
    base_url = os.environ.get("MEMORY_SERVICE_URL", "http://localhost:8080")
    user = os.environ.get("MEMORY_SERVICE_USER", "bob")
    api_key = os.environ.get("MEMORY_SERVICE_API_KEY")
    if not api_key:
        print("set MEMORY_SERVICE_API_KEY (python manage.py apikeys create --client langgraph-example)", file=sys.stderr)
        return 2
    token: Any = os.environ.get("MEMORY_SERVICE_TOKEN") or OAuthToken.dev_idp(base_url, user)
    run_id = uuid.uuid4().hex[:8]  # fresh thread ids on every run

    def connect() -> tuple[MemoryServiceStore, MemoryServiceCheckpointSaver]:
        return (MemoryServiceStore(base_url, token=token),
                MemoryServiceCheckpointSaver(base_url, token=token, api_key=api_key))

    def config(thread: str) -> RunnableConfig:
        return {"configurable": {"thread_id": f"example-{thread}-{run_id}", "user_id": user}}

    store, saver = connect()
    with store, saver:
        # 1. Thread A: the agent saves a fact about the user in the long-term store.
        model = FakeMessagesListChatModel(responses=[
            call("remember", topic="favourite-city", fact="favourite city: Lisbon"), AIMessage("Noted."),
        ])
        graph = build(model, store, saver)
        out = graph.invoke({"messages": [HumanMessage("Remember that my favourite city is Lisbon.")]}, config("a"))
        print("thread A:", out["messages"][-2].content, "|", out["messages"][-1].content)

        # 2. Thread B, new: nothing of thread A is in its state; the fact comes back from the store.
        model = FakeMessagesListChatModel(responses=[call("recall"), AIMessage("How about Lisbon?")])
        graph = build(model, store, saver)
        out = graph.invoke({"messages": [HumanMessage("Where should I go on holiday?")]}, config("b"))
        assert len(out["messages"]) == 4  # its own messages only
        print("thread B recalled:", out["messages"][-2].content)

        # 3. Thread C: the booking waits for approval; the run stops at the interrupt.
        model = FakeMessagesListChatModel(responses=[call("book_trip", city="Lisbon")])
        graph = build(model, store, saver)
        out = graph.invoke({"messages": [HumanMessage("Book me a trip there.")]}, config("c"))
        print("thread C interrupted:", out["__interrupt__"][0].value["question"])

    # As after a restart: new objects, nothing in memory; the checkpoint in the service resumes thread C.
    store, saver = connect()
    with store, saver:
        model = FakeMessagesListChatModel(responses=[AIMessage("Done: your trip to Lisbon is booked.")])
        graph = build(model, store, saver)
        assert graph.get_state(config("c")).next == ("tools",)
        out = graph.invoke(Command(resume="yes"), config("c"))
        print("thread C resumed:", out["messages"][-2].content, "|", out["messages"][-1].content)
        print("thread C checkpoints:", len(list(saver.list(config("c")))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
