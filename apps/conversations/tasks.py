"""Background work of conversations: the search indexer (apps.conversations.indexer), requested after commit by
appends and index writes, and run by beat every CONVERSATION_INDEXING_INTERVAL seconds as the safety net."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="apps.conversations.tasks.index_conversation_entries", ignore_result=True)
def index_conversation_entries() -> int:
    from apps.conversations.indexer import INDEXER

    return INDEXER.run_requested().indexed
