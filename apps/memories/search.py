"""Memory search with a query (D4, D11): by meaning, by words, or both (``search_type``), for one question or several.

- ``semantic``: the query embedded, ANN in pgvector inside the caller's scope (vector_index), plus the newest short
  versions the indexer has not embedded yet (apps.memories.fresh: read your writes). Score: cosine similarity.
- ``fulltext``: the keyword index (apps.memories.keyword_index): BM25 over keyed term hashes, statistics from the
  caller's own scope. Score: BM25 against the query's ceiling, in [0, 1].
- ``auto`` (default): both, the words read while the encoder embeds the query (apps.retrieval.embeddings.meanwhile).
  Candidates are the best ``depth`` of each list (depth = offset + limit, or per_query_limit); a candidate only one
  list found gets the other half computed (its vectors' distance, or 0 for words it lacks); one without vectors yet
  (and not embedded by the search itself) is scored by its words alone. Score: ``w * similarity + (1 - w) * words``
  above a floor (apps.retrieval.lexical.hybrid_score, as conversation search's), w = MEMORY_SEARCH_SEMANTIC_WEIGHT,
  in [0, 1]. Why scores and not reciprocal ranks: rank fusion gives a list's first place the same weight whether its
  words were a rare code or two common words. When the embedding provider is down, ``auto`` answers by words alone
  (``semantic`` answers 503).

``queries`` (D11): every question's text embedded in one encoder pass (with the pending versions), each ranked as
above to ``per_query_limit``, the lists fused by reciprocal rank (k = 60); score = the fused sum divided by the most
it can be (first in every list), in [0, 1]; ``matched_queries`` names the questions whose list held the item.

Scope, attribute filters, prefixes, policy and expiry apply to every list as to attribute search (selectors.scope_for).
A version deleted or superseded since it was indexed takes no place (its vectors and terms are skipped in SQL); the
primary-store read below checks state and expiry once more, as it fetches and decrypts the values.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from apps.core import errors
from apps.identity.principal import Principal
from apps.memories import fresh, keyword_index, selectors, vector_index
from apps.memories.models import Memory, MemoryState
from apps.memories.responses import MemorySearchItem
from apps.memories.services import VALUE_PURPOSE
from apps.memories.vector_index import Neighbour
from apps.retrieval import lexical, vectors
from apps.retrieval.embeddings import EmbeddingError, get_provider, meanwhile

logger = logging.getLogger(__name__)

similarity = vectors.similarity  # cosine distance -> similarity clamped to [0, 1]

Ranked = list[tuple[Any, float]]  # (memory id, score in [0, 1]), best first


@dataclass(frozen=True)
class Question:
    text: str
    label: str  # what matched_queries says: the purpose, or the text


def search(
    principal: Principal,
    *,
    namespace_prefix: list[str],
    filter: Any,
    limit: int,
    offset: int,
    query: str | None = None,
    queries: Sequence[dict] | None = None,
    per_query_limit: int | None = None,
    search_type: str = "auto",
) -> list[dict]:
    """The page of a search with ``query`` or ``queries`` (exactly one), as MemorySearchItem bodies."""
    scope = selectors.scope_for(principal, namespace_prefix, filter)
    if queries is None:
        (ranked,) = _rank(scope, [query or ""], search_type, offset + limit)
        return _items(ranked[offset : offset + limit], None)
    questions = [Question(q["text"], q.get("purpose") or q["text"]) for q in queries]
    lists = _rank(scope, [q.text for q in questions], search_type, per_query_limit or limit)
    fused, matched = _fuse(lists, questions)
    return _items(fused[offset : offset + limit], matched)


def arguments(data: dict) -> dict[str, Any]:
    """search()'s keyword arguments from a validated MemorySearchSerializer body (the view's and the MCP tool's)."""
    names = ("namespace_prefix", "query", "queries", "per_query_limit", "search_type")
    return {"filter": data.get("filter"), **{name: data[name] for name in names if name in data}}


