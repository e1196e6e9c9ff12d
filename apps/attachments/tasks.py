"""Background work of attachments, run by Celery beat (schedule in settings: ATTACHMENT_EXPIRY_INTERVAL)."""

from __future__ import annotations

import logging

from celery import shared_task

from apps.attachments import services

logger = logging.getLogger(__name__)


@shared_task(name="apps.attachments.tasks.remove_expired_attachments", ignore_result=True)
def remove_expired_attachments() -> int:
    count = services.remove_expired()
    if count:
        logger.info("attachments expired", extra={"count": count})
    return count
