"""Conversation search (D5): full-text, semantic and both fused, over history entries' index text.

Reads only. Access is decided inside the SQL that ranks: a user's search starts from their memberships
(apps.sharing.access.member_trees), so a page is never short because of filtering afterwards and a
membership removed is out of the very next search. Admin search (auditor/admin) ranks every live conversation.

- ``fulltext``: BM25 (apps.retrieval.lexical) over the generated ``search_vector`` (``to_tsvector('english',
  indexed_content)``, GIN). An entry matches when it holds ANY of the query's words (stemmed; at most
  MAX_QUERY_TERMS), the last bare word also as a prefix (``lisb`` finds Lisbon); websearch syntax still filters:
  a ``"quoted phrase"`` must be present, ``-word`` / ``-"a phrase"`` must not. Each matched word weighs by its idf,
  tf is its number of positions in the entry's vector, dl the vector's number of lexemes. idf counts conversations
  (what search returns): N = the caller's live conversations (their member trees, or every one for admin search),
  df = those with an entry holding the word, so another tenant's texts never move a caller's scores; avgdl is the
  mean length of the entries matching any query word. Neither needs a pass over the scope's entries: the cost
  follows the entries that match (GIN), not the scope's size. score = raw / ceiling (the best any entry could
  reach), in [0, 1].
- ``semantic``: the query embedded with the configured provider, cosine distance to the entries' vectors
  (apps.conversations.vector_index); score = 1 - distance clamped to [0, 1].
- ``auto`` (default): both, fused by score over each method's best ``CONVERSATION_SEARCH_FUSION_DEPTH``
  conversations (``auto_hits``), in [0, 1]. When the embedding provider is down, ``auto`` answers with full-text
  alone (``semantic`` answers 503).

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
from apps.retrieval import lexical, vectors
from apps.retrieval.embeddings import EmbeddingError, get_provider, meanwhile
from apps.sharing import access

logger = logging.getLogger(__name__)

TS_CONFIG = "english"  # fixed: the generated search_vector column (migration 0002) uses the same configuration
SEARCH_TYPES = ("auto", "fulltext", "semantic")
HEADLINE_OPTIONS = 'StartSel=**, StopSel=**, MaxWords=35, MinWords=12, MaxFragments=2, FragmentDelimiter=" … "'
MAX_QUERY_TERMS = 24  # a query's lexemes that rank (in query order): bounds the terms joined per candidate
# A term's frequency in an entry: with every weight 1 and no normalization, the cover density of a one-term query
# is the number of the term's positions in the vector (a prefix: of every lexeme it begins). Three times cheaper
# than unnest(vector) per candidate, measured at 8,880 candidates.
_TF = "ts_rank_cd('{1,1,1,1}'::float4[], m.search_vector, t.q, 0)::float8"
MIN_PREFIX_CHARS = 3  # a shorter last word is matched whole: "b":* would make most of the scope a candidate


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


# websearch syntax, read the way websearch_to_tsquery reads it: "a phrase" (an unclosed quote runs to the end),
# -word and -"a phrase" exclude, "or" between words is the operator (every word is optional here anyway).
_PIECE = re.compile(r'(-?)"([^"]*)"?|(\S+)')


@dataclass(frozen=True)
class ParsedQuery:
    """A full-text query: ``words`` rank (any may match; the last one also as a prefix when ``prefix_last``),
    ``phrases`` must all be present in that order (their words rank too), ``excluded`` must be absent."""

    words: tuple[str, ...]
    phrases: tuple[str, ...]
    excluded: tuple[str, ...]
    prefix_last: bool

    @property
    def filter_text(self) -> str:
        """The phrases and exclusions as websearch text: what a candidate must satisfy besides matching a term."""
        return " ".join([*(f'"{p}"' for p in self.phrases), *(f'-"{x}"' for x in self.excluded)])


def parse_query(query: str) -> ParsedQuery:
    words: list[str] = []
    phrases: list[str] = []
    excluded: list[str] = []
    for match in _PIECE.finditer(query.replace("\x00", " ")):
        negated, phrase, word = match.group(1), match.group(2), match.group(3)
        if phrase is not None:
            (excluded if negated else phrases).append(phrase.replace('"', " "))
        elif word.startswith("-") and len(word) > 1:
            excluded.append(word[1:].replace('"', " "))
        elif word.lower() != "or":
            words.append(word.replace('"', " "))
    return ParsedQuery(tuple(words), tuple(phrases), tuple(excluded), _prefix_last_word(query) and bool(words))


@dataclass(frozen=True)
class Terms:
    """The query's distinct lexemes (at most MAX_QUERY_TERMS, in query order) and which are prefixes."""

    lexemes: list[str]
    prefix: list[bool]
    filter_text: str

    @property
    def tsquery(self) -> str:
        """Any of the terms, as tsquery input."""
        return self.tsquery_of(prefix=None)

    @property
    def each_tsquery(self) -> list[str]:
        """Each term alone, as tsquery input."""
        return [_quoted(lex, pre) for lex, pre in zip(self.lexemes, self.prefix, strict=True)]

    def tsquery_of(self, *, prefix: bool | None) -> str:
        """Any of the terms (only the prefixes, only the whole words, or all: None), as tsquery input (lexemes
        quoted: they may hold any character); "" when there is none."""
        quoted = [
            _quoted(lex, pre)
            for lex, pre in zip(self.lexemes, self.prefix, strict=True)
            if prefix is None or pre == prefix
        ]
        return " | ".join(quoted)