def _rank(scope: Any, texts: list[str], search_type: str, depth: int) -> list[Ranked]:
    """Each text's ranked list, best ``depth`` first."""
    if search_type == "fulltext":
        return [_best(dict(keyword_index.ranked(scope, text, depth)), depth) for text in texts]
    provider = get_provider()
    versions = fresh.pending_in_scope(scope)
    if search_type == "semantic":
        try:
            query_vectors, pending = fresh.embed_with_pending(provider, texts, versions)
        except EmbeddingError as exc:
            raise errors.unavailable("The embedding provider is unavailable; try again shortly.") from exc
        return [_best(_meaning(provider, scope, vector, pending, depth), depth) for vector in query_vectors]
    # auto: the words need no vector, so they are read while the encoder embeds (meanwhile: on another core).
    # Next to meaning, a common term's first matches only (keyword_index.ranked).
    embedding = meanwhile.start(fresh.embed_with_pending, provider, texts, versions)
    words_lists = [
        dict(keyword_index.ranked(scope, text, depth, exhaustive=False, common_weight=lexical.COMMON_WORD_WEIGHT))
        for text in texts
    ]
    try:
        query_vectors, pending = embedding.result()
    except EmbeddingError:
        logger.warning("embedding provider unavailable; auto search answers by words alone", exc_info=True)
        # Words alone read every match, as fulltext.
        return [_best(dict(keyword_index.ranked(scope, text, depth)), depth) for text in texts]
    weight = float(settings.MEMORY_SEARCH_SEMANTIC_WEIGHT)
    lists = []
    for vector, words in zip(query_vectors, words_lists, strict=True):
        meaning = _meaning(provider, scope, vector, pending, depth)
        meaning.update(_similarities(provider, vector, pending, [m for m in words if m not in meaning]))
        fused = {
            # A version with no vectors yet (waiting for the indexer beyond what the search embeds) has no meaning
            # to weigh: its words alone score it, as when the embedder is down, rather than a similarity of 0.
            memory_id: words[memory_id]
            if memory_id not in meaning
            else lexical.hybrid_score(meaning[memory_id], words.get(memory_id, 0.0), weight)
            for memory_id in meaning.keys() | words.keys()
        }
        lists.append(_best(fused, depth))
    return lists


def _meaning(provider: Any, scope: Any, query_vector: list[float], pending: dict, depth: int) -> dict[Any, float]:
    """The ``depth`` nearest versions of ``scope`` by meaning, with those still waiting for the indexer."""
    neighbours = vector_index.nearest_memories(
        provider=provider,
        query_vector=query_vector,
        namespace_prefix=scope.namespace_prefix,
        attribute_filter=scope.attribute_filter,
        count=depth,
    )
    return {n.memory_id: similarity(n.distance) for n in fresh.merge(neighbours, query_vector, pending, depth)}


def _similarities(provider: Any, query_vector: list[float], pending: dict, memory_ids: list[Any]) -> dict[Any, float]:
    """The meaning half for memories only the keyword list found: their stored vectors', or their pending ones'."""
    if not memory_ids:
        return {}
    stored = vector_index.distances(provider, query_vector, memory_ids)
    waiting = {memory_id: pending[memory_id] for memory_id in memory_ids if memory_id in pending}
    best = fresh.merge(
        [Neighbour(memory_id, distance) for memory_id, distance in stored.items()],
        query_vector,
        waiting,
        len(memory_ids),
    )
    return {n.memory_id: similarity(n.distance) for n in best}


def _best(scores: dict[Any, float], depth: int) -> Ranked:
    return sorted(scores.items(), key=lambda item: (-item[1], str(item[0])))[:depth]


def _fuse(lists: list[Ranked], questions: list[Question]) -> tuple[Ranked, dict[Any, list[str]]]:
    """Reciprocal-rank fusion of the questions' lists (vectors.reciprocal_rank_fusion), and who found what."""
    fused = vectors.reciprocal_rank_fusion([[memory_id for memory_id, _ in ranked] for ranked in lists])
    matched: dict[Any, list[str]] = {}
    for ranked, question in zip(lists, questions, strict=True):
        for memory_id, _score in ranked:
            labels = matched.setdefault(memory_id, [])
            if question.label not in labels:
                labels.append(question.label)
    return _best(fused, len(fused)), matched


def _items(page: Ranked, matched: dict[Any, list[str]] | None) -> list[dict]:
    if not page:
        return []
    now = timezone.now()
    rows = {
        memory.id: memory
        for memory in Memory.objects.filter(
            id__in=[memory_id for memory_id, _ in page], state=MemoryState.ACTIVE
        ).filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
    }
    items = []
    for memory_id, score in page:
        memory = rows.get(memory_id)
        if memory is None:  # deleted, superseded or expired since it was ranked
            continue
        value = selectors.decrypt_value(memory.value_ciphertext, VALUE_PURPOSE, memory.id)
        if matched is None:
            items.append(MemorySearchItem.from_object(memory, value=value, score=score))
        else:
            items.append(
                MemorySearchItem.from_object(memory, value=value, score=score, matched_queries=matched[memory_id])
            )
    return items
