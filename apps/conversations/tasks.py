"""Background work of conversations: the search indexer (apps.conversations.indexer), requested after commit by
appends and index writes, and run by beat every CONVERSATION_INDEXING_INTERVAL seconds as the safety net."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.db import connection

from apps.core.redis_client import get_client

logger = logging.getLogger(__name__)


def _indexing_requested_key() -> str:
    # Per database, so services (and test runs) sharing one Redis do not suppress each other's requests.
    return f"memory-service:{connection.settings_dict['NAME']}:conversation-indexing-requested"


def request_indexing() -> None:
    """Ask a worker to run the indexer soon: one task per burst of writes (a Redis flag set with NX, cleared by
    the task before it claims entries, so a write committed after that asks again; the TTL only guards against a
    task lost with its broker)."""
    if get_client().set(_indexing_requested_key(), "1", nx=True, ex=settings.CONVERSATION_INDEXING_INTERVAL * 2):
        index_conversation_entries.delay()


def request_indexing_quietly() -> None:
    """``transaction.on_commit`` hook of the writes: a broker hiccup must not fail a committed write (beat's
    periodic run picks the entry up)."""
    try:
        request_indexing()
    except Exception:
        logger.warning("could not enqueue the conversation indexer; the periodic run will pick the write up")


@shared_task(name="apps.conversations.tasks.index_conversation_entries", ignore_result=True)
def index_conversation_entries() -> int:
    from apps.conversations import indexer

    get_client().delete(_indexing_requested_key())
    return indexer.run_cycle().indexed
