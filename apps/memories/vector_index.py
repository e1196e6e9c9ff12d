"""The pgvector side of semantic search: the HNSW index per embedding dimension, and the filtered ANN query.

``memory_vectors.embedding`` is an untyped ``vector`` so one table serves any provider; the HNSW index is an
partial expression index on ``embedding::vector(<dimension>)`` (rows of that dimension only), created for
the configured provider on first use (or by
``reindex_memories``), and queries use the same expression so the planner can take it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from apps.core.embeddings import EmbeddingProvider
from apps.memories import filters

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
    vector_literal = "[" + ",".join(repr(float(x)) for x in query_vector) + "]"
    threshold = int(settings.MEMORY_VECTOR_EXACT_SCAN_THRESHOLD)
    if threshold > 0 and _scope_size(scope_sql, scope_params, threshold) <= threshold:
        return _exact(dimension, vector_literal, scope_sql, scope_params, count)
    return _approximate(dimension, vector_literal, scope_sql, scope_params, count)


# (scope SQL, parameters, threshold) -> (monotonic deadline, size). The probe costs ~20 ms on a 100k-vector
# scope (the GIN bitmap is built in full before LIMIT applies) and a user's scope repeats from search to search;
# a stale size only picks the other plan, both of which return correct results.
_scope_sizes: dict[tuple, tuple[float, int]] = {}
_SCOPE_SIZE_CACHE_MAX = 10_000


def _scope_size(scope_sql: str, scope_params: list[Any], threshold: int) -> int:
    """How many vectors are in scope, counting no further than threshold + 1 (cached briefly per scope)."""
    key = (connection.alias, scope_sql, repr(scope_params), threshold)
    now = time.monotonic()
    cached = _scope_sizes.get(key)
    if cached is not None and cached[0] > now:
        return cached[1]
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM memory_vectors v WHERE {scope_sql} LIMIT %s) AS s",  # noqa: S608
            [*scope_params, threshold + 1],
        )
        size = int(cursor.fetchone()[0])
    if len(_scope_sizes) >= _SCOPE_SIZE_CACHE_MAX:
        _scope_sizes.clear()
    _scope_sizes[key] = (now + settings.MEMORY_VECTOR_SCOPE_SIZE_CACHE_SECONDS, size)
    return size


_RANKED = """
    SELECT memory_id, min(distance) AS best, count(*) AS vectors
    FROM candidates GROUP BY memory_id ORDER BY best, memory_id
"""


def _exact(dimension: int, vector_literal: str, scope_sql: str, scope_params: list[Any], count: int) -> list[Neighbour]:
    with transaction.atomic(), connection.cursor() as cursor:
        # The HNSW index must not be used here: the point is to compare every vector in the (small) scope.
        cursor.execute("SET LOCAL enable_indexscan = off")
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
