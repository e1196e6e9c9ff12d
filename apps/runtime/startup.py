"""Checks and warm-up run when a server process starts (web, Celery worker), not on every manage.py command."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def check_or_die() -> None:
    """Stop the process with a clear message when policies do not compile or the key ring is unusable."""
    from apps.core import crypto
    from apps.policy import load_or_die

    crypto.check_configuration()
    load_or_die()


def warm_up_embedder(purpose: str = "queries") -> None:
    """Start loading the local embedding model in the background, so neither the first semantic search nor the
    first /readyz waits for it. ``purpose``: what this process embeds, ``queries`` (web) or ``documents`` (the
    Celery worker). Remote providers need no warm-up."""
    try:
        from apps.retrieval.embeddings import get_provider
        from apps.retrieval.embeddings.local import LocalEmbeddingProvider

        provider = get_provider()
        if isinstance(provider, LocalEmbeddingProvider):
            provider.start_loading(purpose)
    except Exception:  # a failed warm-up must not kill the server; /readyz shows the cause
        logger.warning("embedding provider warm-up failed", exc_info=True)


def preload_embedder_for_fork() -> None:
    """In a pre-fork parent (gunicorn's master): load the local model's query runtime (never run) for every child to
    share copy-on-write."""
    try:
        from apps.retrieval.embeddings import get_provider
        from apps.retrieval.embeddings.local import LocalEmbeddingProvider

        provider = get_provider()
        if isinstance(provider, LocalEmbeddingProvider):
            provider.preload_for_fork("queries")
    except Exception:  # the workers load (and report) the model themselves
        logger.warning("embedding model could not be loaded before the fork", exc_info=True)


def check_embedding_device(purpose: str) -> None:
    """Raise ImproperlyConfigured, with what is missing, unless the device this process embeds ``purpose`` on can
    run here (EMBEDDING_DEVICE=cuda on a machine without a usable GPU). The CPU always can: no imports then."""
    from django.core.exceptions import ImproperlyConfigured

    from apps.retrieval.embeddings import get_provider
    from apps.retrieval.embeddings.local import DeviceUnavailable, LocalEmbeddingProvider

    provider = get_provider()
    if not isinstance(provider, LocalEmbeddingProvider) or provider.runtime(purpose).device == "cpu":
        return
    try:
        backend = provider.check_device(purpose)
    except DeviceUnavailable as exc:
        raise ImproperlyConfigured(str(exc)) from exc
    logger.info("embedding device", extra={"purpose": purpose, "device": provider.runtime(purpose).device, "backend": backend})
