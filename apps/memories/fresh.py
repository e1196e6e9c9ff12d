"""Read your writes, by meaning (D11): a search issued after a PUT returned finds the version it wrote.

PROTOTYPE: two ways, each behind a setting, to be measured against each other (bench/read_your_writes.py).

(a) ``embed_for_put``: a PUT whose index text is short (MEMORY_INLINE_INDEX_MAX_CHARS) is embedded in the request;
    services.put_memory writes the vectors in the PUT's own statement and the version is born ``indexed``.
(b) ``nearest``: a search also embeds the newest pending short versions of its scope (MEMORY_SEARCH_PENDING_LIMIT)
    in the query's encoder pass, and ranks them with the ANN neighbours.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection

from apps.memories import filters, vector_index
from apps.memories.vector_index import Neighbour
from apps.retrieval import vectors
from apps.retrieval.embeddings import EmbeddingProvider, get_provider

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class InlineVectors:
    """The vectors of a PUT's index, as the bound parameters of services.PUT_INLINE_SQL's vectors CTE."""

    model: str
    fields: list[str]
    chunks: list[int]
    embeddings: list[str]

    def params(self) -> dict[str, Any]:
        return {
            "vector_model": self.model,
            "vector_fields": self.fields,
            "vector_chunks": self.chunks,
            "vector_embeddings": self.embeddings,
        }


def embed_for_put(index: dict[str, str]) -> InlineVectors | None:
    limit = int(settings.MEMORY_INLINE_INDEX_MAX_CHARS)
    if limit <= 0 or not index or sum(len(text) for text in index.values()) > limit:
        return None
    provider = get_provider()
    fields: list[str] = []
    chunks: list[int] = []
    embeddings: list[str] = []
    try:
        for field, text in sorted(index.items()):
            if not text.strip():
                continue
            for number, piece in enumerate(provider.chunk(text)):
                fields.append(field)
                chunks.append(number)
                embeddings.append(vectors.vector_literal(provider.embed_query(piece)))
    except Exception:
        logger.warning("could not embed a short index text in the request; the indexer will", exc_info=True)
        return None
    return InlineVectors(vector_index.model_tag(provider), fields, chunks, embeddings)


def _pending(scope: Any, limit: int, max_chars: int) -> list[tuple[Any, dict[str, str]]]:
    prefix_sql, prefix_params = filters.owner_prefix_sql(scope.namespace_prefix, "t.namespace")
    filter_sql, filter_params = filters.to_sql(scope.attribute_filter, "t.attributes")
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT t.id, t.indexed_content FROM memories t WHERE t.index_status = 'pending' "  # noqa: S608
            f"AND t.state = 'active' AND t.index_quarantined_at IS NULL "
            f"AND (t.expires_at IS NULL OR t.expires_at > now()) AND {prefix_sql} AND {filter_sql} "
            f"AND octet_length(t.indexed_content::text) <= %s ORDER BY t.created_at DESC LIMIT %s",
            [*prefix_params, *filter_params, max_chars + 64, limit],
        )
        rows = cursor.fetchall()
    return [(row_id, json.loads(content) if isinstance(content, str) else content) for row_id, content in rows]


def nearest(provider: EmbeddingProvider, query: str, scope: Any, count: int) -> list[Neighbour]:
    limit = int(settings.MEMORY_SEARCH_PENDING_LIMIT)
    pending = _pending(scope, limit, 200) if limit > 0 else []
    texts = [(row_id, text) for row_id, content in pending for text in (content or {}).values() if text.strip()]
    if texts:
        embedded = provider.embed_documents([query, *(text for _row_id, text in texts)])
        query_vector, others = embedded[0], embedded[1:]
    else:
        query_vector, others = provider.embed_query(query), []
    neighbours = vector_index.nearest_memories(
        provider=provider,
        query_vector=query_vector,
        namespace_prefix=scope.namespace_prefix,
        attribute_filter=scope.attribute_filter,
        count=count,
    )
    if not others:
        return neighbours
    best: dict[Any, float] = {n.memory_id: n.distance for n in neighbours}
    for (row_id, _text), vector in zip(texts, others, strict=True):
        distance = 1.0 - sum(a * b for a, b in zip(query_vector, vector, strict=True))
        if not math.isnan(distance) and distance < best.get(row_id, math.inf):
            best[row_id] = distance
    ranked = sorted(best.items(), key=lambda item: (item[1], str(item[0])))
    return [Neighbour(row_id, distance) for row_id, distance in ranked[:count]]
