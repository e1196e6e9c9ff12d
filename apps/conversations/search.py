"""Conversation search (D5): full-text, semantic and both fused, over history entries' index text.

Reads only. Access is decided inside the SQL that ranks: a user's search starts from their memberships
(apps.sharing.access.member_trees), so a page is never short because of filtering afterwards and a
membership removed is out of the very next search. Admin search (auditor/admin) ranks every live conversation.

- ``fulltext``: the generated ``search_vector`` (``to_tsvector('english', indexed_content)``, GIN) matched with
  ``websearch_to_tsquery`` (quotes, ``or``, ``-word``), the last word also as a prefix (``lisb`` finds Lisbon) unless
  it is quoted or negated; ranked by ``ts_rank_cd`` with length normalisation and ``rank / (rank + 1)``, so the
  score is in [0, 1).
- ``semantic``: the query embedded with the configured provider, cosine distance to the entries' vectors
  (apps.conversations.vector_index); score = 1 - distance clamped to [0, 1].
- ``auto`` (default): both, fused by reciprocal rank fusion over each method's best
  ``CONVERSATION_SEARCH_FUSION_DEPTH`` conversations, score normalised to [0, 1]. When the embedding provider is
  down, ``auto`` answers with full-text alone (``semantic`` answers 503).

Every method keeps the best hit per conversation and orders by (score, conversation id); ``afterCursor`` is that
keyset position, tagged with the method, the scope (user or admin) and a digest of the query, so a cursor from
another search is a 400 and paging a fixed result set never repeats a conversation.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection

from apps.conversations import selectors, vector_index
from apps.conversations.responses import SearchResult, UnindexedItem
from apps.core import errors, pagination
from apps.retrieval import vectors
from apps.retrieval.embeddings import EmbeddingError, get_provider
from apps.sharing import access

logger = logging.getLogger(__name__)

TS_CONFIG = "english"  # fixed: the generated search_vector column (migration 0002) uses the same configuration
SEARCH_TYPES = ("auto", "fulltext", "semantic")
HEADLINE_OPTIONS = "StartSel=**, StopSel=**, MaxWords=35, MinWords=12, MaxFragments=2, FragmentDelimiter=\" … \""
# The tsquery the user's text compiles to. The prefix form turns the last lexeme 'x' into 'x':*.
_TSQUERY = f"websearch_to_tsquery('{TS_CONFIG}', %s)"
_TSQUERY_PREFIX = f"regexp_replace(websearch_to_tsquery('{TS_CONFIG}', %s)::text, '''$', ''':*')::tsquery"


@dataclass(frozen=True)
class Hit:
    conversation_id: UUID
    entry_id: UUID
    score: float  # higher is better, in [0, 1]
    position: float  # the keyset sort value (descending for every method)


@dataclass(frozen=True)
class SearchScope:
    """Which conversations a search covers: those ``user_id`` is a member of, or (None) every live one, for the
    admin search."""

    user_id: str | None

    @property
    def tag(self) -> str:
        return "admin" if self.user_id is None else "user"


def _prefix_last_word(query: str) -> bool:
    """Whether the last word of the query is typed as a bare word (a prefix is then also matched)."""
    stripped = query.rstrip()
    if not stripped or not re.search(r"\w$", stripped) or stripped.count('"') % 2:
        return False
    last = stripped.split()[-1]
    return not last.startswith(("-", '"')) and last.lower() != "or"


def tsquery_sql(query: str) -> tuple[str, list[Any]]:
    return (_TSQUERY_PREFIX if _prefix_last_word(query) else _TSQUERY), [query]


# --- Full-text --------------------------------------------------------------------------------------------------


def fulltext_hits(scope: SearchScope, query: str, *, limit: int, after: tuple[float, UUID] | None) -> list[Hit]:
    """The best ``limit`` conversations by their best-ranked entry, after the keyset position ``after``."""
    tsq_sql, tsq_params = tsquery_sql(query)
    if scope.user_id is None:
        source = "conversations c JOIN conversation_entries e ON e.conversation_id = c.id"
        where, params = ["c.deleted_at IS NULL"], []
    else:
        trees = access.member_trees(scope.user_id)
        source = (
            f"{trees.sql} m JOIN conversations c ON c.root_id = m.root_id AND c.deleted_at IS NULL "
            "JOIN conversation_entries e ON e.conversation_id = c.id"
        )
        where, params = ["TRUE"], [*trees.params]
    keyset, keyset_params = "TRUE", []
    if after is not None:
        keyset = "(b.rank < %s OR (b.rank = %s AND b.conversation_id > %s))"
        keyset_params = [after[0], after[0], after[1]]
    sql = f"""
        WITH q AS (SELECT {tsq_sql} AS tsq),
        best AS (
            SELECT DISTINCT ON (e.conversation_id) e.conversation_id, e.id AS entry_id,
                   ts_rank_cd(e.search_vector, q.tsq, 1 | 32)::float8 AS rank
            FROM q, {source}
            WHERE {' AND '.join(where)} AND e.channel = 'history' AND e.search_vector @@ q.tsq
            ORDER BY e.conversation_id, rank DESC, e.id
        )
        SELECT b.conversation_id, b.entry_id, b.rank FROM best b WHERE {keyset}
        ORDER BY b.rank DESC, b.conversation_id LIMIT %s
    """  # noqa: S608 - fragments come from code; values are bound parameters
    with connection.cursor() as cursor:
        cursor.execute(sql, [*tsq_params, *params, *keyset_params, limit])
        rows = cursor.fetchall()
    return [Hit(conv, entry, max(0.0, min(1.0, rank)), rank) for conv, entry, rank in rows]


# --- Semantic ---------------------------------------------------------------------------------------------------


def _embed_query(query: str):
    provider = get_provider()
    return provider, provider.embed_query(query)


def semantic_hits(
    scope: SearchScope, query: str, *, limit: int, after: tuple[float, UUID] | None, query_vector=None, provider=None
) -> list[Hit]:
    if query_vector is None:
        try:
            provider, query_vector = _embed_query(query)
        except EmbeddingError as exc:
            raise errors.unavailable("The embedding provider is unavailable; try again shortly.") from exc
    # The keyset runs on distance ascending; Hit.position is its negation so every method pages descending.
    after_distance = None if after is None else (-after[0], after[1])
    neighbours = vector_index.nearest_conversations(
        provider=provider, query_vector=query_vector, user_id=scope.user_id, count=limit, after=after_distance
    )
    return [Hit(n.conversation_id, n.entry_id, vectors.similarity(n.distance), -n.distance) for n in neighbours]


# --- Fused ------------------------------------------------------------------------------------------------------


def auto_hits(scope: SearchScope, query: str, *, limit: int, after: tuple[float, UUID] | None) -> list[Hit]:
    """Reciprocal rank fusion of the two methods' best FUSION_DEPTH conversations each. The depth is fixed (not
    derived from the page) so a conversation's fused score is the same on every page: paging is stable."""
    depth = int(settings.CONVERSATION_SEARCH_FUSION_DEPTH)
    lexical = fulltext_hits(scope, query, limit=depth, after=None)
    try:
        provider, query_vector = _embed_query(query)
        semantic = semantic_hits(
            scope, query, limit=depth, after=None, query_vector=query_vector, provider=provider
        )
    except EmbeddingError:
        logger.warning("embedding provider unavailable; auto search answers with full-text only", exc_info=True)
        semantic = []
    fused = vectors.reciprocal_rank_fusion(
        [[hit.conversation_id for hit in lexical], [hit.conversation_id for hit in semantic]]
    )
    # The entry shown: the full-text hit when there is one (its highlights show the matched words).
    entries = {hit.conversation_id: hit.entry_id for hit in semantic}
    entries.update({hit.conversation_id: hit.entry_id for hit in lexical})
    ranked = sorted(fused.items(), key=lambda item: (-item[1], str(item[0])))
    hits = []
    for conversation_id, score in ranked:
        if after is not None and not (score < after[0] or (score == after[0] and str(conversation_id) > str(after[1]))):
            continue
        hits.append(Hit(conversation_id, entries[conversation_id], score, score))
        if len(hits) == limit:
            break
    return hits


