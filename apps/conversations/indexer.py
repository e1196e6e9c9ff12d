"""The conversation indexer: gives history entries their index text and embeds it (D5).

An entry needs work when it is a history entry with no index text yet (only with CONVERSATION_AUTO_INDEX: the
text is then the entry's text items, decrypted here, joined by newlines) or when its index text has no vectors yet
(``embedding_pending``: set by an append with ``indexedContent``, by ``POST /v1/conversations/index`` and by this
indexer's own text pass).

Claims are session advisory locks (apps.core.claims, kind CONVERSATION_INDEXING), as the memory indexer's: live
workers never take the same entry, and a worker killed mid-batch holds nothing once PostgreSQL sees its connection
close, so the next cycle of any worker (beat, every CONVERSATION_INDEXING_INTERVAL) takes those entries again.
Nothing is written before the batch is embedded, and the write re-checks under a row lock that the entry's index
text is still the one embedded: a ``POST .../index`` that replaced it meanwhile wins (its text is embedded next).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from uuid import UUID

from django.conf import settings
from django.db import DatabaseError, connection, transaction

from apps.conversations import selectors, vector_index
from apps.core import claims, metrics, vectors
from apps.core.embeddings import EmbeddingError, get_provider

logger = logging.getLogger(__name__)


@dataclass
class CycleReport:
    indexed: int = 0  # entries whose text and vectors are now stored
    failed: int = 0


@dataclass
class _Work:
    entry_id: UUID
    conversation_id: UUID
    root_id: UUID
    text: str  # the text to embed (the stored one, or the one derived from the content)
    derived: bool  # True when the entry had no index text: ``text`` is stored with the vectors


def entry_text(content: list) -> str:
    """The index text the service derives from a history entry's content: its text items, one per line."""
    return "\n".join(item["text"] for item in content if isinstance(item, dict) and isinstance(item.get("text"), str))


def _candidates(batch_size: int) -> list[UUID]:
    with connection.cursor() as cursor:
        # Entries of deleted conversations are never candidates (their vectors went with the delete).
        live = (
            "SELECT e.id, e.created_at FROM conversation_entries e "
            "JOIN conversations c ON c.id = e.conversation_id AND c.deleted_at IS NULL WHERE "
        )
        parts = [live + "e.embedding_pending"]
        if settings.CONVERSATION_AUTO_INDEX:
            parts.append(live + "e.indexed_content IS NULL AND e.channel = 'history'")
        # More candidates than the batch, so entries other workers are busy with do not leave this one idle.
        sql = " UNION ALL ".join(f"({part} ORDER BY e.created_at LIMIT %s)" for part in parts)
        cursor.execute(f"SELECT id FROM ({sql}) AS t ORDER BY created_at", [batch_size * 4] * len(parts))  # noqa: S608
        return [row[0] for row in cursor.fetchall()]


def _claim(batch_size: int) -> list[_Work]:
    mine = claims.try_claim(claims.CONVERSATION_INDEXING, _candidates(batch_size), limit=batch_size)
    if not mine:
        return []
    try:
        # Re-read under the claim: another worker may have finished a candidate between the query and the claim.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT e.id, e.conversation_id, c.root_id, e.indexed_content, e.content, e.embedding_pending "
                "FROM conversation_entries e JOIN conversations c ON c.id = e.conversation_id "
                "WHERE e.id = ANY(%s) AND c.deleted_at IS NULL AND (e.embedding_pending "
                "OR (%s AND e.indexed_content IS NULL AND e.channel = 'history'))",
                [mine, bool(settings.CONVERSATION_AUTO_INDEX)],
            )
            rows = cursor.fetchall()
        work = []
        for entry_id, conversation_id, root_id, indexed, content, _pending in rows:
            if indexed is None:
                text = entry_text(selectors.decrypt_content(content, conversation_id, entry_id))
                work.append(_Work(entry_id, conversation_id, root_id, text, derived=True))
            else:
                work.append(_Work(entry_id, conversation_id, root_id, indexed, derived=False))
    except BaseException:
        _release(mine)
        raise
    done_meanwhile = set(mine) - {item.entry_id for item in work}
    if done_meanwhile:
        _release(done_meanwhile)
    return work


def _release(entry_ids) -> None:
    try:
        claims.release(claims.CONVERSATION_INDEXING, list(entry_ids))
    except DatabaseError:
        # The connection broke, and with it the session holding the claims: nothing is held any more.
        logger.warning("could not release indexer claims; closing the connection", exc_info=True)
        connection.close()


