"""The memory indexer: embeds pending memory versions and removes vectors of versions that stopped being active.

Leases, batching, per-row backoff and quarantine, metrics and wake-ups are apps.retrieval.indexing's; this module says
what is pending (an active version with ``index_status = 'pending'``), what its text is (each non-blank field of its
``indexed_content``, one vector per chunk) and where the vectors go. Taking a version counts an attempt
(``index_attempts``). The vectors are written in a transaction that re-checks the row is still pending and active
under a row lock: a version superseded meanwhile gets no vectors, and no row is marked indexed without its vectors.
"""

from __future__ import annotations

import json

from django.db import connection, transaction

from apps.core import metrics
from apps.memories import vector_index
from apps.retrieval import indexing, leases
from apps.retrieval.indexing import CycleReport, Work
from apps.retrieval.vectors import vector_literal

__all__ = ["INDEXER", "CycleReport", "MemoryIndexer", "run_cycle"]


class MemoryIndexer(indexing.Indexer):
    name = "memory"
    lease_kind = leases.MEMORY_INDEXING
    table = "memories"
    from_sql = "memories t"
    # The owner's subtree (["user", <id>] under the built-in policies): fairness is between those.
    owner_sql = "t.namespace[1:2]"
    size_sql = "octet_length(t.indexed_content::text)"
    readiness_key = "indexer"
    backlog_gauge = metrics.INDEXER_BACKLOG
    lag_gauge = metrics.INDEXER_LAG
    interval_setting = "MEMORY_EPISODIC_INDEXING_INTERVAL"
    batch_size_setting = "MEMORY_EPISODIC_INDEXING_BATCH_SIZE"
    task_name = "apps.memories.tasks.index_pending_memories"
    batch_text_bytes_setting = "MEMORY_INDEXING_BATCH_TEXT_BYTES"

    def pending(self) -> list[str]:
        return ["t.index_status = 'pending' AND t.state = 'active'"]

    def check_index(self, dimension: int) -> None:
        vector_index.check_index(dimension)

    def before_cycle(self, batch_size: int) -> int:
        removed = 0
        while True:
            done = remove_stale_vectors(batch_size)
            removed += done
            if done < batch_size:
                return removed

    def load(self, ids: list) -> list[tuple]:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"""
                UPDATE memories t SET index_attempts = t.index_attempts + 1
                WHERE t.id = ANY(%s) AND t.index_status = 'pending' AND t.state = 'active' AND {indexing.due_sql()}
                RETURNING t.id, t.namespace, t.attributes, t.indexed_content, t.expires_at
                """,  # noqa: S608 - code's SQL
                [ids],
            )
            # Django's psycopg setup hands jsonb back as text on raw cursors.
            return [
                (memory_id, namespace, _from_json(attributes), _from_json(content), expires_at)
                for memory_id, namespace, attributes, content, expires_at in cursor.fetchall()
            ]

    def work(self, row: tuple) -> Work:
        # One vector per chunk of each non-blank index field; a version whose fields are all blank gets none.
        memory_id, _namespace, _attributes, content, _expires_at = row
        return Work(memory_id, sorted((content or {}).items()), data=row)

    def store(self, done: list[tuple[Work, list[indexing.Vector]]], model: str) -> int:
        by_memory = {work.id: (work.data, vectors_of_memory) for work, vectors_of_memory in done}
        indexed = 0
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT id FROM memories WHERE id = ANY(%s) AND index_status = 'pending' AND state = 'active' "
                "ORDER BY id FOR UPDATE",
                [list(by_memory)],
            )
            still_pending = [row[0] for row in cursor.fetchall()]
            for memory_id in still_pending:
                (_id, namespace, attributes, _content, expires_at), vectors_of_memory = by_memory[memory_id]
                cursor.execute("DELETE FROM memory_vectors WHERE memory_id = %s", [memory_id])  # a retried lease
                if vectors_of_memory:
                    cursor.executemany(
                        "INSERT INTO memory_vectors (memory_id, field, chunk, model, namespace, attributes, "
                        "expires_at, embedding) VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s, %s::vector)",
                        [
                            [memory_id, field, chunk, model, namespace, _jsonb(attributes), expires_at,
                             vector_literal(vector)]
                            for field, chunk, vector in vectors_of_memory
                        ],
                    )  # fmt: skip
                indexed += 1
            if still_pending:
                cursor.execute(
                    f"UPDATE memories SET index_status = 'indexed', {indexing.CLEARED_STATE_SQL} "  # noqa: S608
                    "WHERE id = ANY(%s)",
                    [still_pending],
                )
        return indexed


def _from_json(value):
    return json.loads(value) if isinstance(value, str) else value


def _jsonb(value) -> str | None:
    return None if value is None else json.dumps(value)


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


INDEXER = MemoryIndexer()
run_cycle = INDEXER.run_cycle
