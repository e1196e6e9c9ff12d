"""The conversation indexer: gives history entries their index text and embeds it (D5).

An entry needs work when it is a history entry with no index text yet (only with CONVERSATION_AUTO_INDEX: the
text is then the entry's text items, decrypted here, joined by newlines) or when its index text has no vectors yet
(``embedding_pending``: set by an append with ``indexedContent``, by ``POST /v1/conversations/index`` and by this
indexer's own text pass). Entries of deleted conversations are never pending (their vectors went with the delete).

Leases, batching, per-row backoff and quarantine, metrics and wake-ups are apps.retrieval.indexing's. An entry whose
content the key ring cannot open (a key id missing after a botched rotation, a damaged row) is that entry's failure
alone: logged with its id and key id, retried with backoff, then quarantined, while the queue goes on. Nothing is
written before the batch is embedded, and the write re-checks under a row lock that the entry's index text is still
the one embedded: a ``POST .../index`` that replaced it meanwhile wins (its text is embedded next).
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction

from apps.conversations import selectors, trees, vector_index
from apps.core import metrics
from apps.encryption import crypto
from apps.retrieval import indexing, leases, vectors
from apps.retrieval.indexing import CycleReport, Work

__all__ = ["INDEXER", "ConversationIndexer", "CycleReport", "entry_text", "run_cycle"]


@dataclass(frozen=True)
class _Entry:
    conversation_id: UUID
    root_id: UUID
    text: str  # the text embedded (the stored one, or the one derived from the content)
    derived: bool  # True when the entry had no index text: ``text`` is stored with the vectors


def entry_text(content: list) -> str:
    """The index text the service derives from a history entry's content: its text items, one per line."""
    return "\n".join(item["text"] for item in content if isinstance(item, dict) and isinstance(item.get("text"), str))


class ConversationIndexer(indexing.Indexer):
    name = "conversation"
    lease_kind = leases.CONVERSATION_INDEXING
    table = "conversation_entries"
    from_sql = "conversation_entries t JOIN conversations c ON c.id = t.conversation_id AND c.deleted_at IS NULL"
    owner_sql = "t.user_id"  # fairness is between the users who wrote the entries
    live_sql = "(SELECT c.deleted_at IS NULL FROM conversations c WHERE c.id = t.conversation_id)"
    # The index text, or (not derived yet) the sealed content it comes from: a little more than its text.
    size_sql = "coalesce(octet_length(t.indexed_content), octet_length(t.content))"
    batch_text_bytes_setting = "CONVERSATION_INDEXING_BATCH_TEXT_BYTES"
    readiness_key = "conversation_indexer"
    backlog_gauge = metrics.CONVERSATION_INDEXER_BACKLOG
    lag_gauge = metrics.CONVERSATION_INDEXER_LAG
    interval_setting = "CONVERSATION_INDEXING_INTERVAL"
    batch_size_setting = "CONVERSATION_INDEXING_BATCH_SIZE"
    task_name = "apps.conversations.tasks.index_conversation_entries"

    def pending(self) -> list[str]:
        # One predicate per partial index (conv_entries_embed, conv_entries_unindexed).
        arms = ["t.embedding_pending"]
        if settings.CONVERSATION_AUTO_INDEX:
            arms.append("t.indexed_content IS NULL AND t.channel = 'history'")
        return arms

    def check_index(self, dimension: int) -> None:
        vector_index.check_index(dimension)

    def load(self, ids: list) -> list[tuple]:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT t.id, t.conversation_id, c.root_id, t.indexed_content, t.content FROM {self.from_sql} "  # noqa: S608
                f"WHERE t.id = ANY(%s) AND ({self.pending_sql()}) AND {indexing.due_sql()}",
                [ids],
            )
            return cursor.fetchall()

    def same_text_sql(self, row: tuple) -> tuple[str, list]:
        # POST /v1/conversations/index replaces an entry's index text in place.
        return "t.indexed_content IS NOT DISTINCT FROM %s", [row[3]]

    def work(self, row: tuple) -> Work:
        entry_id, conversation_id, root_id, indexed, content = row
        if indexed is not None:
            return Work(entry_id, [(None, indexed)], _Entry(conversation_id, root_id, indexed, derived=False))
        try:
            text = entry_text(selectors.decrypt_content(content, conversation_id, entry_id))
        except crypto.DecryptionError:
            raise indexing.RowError("decrypt", key_id=_key_id(content)) from None
        return Work(entry_id, [(None, text)], _Entry(conversation_id, root_id, text, derived=True))

    def store(self, done: list[tuple[Work, list[indexing.Vector]]], model: str) -> int:
        stored = 0
        with transaction.atomic(), connection.cursor() as cursor:
            # The trees first, as apps.conversations.trees orders locks: a delete (which takes its tree's lock before
            # anything else) either finished first (its conversations are skipped below) or waits for these vectors.
            # Holding a fork's row while waiting for its root instead deadlocked with a delete or a transfer accept
            # that held the root and waited for the fork.
            trees.share_roots([work.data.root_id for work, _vectors in done])
            cursor.execute(
                "SELECT e.id, e.indexed_content FROM conversation_entries e "
                "JOIN conversations c ON c.id = e.conversation_id "
                "WHERE e.id = ANY(%s) AND c.deleted_at IS NULL ORDER BY e.id FOR UPDATE OF e",
                [[work.id for work, _vectors in done]],
            )
            current = dict(cursor.fetchall())
            for work, vectors_of_entry in done:
                entry: _Entry = work.data
                if work.id not in current:
                    continue  # its conversation was deleted meanwhile
                now = current[work.id]
                if (now is None and not entry.derived) or (now is not None and now != entry.text):
                    continue  # replaced meanwhile (POST .../index): that text is pending and embedded next
                cursor.execute("DELETE FROM conversation_entry_vectors WHERE entry_id = %s", [work.id])
                if vectors_of_entry:
                    cursor.executemany(
                        "INSERT INTO conversation_entry_vectors (entry_id, conversation_id, root_id, chunk, model, "
                        "embedding) VALUES (%s, %s, %s, %s, %s, %s::vector)",
                        [
                            [work.id, entry.conversation_id, entry.root_id, number, model, vectors.vector_literal(v)]
                            for _field, number, v in vectors_of_entry
                        ],
                    )
                cursor.execute(
                    "UPDATE conversation_entries SET indexed_content = %s, embedding_pending = false, "  # noqa: S608
                    f"{indexing.CLEARED_STATE_SQL} WHERE id = %s",
                    [entry.text, work.id],
                )
                stored += 1
        return stored


def _key_id(blob) -> str | None:
    """The key id an undecryptable envelope names (for operators: is it missing from the ring?); None when the bytes
    are not even an envelope."""
    try:
        return crypto.key_id_of(bytes(blob))
    except crypto.DecryptionError:
        return None


INDEXER = ConversationIndexer()
run_cycle = INDEXER.run_cycle
