"""The one lexical ranking (D11 "words and meaning"): BM25, shared by memory search and conversation search.

Why BM25 and not ``ts_rank``: ``ts_rank`` scores every matched word alike, so a query's common words ("order",
"status") outweigh the rare one that names the thing ("SW8629"). BM25 weighs each matched term by its inverse
document frequency in the searched corpus and saturates repeated terms:

    idf(t)     = ln(1 + (N - df + 0.5) / (df + 0.5))
    weight(t)  = idf(t) * tf * (K1 + 1) / (tf + K1 * (1 - B + B * dl / avgdl))
    raw(d)     = sum of weight(t) over the query's terms found in d

``score`` must stay in [0, 1] (D4). ``raw`` is divided by the best any document could reach for this query
(``ceiling``: every query term present with saturated frequency, i.e. sum of idf(t) * (K1 + 1)), so a document that
matches only the query's common words scores low, and one that matches its rare words scores high, whatever the
corpus size.

Each caller supplies its own SQL for ``tf``, ``dl``, ``df``, ``N`` and ``avgdl`` (memory search from its keyed term
table, conversation search from the entries' ``tsvector``); the formula and its constants live here only.
"""

from __future__ import annotations

import math

K1 = 1.2  # term-frequency saturation (the usual 1.2-2.0; short texts favour the low end)
B = 0.75  # length normalisation


def idf(df: float, n: float) -> float:
    """Inverse document frequency of a term found in ``df`` of ``n`` documents (always > 0)."""
    return math.log(1.0 + (n - df + 0.5) / (df + 0.5))


def idf_sql(df: str, n: str) -> str:
    """``idf`` as an SQL expression over the SQL expressions ``df`` and ``n`` (float8)."""
    return f"ln(1.0 + (({n})::float8 - ({df}) + 0.5) / (({df})::float8 + 0.5))"


def term_weight_sql(idf_expr: str, tf: str, dl: str, avgdl: str) -> str:
    """BM25's weight of one matched term as an SQL expression (float8)."""
    return (
        f"({idf_expr}) * ({tf})::float8 * {K1 + 1} / "
        f"(({tf})::float8 + {K1} * (1 - {B} + {B} * ({dl})::float8 / greatest(({avgdl})::float8, 1.0)))"
    )


def ceiling(idfs: list[float]) -> float:
    """The highest raw score any document can reach for a query whose terms have these idfs."""
    return sum(idfs) * (K1 + 1)


def normalized(raw: float, ceiling_value: float) -> float:
    """``raw`` mapped into [0, 1] against the query's ceiling."""
    if ceiling_value <= 0:
        return 0.0
    return max(0.0, min(1.0, raw / ceiling_value))


def ceiling_sql(idf_sum: str) -> str:
    """``ceiling`` as an SQL expression over the SQL expression ``idf_sum`` (the sum of the query terms' idfs)."""
    return f"(({idf_sum})::float8 * {K1 + 1})"


def normalized_sql(raw: str, ceiling_expr: str) -> str:
    """``normalized`` as an SQL expression (float8): ``raw`` against the ceiling, clamped to [0, 1]."""
    return (
        f"(CASE WHEN ({ceiling_expr}) > 0 THEN least(1.0, greatest(0.0, ({raw})::float8 / ({ceiling_expr}))) "
        "ELSE 0.0 END)::float8"
    )


# Hybrid search (memory search's and conversation search's ``auto``): a words score below this matched only the
# query's common words, which is no evidence; with any-word matching a paraphrase meets such matches everywhere.
LEXICAL_FLOOR = 0.15


# Hybrid memory search: what a common word (keywords.common_query_terms: a whole word of the encoder's vocabulary)
# adds to the words score. The words half is there for what the encoder cannot read (codes, ids, numbers, rare
# names); a common word the encoder already weighs, and one that happens to be rare in a small scope otherwise
# decided between two versions close in meaning (bench/recall.py). Conversation search keeps every word at full
# weight: its labelled set lost nothing to common words, and halving them let order-status look-alikes pass a
# code's conversation (tests/conversations/test_search_ranking.py).
COMMON_WORD_WEIGHT = 0.5


def hybrid_score(similarity: float, words: float, semantic_weight: float) -> float:
    """``w * similarity + (1 - w) * words'`` in [0, 1], where ``words'`` is the BM25 score above LEXICAL_FLOOR
    rescaled to [0, 1]. Scores, not reciprocal ranks: rank fusion gives the top of a list of common-word matches as
    much weight as the top of the meaning list (bench/recall.py: paraphrase recall@5 0.906 -> 0.562 on the
    conversation set)."""
    above = max(0.0, words - LEXICAL_FLOOR) / (1.0 - LEXICAL_FLOOR)
    return semantic_weight * similarity + (1.0 - semantic_weight) * above