def _quoted(lexeme: str, prefix: bool) -> str:
    """A lexeme as tsquery input: quoted (it may hold any character), ``:*`` for a prefix."""
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'" + (":*" if prefix else "")


# Each piece's lexemes; those of the piece numbered by the first parameter (the last bare word) are prefixes.
_TERMS_SQL = f"""
    SELECT u.lexeme, w.ord = %s AND length(u.lexeme) >= %s
    FROM unnest(%s::text[]) WITH ORDINALITY AS w(piece, ord), LATERAL unnest(to_tsvector('{TS_CONFIG}', w.piece)) AS u
    ORDER BY w.ord, u.positions[1], u.lexeme
"""  # noqa: S608 - the configuration is a constant


def query_terms(query: str) -> Terms:
    """The lexemes the query's words and phrases stem to (the search_vector's configuration), in one round trip."""
    parsed = parse_query(query)
    pieces = [*parsed.phrases, *parsed.words]
    last = len(pieces) if parsed.prefix_last else 0  # 1-based ordinality of the prefix word; 0: none
    if not pieces:
        return Terms([], [], parsed.filter_text)
    with connection.cursor() as cursor:
        cursor.execute(_TERMS_SQL, [last, MIN_PREFIX_CHARS, pieces])
        rows = cursor.fetchall()
    seen: dict[tuple[str, bool], None] = {}
    for lexeme, prefix in rows:
        seen.setdefault((lexeme, bool(prefix)), None)
    chosen = list(seen)[:MAX_QUERY_TERMS]
    return Terms([lex for lex, _ in chosen], [pre for _, pre in chosen], parsed.filter_text)


# --- Full-text --------------------------------------------------------------------------------------------------


def _conversations_sql(scope: SearchScope) -> tuple[str, list[Any]]:
    """The scope's live conversations ``(id)``: the caller's member trees, or every one for the admin search."""
    if scope.user_id is None:
        return "SELECT c.id FROM conversations c WHERE c.deleted_at IS NULL", []
    trees = access.member_trees(scope.user_id)
    return (
        f"SELECT c.id FROM {trees.sql} m "  # noqa: S608 - fragment from code
        "JOIN conversations c ON c.root_id = m.root_id AND c.deleted_at IS NULL"
    ), [*trees.params]


