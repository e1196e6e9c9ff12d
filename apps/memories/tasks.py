"""Background work of the memory store, run by Celery beat (schedule in settings) and workers."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.db import connection

from apps.core.redis_client import get_client
from apps.memories import services

logger = logging.getLogger(__name__)


@shared_task(name="apps.memories.tasks.expire_memories", ignore_result=True)
def expire_memories() -> int:
    count = services.expire_due_memories()
    if count:
        logger.info("memories expired", extra={"count": count})
    return count


@shared_task(name="apps.memories.tasks.prune_memory_events", ignore_result=True)
def prune_memory_events() -> int:
    count = services.prune_events()
    if count:
        logger.info("memory events pruned", extra={"count": count})
    return count


def _indexing_requested_key() -> str:
    # Per database, so services (and test runs) sharing one Redis do not suppress each other's requests.
    return f"memory-service:{connection.settings_dict['NAME']}:indexing-requested"


def request_indexing() -> None:
    """Ask a worker to run the indexer soon, publishing at most one task while one is already waiting.

    The flag is set with NX: a burst of writes publishes one task, not one per write (a publish costs more than
    the write's own SQL). The task clears the flag before it claims rows, so a write committed after that
    publishes again; the TTL only guards against a task lost with its broker.
    """
    if get_client().set(_indexing_requested_key(), "1", nx=True, ex=settings.MEMORY_EPISODIC_INDEXING_INTERVAL * 2):
        index_pending_memories.delay()


@shared_task(name="apps.memories.tasks.index_pending_memories", ignore_result=True)
def index_pending_memories() -> int:
    """Embed pending versions and drop vectors of ended ones. Requested after indexed writes (request_indexing)
    and run by beat every MEMORY_EPISODIC_INDEXING_INTERVAL seconds as the safety net."""
    from apps.memories import indexer

    get_client().delete(_indexing_requested_key())
    report = indexer.run_cycle()
    return report.indexed