# --- The page ---------------------------------------------------------------------------------------------------

_METHODS = {"fulltext": fulltext_hits, "semantic": semantic_hits, "auto": auto_hits}


def cursor_tag(scope: SearchScope, search_type: str, query: str) -> str:
    digest = hashlib.sha256(query.encode("utf-8")).hexdigest()[:16]
    return f"search.{scope.tag}.{search_type}.{digest}"


def search(scope: SearchScope, *, query: str, search_type: str, limit: int, cursor: str | None) -> dict:
    """One page of the envelope ``{"data": [search result], "afterCursor"}``."""
    page = pagination.keyset_page(
        _Ranking(scope, query, _METHODS[search_type]), tag=cursor_tag(scope, search_type, query), cursor=cursor,
        limit=limit,
    )
    return pagination.envelope(_results(page.items, query), page.next_cursor)


@dataclass(frozen=True)
class _Ranking:
    """A search method's hits as a keyset (apps.core.pagination): best first by (position, conversation id)."""

    scope: SearchScope
    query: str
    method: Callable[..., list[Hit]]
    kind: type = float

    def fetch(self, after: tuple[float, UUID] | None, count: int) -> list[Hit]:
        return self.method(self.scope, self.query, limit=count, after=after)

    def key(self, hit: Hit) -> tuple[float, UUID]:
        return hit.position, hit.conversation_id


