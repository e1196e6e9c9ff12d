"""The one interface every embedding provider implements, so the indexer and search never know which one runs."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence


class EmbeddingError(Exception):
    """A provider could not produce embeddings (model missing, endpoint down, bad response).

    Callers such as the indexer catch this and back off; configuration mistakes raise
    ``django.core.exceptions.ImproperlyConfigured`` instead, because retrying cannot fix them.
    """


class EmbeddingProvider(ABC):
    """Turns text into fixed-size vectors.

    Contract, relied on by the pgvector column and the search query:

    * every vector has exactly ``dimension`` floats;
    * every vector is L2-normalized (unit length), so cosine similarity equals the dot product and
      pgvector's inner-product and cosine operators rank identically. The one exception is a text with
      nothing to embed (e.g. the hashing provider given only punctuation), which yields the zero vector;
    * ``embed_documents`` returns one vector per input text, in input order, and batches internally,
      so callers may pass any number of texts;
    * failures raise :class:`EmbeddingError`.
    """

    name: str
    dimension: int
    # The longest text (in characters) embedded whole; None = no limit. Providers that know their window in
    # tokens (local) override ``chunk`` instead.
    max_input_chars: int | None = None

    def chunk(self, text: str) -> list[str]:
        """``text`` as one or more overlapping pieces that each fit the model's input window and together cover
        all of it, so nothing past the window is silently cut. A text that fits is returned whole."""
        return chunk_by_chars(text, self.max_input_chars)

    @abstractmethod
    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed texts meant to be stored and searched over."""

    def embed_chunked(self, texts: list[str]) -> list[list[list[float]]]:
        """The indexers' path: every text ``chunk``-ed and every piece embedded, in one call; per text, the vectors
        of its pieces in order. Providers that tokenize override it to tokenize each text once."""
        pieces = [self.chunk(text) for text in texts]
        vectors = self.embed_documents([piece for pieces_of_text in pieces for piece in pieces_of_text])
        return split_by_counts(vectors, [len(pieces_of_text) for pieces_of_text in pieces])

    def embed_query(self, text: str) -> list[float]:
        """Embed a search query. Symmetric models embed queries like documents; asymmetric ones override this."""
        return self.embed_documents([text])[0]

    def embed_with_documents(
        self, queries: list[str], documents: list[str]
    ) -> tuple[list[list[float]], list[list[float]]]:
        """Queries and documents (each short enough to embed whole) in one pass where the provider can: a search
        that scores versions not indexed yet along with its query (apps.memories.fresh). A symmetric provider (one
        that embeds queries as documents) makes one call of all of them; an asymmetric one embeds each its own way.
        """
        if type(self).embed_query is EmbeddingProvider.embed_query:
            vectors = self.embed_documents([*queries, *documents])
            return vectors[: len(queries)], vectors[len(queries) :]
        return [self.embed_query(query) for query in queries], self.embed_documents(documents) if documents else []

    def check(self) -> None:
        """Readiness: raise :class:`EmbeddingError` unless the provider can embed right now.

        The default embeds a probe text, which also loads lazy models and verifies the dimension end to end.
        """
        vector = self.embed_query("readiness probe")
        if len(vector) != self.dimension:
            raise EmbeddingError(f"{self.name}: expected dimension {self.dimension}, got {len(vector)}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} dimension={self.dimension}>"


def split_by_counts(vectors: list[list[float]], counts: list[int]) -> list[list[list[float]]]:
    """``vectors`` in consecutive groups of ``counts``."""
    groups, start = [], 0
    for count in counts:
        groups.append(vectors[start : start + count])
        start += count
    return groups


def l2_normalize(values: Sequence[float]) -> list[float]:
    """Scale to unit length; the zero vector stays zero because it has no direction to keep."""
    norm = math.sqrt(math.fsum(v * v for v in values))
    if norm == 0.0:
        return [0.0] * len(values)
    return [v / norm for v in values]


def chunk_by_chars(text: str, window: int | None, overlap_ratio: float = 0.25) -> list[str]:
    """Windows of ``window`` characters, consecutive ones overlapping by ``overlap_ratio`` of a window (so a
    sentence cut by one boundary is whole in the neighbouring chunk); the last one ends at the end of ``text``."""
    if window is None or len(text) <= window:
        return [text]
    stride = max(1, int(window * (1 - overlap_ratio)))
    chunks = []
    start = 0
    while True:
        end = min(start + window, len(text))
        chunks.append(text[start:end])
        if end == len(text):
            return chunks
        start += stride
