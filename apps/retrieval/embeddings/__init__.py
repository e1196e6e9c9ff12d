"""Embedding providers for semantic search, behind one interface (:class:`EmbeddingProvider`).

``get_provider()`` returns the process-wide provider chosen by ``settings.EMBEDDING_PROVIDER``:

* ``local`` (default): all-MiniLM-L6-v2 in-process, 384 dimensions, semantic (onnxruntime by default, or torch:
  ``EMBEDDING_BACKEND``; ``minilm`` is the model, ``onnx_export`` its one-off export, ``local`` the provider);
* ``openai``: any OpenAI-compatible ``/embeddings`` endpoint, ``EMBEDDING_DIMENSIONS`` dimensions, semantic;
* ``hash``: feature hashing, lexical only, for low-resource installs and fast tests.

All vectors are L2-normalized, so cosine similarity is the dot product.

The model code (``base``, ``minilm``, ``onnx_export``, ``local``'s provider class) also runs without Django (the
export's command line, bench/embeddings_gpu.py on a machine with only the ML stack), so this package imports Django
only where it is installed.
"""

from __future__ import annotations

import threading
from typing import Any

from .base import EmbeddingError, EmbeddingProvider, l2_normalize

__all__ = ["EmbeddingError", "EmbeddingProvider", "get_provider", "l2_normalize", "reset_provider"]

PROVIDERS = ("local", "openai", "hash")

_lock = threading.Lock()
_provider: EmbeddingProvider | None = None


def _build(kind: str) -> EmbeddingProvider:
    from django.core.exceptions import ImproperlyConfigured

    # Imported on demand so that choosing "hash" or "openai" never loads a model runtime.
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
    from django.conf import settings

    with _lock:
        if _provider is None:
            _provider = _build(getattr(settings, "EMBEDDING_PROVIDER", "local") or "local")
        return _provider


def reset_provider() -> None:
    """Forget the singleton so the next get_provider() reads settings again (the local model stays cached)."""
    global _provider
    with _lock:
        _provider = None


def _reset_on_setting_change(*, setting: str, **kwargs: Any) -> None:
    if setting.startswith("EMBEDDING_"):
        reset_provider()


try:
    from django.core.signals import setting_changed
except ImportError:  # no Django on this machine: nothing changes settings
    pass
else:
    setting_changed.connect(_reset_on_setting_change)
