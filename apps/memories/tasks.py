"""Background work of the memory store, run by Celery beat (schedule in settings) and workers."""

from __future__ import annotations

import logging

from celery import shared_task

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


@shared_task(name="apps.memories.tasks.index_pending_memories", ignore_result=True)
def index_pending_memories() -> int:
    """Embed pending versions and drop vectors of ended ones. Requested after indexed writes (Indexer.request_run)
    and run by beat every MEMORY_EPISODIC_INDEXING_INTERVAL seconds as the safety net."""
    from apps.memories.indexer import INDEXER

    return INDEXER.run_requested().indexed