def fulltext_hits(
    scope: SearchScope, query: str, *, limit: int, after: tuple[float, UUID] | None, terms: Terms | None = None
) -> list[Hit]:
    """The best ``limit`` conversations by their best entry's BM25 score (apps.retrieval.lexical), after the
    keyset position ``after``. N, df and the mean length are the scope's own: another tenant's texts never move
    these scores."""
    terms = terms if terms is not None else query_terms(query)
    if not terms.lexemes:
        return []
    conversations_sql, conversations_params = _conversations_sql(scope)
    kept, filter_from, filter_params = "TRUE", "", []
    if terms.filter_text:
        # An exclusion or phrase of stop words alone compiles to an empty tsquery, which would match nothing.
        kept = "(numnode(fq.q) = 0 OR e.search_vector @@ fq.q)"
        filter_from = f" CROSS JOIN (SELECT websearch_to_tsquery('{TS_CONFIG}', %s) AS q) fq"
        filter_params = [terms.filter_text]
    # The entries holding any term (m), then one row per (entry, term it holds) with its frequency (tf). Whole words and prefixes are matched in separate branches: the planner prices a prefix scan of the GIN index
    # high, and one OR of both made it read the whole table instead of the index.
    branches, branch_params = [], []
    whole, partial = terms.tsquery_of(prefix=False), terms.tsquery_of(prefix=True)
    matches = [("e.search_vector @@ %s::tsquery", [whole])] if whole else []
    if partial and whole:  # each entry once: those holding a whole word are the first branch's
        matches.append(("e.search_vector @@ %s::tsquery AND NOT e.search_vector @@ %s::tsquery", [partial, whole]))
    elif partial:
        matches.append(("e.search_vector @@ %s::tsquery", [partial]))
    for match_sql, match_params in matches:
        branches.append(f"""
            SELECT e.id, e.conversation_id, e.search_vector, {kept} AS kept
            FROM sc JOIN conversation_entries e ON e.conversation_id = sc.id{filter_from}
            WHERE e.channel = 'history' AND {match_sql}""")  # noqa: S608 - from code
        branch_params += [*filter_params, *match_params]
    keyset, keyset_params = "TRUE", []
    if after is not None:
        keyset = "(b.score < %s OR (b.score = %s AND b.conversation_id > %s))"
        keyset_params = [after[0], after[0], after[1]]
    idf = lexical.idf_sql("coalesce(df.df, 0)", "st.n")
    weight = lexical.term_weight_sql("i.idf", "tf.tf", "tf.dl", "dl.avgdl")
    score = lexical.normalized_sql("s.raw", lexical.ceiling_sql("ce.idf_sum"))
    # Floats are summed as numeric (exact, so in any order) and counts and lengths are integers: a conversation's
    # score is bit-identical on every page of the same search, and the keyset neither repeats nor skips.
    # idf counts conversations (what search returns): N = the scope's live conversations, df = those with an
    # entry holding the term; tf and dl are the entry's.
    sql = f"""
        WITH sc AS MATERIALIZED ({conversations_sql}),
        terms AS (SELECT t.q::tsquery AS q, t.k FROM unnest(%s::text[]) WITH ORDINALITY AS t(q, k)),
        st AS (SELECT count(*)::float8 AS n FROM sc),
        m AS MATERIALIZED ({" UNION ALL ".join(branches)}
        ),
        tf AS MATERIALIZED (
            SELECT m.id, m.conversation_id, m.kept, length(m.search_vector) AS dl, t.k, {_TF} AS tf
            FROM m CROSS JOIN terms t WHERE m.search_vector @@ t.q
        ),
        dl AS MATERIALIZED (SELECT coalesce(avg(length(m.search_vector)), 0)::float8 AS avgdl FROM m),
        df AS (SELECT d.k, count(*)::float8 AS df FROM (SELECT DISTINCT tf.k, tf.conversation_id FROM tf) d GROUP BY d.k),
        i AS MATERIALIZED (SELECT t.k, {idf} AS idf FROM terms t CROSS JOIN st LEFT JOIN df ON df.k = t.k),
        ce AS MATERIALIZED (SELECT sum(i.idf::numeric)::float8 AS idf_sum FROM i),
        s AS (
            SELECT tf.id, tf.conversation_id, sum(({weight})::numeric)::float8 AS raw
            FROM tf JOIN i ON i.k = tf.k CROSS JOIN dl
            WHERE tf.kept
            GROUP BY tf.id, tf.conversation_id
        ),
        b AS (
            SELECT DISTINCT ON (s.conversation_id) s.conversation_id, s.id AS entry_id, {score} AS score
            FROM s CROSS JOIN ce
            ORDER BY s.conversation_id, score DESC, s.id
        )
        SELECT b.conversation_id, b.entry_id, b.score FROM b WHERE {keyset}
        ORDER BY b.score DESC, b.conversation_id LIMIT %s
    """  # noqa: S608 - fragments come from code; values are bound parameters
    params = [*conversations_params, terms.each_tsquery, *branch_params, *keyset_params, limit]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return [Hit(conv, entry, score, score) for conv, entry, score in rows]


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


