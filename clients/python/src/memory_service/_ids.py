"""Conversation ids for the ids LangGraph and LangChain use (thread ids, session ids), per user."""

from __future__ import annotations

import uuid

# The namespace under which each user's own namespace is derived (uuid5 of the user id), and under that the
# conversation of each thread id. Shared by the checkpointer and the chat history, so a LangGraph thread's
# checkpoints and its chat land in one conversation.
THREAD_NAMESPACE = uuid.UUID("6f6a0b8e-2d5c-5b8e-9a57-1c6f4a1e2b33")


def conversation_id_for(thread_id: str | uuid.UUID, user_id: str) -> str:
    """The conversation that holds ``user_id``'s thread: the thread id itself when it is a UUID (the conversation
    you see and may share), else a UUID derived from the user and the thread id (uuid5 under the user's own
    namespace). So two users' thread ids never name one conversation, and any LangGraph thread id works.

    Derived ids are predictable, so another user could still create one first: the adapters check that the
    conversation is the caller's before they use it (:class:`~memory_service.ConversationTakenError` when not)."""
    try:
        return str(uuid.UUID(str(thread_id)))
    except ValueError:
        pass
    if not user_id:
        raise ValueError("a user id is needed to derive the conversation of a thread id")
    return str(uuid.uuid5(uuid.uuid5(THREAD_NAMESPACE, user_id), str(thread_id)))
