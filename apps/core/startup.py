"""Checks and warm-up run when a server process starts (web, Celery worker), not on every manage.py command."""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger(__name__)


def check_or_die() -> None:
    """Stop the process with a clear message when policies do not compile or the key ring is unusable."""
    from apps.core import crypto
    from apps.core.policy import load_or_die

    crypto.check_configuration()
    load_or_die()


def warm_up_embedder() -> None:
    """Load the embedding model in the background so the first semantic search does not pay for it."""

    def load() -> None:
        try:
            from apps.memories.embeddings import get_provider

            get_provider().check()
        except Exception:  # readiness reports it; a failed warm-up must not kill the server
            logger.warning("embedding provider warm-up failed", exc_info=True)

    threading.Thread(target=load, name="embedder-warm-up", daemon=True).start()