def auto_hits(
    scope: SearchScope, query: str, *, limit: int, after: tuple[float, UUID] | None, terms: Terms | None = None
) -> list[Hit]:
    """Score fusion of the two methods' best FUSION_DEPTH conversations each: ``w * similarity + (1 - w) *
    words`` (apps.retrieval.lexical.hybrid_score: the BM25 score above a floor, 0 when absent). The depth
    is fixed (not derived from the page) so a conversation's fused score is the same on every page: paging is
    stable.

    Why scores and not reciprocal ranks: with any-word matching, a paraphrase query matches unrelated entries on a
    common word or two, and rank fusion gives the top of that list as much weight as the top of the semantic one
    (bench/recall.py, conversation set: paraphrase recall@5 0.906 -> 0.562). A BM25 score says how much of the
    query's weight an entry matched; below the floor (common words only) it is noise and adds nothing."""
    depth = int(settings.CONVERSATION_SEARCH_FUSION_DEPTH)
    weight = float(settings.CONVERSATION_SEARCH_SEMANTIC_WEIGHT)
    # The words need no vector, so they are read while the encoder embeds (meanwhile: on another core).
    provider = get_provider()
    embedding = meanwhile.start(provider.embed_query, query)
    lexical_hits = fulltext_hits(scope, query, limit=depth, after=None, terms=terms)
    try:
        query_vector = embedding.result()
        semantic = semantic_hits(scope, query, limit=depth, after=None, query_vector=query_vector, provider=provider)
    except EmbeddingError:
        logger.warning("embedding provider unavailable; auto search answers with full-text only", exc_info=True)
        semantic = None
    if semantic is None:  # full-text alone, ranked and scored as fulltext
        fused = {hit.conversation_id: hit.score for hit in lexical_hits}
        semantic = []
    else:
        words = {hit.conversation_id: hit.score for hit in lexical_hits}
        meaning = {hit.conversation_id: hit.score for hit in semantic}
        fused = {
            conversation_id: lexical.hybrid_score(
                meaning.get(conversation_id, 0.0), words.get(conversation_id, 0.0), weight
            )
            for conversation_id in words.keys() | meaning.keys()
        }
    # The entry shown: the full-text hit when there is one (its highlights show the matched words).
    entries = {hit.conversation_id: hit.entry_id for hit in semantic}
    entries.update({hit.conversation_id: hit.entry_id for hit in lexical_hits})
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

_METHODS: dict[str, Callable[..., list[Hit]]] = {
    "fulltext": fulltext_hits,
    "semantic": lambda scope, query, *, terms, **page: semantic_hits(scope, query, **page),
    "auto": auto_hits,
}


def cursor_tag(scope: SearchScope, search_type: str, query: str) -> str:
    digest = hashlib.sha256(query.encode("utf-8")).hexdigest()[:16]
    return f"search.{scope.tag}.{search_type}.{digest}"


def search(scope: SearchScope, *, query: str, search_type: str, limit: int, cursor: str | None) -> dict:
    """One page of the envelope ``{"data": [search result], "afterCursor"}``."""
    terms = query_terms(query)  # once: the ranking's and the highlights' terms
    page = pagination.keyset_page(
        _Ranking(scope, query, terms, _METHODS[search_type]),
        tag=cursor_tag(scope, search_type, query),
        cursor=cursor,
        limit=limit,
    )
    return pagination.envelope(_results(page.items, terms), page.next_cursor)


@dataclass(frozen=True)
class _Ranking:
    """A search method's hits as a keyset (apps.core.pagination): best first by (position, conversation id)."""

    scope: SearchScope
    query: str
    terms: Terms
    method: Callable[..., list[Hit]]
    kind: type = float

    def fetch(self, after: tuple[float, UUID] | None, count: int) -> list[Hit]:
        return self.method(self.scope, self.query, limit=count, after=after, terms=self.terms)

    def key(self, hit: Hit) -> tuple[float, UUID]:
        return hit.position, hit.conversation_id


def _results(hits: list[Hit], terms: Terms) -> list[dict]:
    """The page's entries (decrypted), titles and highlights (any query term found), in one query, in the hits'
    order."""
    if not hits:
        return []
    sql = f"""
        SELECT e.id, e.conversation_id, e.user_id, e.channel, e.content_type, e.content, e.created_at, e.key, c.title,
               ts_headline('{TS_CONFIG}', coalesce(e.indexed_content, ''), %s::tsquery, %s)
        FROM conversation_entries e JOIN conversations c ON c.id = e.conversation_id AND c.deleted_at IS NULL
        WHERE e.id = ANY(%s)
    """  # noqa: S608 - fragments come from code
    with connection.cursor() as cursor:
        cursor.execute(sql, [terms.tsquery, HEADLINE_OPTIONS, [hit.entry_id for hit in hits]])
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
            ["e.indexed_content IS NULL", "e.channel = 'history'", "c.deleted_at IS NULL"],
            [],
            order=("e.created_at", "e.id"),
            position_index=6,
        ),
        tag=UNINDEXED_CURSOR,
        cursor=cursor,
        limit=limit,
    )
    data = [UnindexedItem.render(conversation_id=row[1], entry=selectors.entry_row(row)) for row in page.items]
    return pagination.envelope(data, page.next_cursor)
