"""Read your writes by meaning (D11): a semantic search finds a version written before it began, even while the
background indexer has not embedded it yet.

The indexer embeds new versions within about a second (apps.memories.indexer); until then a version has no vectors,
and the ANN query (vector_index) cannot see it. So a search also reads the newest versions of its own scope still
waiting for the indexer (at most MEMORY_SEARCH_PENDING_LIMIT, each with index text of at most
MEMORY_SEARCH_PENDING_MAX_CHARS characters in all), embeds them in its query's encoder pass, and ranks them with the
ANN neighbours by the same cosine distance. Nothing is written on the read path: the indexer stores their vectors
as before.

Why here and not in the PUT (measured with bench/read_your_writes.py, see the README): embedding a short text costs
the local model about 9 ms of CPU on the reference machine, three times a whole PUT, and every PUT with an index
would pay it; a search pays only for versions the indexer has not reached yet, once per web process (``_CACHE``: a
version's index text never changes, so neither do its vectors).

Scope is the search's own: the caller's policy-narrowed prefix and attribute filter, active and unexpired versions
only, as the ANN query. A version replaced or deleted is no longer pending (services._close_sql), so it is never
embedded here, and the primary-store read after the ranking checks state and expiry once more.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.utils import timezone

from apps.core.db.prepared import bound_cursor
from apps.memories import filters, vector_index
from apps.memories.vector_index import Neighbour
from apps.retrieval.embeddings import EmbeddingError, EmbeddingProvider

__all__ = ["Pending", "embed_with_pending", "merge", "pending_in_scope"]

logger = logging.getLogger(__name__)

# A version is waiting for the indexer, alive, in scope, and not one the indexer failed on (such a text may fail
# again, and a search must not pay for it over and over). Its index text's length is counted in characters, as the
# setting says. Newest first: the versions a caller just wrote. For a scope inside one user's subtree the
# owner-led prefix match walks the indexer's own queue index (memories_index_owner_queue) newest first.
_PENDING_SQL = (
    "SELECT t.id, t.indexed_content FROM memories t "
    "WHERE t.index_status = 'pending' AND t.state = 'active' AND t.index_quarantined_at IS NULL "
    "AND t.index_failures = 0 AND (t.expires_at IS NULL OR t.expires_at > %s) AND {prefix} AND {filter} "
    "AND (SELECT coalesce(sum(char_length(f.value)), 0) FROM jsonb_each_text(t.indexed_content) f) <= %s "
    "ORDER BY t.created_at DESC, t.id DESC LIMIT %s"
)


@dataclass(frozen=True)
class Pending:
    """A version the indexer has not embedded yet: its id and its non-blank index fields' texts."""

    memory_id: Any
    texts: tuple[str, ...]


def pending_in_scope(scope: Any) -> list[Pending]:
    """The newest pending versions with short index text inside ``scope`` (a selectors.Scope), newest first."""
    limit = int(settings.MEMORY_SEARCH_PENDING_LIMIT)
    if limit <= 0:
        return []
    prefix_sql, prefix_params = filters.owner_prefix_sql(scope.namespace_prefix, "t.namespace")
    filter_sql, filter_params = filters.to_sql(scope.attribute_filter, "t.attributes")
    # Bound server-side (apps.core.db.prepared) but planned on every call: the prefix's selectivity picks the plan
    # (the owner's queue index for a whole subtree, the namespace GIN index for a narrow prefix).
    with bound_cursor() as cursor:
        cursor.execute(
            _PENDING_SQL.format(prefix=prefix_sql, filter=filter_sql),
            [timezone.now(), *prefix_params, *filter_params, int(settings.MEMORY_SEARCH_PENDING_MAX_CHARS), limit],
        )
        rows = cursor.fetchall()
    found = []
    for memory_id, content in rows:
        content = json.loads(content) if isinstance(content, str) else content
        found.append(
            Pending(memory_id, tuple(text for _field, text in sorted((content or {}).items()) if text.strip()))
        )
    return found


