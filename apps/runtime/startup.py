"""Checks and warm-up run when a server process starts (web, Celery worker), not on every manage.py command."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def check_or_die() -> None:
    """Stop the process with a clear message when policies do not compile or the key ring is unusable."""
    from apps.encryption import crypto
    from apps.policy import load_or_die

    crypto.check_configuration()
    load_or_die()
    log_secret_sources()


def log_secret_sources() -> None:
    """Say where this process's secrets came from (issue 32.2). Loud (WARNING) where that matters to other hosts: a
    secret generated here, or read from this host's data directory next to a database other hosts may share; the
    environment and the embedded database's own files are INFO."""
    from django.conf import settings

    sources = dict(settings.SECRET_SOURCES)
    if settings.DEV_IDP_ENABLED and "DEV_IDP_SIGNING_KEY_FILE" not in sources:
        from apps.identity.dev_idp import keys

        path = keys.key_path()
        sources["DEV_IDP_SIGNING_KEY_FILE"] = f"file {path}" if path.exists() else f"generated on first use into {path}"
    if not sources:
        return
    local = {name: source for name, source in sources.items() if source != "environment"}
    generated = any(source.startswith("generated") for source in local.values())
    if generated or (local and not settings.DATABASE_IS_EMBEDDED):
        logger.warning(
            "secrets from this host's data directory: every host sharing this database needs the same values "
            "(README \"Several hosts\")",
            extra={"secret_sources": sources},
        )
    else:
        logger.info("secret sources", extra={"secret_sources": sources})


def start_key_ring_heartbeat() -> None:
    """Report this process's key ring now and periodically (apps.encryption.key_rings): other hosts and /readyz compare rings
    by it. In each process that serves or runs tasks, after any fork."""
    from apps.encryption import key_rings

    key_rings.start_heartbeat()


def check_dev_idp_key() -> None:
    """The web process stops at start, rather than on its first token, when the dev IdP is on and its key is missing
    where none may be generated (apps.identity.dev_idp.keys.check_available)."""
    from django.conf import settings

    if settings.DEV_IDP_ENABLED:
        from apps.identity.dev_idp import keys

        keys.check_available()


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
