"""A deterministic feature-hashing embedder.

LEXICAL, NOT SEMANTIC: two texts are close only when they share words or word fragments. "car" and
"automobile" are unrelated here. It exists for low-resource installs (no torch, no network) and for fast,
reproducible tests; use the ``local`` or ``openai`` provider for real semantic search.

Features are lowercased word unigrams plus character trigrams of each word (padded with ``<``/``>`` so
prefixes and suffixes count, which lets "cook" and "cooking" overlap). Each feature is hashed with blake2b,
a stable hash (unlike ``hash()``, which is salted per process), into one of ``dimension`` buckets with a
hash-derived sign so that collisions cancel out on average instead of piling up. The result is L2-normalized.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
import unicodedata
from functools import lru_cache

from django.conf import settings

from .base import EmbeddingProvider, l2_normalize

DEFAULT_DIMENSION = 256

_WORD = re.compile(r"\w+")
# Whole words carry more meaning than any one of their fragments.
_WORD_WEIGHT = 1.0
_TRIGRAM_WEIGHT = 0.5


# A model with a cost (delay_per_text_seconds) runs one call at a time per process, as the local model does on its one
# encode thread: two threads embedding take turns, they do not overlap.
_model_lock = threading.Lock()


@lru_cache(maxsize=65536)
def _bucket(feature: str, dimension: int) -> tuple[int, float]:
    digest = int.from_bytes(hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest(), "big")
    sign = 1.0 if digest >> 63 else -1.0
    return digest % dimension, sign


def _features(text: str) -> list[tuple[str, float]]:
    normalized = unicodedata.normalize("NFKC", text).casefold()
    features: list[tuple[str, float]] = []
    for word in _WORD.findall(normalized):
        # Prefixes keep word and trigram features in separate hash spaces ("the" the word vs "the" the trigram).
        features.append(("w:" + word, _WORD_WEIGHT))
        padded = f"<{word}>"
        features.extend(("c:" + padded[i : i + 3], _TRIGRAM_WEIGHT) for i in range(len(padded) - 2))
    return features


class HashingEmbeddingProvider(EmbeddingProvider):
    """Lexical feature hashing; see the module docstring for why this is not semantic search."""

    name = "hash"

    def __init__(
        self,
        dimension: int = DEFAULT_DIMENSION,
        delay_seconds: float = 0.0,
        max_input_chars: int | None = None,
        delay_per_text_seconds: float = 0.0,
    ) -> None:
        if dimension < 1:
            raise ValueError("dimension must be positive")
        self.dimension = dimension
        self.delay_seconds = delay_seconds
        # Tests: a model whose cost grows with the texts (chunks) it embeds, one call at a time per process.
        self.delay_per_text_seconds = delay_per_text_seconds
        # Hashing has no input window; a limit (EMBEDDING_MAX_INPUT_CHARS) makes it chunk like a real model would.
        self.max_input_chars = max_input_chars

    @classmethod
    def from_settings(cls) -> HashingEmbeddingProvider:
        return cls(
            dimension=getattr(settings, "EMBEDDING_DIMENSIONS", None) or DEFAULT_DIMENSION,
            delay_seconds=getattr(settings, "EMBEDDING_HASH_DELAY_SECONDS", 0.0),
            max_input_chars=getattr(settings, "EMBEDDING_MAX_INPUT_CHARS", None) or None,
            delay_per_text_seconds=getattr(settings, "EMBEDDING_HASH_DELAY_PER_TEXT_SECONDS", 0.0),
        )

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if self.delay_seconds and texts:
            time.sleep(self.delay_seconds)  # tests: a slow model, so a worker can be killed mid-batch
        if self.delay_per_text_seconds and texts:
            with _model_lock:
                time.sleep(self.delay_per_text_seconds * len(texts))
        return [self._embed(text) for text in texts]

    def _embed(self, text: str) -> list[float]:
        vector = [0.0] * self.dimension
        for feature, weight in _features(text):
            index, sign = _bucket(feature, self.dimension)
            vector[index] += sign * weight
        return l2_normalize(vector)

    def check(self) -> None:
        """Always ready: pure Python, no model, no network."""
