"""The pgvector side of semantic search: the HNSW index per embedding dimension (apps.retrieval.vectors, shared with
conversation search), and the filtered ANN query.

``memory_vectors.embedding`` is an untyped ``vector`` so one table serves any provider; the HNSW index is a
partial expression index on ``embedding::vector(<dimension>)`` (rows of that dimension only), created for the
configured provider by ``manage.py migrate`` (apps.memories.apps, after every migrate) and by ``reindex_memories``,
never on the request path; queries use the same expression so the planner can take it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, transaction

from apps.memories import filters
from apps.retrieval import vectors
from apps.retrieval.embeddings import EmbeddingProvider

logger = logging.getLogger(__name__)

_scope_sizes = vectors.ScopeSizes()


def model_tag(provider: EmbeddingProvider) -> str:
    """What a vector was made with; vectors of another tag are never compared with this provider's queries."""
    return vectors.model_tag(provider)


def index_name(dimension: int) -> str:
    return f"memory_vectors_hnsw_{dimension}"


TABLE = "memory_vectors"


def create_index(dimension: int, using: str = DEFAULT_DB_ALIAS) -> None:
    """Create the HNSW cosine index for ``dimension`` unless it exists (DDL: migrate and management commands only)."""
    vectors.create_hnsw_index(TABLE, index_name(int(dimension)), int(dimension), using=using)


def check_index(dimension: int) -> bool:
    """Whether the index for ``dimension`` exists (logged when not); never creates it."""
    return vectors.check_hnsw_index(index_name(int(dimension)))


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
    check_index(dimension)
    prefix_sql, prefix_params = filters.namespace_prefix_sql(namespace_prefix, "v.namespace")
    filter_sql, filter_params = filters.to_sql(attribute_filter, "v.attributes")
    scope_sql = (
        f"vector_dims(v.embedding) = {dimension} AND v.model = %s "
        f"AND (v.expires_at IS NULL OR v.expires_at > now()) AND {prefix_sql} AND {filter_sql}"
    )
    scope_params = [model_tag(provider), *prefix_params, *filter_params]
    vector_literal = vectors.vector_literal(query_vector)
    # The scope-size probe is bounded and cached briefly (apps.retrieval.vectors.ScopeSizes): a user's scope repeats
    # from search to search, and a stale size only picks the other plan, both of which return correct results.
    if _scope_sizes.exact(f"FROM {TABLE} v WHERE {scope_sql}", scope_params):
        return _exact(dimension, vector_literal, scope_sql, scope_params, count)
    return _approximate(dimension, vector_literal, scope_sql, scope_params, count)


# A vector counts only while its version is the active one. Vectors of superseded and deleted versions stay in
# memory_vectors until the indexer's next cycle removes them; judged in SQL, they can neither take a page's places
# nor stop the HNSW walk early (three matches, the two best deleted, limit 2 must still find the third). Expiry is
# judged on the vector's own copy of expires_at (scope_sql).
_LIVE = "EXISTS (SELECT FROM memories m WHERE m.id = {memory_id} AND m.state = 'active')"


def _neighbours(rows: list[tuple], count: int) -> list[Neighbour]:
    """(memory_id, best distance, ...) rows, nearest first, as Neighbours. A NaN distance (a zero vector: a text
    without words, for the hashing embedder, or a query without any) has no direction and is no match."""
    return [Neighbour(row[0], float(row[1])) for row in rows if not math.isnan(row[1])][:count]