class _VectorCache:
    """Vectors of pending versions this process embedded, by (model tag, version id). A version's index text never
    changes (a new text is a new version), so an entry is never stale; it is only unneeded once the indexer has
    stored the version's vectors, and the oldest entries make room."""

    MAX_ENTRIES = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, Any], list[list[float]]] = OrderedDict()

    def get(self, key: tuple[str, Any]) -> list[list[float]] | None:
        with self._lock:
            vectors = self._entries.get(key)
            if vectors is not None:
                self._entries.move_to_end(key)
            return vectors

    def put(self, key: tuple[str, Any], vectors: list[list[float]]) -> None:
        with self._lock:
            self._entries[key] = vectors
            self._entries.move_to_end(key)
            while len(self._entries) > self.MAX_ENTRIES:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


_CACHE = _VectorCache()


def embed_with_pending(
    provider: EmbeddingProvider, queries: Sequence[str], pending: Sequence[Pending]
) -> tuple[list[list[float]], dict[Any, list[list[float]]]]:
    """The queries' vectors, and each pending version's vectors: those not cached yet are embedded in the same
    encoder pass as the queries. A failure of that pass never fails the search: the queries are embedded alone
    and the pending versions wait for the indexer (a query that cannot be embedded raises EmbeddingError, as
    before)."""
    tag = vector_index.model_tag(provider)
    vectors = {version.memory_id: _CACHE.get((tag, version.memory_id)) for version in pending}
    missing = [version for version in pending if vectors[version.memory_id] is None and version.texts]
    if not missing:
        return [provider.embed_query(query) for query in queries], {
            memory_id: found for memory_id, found in vectors.items() if found
        }
    # As the indexer: each field cut into the model's chunks (a short text is one).
    pieces = {
        version.memory_id: [piece for text in version.texts for piece in provider.chunk(text)] for version in missing
    }
    texts = [piece for version in missing for piece in pieces[version.memory_id]]
    try:
        query_vectors, text_vectors = provider.embed_with_documents(list(queries), texts)
    except EmbeddingError:
        logger.warning("could not embed versions waiting for the indexer with a query", exc_info=True)
        return [provider.embed_query(query) for query in queries], {
            memory_id: found for memory_id, found in vectors.items() if found
        }
    position = 0
    for version in missing:
        embedded = text_vectors[position : position + len(pieces[version.memory_id])]
        position += len(pieces[version.memory_id])
        _CACHE.put((tag, version.memory_id), embedded)
        vectors[version.memory_id] = embedded
    return query_vectors, {memory_id: found for memory_id, found in vectors.items() if found}


def merge(
    neighbours: Sequence[Neighbour], query_vector: Sequence[float], pending: dict[Any, list[list[float]]], count: int
) -> list[Neighbour]:
    """The ``count`` nearest of the ANN neighbours and the pending versions, each memory once at its best distance.

    Cosine distance of unit vectors, as pgvector's ``<=>``; a zero vector (no direction: a text without words, for
    the hashing embedder) is no match, as in the ANN query. A version the indexer stored between the two reads is
    in both lists with the same vectors, and appears once."""
    if not pending or _norm(query_vector) == 0.0:
        return list(neighbours)[:count]
    best = {neighbour.memory_id: neighbour.distance for neighbour in neighbours}
    for memory_id, vectors in pending.items():
        for vector in vectors:
            if _norm(vector) == 0.0:
                continue
            distance = 1.0 - math.fsum(a * b for a, b in zip(query_vector, vector, strict=True))
            if distance < best.get(memory_id, math.inf):
                best[memory_id] = distance
    ranked = sorted(best.items(), key=lambda item: (item[1], str(item[0])))
    return [Neighbour(memory_id, distance) for memory_id, distance in ranked[:count]]


def _norm(vector: Sequence[float]) -> float:
    return math.sqrt(math.fsum(x * x for x in vector))
