"""Background work of conversations: the search indexer (apps.conversations.indexer), requested after commit by
appends and index writes, and run by beat every CONVERSATION_INDEXING_INTERVAL seconds as the safety net."""

from __future__ import annotations

from celery import shared_task


def request_indexing() -> None:
    """Ask a worker to run the indexer soon: one task per burst of writes (apps.core.indexing)."""
    from apps.conversations.indexer import INDEXER

    INDEXER.request_run(index_conversation_entries)


def request_indexing_quietly() -> None:
    """``transaction.on_commit`` hook of the writes: a broker hiccup must not fail a committed write (beat's
    periodic run picks the entry up)."""
    from apps.conversations.indexer import INDEXER

    INDEXER.request_run_quietly(index_conversation_entries)


@shared_task(name="apps.conversations.tasks.index_conversation_entries", ignore_result=True)
def index_conversation_entries() -> int:
    from apps.conversations.indexer import INDEXER

    return INDEXER.run_requested().indexed
