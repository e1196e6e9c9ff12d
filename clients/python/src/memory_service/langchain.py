"""LangChain on Memory Service: a chat message history over a conversation's history entries.

Needs the ``langchain`` extra: ``pip install 'memory-service-client[langchain]'``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, message_to_dict, messages_from_dict
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "memory_service.langchain needs langchain-core: pip install 'memory-service-client[langchain]'"
    ) from exc

from memory_service import _operations as ops
from memory_service._flow import (
    Clients,
    Flow,
    Threads,
    UsesClients,
    arun,
    conversation_entries,
    delete_conversation,
    run,
)
from memory_service._ids import conversation_id_for
from memory_service.async_client import AsyncClient
from memory_service.auth import TokenSource
from memory_service.client import Client

# The contentType of the entries this history writes (D10: "history/<flavour>"); it reads every history entry.
CONTENT_TYPE = "history/langchain"
TITLE_CHARS = 40  # the service's title from an entry's first text


class MemoryServiceChatMessageHistory(BaseChatMessageHistory, UsesClients):
    """A LangChain ``BaseChatMessageHistory`` kept in a Memory Service conversation's history.

    >>> history = MemoryServiceChatMessageHistory("chat-42", "http://localhost:8080", token=...)
    >>> history.add_messages([HumanMessage("Plan a trip to Lisbon"), AIMessage("Three days?")])
    >>> history.messages

    ``session_id`` names the conversation (:func:`~memory_service.langgraph.conversation_id_for`: the id itself
    when it is a UUID, else derived from the caller's user id and it; the same conversation a LangGraph
    checkpointer of the same user uses for that thread id). The first message creates it, owned by the token's
    user, titled from its text. A conversation that exists but is not the caller's (another user created it first,
    or shared it) is a :class:`~memory_service.ConversationTakenError`: the history neither reads nor writes it
    unless ``allow_shared=True`` (then members it is shared with read and, as writers, add to the same history).

    Each message is one content item: ``role`` (``USER`` for a human message, ``AI`` for every other kind, the
    service knowing no other roles), ``text`` (what the service searches and titles conversations by; left out for
    system messages) and
    ``message``, the whole LangChain message (``message_to_dict``: system and tool messages, tool calls, ids,
    metadata), so :attr:`messages` gives back exactly what was added. Consecutive messages of one role are one
    entry (contentType ``history/langchain``): ``add_messages([human, ai])`` is two appends, an AI message with its
    tool calls and the tool results one. Entries other clients wrote (items with ``role`` and ``text`` only) read
    as ``HumanMessage``/``AIMessage``.

    ``clear()`` deletes the conversation (owner only); the service never reuses a deleted conversation's id, so the
    session id cannot hold messages again afterwards (``add_messages`` raises :class:`~memory_service.NotFoundError`).
    """

    def __init__(
        self,
        session_id: str,
        base_url: str | None = None,
        *,
        token: TokenSource | None = None,
        api_key: str | None = None,
        client: Client | None = None,
        async_client: AsyncClient | None = None,
        allow_shared: bool = False,
        **client_kwargs: Any,
    ) -> None:
        super().__init__()
        self._clients = Clients(client, async_client, base_url, token=token, api_key=api_key, **client_kwargs)
        self.session_id = session_id
        self._threads = Threads(allow_shared=allow_shared)

    @property
    def conversation_id(self) -> str:
        """The conversation holding the session (asks the service who the caller is, once)."""
        return run(self._clients.sync, self._threads.conversation_id(self.session_id))

    # --- BaseChatMessageHistory -----------------------------------------------------------------------------------

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return run(self._clients.sync, self._read())

    async def aget_messages(self) -> list[BaseMessage]:
        return await arun(self._clients.async_, self._read())

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        run(self._clients.sync, self._append(messages))

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        await arun(self._clients.async_, self._append(messages))

    def clear(self) -> None:
        run(self._clients.sync, self._clear())

    async def aclear(self) -> None:
        await arun(self._clients.async_, self._clear())

    # --- Flows ----------------------------------------------------------------------------------------------------

    def _read(self) -> Flow[list[BaseMessage]]:
        conversation_id = yield from self._threads.readable(self.session_id)
        if conversation_id is None:
            return []
        entries = yield from conversation_entries(conversation_id, "history")
        return [_message(item) for entry in entries or () for item in entry.content]

    def _clear(self) -> Flow[None]:
        conversation_id = yield from self._threads.readable(self.session_id)
        if conversation_id is not None:
            yield from delete_conversation(conversation_id)
            self._threads.forget(conversation_id)
        return None

    def _append(self, messages: Sequence[BaseMessage]) -> Flow[None]:
        if not messages:
            return None
        runs: list[list[dict[str, Any]]] = []
        for message in messages:
            item = _item(message)
            if runs and runs[-1][0]["role"] == item["role"]:
                runs[-1].append(item)
            else:
                runs.append([item])
        # Titled as the service titles a conversation an append creates: the first text of its first entry.
        title = next((item["text"] for item in runs[0] if item.get("text")), "")[:TITLE_CHARS]
        conversation_id = yield from self._threads.writable(self.session_id, title=title)
        for content in runs:
            yield ops.append_entry(conversation_id, content, channel="history", content_type=CONTENT_TYPE)
        return None


def _role(message: BaseMessage) -> str:
    if message.type == "human" or (message.type == "chat" and getattr(message, "role", "") in ("user", "human")):
        return "USER"
    return "AI"


def _item(message: BaseMessage) -> dict[str, Any]:
    item: dict[str, Any] = {"role": _role(message)}
    text = message.text
    # A system prompt is instructions, not conversation: not searched, and never the conversation's title.
    if text and message.type != "system":
        item["text"] = text
    item["message"] = message_to_dict(message)
    return item


def _message(item: dict[str, Any]) -> BaseMessage:
    stored = item.get("message")
    if isinstance(stored, dict) and "type" in stored and "data" in stored:
        return messages_from_dict([stored])[0]
    text = item.get("text") if isinstance(item.get("text"), str) else ""
    return HumanMessage(content=text) if item.get("role") == "USER" else AIMessage(content=text)


__all__ = ["MemoryServiceChatMessageHistory", "conversation_id_for"]
