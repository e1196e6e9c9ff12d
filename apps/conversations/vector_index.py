"""The pgvector side of conversation search: nearest conversations (best entry chunk each) for a query vector,
restricted in SQL to the conversations the caller may read.

The plan is chosen by the size of the caller's scope (apps.retrieval.vectors.ScopeSizes), as memory search does:

* at most MEMORY_VECTOR_EXACT_SCAN_THRESHOLD vectors in scope (a user who reads a few conversations): every vector
  of the caller's trees is compared, starting from their memberships: exact, recall 1;
* more: HNSW with pgvector's iterative scan, the membership test a per-candidate probe of the unique
  ``(root_id, user_id)`` index; asked for more vectors than conversations wanted (several entries and chunks per
  conversation) and widened until enough conversations are found or the scope is exhausted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, transaction

from apps.retrieval import vectors
from apps.retrieval.embeddings import EmbeddingProvider
from apps.sharing import access

TABLE = "conversation_entry_vectors"
_scope_sizes = vectors.ScopeSizes()


def index_name(dimension: int) -> str:
    return f"conv_entry_vectors_hnsw_{int(dimension)}"


def create_index(dimension: int, using: str = DEFAULT_DB_ALIAS) -> None:
    """Create the HNSW cosine index for ``dimension`` unless it exists (DDL: ``manage.py migrate`` runs it for the
    configured provider, apps.conversations.apps; never the request path)."""
    vectors.create_hnsw_index(TABLE, index_name(dimension), int(dimension), using=using)


def check_index(dimension: int) -> bool:
    """Whether the index for ``dimension`` exists (logged when not); never creates it."""
    return vectors.check_hnsw_index(index_name(dimension))


@dataclass(frozen=True)
class Neighbour:
    conversation_id: UUID
    entry_id: UUID
    distance: float


def _scope(user_id: str | None, dimension: int, model: str) -> tuple[str, list[Any]]:
    """FROM ... WHERE of the vectors the caller may search (admin: every live conversation's; deleted
    conversations' vectors are removed when they are deleted)."""
    where = f"vector_dims(v.embedding) = {int(dimension)} AND v.model = %s"
    if user_id is None:
        return f"FROM {TABLE} v WHERE {where}", [model]
    trees = access.member_trees(user_id)
    return f"FROM {trees.sql} m JOIN {TABLE} v ON v.root_id = m.root_id WHERE {where}", [*trees.params, model]


def nearest_conversations(
    *,
    provider: EmbeddingProvider,
    query_vector: list[float],
    user_id: str | None,
    count: int,
    after: tuple[float, UUID] | None = None,
) -> list[Neighbour]:
    """The ``count`` nearest conversations after the keyset position ``after`` = (distance, conversation id),
    ordered by (distance, conversation id). Vectors at cosine distance 1 or more (orthogonal or opposite to the
    query: similarity 0) are no match."""
    dimension = int(provider.dimension)
    check_index(dimension)
    model = vectors.model_tag(provider)
    literal = vectors.vector_literal(query_vector)
    scope_sql, scope_params = _scope(user_id, dimension, model)
    if _scope_sizes.exact(scope_sql, scope_params):
        return _exact(dimension, literal, scope_sql, scope_params, count, after)
    return _approximate(dimension, literal, user_id, model, count, after)


def _keyset(after: tuple[float, UUID] | None) -> tuple[str, list[Any]]:
    if after is None:
        return "TRUE", []
    return "(b.distance > %s OR (b.distance = %s AND b.conversation_id > %s))", [after[0], after[0], after[1]]


def _exact(
    dimension: int,
    literal: str,
    scope_sql: str,
    scope_params: list[Any],
    count: int,
    after: tuple[float, UUID] | None,
) -> list[Neighbour]:
    keyset_sql, keyset_params = _keyset(after)
    with transaction.atomic(), connection.cursor() as cursor:
        # A scope this small is read in a few ms; starting parallel workers costs more than it saves (measured
        # 15-40 ms with a Gather against 5-9 ms without, 1000 vectors of a 100k table, 2 loaded cores).
        vectors.set_local(cursor, {"max_parallel_workers_per_gather": 0})
        cursor.execute(
            f"""
            WITH d AS MATERIALIZED (
                SELECT v.conversation_id, v.entry_id,
                       v.embedding::vector({dimension}) <=> %s::vector({dimension}) AS distance
                {scope_sql}
            ), b AS (
                SELECT DISTINCT ON (conversation_id) conversation_id, entry_id, distance
                FROM d WHERE distance < 1 ORDER BY conversation_id, distance, entry_id
            )
            SELECT b.conversation_id, b.entry_id, b.distance FROM b WHERE {keyset_sql}
            ORDER BY b.distance, b.conversation_id LIMIT %s
            """,  # noqa: S608 - identifiers come from code; values are bound parameters
            [literal, *scope_params, *keyset_params, count],
        )
        return [Neighbour(conv, entry, float(distance)) for conv, entry, distance in cursor.fetchall()]


def _approximate(
    dimension: int,
    literal: str,
    user_id: str | None,
    model: str,
    count: int,
    after: tuple[float, UUID] | None,
) -> list[Neighbour]:
    access_sql, access_params = "TRUE", []
    if user_id is not None:
        member = access.is_member("v.root_id", user_id)
        access_sql, access_params = member.sql, [*member.params]
    # No "distance >= cursor" floor in the scan: a conversation of an earlier page must be seen with its best
    # vector (nearest first), or its farther vectors would bring it back on this page.
    fetch = max(count * 4, 40)
    maximum = int(settings.MEMORY_VECTOR_MAX_CANDIDATES)
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            local: dict[str, str | int] = {
                "hnsw.iterative_scan": "relaxed_order",
                "hnsw.ef_search": max(int(settings.MEMORY_VECTOR_EF_SEARCH), min(fetch, 1000)),
            }
            if user_id is not None:
                # The membership test must stay a per-candidate probe under the HNSW scan (a nested loop): a merge
                # or hash join drains the whole index before the LIMIT applies (measured 790 ms instead of 30 ms
                # at 10k vectors).
                local.update(enable_mergejoin="off", enable_hashjoin="off")
            vectors.set_local(cursor, local)
            cursor.execute(
                f"""
                SELECT v.conversation_id, v.entry_id,
                       v.embedding::vector({dimension}) <=> %s::vector({dimension}) AS distance
                FROM {TABLE} v
                WHERE vector_dims(v.embedding) = {dimension} AND v.model = %s AND {access_sql}
                ORDER BY distance LIMIT %s
                """,  # noqa: S608 - identifiers come from code; values are bound parameters
                [literal, model, *access_params, fetch],
            )
            rows = cursor.fetchall()
        best: dict[UUID, Neighbour] = {}
        unrelated = any(distance >= 1 for _c, _e, distance in rows)
        for conversation_id, entry_id, distance in rows:
            if distance >= 1:
                continue
            known = best.get(conversation_id)
            if known is None or (distance, entry_id) < (known.distance, known.entry_id):
                best[conversation_id] = Neighbour(conversation_id, entry_id, float(distance))
        ranked = sorted(best.values(), key=lambda n: (n.distance, n.conversation_id))
        if after is not None:
            ranked = [n for n in ranked if (n.distance, n.conversation_id) > after]
        # Candidates come nearest first: once one is unrelated, the rest are too.
        exhausted = len(rows) < fetch or unrelated
        if len(ranked) >= count or exhausted or fetch >= maximum:
            return ranked[:count]
        # Several entries (and chunks) per conversation crowded the candidates: widen and ask again.
        fetch = min(fetch * 4, maximum)
