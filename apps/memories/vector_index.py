"""The pgvector side of semantic search: the HNSW index per embedding dimension, and the filtered ANN query.

``memory_vectors.embedding`` is an untyped ``vector`` so one table serves any provider; the HNSW index is an
partial expression index on ``embedding::vector(<dimension>)`` (rows of that dimension only), created for
the configured provider on first use (or by
``reindex_memories``), and queries use the same expression so the planner can take it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from apps.memories import filters
from apps.memories.embeddings import EmbeddingProvider

logger = logging.getLogger(__name__)

_ensured: set[tuple[str, int]] = set()
_ensure_lock = threading.Lock()


def model_tag(provider: EmbeddingProvider) -> str:
    """What a vector was made with; vectors of another tag are never compared with this provider's queries."""
    return f"{provider.name}:{provider.dimension}"


def index_name(dimension: int) -> str:
    return f"memory_vectors_hnsw_{dimension}"


def ensure_index(dimension: int) -> None:
    """Create the HNSW cosine index for ``dimension`` once per process (idempotent across processes)."""
    key = (connection.alias, dimension)
    if key in _ensured:
        return
    with _ensure_lock:
        if key in _ensured:
            return
        with connection.cursor() as cursor:
            # Inside a transaction that wrote vectors, deferred FK checks must run before an index can be built.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            # The dimension is an int from the provider, never caller input.
            cursor.execute(
                f"CREATE INDEX IF NOT EXISTS {index_name(int(dimension))} ON memory_vectors "
                f"USING hnsw ((embedding::vector({int(dimension)})) vector_cosine_ops) "
                f"WITH (m = {int(settings.MEMORY_VECTOR_HNSW_M)}, ef_construction = "
                f"{int(settings.MEMORY_VECTOR_HNSW_EF_CONSTRUCTION)}) "
                # Partial: rows of another dimension (during a provider change) must not be cast.
                f"WHERE vector_dims(embedding) = {int(dimension)}"
            )
        _ensured.add(key)


def forget_ensured() -> None:
    _ensured.clear()


@dataclass(frozen=True)
class Neighbour:
    memory_id: Any
    distance: float


def nearest_memories(
    *,
    provider: EmbeddingProvider,
    query_vector: list[float],
    namespace_prefix: list[str],
    attribute_filter: filters.CompiledFilter,
    count: int,
) -> list[Neighbour]:
    """The ``count`` nearest distinct memories (best field per memory), inside the scope, not expired.

    HNSW returns vectors, several per memory, so it is asked for more than ``count`` and the request widens
    until ``count`` memories are found or the scope is exhausted. pgvector's iterative scan keeps walking the
    graph while the WHERE clause (a selective namespace or attribute filter) rejects candidates, so a narrow
    scope still fills the page instead of returning the few survivors of the first ef_search candidates.
    """
    dimension = int(provider.dimension)
    ensure_index(dimension)
    prefix_sql, prefix_params = filters.namespace_prefix_sql(namespace_prefix, "v.namespace")
    filter_sql, filter_params = filters.to_sql(attribute_filter, "v.attributes")
    vector_literal = "[" + ",".join(repr(float(x)) for x in query_vector) + "]"
    fetch = max(count * 4, 40)
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
            cursor.execute(f"SET LOCAL hnsw.ef_search = {max(int(settings.MEMORY_VECTOR_EF_SEARCH), min(fetch, 1000))}")
            cursor.execute(
                f"""
                WITH candidates AS MATERIALIZED (
                    SELECT v.memory_id, v.embedding::vector({dimension}) <=> %s::vector({dimension}) AS distance
                    FROM memory_vectors v
                    WHERE vector_dims(v.embedding) = {dimension} AND v.model = %s
                      AND (v.expires_at IS NULL OR v.expires_at > now())
                      AND {prefix_sql} AND {filter_sql}
                    ORDER BY distance
                    LIMIT %s
                )
                SELECT memory_id, min(distance) AS best, count(*) AS vectors
                FROM candidates GROUP BY memory_id ORDER BY best, memory_id
                """,  # noqa: S608 - identifiers come from code; values are bound parameters
                [vector_literal, model_tag(provider), *prefix_params, *filter_params, fetch],
            )
            rows = cursor.fetchall()
        candidates = sum(vectors for _memory_id, _best, vectors in rows)
        exhausted = candidates < fetch  # the scope holds no more vectors than we got
        if len(rows) >= count or exhausted or fetch >= settings.MEMORY_VECTOR_MAX_CANDIDATES:
            return [Neighbour(memory_id, float(best)) for memory_id, best, _vectors in rows[:count]]
        # Several vectors per memory crowded the candidates: widen and ask again.
        fetch = min(fetch * 4, settings.MEMORY_VECTOR_MAX_CANDIDATES)
