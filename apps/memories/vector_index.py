"""The pgvector side of semantic search: the HNSW index per embedding dimension (apps.core.vectors, shared with
conversation search), and the filtered ANN query.

``memory_vectors.embedding`` is an untyped ``vector`` so one table serves any provider; the HNSW index is an
partial expression index on ``embedding::vector(<dimension>)`` (rows of that dimension only), created for
the configured provider on first use (or by
``reindex_memories``), and queries use the same expression so the planner can take it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from apps.core import vectors
from apps.core.embeddings import EmbeddingProvider
from apps.memories import filters

logger = logging.getLogger(__name__)

_scope_sizes = vectors.ScopeSizes()


def model_tag(provider: EmbeddingProvider) -> str:
    """What a vector was made with; vectors of another tag are never compared with this provider's queries."""
    return vectors.model_tag(provider)


def index_name(dimension: int) -> str:
    return f"memory_vectors_hnsw_{dimension}"


def ensure_index(dimension: int) -> None:
    """Create the HNSW cosine index for ``dimension`` once per process (idempotent across processes)."""
    vectors.ensure_hnsw_index("memory_vectors", index_name(int(dimension)), dimension)


def forget_ensured() -> None:
    vectors.forget_ensured()


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

    Two plans, chosen by the size of the scope:

    * a small scope (at most MEMORY_VECTOR_EXACT_SCAN_THRESHOLD vectors, counted with a bounded probe on the GIN
      indexes) is ranked exactly: every vector in scope is compared. Walking the HNSW graph for a selective
      filter visits far more candidates than the scope holds, so exact is both faster and has recall 1;
    * a large scope walks HNSW with pgvector's iterative scan, which keeps going while the WHERE clause rejects
      candidates. HNSW returns vectors, several per memory, so it is asked for more than ``count`` and the
      request widens until ``count`` memories are found or the scope is exhausted.
    """
    dimension = int(provider.dimension)
    ensure_index(dimension)
    prefix_sql, prefix_params = filters.namespace_prefix_sql(namespace_prefix, "v.namespace")
    filter_sql, filter_params = filters.to_sql(attribute_filter, "v.attributes")
    scope_sql = (
        f"vector_dims(v.embedding) = {dimension} AND v.model = %s "
        f"AND (v.expires_at IS NULL OR v.expires_at > now()) AND {prefix_sql} AND {filter_sql}"
    )
    scope_params = [model_tag(provider), *prefix_params, *filter_params]
    vector_literal = vectors.vector_literal(query_vector)
    # The scope-size probe is bounded and cached briefly (apps.core.vectors.ScopeSizes): a user's scope repeats
    # from search to search, and a stale size only picks the other plan, both of which return correct results.
    if _scope_sizes.exact(f"FROM memory_vectors v WHERE {scope_sql}", scope_params):
        return _exact(dimension, vector_literal, scope_sql, scope_params, count)
    return _approximate(dimension, vector_literal, scope_sql, scope_params, count)


_RANKED = """
    SELECT memory_id, min(distance) AS best, count(*) AS vectors
    FROM candidates GROUP BY memory_id ORDER BY best, memory_id
"""


def _exact(dimension: int, vector_literal: str, scope_sql: str, scope_params: list[Any], count: int) -> list[Neighbour]:
    with transaction.atomic(), connection.cursor() as cursor:
        # The HNSW index must not be used here: the point is to compare every vector in the (small) scope.
        cursor.execute("SET LOCAL enable_indexscan = off")
        # A scope this small is read in a few ms; starting parallel workers costs more than it saves (conversation
        # search measured 15-40 ms with a Gather against 5-9 ms without on 2 loaded cores).
        cursor.execute("SET LOCAL max_parallel_workers_per_gather = 0")
        cursor.execute(
            f"""
            WITH candidates AS MATERIALIZED (
                SELECT v.memory_id, v.embedding::vector({dimension}) <=> %s::vector({dimension}) AS distance
                FROM memory_vectors v WHERE {scope_sql}
            )
            {_RANKED} LIMIT %s
            """,  # noqa: S608 - identifiers come from code; values are bound parameters
            [vector_literal, *scope_params, count],
        )
        return [Neighbour(memory_id, float(best)) for memory_id, best, _vectors in cursor.fetchall()]


def _approximate(
    dimension: int, vector_literal: str, scope_sql: str, scope_params: list[Any], count: int
) -> list[Neighbour]:
    fetch = max(count * 4, 40)
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
            cursor.execute(f"SET LOCAL hnsw.ef_search = {max(int(settings.MEMORY_VECTOR_EF_SEARCH), min(fetch, 1000))}")
            cursor.execute(
                f"""
                WITH candidates AS MATERIALIZED (
                    SELECT v.memory_id, v.embedding::vector({dimension}) <=> %s::vector({dimension}) AS distance
                    FROM memory_vectors v WHERE {scope_sql}
                    ORDER BY distance
                    LIMIT %s
                )
                {_RANKED}
                """,  # noqa: S608 - identifiers come from code; values are bound parameters
                [vector_literal, *scope_params, fetch],
            )
            rows = cursor.fetchall()
        candidates = sum(vectors for _memory_id, _best, vectors in rows)
        exhausted = candidates < fetch  # the scope holds no more vectors than we got
        if len(rows) >= count or exhausted or fetch >= settings.MEMORY_VECTOR_MAX_CANDIDATES:
            return [Neighbour(memory_id, float(best)) for memory_id, best, _vectors in rows[:count]]
        # Several vectors per memory crowded the candidates: widen and ask again.
        fetch = min(fetch * 4, settings.MEMORY_VECTOR_MAX_CANDIDATES)