def _store(work: list[_Work], chunks: list[tuple[UUID, int]], embedded: list[list[float]], model: str) -> int:
    by_entry: dict[UUID, list[tuple[int, list[float]]]] = {}
    for (entry_id, number), vector in zip(chunks, embedded, strict=True):
        by_entry.setdefault(entry_id, []).append((number, vector))
    stored = 0
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT e.id, e.indexed_content FROM conversation_entries e "
            "JOIN conversations c ON c.id = e.conversation_id "
            # FOR SHARE OF c: a concurrent delete of the conversation (FOR UPDATE of its row, then its vectors
            # deleted) either finished first (the row is re-checked and skipped) or waits for these vectors.
            "WHERE e.id = ANY(%s) AND c.deleted_at IS NULL ORDER BY e.id FOR UPDATE OF e FOR SHARE OF c",
            [[item.entry_id for item in work]],
        )
        current = dict(cursor.fetchall())
        for item in work:
            if item.entry_id not in current:
                continue  # its conversation was deleted meanwhile
            now = current[item.entry_id]
            if (now is None and not item.derived) or (now is not None and now != item.text):
                continue  # replaced meanwhile (POST .../index): that text is pending and embedded next
            cursor.execute("DELETE FROM conversation_entry_vectors WHERE entry_id = %s", [item.entry_id])
            rows = by_entry.get(item.entry_id, [])
            if rows:
                cursor.executemany(
                    "INSERT INTO conversation_entry_vectors (entry_id, conversation_id, root_id, chunk, model, "
                    "embedding) VALUES (%s, %s, %s, %s, %s, %s::vector)",
                    [
                        [item.entry_id, item.conversation_id, item.root_id, number, model, vectors.vector_literal(v)]
                        for number, v in rows
                    ],
                )
            cursor.execute(
                "UPDATE conversation_entries SET indexed_content = %s, embedding_pending = false WHERE id = %s",
                [item.text, item.entry_id],
            )
            stored += 1
    return stored


def _index_batch(work: list[_Work], provider, model: str, report: CycleReport) -> bool:
    started = time.perf_counter()
    try:
        pieces = [
            (item.entry_id, number, piece)
            for item in work
            if item.text.strip()
            for number, piece in enumerate(provider.chunk(item.text))
        ]
        embedded = provider.embed_documents([piece for *_address, piece in pieces]) if pieces else []
    except EmbeddingError:
        logger.warning("embedding failed; entries stay pending", extra={"rows": len(work)}, exc_info=True)
        report.failed += len(work)
        return False
    report.indexed += _store(work, [(entry_id, number) for entry_id, number, _piece in pieces], embedded, model)
    logger.info(
        "conversation entries indexed",
        extra={"rows": len(work), "texts": len(pieces), "seconds": round(time.perf_counter() - started, 3)},
    )
    return True


def run_cycle(batch_size: int | None = None, max_batches: int = 50) -> CycleReport:
    """One indexer run: claim, embed and store batches until nothing is due (or the provider fails)."""
    batch_size = batch_size or settings.CONVERSATION_INDEXING_BATCH_SIZE
    report = CycleReport()
    provider = get_provider()
    model = vectors.model_tag(provider)
    vector_index.ensure_index(provider.dimension)
    for _ in range(max_batches):
        work = _claim(batch_size)
        if not work:
            break
        try:
            ok = _index_batch(work, provider, model, report)
        finally:
            _release(item.entry_id for item in work)
        if not ok:
            break
    update_backlog_metrics()
    return report


def backlog() -> tuple[int, float]:
    """(entries of live conversations waiting for the indexer, age in seconds of the oldest one)."""
    auto = "OR (e.indexed_content IS NULL AND e.channel = 'history')" if settings.CONVERSATION_AUTO_INDEX else ""
    where = f"(e.embedding_pending {auto})"
    sql = (
        "SELECT count(*), coalesce(extract(epoch FROM now() - min(e.created_at)), 0) FROM conversation_entries e "  # noqa: S608
        f"JOIN conversations c ON c.id = e.conversation_id AND c.deleted_at IS NULL WHERE {where}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql)
        count, lag = cursor.fetchone()
    return int(count), float(lag)


def update_backlog_metrics() -> tuple[int, float]:
    count, lag = backlog()
    metrics.CONVERSATION_INDEXER_BACKLOG.set(count)
    metrics.CONVERSATION_INDEXER_LAG.set(lag)
    return count, lag


def readiness_info() -> dict:
    count, lag = update_backlog_metrics()
    return {"backlog": count, "oldest_pending_seconds": round(lag, 3)}
