"""The memory keyword index (D11 "words and meaning"): ``memory_terms`` holds, per active version with index text,
each term's keyed hash (apps.retrieval.keywords), its frequency and the version's length in terms, never the text.

Written by the PUT in its own statement (services.PUT_SQL), so a search issued after the PUT returned finds its
words; the terms of the version a PUT or DELETE closes leave in that same statement. Each row carries its version's
owner key (owner_key_sql: the first two namespace segments, hashed), and the primary key is (term, owner key,
memory id): a search inside one user's subtree reads only that user's rows of a term (migration 0013).

Ranking is BM25 (apps.retrieval.lexical) with statistics taken inside the search's own scope only: ``N`` is the
number of the scope's live versions that hold any of the query's terms and ``df`` how many of them hold each term.
So another tenant's words never move a caller's scores (they may only change how the rows are read: ``_hits``),
and the lookup reads only rows that match a query term (through the primary key ``(term, memory_id)``), never a
count of the whole scope. Within the set that matches, a term every match shares weighs almost nothing and a term
one match holds weighs most: "order status for reference SW8629" is decided by SW8629. Next to meaning (``auto``),
a large scope's term held by more than HITS_PER_TERM of its versions is read only that far and weighs nothing.
The raw sum is divided by the query's ceiling (lexical.ceiling over all its terms, a term nobody holds counting at
df = 0), so a version that matches only a query's common words scores low.

Terms are hashed under a key derived from the ring's primary key; a search hashes its terms under every key id the
index still holds, so rows written before a rotation keep matching until ``rotate_encryption_key`` re-hashes them
(registered here as one of its rotators).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.db import connection
from django.utils import timezone

from apps.encryption import crypto
from apps.memories import filters
from apps.retrieval import keywords, lexical

ROTATION_LABEL = "memory keyword index"
_BATCH = 500


def document_params(index: dict[str, str] | None) -> dict[str, Any]:
    """The PUT statement's parameters for the new version's terms (none without index text)."""
    kid = crypto.primary_key_id()
    if not index:
        return {"terms": [], "tfs": [], "term_dl": 0, "term_key": kid}
    hashes, tfs, length = keywords.hashed_document(keywords.term_key(kid), index.values())
    return {"terms": hashes, "tfs": tfs, "term_dl": length, "term_key": kid}


def owner_key_sql(namespace: str) -> str:
    """SQL of the owner key of the namespace expression ``namespace``: its first filters.OWNER_DEPTH segments,
    hashed to 64 bits (two owners whose keys collide would only read each other's rows, which the scope test drops).
    A row's key is its version's, written with it (services.PUT_SQL, _reindex)."""
    return f"hashtextextended(array_to_string(({namespace})[1:{filters.OWNER_DEPTH}], chr(31)), 0)"


def _key_ids() -> list[str]:
    """The key ids the index may hold: the ring's, primary first (a row under a key the ring lacks cannot be matched,
    and the readiness checks already report that key missing)."""
    ring = crypto.keyring()
    return [ring.primary, *sorted(kid for kid in ring.keys if kid != ring.primary)]


def _query_hashes(text: str, common_weight: float) -> tuple[list[int], list[int], list[float]]:
    """(hash, slot, weight) of the query's terms under every key id of the ring; ``slot`` numbers the term, and
    ``weight`` is ``common_weight`` for a common word (keywords.common_query_terms), 1 for any other term."""
    words = keywords.query_terms(text)
    common = keywords.common_query_terms(text) if common_weight != 1.0 else set()
    hashes, slots, weights = [], [], []
    for kid in _key_ids() if words else ():
        key = keywords.term_key(kid)
        for slot, word in enumerate(words):
            hashes.append(keywords.term_hash(key, word))
            slots.append(slot)
            weights.append(common_weight if word in common else 1.0)
    return hashes, slots, weights


# How the scope's rows of the query terms are read; inside one owner's subtree only that owner's rows (the primary
# key leads with term and owner key), across owners (an admin's search) every user's. When no query term has more
# than SHORT_POSTINGS rows (counted on the primary key alone), from those rows: the work is bounded by them.
# Otherwise a scope of at most SMALL_SCOPE live versions from its versions (each probes the query's terms by primary
# key: bounded by the scope); a larger one from the query terms' rows, each term's first HITS_PER_TERM in the scope
# when not exhaustive (100k memories, whole scope, the words half of auto: 115 -> 7 ms p50; bench/semantic_search.py).
SHORT_POSTINGS = 1000
SMALL_SCOPE = 2000
HITS_PER_TERM = 300


def ranked(
    scope: Any, text: str, count: int, *, exhaustive: bool = True, common_weight: float = 1.0
) -> list[tuple[Any, float]]:
    """The ``count`` best (memory id, score in [0, 1]) of ``scope`` (a selectors.Scope) for ``text`` by its words.

    ``exhaustive=False`` (hybrid search, whose meaning half finds what common words would) reads at most
    HITS_PER_TERM matches of each term in a large scope: a rare term's matches are all read; a term with more weighs
    nothing (its df counts as N), so its first matches add no score and a version found only through it ranks
    last among the words.

    ``common_weight`` scales what a common word adds to a version's score (not the query's ceiling): hybrid search
    takes the words half for what the encoder cannot read (lexical.COMMON_WORD_WEIGHT)."""
    hashes, slots, weights = _query_hashes(text, common_weight)
    if not hashes or count <= 0:
        return []
    prefix_sql, prefix_params = filters.namespace_prefix_sql(scope.namespace_prefix, "m.namespace")
    filter_sql, filter_params = filters.to_sql(scope.attribute_filter, "m.attributes")
    in_scope = f"m.state = 'active' AND (m.expires_at IS NULL OR m.expires_at > %s) AND {prefix_sql} AND {filter_sql}"
    scope_params = [timezone.now(), *prefix_params, *filter_params]
    # Inside one owner's subtree (every user's own searches) the rows are read by (term, owner key): another user's
    # rows of a common term are never read, and never count towards SHORT_POSTINGS.
    prefix = scope.namespace_prefix
    owner = list(prefix[: filters.OWNER_DEPTH]) if len(prefix) >= filters.OWNER_DEPTH else None
    with connection.cursor() as cursor:
        hits, hits_params, saturated = _hits(cursor, hashes, owner, in_scope, scope_params, exhaustive)
        cursor.execute(_ranking_sql(hits, saturated), [hashes, slots, weights, *hits_params, count])
        return [(memory_id, float(score)) for memory_id, score in cursor.fetchall()]


def _hits(
    cursor: Any, hashes: list[int], owner: list[str] | None, in_scope: str, params: list, exhaustive: bool
) -> tuple[str, list, int | None]:
    """The SQL of the scope's rows of the query terms ``q`` (memory_id, slot, tf, dl), its parameters, and the hit
    count above which a term was cut short (None: every row was read). Each hash of a term (one per key id during a
    rotation) reads one more than that, so a term has more in the scope exactly when more were read. With ``owner``
    (the scope lies in that owner's subtree) only the owner's rows are read."""
    # One round trip: the owner's key, the most rows any query term has, and, only when that is above SHORT_POSTINGS
    # (the scalar subquery under CASE runs only then), how many versions the scope holds up to SMALL_SCOPE + 1.
    key_sql, key_params = (owner_key_sql("%s::text[]"), [owner]) if owner else ("NULL::bigint", [])
    cursor.execute(
        f"WITH o AS MATERIALIZED (SELECT {key_sql} AS key), p AS MATERIALIZED ("  # noqa: S608 - fragments from code
        "SELECT max(n) AS most FROM unnest(%s::bigint[]) AS q(term) CROSS JOIN LATERAL (SELECT count(*) AS n FROM "
        f"(SELECT FROM memory_terms t WHERE t.term = q.term {'AND t.owner_key = (SELECT key FROM o)' if owner else ''} "
        "LIMIT %s) r) c) "
        "SELECT p.most, o.key, CASE WHEN p.most > %s THEN "
        f"(SELECT count(*) FROM (SELECT FROM memories m WHERE {in_scope} LIMIT %s) s) END FROM o, p",
        [*key_params, hashes, SHORT_POSTINGS + 1, SHORT_POSTINGS, *params, SMALL_SCOPE + 1],
    )
    most, key, scope_size = cursor.fetchone()
    owned, owned_params = ("AND t.owner_key = %s", [key]) if owner else ("", [])
    every_row = f"""
        SELECT t.memory_id, q.slot, t.tf, t.dl
        FROM q JOIN memory_terms t ON t.term = q.term {owned} JOIN memories m ON m.id = t.memory_id WHERE {in_scope}
    """  # noqa: S608
    if most <= SHORT_POSTINGS:
        return every_row, [*owned_params, *params], None
    if scope_size <= SMALL_SCOPE:  # the scope's versions, each probing the query's terms by primary key
        version_key = "%s::bigint" if owner else owner_key_sql("m.namespace")  # the owner's, or each version's
        probes = f"""
            SELECT m.id AS memory_id, q.slot, t.tf, t.dl
            FROM (SELECT m.id, {version_key} AS owner_key FROM memories m WHERE {in_scope} LIMIT {SMALL_SCOPE + 1}) m
            CROSS JOIN q CROSS JOIN LATERAL (
                SELECT t.tf, t.dl FROM memory_terms t
                WHERE t.term = q.term AND t.owner_key = m.owner_key AND t.memory_id = m.id OFFSET 0
            ) t
        """  # noqa: S608
        return probes, [*owned_params, *params], None
    if exhaustive:
        return every_row, [*owned_params, *params], None
    first_hits = f"""
        SELECT h.* FROM q CROSS JOIN LATERAL (
            SELECT t.memory_id, q.slot, t.tf, t.dl
            FROM memory_terms t JOIN memories m ON m.id = t.memory_id WHERE t.term = q.term {owned} AND {in_scope}
            LIMIT {HITS_PER_TERM + 1}
        ) h
    """  # noqa: S608
    return first_hits, [*owned_params, *params], HITS_PER_TERM


def _ranking_sql(hits: str, saturated: int | None) -> str:
    """BM25 over ``hits`` (memory_id, slot, tf, dl: the scope's rows of the query terms ``q``), best first; a term
    with more than ``saturated`` hits (its reading was cut) counts as held by all (df = N: no weight)."""
    full = f"count(*) > {int(saturated)}" if saturated else "false"
    idf = lexical.idf_sql("CASE WHEN s.full THEN c.n ELSE coalesce(s.df, 0) END", "c.n")  # no row: held by none
    weight = lexical.term_weight_sql(
        lexical.idf_sql("CASE WHEN s.full THEN c.n ELSE s.df END", "c.n"), "h.tf", "h.dl", "c.avgdl"
    )
    return f"""
        WITH q AS (SELECT * FROM unnest(%s::bigint[], %s::int[], %s::float8[]) AS q(term, slot, w)),
        slots AS (SELECT DISTINCT slot, w FROM q),
        hits AS MATERIALIZED ({hits}),
        stats AS (SELECT slot, count(*)::float8 AS df, {full} AS full FROM hits GROUP BY slot),
        corpus AS (SELECT count(DISTINCT memory_id)::float8 AS n, avg(dl)::float8 AS avgdl FROM hits),
        ceiling AS (
            SELECT {lexical.ceiling_sql(f"sum({idf})")} AS value
            FROM (SELECT DISTINCT slot FROM q) qs LEFT JOIN stats s USING (slot) CROSS JOIN corpus c
        )
        SELECT h.memory_id, {lexical.normalized_sql(f"sum(sl.w * {weight})", "max(ceiling.value)")} AS score
        FROM hits h JOIN stats s USING (slot) JOIN slots sl USING (slot) CROSS JOIN corpus c CROSS JOIN ceiling
        GROUP BY h.memory_id ORDER BY score DESC, h.memory_id LIMIT %s
    """  # noqa: S608 - fragments come from code; values are bound parameters


# --- Rebuilding: the migration's backfill and key rotation ---------------------------------------------------------


def _reindex(cursor: Any, rows: list[tuple[Any, Any]], kid: str) -> None:
    """Replace the terms of these (id, indexed_content) versions by their hashes under ``kid``."""
    key = keywords.term_key(kid)
    ids, terms, tfs, dls = [], [], [], []
    for memory_id, content in rows:
        content = json.loads(content) if isinstance(content, str) else (content or {})
        hashes, frequencies, length = keywords.hashed_document(key, content.values())
        ids.extend([memory_id] * len(hashes))
        terms.extend(hashes)
        tfs.extend(frequencies)
        dls.extend([length] * len(hashes))
    cursor.execute("DELETE FROM memory_terms WHERE memory_id = ANY(%s)", [[memory_id for memory_id, _ in rows]])
    cursor.execute(
        f"INSERT INTO memory_terms (memory_id, owner_key, term, tf, dl, key_id) "  # noqa: S608 - from code
        f"SELECT u.memory_id, {owner_key_sql('m.namespace')}, u.term, u.tf, u.dl, %s "
        "FROM unnest(%s::uuid[], %s::bigint[], %s::int[], %s::int[]) AS u(memory_id, term, tf, dl) "
        "JOIN memories m ON m.id = u.memory_id ON CONFLICT DO NOTHING",
        [kid, ids, terms, tfs, dls],
    )


def rebuild(db: Any = connection) -> int:
    """Re-index every active version with index text (a migration: the normalisation of apps.retrieval.keywords or
    the table's columns changed). In batches, each its own statement pair."""
    kid, done, after = crypto.primary_key_id(), 0, None
    sql = (
        "SELECT m.id, m.indexed_content FROM memories m WHERE m.state = 'active' "
        "AND m.indexed_content IS NOT NULL AND (%s::uuid IS NULL OR m.id > %s) ORDER BY m.id LIMIT %s"
    )
    with db.cursor() as cursor:
        while True:
            cursor.execute(sql, [after, after, _BATCH])
            rows = cursor.fetchall()
            if rows:
                _reindex(cursor, rows, kid)
                done, after = done + len(rows), rows[-1][0]
            if len(rows) < _BATCH:
                return done


def _stale_sql() -> str:
    return "SELECT DISTINCT t.memory_id FROM memory_terms t WHERE t.key_id <> %s"


def _count_stale() -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM ({_stale_sql()}) s", [crypto.primary_key_id()])  # noqa: S608
        return int(cursor.fetchone()[0])


def _rotate(primary: str, progress: Callable[[int], object], dry_run: bool) -> crypto.BlobRotation:
    """Re-hash every version whose terms were hashed under another key than ``primary`` (rotate_encryption_key)."""
    from django.db import transaction

    rotated = 0
    if dry_run:
        return crypto.BlobRotation(rotated=_count_stale())
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"SELECT m.id, m.indexed_content FROM memories m WHERE m.id IN ({_stale_sql()} LIMIT %s) "  # noqa: S608
                "FOR UPDATE OF m",
                [primary, _BATCH],
            )
            rows = cursor.fetchall()
            if rows:
                _reindex(cursor, rows, primary)
                rotated += len(rows)
            progress(len(rows))
        if len(rows) < _BATCH:
            break
    return crypto.BlobRotation(rotated=rotated, skipped=_count_stale())


def register_rotation() -> None:
    crypto.register_blob_rotator(crypto.BlobRotator(ROTATION_LABEL, _count_stale, _rotate))