def _results(hits: list[Hit], query: str) -> list[dict]:
    """The page's entries (decrypted), titles and highlights, in one query, in the hits' order."""
    if not hits:
        return []
    tsq_sql, tsq_params = tsquery_sql(query)
    sql = f"""
        SELECT e.id, e.conversation_id, e.user_id, e.channel, e.content_type, e.content, e.created_at, e.key, c.title,
               ts_headline('{TS_CONFIG}', coalesce(e.indexed_content, ''), {tsq_sql}, %s)
        FROM conversation_entries e JOIN conversations c ON c.id = e.conversation_id AND c.deleted_at IS NULL
        WHERE e.id = ANY(%s)
    """  # noqa: S608 - fragments come from code
    with connection.cursor() as cursor:
        cursor.execute(sql, [*tsq_params, HEADLINE_OPTIONS, [hit.entry_id for hit in hits]])
        rows = {row[0]: row for row in cursor.fetchall()}
    results = []
    for hit in hits:
        row = rows.get(hit.entry_id)
        if row is None:  # its conversation was deleted since the ranking query
            continue
        results.append(
            SearchResult.render(
                conversation_id=row[1],
                conversation_title=row[8],
                entry_id=row[0],
                score=hit.score,
                highlights=row[9],
                entry=selectors.entry_row(row[:8]),
            )
        )
    return results


# --- Unindexed entries ------------------------------------------------------------------------------------------

UNINDEXED_CURSOR = "conversations.unindexed"


def unindexed(*, cursor: str | None, limit: int) -> dict:
    """History entries of live conversations with no index text yet, oldest first (indexer role)."""
    page = pagination.keyset_page(
        pagination.SqlKeyset(
            "SELECT e.id, e.conversation_id, e.user_id, e.channel, e.content_type, e.content, e.created_at, e.key "
            "FROM conversation_entries e JOIN conversations c ON c.id = e.conversation_id",
            ["e.indexed_content IS NULL", "e.channel = 'history'", "c.deleted_at IS NULL"], [],
            order=("e.created_at", "e.id"), position_index=6,
        ),
        tag=UNINDEXED_CURSOR, cursor=cursor, limit=limit,
    )
    data = [UnindexedItem.render(conversation_id=row[1], entry=selectors.entry_row(row)) for row in page.items]
    return pagination.envelope(data, page.next_cursor)

