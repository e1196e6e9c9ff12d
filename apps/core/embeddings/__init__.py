"""Embedding providers for semantic search, behind one interface (:class:`EmbeddingProvider`).

``get_provider()`` returns the process-wide provider chosen by ``settings.EMBEDDING_PROVIDER``:

* ``local`` (default): all-MiniLM-L6-v2 in-process on CPU, 384 dimensions, semantic;
* ``openai``: any OpenAI-compatible ``/embeddings`` endpoint, ``EMBEDDING_DIMENSIONS`` dimensions, semantic;
* ``hash``: feature hashing, lexical only, for low-resource installs and fast tests.

All vectors are L2-normalized, so cosine similarity is the dot product.
"""

from __future__ import annotations

import threading
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from .base import EmbeddingError, EmbeddingProvider, l2_normalize

__all__ = ["EmbeddingError", "EmbeddingProvider", "get_provider", "l2_normalize", "reset_provider"]

PROVIDERS = ("local", "openai", "hash")

_lock = threading.Lock()
_provider: EmbeddingProvider | None = None


def _build(kind: str) -> EmbeddingProvider:
    # Imported on demand so that choosing "hash" or "openai" never imports torch.
    if kind == "local":
        from .local import LocalEmbeddingProvider

        return LocalEmbeddingProvider.from_settings()
    if kind == "openai":
        from .openai import OpenAICompatibleEmbeddingProvider

        return OpenAICompatibleEmbeddingProvider.from_settings()
    if kind == "hash":
        from .hashing import HashingEmbeddingProvider

        return HashingEmbeddingProvider.from_settings()
    raise ImproperlyConfigured(f"EMBEDDING_PROVIDER must be one of {', '.join(PROVIDERS)}, got {kind!r}")


def get_provider() -> EmbeddingProvider:
    """The process-wide provider. Cheap to call: construction does no I/O (the local model loads on first
    embed), and a misconfiguration raises ImproperlyConfigured here rather than an EmbeddingError later."""
    global _provider
    provider = _provider
    if provider is not None:
        return provider
    with _lock:
        if _provider is None:
            _provider = _build(getattr(settings, "EMBEDDING_PROVIDER", "local") or "local")
        return _provider


def reset_provider() -> None:
    """Forget the singleton so the next get_provider() reads settings again (the local model stays cached)."""
    global _provider
    with _lock:
        _provider = None


@receiver(setting_changed)
def _reset_on_setting_change(*, setting: str, **kwargs: Any) -> None:
    if setting.startswith("EMBEDDING_"):
        reset_provider()
