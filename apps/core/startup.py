"""Checks and warm-up run when a server process starts (web, Celery worker), not on every manage.py command."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def check_or_die() -> None:
    """Stop the process with a clear message when policies do not compile or the key ring is unusable."""
    from apps.core import crypto
    from apps.core.policy import load_or_die

    crypto.check_configuration()
    load_or_die()


def warm_up_embedder() -> None:
    """Start loading the local embedding model in the background, so neither the first semantic search nor the
    first /readyz waits for it. Remote providers need no warm-up."""
    try:
        from apps.core.embeddings import get_provider
        from apps.core.embeddings.local import LocalEmbeddingProvider, start_loading

        provider = get_provider()
        if isinstance(provider, LocalEmbeddingProvider):
            start_loading(provider.torch_threads)
    except Exception:  # a failed warm-up must not kill the server; /readyz shows the cause
        logger.warning("embedding provider warm-up failed", exc_info=True)


def preload_embedder_for_fork() -> None:
    """In a pre-fork parent: load the local model (never run) for every child to share copy-on-write."""
    try:
        from apps.core.embeddings import get_provider
        from apps.core.embeddings.local import LocalEmbeddingProvider, preload_for_fork

        if isinstance(get_provider(), LocalEmbeddingProvider):
            preload_for_fork()
    except Exception:  # the workers load (and report) the model themselves
        logger.warning("embedding model could not be loaded before the fork", exc_info=True)
