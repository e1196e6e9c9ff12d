"""Semantic search (query mode, D4): embed the query, ANN in pgvector inside the caller's scope, then fetch and
decrypt the matching active versions from the primary store.

Versions with vectors appear, and the newest short ones of the scope still waiting for the indexer (apps.memories.fresh:
read your writes); no fallback to attribute search. A version deleted or superseded since it was
indexed is skipped inside the ANN query (vector_index), so it takes no place on the page, before the indexer
removes its vectors; the primary-store read below checks state and expiry once more, as it fetches the values.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Q
from django.utils import timezone

from apps.core import errors
from apps.identity.principal import Principal
from apps.memories import fresh, selectors
from apps.memories.models import Memory, MemoryState
from apps.memories.responses import MemorySearchItem
from apps.memories.services import VALUE_PURPOSE
from apps.retrieval import vectors
from apps.retrieval.embeddings import EmbeddingError, get_provider

similarity = vectors.similarity  # cosine distance -> similarity clamped to [0, 1]


def search(
    principal: Principal, *, namespace_prefix: list[str], query: str, filter: Any, limit: int, offset: int
) -> list[dict]:
    scope = selectors.scope_for(principal, namespace_prefix, filter)
    provider = get_provider()
    try:
        neighbours = fresh.nearest(provider, query, scope, offset + limit)[offset:]
    except EmbeddingError as exc:
        raise errors.unavailable("The embedding provider is unavailable; try again shortly.") from exc
    if not neighbours:
        return []
    now = timezone.now()
    rows = {
        memory.id: memory
        for memory in Memory.objects.filter(id__in=[n.memory_id for n in neighbours], state=MemoryState.ACTIVE).filter(
            Q(expires_at__isnull=True) | Q(expires_at__gt=now)
        )
    }
    items = []
    for neighbour in neighbours:
        memory = rows.get(neighbour.memory_id)
        if memory is None:  # deleted, superseded or expired since it was indexed
            continue
        items.append(
            MemorySearchItem.from_object(
                memory,
                value=selectors.decrypt_value(memory.value_ciphertext, VALUE_PURPOSE, memory.id),
                score=similarity(neighbour.distance),
            )
        )
    return items
