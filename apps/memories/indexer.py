"""The background indexer: embeds pending memory versions and removes vectors of versions that stopped being active.

A worker claims a batch with session-level advisory locks held by its database connection (apps.core.claims), not
with a row lock or a lease written to the rows: concurrent workers never take the same version, a slow model never
blocks a PUT on the row, and when a worker dies (``kill -9``, OOM) PostgreSQL drops its claims with its connection,
so the next cycle of any other worker (beat runs one every MEMORY_EPISODIC_INDEXING_INTERVAL seconds) takes the
rows again at once. The vectors are written in a transaction that re-checks the row is still pending and active
under a row lock; a version superseded meanwhile gets no vectors. An embedding failure leaves the rows pending
with an exponential backoff (``index_retry_at``); a row is never marked indexed without its vectors.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import DatabaseError, connection, transaction

from apps.core import claims, metrics
from apps.core.embeddings import EmbeddingError, get_provider
from apps.core.vectors import vector_literal
from apps.memories import vector_index

logger = logging.getLogger(__name__)


@dataclass
class CycleReport:
    indexed: int = 0
    failed: int = 0
    removed_versions: int = 0


def _claim(batch_size: int) -> list[tuple]:
    """Claim up to ``batch_size`` due versions for this worker; the caller must ``_release`` them when done."""
    with connection.cursor() as cursor:
        # More candidates than the batch, so rows other workers are busy with do not leave this one idle.
        cursor.execute(
            "SELECT id, octet_length(indexed_content::text) FROM memories WHERE index_status = 'pending' "
            "AND state = 'active' AND (index_retry_at IS NULL OR index_retry_at <= now()) ORDER BY created_at LIMIT %s",
            [batch_size * 4],
        )
        sizes = dict(cursor.fetchall())
    mine = claims.try_claim(claims.MEMORY_INDEXING, list(sizes), limit=batch_size)
    if not mine:
        return []
    # A batch also stops at MEMORY_INDEXING_BATCH_TEXT_BYTES of index text (at least one version): a few versions
    # with 256 KiB of text each take minutes to embed, and a batch is committed (searchable) only when all is done.
    kept, total = 0, 0
    for memory_id in mine:
        total += sizes[memory_id] or 0
        if kept and total > settings.MEMORY_INDEXING_BATCH_TEXT_BYTES:
            break
        kept += 1
    if kept < len(mine):
        _release(mine[kept:])
        mine = mine[:kept]
    try:
        # Re-read under the claim: another worker may have finished a candidate (and released it) between the
        # query above and the claim; counting the attempt here is what the failure backoff grows with.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                """
                UPDATE memories SET index_attempts = index_attempts + 1
                WHERE id = ANY(%s) AND index_status = 'pending' AND state = 'active'
                RETURNING id, namespace, attributes, indexed_content, expires_at, index_attempts
                """,
                [mine],
            )
            # Django's psycopg setup hands jsonb back as text on raw cursors.
            rows = [
                (memory_id, namespace, _from_json(attributes), _from_json(content), expires_at, attempts)
                for memory_id, namespace, attributes, content, expires_at, attempts in cursor.fetchall()
            ]
    except BaseException:
        _release(mine)
        raise
    done_meanwhile = set(mine) - {row[0] for row in rows}
    if done_meanwhile:
        _release(done_meanwhile)
    return rows


def _release(memory_ids) -> None:
    try:
        claims.release(claims.MEMORY_INDEXING, list(memory_ids))
    except DatabaseError:
        # The connection broke (and with it the session holding the claims): nothing is held any more. Closing
        # it lets the next cycle reconnect instead of failing on the dead one.
        logger.warning("could not release indexer claims; closing the connection", exc_info=True)
        connection.close()


def _from_json(value):
    return json.loads(value) if isinstance(value, str) else value


def _backoff_seconds(attempts: int) -> int:
    return min(settings.MEMORY_INDEXING_MAX_BACKOFF_SECONDS, 5 * 2 ** max(attempts - 1, 0))


def _store(rows: list[tuple], vectors: list[list[float]], fields: list[tuple], model: str) -> int:
    """Write vectors for the claimed rows that are still pending and active; returns how many rows were indexed."""
    by_memory: dict = {}
    for (memory_id, field, chunk), vector in zip(fields, vectors, strict=True):
        by_memory.setdefault(memory_id, []).append((field, chunk, vector))
    meta = {row[0]: row for row in rows}
    indexed = 0
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM memories WHERE id = ANY(%s) AND index_status = 'pending' AND state = 'active' "
            "ORDER BY id FOR UPDATE",
            [list(meta)],
        )
        still_pending = [row[0] for row in cursor.fetchall()]
        for memory_id in still_pending:
            _id, namespace, attributes, _content, expires_at, _attempts = meta[memory_id]
            cursor.execute("DELETE FROM memory_vectors WHERE memory_id = %s", [memory_id])  # a retried claim
            vectors_of_memory = by_memory.get(memory_id, [])
            if vectors_of_memory:
                cursor.executemany(
                    "INSERT INTO memory_vectors (memory_id, field, chunk, model, namespace, attributes, expires_at, "
                    "embedding) VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s, %s::vector)",
                    [
                        [memory_id, field, chunk, model, namespace, _jsonb(attributes), expires_at,
                         vector_literal(vector)]
                        for field, chunk, vector in vectors_of_memory
                    ],
                )
            indexed += 1
        if still_pending:
            cursor.execute(
                "UPDATE memories SET index_status = 'indexed', index_retry_at = NULL WHERE id = ANY(%s)",
                [still_pending],
            )
    return indexed


def _jsonb(value) -> str | None:
    return None if value is None else json.dumps(value)


def _release_after_failure(rows: list[tuple]) -> None:
    with connection.cursor() as cursor:
        for row in rows:
            cursor.execute(
                "UPDATE memories SET index_retry_at = now() + make_interval(secs => %s) "
                "WHERE id = %s AND index_status = 'pending'",
                [_backoff_seconds(row[5]), row[0]],
            )


def remove_stale_vectors(batch_size: int) -> int:
    """Vectors of superseded, deleted and expired versions go; their rows become ``removed``."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            """
            WITH stale AS (
                SELECT id FROM memories
                WHERE index_status = 'indexed' AND state <> 'active'
                LIMIT %s
                FOR UPDATE SKIP LOCKED
            ), gone AS (
                DELETE FROM memory_vectors v USING stale WHERE v.memory_id = stale.id
            )
            UPDATE memories m SET index_status = 'removed' FROM stale WHERE m.id = stale.id
            """,
            [batch_size],
        )
        return cursor.rowcount


def run_cycle(batch_size: int | None = None, max_batches: int = 50) -> CycleReport:
    """One indexer run: remove stale vectors, then embed pending versions batch by batch."""
    batch_size = batch_size or settings.MEMORY_EPISODIC_INDEXING_BATCH_SIZE
    report = CycleReport()
    while True:
        removed = remove_stale_vectors(batch_size)
        report.removed_versions += removed
        if removed < batch_size:
            break
    provider = get_provider()
    model = vector_index.model_tag(provider)
    vector_index.ensure_index(provider.dimension)
    for _ in range(max_batches):
        rows = _claim(batch_size)
        if not rows:
            break
        try:
            embedded = _index_batch(rows, provider, model, report)
        finally:
            _release(row[0] for row in rows)
        if not embedded:
            break
    update_backlog_metrics()
    return report


def _index_batch(rows: list[tuple], provider, model: str, report: CycleReport) -> bool:
    """Embed and store one claimed batch; False when the provider failed (the cycle stops)."""
    # One vector per chunk of each non-blank index field (a field that fits the model's window is one chunk); a
    # version whose fields are all blank is indexed with none.
    started = time.perf_counter()
    try:
        pieces = [
            (row[0], name, number, piece)
            for row in rows
            for name, text in sorted((row[3] or {}).items())
            if text.strip()
            for number, piece in enumerate(provider.chunk(text))
        ]
        fields = [(memory_id, name, number) for memory_id, name, number, _piece in pieces]
        texts = [piece for *_address, piece in pieces]
        vectors = provider.embed_documents(texts) if texts else []
    except EmbeddingError:
        logger.warning("embedding failed; rows stay pending with backoff", extra={"rows": len(rows)}, exc_info=True)
        _release_after_failure(rows)
        report.failed += len(rows)
        return False
    report.indexed += _store(rows, vectors, fields, model)
    logger.info(
        "memories indexed",
        extra={"rows": len(rows), "texts": len(texts), "seconds": round(time.perf_counter() - started, 3)},
    )
    return True


def backlog() -> tuple[int, float]:
    """(versions waiting to be embedded, age in seconds of the oldest one)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0) FROM memories "
            "WHERE index_status = 'pending' AND state = 'active'"
        )
        count, lag = cursor.fetchone()
    return int(count), float(lag)


def update_backlog_metrics() -> tuple[int, float]:
    count, lag = backlog()
    metrics.INDEXER_BACKLOG.set(count)
    metrics.INDEXER_LAG.set(lag)
    return count, lag


def readiness_info() -> dict:
    count, lag = update_backlog_metrics()
    return {"backlog": count, "oldest_pending_seconds": round(lag, 3)}