def _exact(dimension: int, vector_literal: str, scope_sql: str, scope_params: list[Any], count: int) -> list[Neighbour]:
    with transaction.atomic(), connection.cursor() as cursor:
        # A scope this small is read in a few ms; starting parallel workers costs more than it saves (conversation
        # search measured 15-40 ms with a Gather against 5-9 ms without on 2 loaded cores).
        # The liveness probe (one primary-key lookup per memory) must run on the ranked list, nearest first, until
        # the page is full: a hash or merge join would read every active memory to judge a scope of a few.
        vectors.set_local(
            cursor, {"max_parallel_workers_per_gather": 0, "enable_hashjoin": "off", "enable_mergejoin": "off"}
        )
        # Every vector in scope is compared (no ORDER BY on the distance, so the HNSW index cannot serve it).
        # OFFSET 0 keeps the liveness test above the sort, so it stops once ``count`` live memories are found.
        cursor.execute(
            f"""
            WITH candidates AS MATERIALIZED (
                SELECT v.memory_id, v.embedding::vector({dimension}) <=> %s::vector({dimension}) AS distance
                FROM {TABLE} v WHERE {scope_sql}
            )
            SELECT r.memory_id, r.best FROM (
                SELECT memory_id, min(distance) AS best FROM candidates WHERE distance < 'NaN'::float8
                GROUP BY memory_id ORDER BY best, memory_id OFFSET 0
            ) AS r
            WHERE {_LIVE.format(memory_id="r.memory_id")}
            LIMIT %s
            """,  # noqa: S608 - identifiers come from code; values are bound parameters
            [vector_literal, *scope_params, count],
        )
        return _neighbours(cursor.fetchall(), count)


def _approximate(
    dimension: int, vector_literal: str, scope_sql: str, scope_params: list[Any], count: int
) -> list[Neighbour]:
    fetch = max(count * 4, 40)
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            # The liveness test must stay a per-candidate probe under the HNSW scan (a nested loop), so the walk
            # goes on past dead versions' vectors: a hash or merge join would drain the whole index first.
            vectors.set_local(cursor, {
                "hnsw.iterative_scan": "relaxed_order",
                "hnsw.ef_search": max(int(settings.MEMORY_VECTOR_EF_SEARCH), min(fetch, 1000)),
                "enable_hashjoin": "off",
                "enable_mergejoin": "off",
            })  # fmt: skip
            cursor.execute(
                f"""
                WITH candidates AS MATERIALIZED (
                    SELECT v.memory_id, v.embedding::vector({dimension}) <=> %s::vector({dimension}) AS distance
                    FROM {TABLE} v WHERE {scope_sql} AND {_LIVE.format(memory_id="v.memory_id")}
                    ORDER BY distance
                    LIMIT %s
                )
                SELECT memory_id, min(distance) AS best, count(*) AS vectors
                FROM candidates GROUP BY memory_id ORDER BY best, memory_id
                """,  # noqa: S608 - identifiers come from code; values are bound parameters
                [vector_literal, *scope_params, fetch],
            )
            rows = cursor.fetchall()
        candidates = sum(found for _memory_id, _best, found in rows)
        exhausted = candidates < fetch  # the scope holds no more live vectors than we got
        neighbours = _neighbours(rows, count)
        if len(neighbours) >= count or exhausted or fetch >= settings.MEMORY_VECTOR_MAX_CANDIDATES:
            return neighbours
        # Several vectors per memory crowded the candidates: widen and ask again.
        fetch = min(fetch * 4, settings.MEMORY_VECTOR_MAX_CANDIDATES)


def distances(provider: EmbeddingProvider, query_vector: list[float], memory_ids: list[Any]) -> dict[Any, float]:
    """The best distance of each of ``memory_ids`` (already in the caller's scope) to the query: the meaning half of
    a hybrid score for memories the keyword index found and the ANN list did not. Those without vectors are absent."""
    if not memory_ids:
        return {}
    dimension = int(provider.dimension)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT v.memory_id, min(v.embedding::vector({dimension}) <=> %s::vector({dimension})) "  # noqa: S608
            f"FROM {TABLE} v WHERE v.memory_id = ANY(%s) AND v.model = %s AND vector_dims(v.embedding) = {dimension} "
            "GROUP BY v.memory_id",
            [vectors.vector_literal(query_vector), list(memory_ids), model_tag(provider)],
        )
        return {memory_id: float(best) for memory_id, best in cursor.fetchall() if not math.isnan(best)}
