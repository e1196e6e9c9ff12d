"""pgvector pieces shared by the apps that search by embedding (memories, conversations).

- ``create_hnsw_index``: the HNSW cosine index per embedding dimension, a partial expression index on
  ``embedding::vector(<dimension>)`` (the columns are untyped ``vector`` so one table serves any provider), created
  by ``manage.py migrate`` (``create_index_after_migrate``: a post_migrate step of each app with vectors, for the
  configured provider) and by ``reindex_memories``, under an advisory lock so that processes arriving together do
  not collide; queries use the same expression so the planner can take it. Never on the request path: the service
  may run as a database role without DDL rights (``check_hnsw_index`` only looks the index up).
- ``ScopeSizes``: the exact-vs-ANN plan choice. A scope of at most ``threshold`` vectors (counted with a bounded
  probe, cached briefly) is ranked exactly: walking HNSW for a selective filter visits more candidates than the
  scope holds, so exact is faster there and has recall 1. A larger scope walks HNSW with pgvector's iterative scan.
- ``reciprocal_rank_fusion``: fusing ranked lists.
- ``set_local``: the planner and pgvector settings of one search query, in one round trip.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models.signals import post_migrate

from apps.retrieval.embeddings import EmbeddingProvider

logger = logging.getLogger(__name__)

# Indexes known to exist, per (database alias, index name); a missing one is looked up again after
# _MISSING_RECHECK_SECONDS (and logged each time).
_present: set[tuple[str, str]] = set()
_missing_until: dict[tuple[str, str], float] = {}
_MISSING_RECHECK_SECONDS = 60.0
# The class half of the two-int advisory lock taken while an index is created: apart from every other advisory lock
# of the service (apps.memories.services, apps.retrieval.leases).
_INDEX_LOCK_CLASS = 0x686E7377  # "hnsw"


def model_tag(provider: EmbeddingProvider) -> str:
    """What a vector was made with; vectors of another tag are never compared with this provider's queries."""
    return f"{provider.name}:{provider.dimension}"


def vector_literal(vector: Sequence[float]) -> str:
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


def similarity(distance: float) -> float:
    """Cosine distance → similarity clamped to [0, 1] (opposite directions score 0, not negative). A zero vector
    (a text with no words, for the hashing embedder) has no direction: pgvector's distance to it is NaN, which is
    no match (0), never a perfect one."""
    if math.isnan(distance):
        return 0.0
    return max(0.0, min(1.0, 1.0 - distance))


def check_hnsw_index(index_name: str) -> bool:
    """Whether the HNSW index ``index_name`` exists; never creates it (DDL belongs to ``manage.py migrate``: the
    service may run as a role with DML rights only). Search works without it, ranking exactly, only slower, so a
    missing index is a warning naming the fix, not an error."""
    key = (connection.alias, index_name)
    if key in _present:
        return True
    now = time.monotonic()
    if _missing_until.get(key, 0.0) > now:
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [index_name])
        exists = bool(cursor.fetchone()[0])
    if exists:
        _present.add(key)
        _missing_until.pop(key, None)
    else:
        _missing_until[key] = now + _MISSING_RECHECK_SECONDS
        logger.warning(
            "HNSW index %s is missing: vector search scans instead; run `manage.py migrate` to create it", index_name
        )
    return exists


def set_local(cursor: Any, parameters: dict[str, str | int]) -> None:
    """``SET LOCAL`` of every name in ``parameters`` (for the rest of the open transaction) in one round trip:
    ``set_config(name, value, true)`` is SET LOCAL. A search set three or four of them one statement at a time, each
    a round trip of its own. Names and values come from code and settings, never from callers."""
    cursor.execute(
        "SELECT " + ", ".join(["set_config(%s, %s, true)"] * len(parameters)),
        [item for name, value in parameters.items() for item in (name, str(value))],
    )


