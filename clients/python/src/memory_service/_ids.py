"""Conversation ids for the ids LangGraph and LangChain use (thread ids, session ids)."""

from __future__ import annotations

import uuid

# thread_id / session_id -> conversation id for ids that are not UUIDs (uuid5 under this fixed namespace). Shared by
# the checkpointer and the chat history, so a LangGraph thread's checkpoints and its chat land in one conversation.
THREAD_NAMESPACE = uuid.UUID("6f6a0b8e-2d5c-5b8e-9a57-1c6f4a1e2b33")


def conversation_id_for(thread_id: str | uuid.UUID) -> str:
    """The conversation that holds a thread: the thread id itself when it is a UUID, else a stable UUID derived
    from it (uuid5), so any LangGraph thread id works and a UUID thread id is the conversation you see."""
    try:
        return str(uuid.UUID(str(thread_id)))
    except ValueError:
        return str(uuid.uuid5(THREAD_NAMESPACE, str(thread_id)))