def create_hnsw_index(table: str, index_name: str, dimension: int, using: str = DEFAULT_DB_ALIAS) -> None:
    """The index, unless it exists (or ``table`` does not, e.g. after migrating an app to zero); safe when several
    processes (two ``migrate`` runs of a rolling deploy) get there at once. ``table`` and ``index_name`` come from
    code, never from callers."""
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL", [table, index_name])
        table_exists, index_exists = cursor.fetchone()
        if not table_exists or index_exists:
            return
        # IF NOT EXISTS alone lets two sessions past its check at once, and the second then fails on pg_class's
        # unique index ("duplicate key value violates unique constraint pg_class_relname_nsp_index": a 500 on a
        # semantic search when both web workers took their first one together). Under the lock the second waits
        # for the first to commit and then finds the index.
        # Building the index over an existing table can take longer than any request's statement may.
        cursor.execute("SET LOCAL statement_timeout = 0")
        cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [_INDEX_LOCK_CLASS, index_name])
        # Inside a transaction that wrote vectors, deferred FK checks must run before an index can be built.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(
            f"CREATE INDEX IF NOT EXISTS {index_name} ON {table} "
            f"USING hnsw ((embedding::vector({dimension})) vector_cosine_ops) "
            f"WITH (m = {int(settings.MEMORY_VECTOR_HNSW_M)}, ef_construction = "
            f"{int(settings.MEMORY_VECTOR_HNSW_EF_CONSTRUCTION)}) "
            # Partial: rows of another dimension (during a provider change) must not be cast.
            f"WHERE vector_dims(embedding) = {dimension}"
        )


def create_index_after_migrate(app: AppConfig, create_index: Callable[..., None]) -> None:
    """After every ``manage.py migrate`` of ``app``: ``create_index(dimension, using=...)`` for the configured
    embedding provider's dimension (a new provider's too, on the next migrate). DDL runs there, under the migrating
    role, never on the request path."""

    def after_migrate(sender: AppConfig, using: str = DEFAULT_DB_ALIAS, **kwargs: Any) -> None:
        from apps.retrieval.embeddings import get_provider

        try:
            dimension = get_provider().dimension
        except ImproperlyConfigured as exc:  # the schema migrates all the same; the service will not start like this
            logger.warning("no HNSW index for %s: the embedding provider is misconfigured (%s)", app.label, exc)
            return
        create_index(dimension, using=using)

    # weak=False: nothing else holds the closure.
    post_migrate.connect(after_migrate, sender=app, weak=False, dispatch_uid=f"{app.label}.create_vector_index")


def forget_checked() -> None:
    """Forget what check_hnsw_index found (tests, benchmarks that drop and rebuild the index)."""
    _present.clear()
    _missing_until.clear()


class ScopeSizes:
    """Bounded, briefly cached counts of the vectors in a search scope: the input of the exact-vs-ANN choice.

    The probe stops at threshold + 1 (a large scope costs no more than a small one) and its result is reused for
    ``MEMORY_VECTOR_SCOPE_SIZE_CACHE_SECONDS``: a user's scope repeats from search to search, and a stale size only
    picks the other plan, both of which return correct results."""

    MAX_ENTRIES = 10_000

    def __init__(self) -> None:
        self._sizes: dict[tuple, tuple[float, int]] = {}

    def count(self, from_where_sql: str, params: list[Any], threshold: int) -> int:
        """``SELECT count(*)`` over ``SELECT 1 {from_where_sql}``, counting no further than threshold + 1."""
        key = (connection.alias, from_where_sql, repr(params), threshold)
        now = time.monotonic()
        cached = self._sizes.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT count(*) FROM (SELECT 1 {from_where_sql} LIMIT %s) AS s",  # noqa: S608 - SQL from code
                [*params, threshold + 1],
            )
            size = int(cursor.fetchone()[0])
        if len(self._sizes) >= self.MAX_ENTRIES:
            self._sizes.clear()
        self._sizes[key] = (now + settings.MEMORY_VECTOR_SCOPE_SIZE_CACHE_SECONDS, size)
        return size

    def clear(self) -> None:
        self._sizes.clear()

    def exact(self, from_where_sql: str, params: list[Any]) -> bool:
        """True when the scope is small enough to rank exactly (MEMORY_VECTOR_EXACT_SCAN_THRESHOLD; 0 = never)."""
        threshold = int(settings.MEMORY_VECTOR_EXACT_SCAN_THRESHOLD)
        return threshold > 0 and self.count(from_where_sql, params, threshold) <= threshold


RRF_K = 60  # the constant of Cormack et al.; dampens the weight of the very first ranks


def reciprocal_rank_fusion(rankings: Sequence[Sequence[Hashable]], k: int = RRF_K) -> dict[Hashable, float]:
    """Fused score per item, normalised to [0, 1]: sum over the lists of 1 / (k + rank), divided by the score of
    an item ranked first in every list. An item missing from a list gets nothing from it."""
    if not rankings:
        return {}
    best = len(rankings) / (k + 1)
    fused: dict[Hashable, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            fused[item] = fused.get(item, 0.0) + 1.0 / (k + rank)
    return {item: min(1.0, score / best) for item, score in fused.items()}
