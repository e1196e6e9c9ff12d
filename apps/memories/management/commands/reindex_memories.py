"""`manage.py reindex_memories`: re-embed every indexed memory with the configured provider.

Run it after changing EMBEDDING_PROVIDER (or the model/dimension). Versions whose vectors were made by another
model are marked pending in batches, then embedded by the same code path as the background indexer. Safe while the
service runs (the indexer's work leases let workers and this command share the work) and resumable: rows
marked pending stay pending until embedded, and a re-run only touches what is still not on the current model.
Until it finishes, semantic search returns only the versions already re-embedded.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import connection
from tqdm import tqdm

from apps.memories import vector_index
from apps.memories.indexer import INDEXER
from apps.retrieval import indexing
from apps.retrieval.embeddings import get_provider


class Command(BaseCommand):
    help = "Re-embed indexed memories whose vectors were made by another embedding model."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=500, help="rows marked pending per statement")
        parser.add_argument("--embed-batch-size", type=int, default=None, help="rows embedded per indexer batch")
        parser.add_argument("--no-progress", action="store_true")
        parser.add_argument(
            "--drop-old-indexes", action="store_true", help="drop HNSW indexes of other dimensions when done"
        )

    def handle(self, *args: Any, batch_size: int, embed_batch_size: int | None, no_progress: bool,
               drop_old_indexes: bool, **options: Any) -> None:
        provider = get_provider()
        model = vector_index.model_tag(provider)
        self.stdout.write(f"Embedding model: {model}")
        vector_index.create_index(provider.dimension)

        marked = 0
        while True:
            with connection.cursor() as cursor:
                cursor.execute(
                    f"""
                    WITH stale AS (
                        SELECT m.id FROM memories m
                        WHERE m.state = 'active' AND m.index_status = 'indexed'
                          AND EXISTS (SELECT 1 FROM memory_vectors v WHERE v.memory_id = m.id AND v.model <> %s)
                        LIMIT %s FOR UPDATE SKIP LOCKED
                    )
                    UPDATE memories m SET index_status = 'pending', index_attempts = 0, {indexing.RESET_STATE_SQL}
                    FROM stale WHERE m.id = stale.id
                    """,  # noqa: S608 - code's SQL
                    [model, batch_size],
                )
                marked += cursor.rowcount
                if cursor.rowcount < batch_size:
                    break
        pending = INDEXER.status().pending
        self.stdout.write(f"Marked {marked} version(s) for re-embedding; {pending} pending in total.")

        with tqdm(total=pending, unit="memory", disable=no_progress) as progress:
            while True:
                report = INDEXER.run_cycle(batch_size=embed_batch_size, max_batches=1)
                progress.update(report.indexed)
                if report.stalled:
                    self.stderr.write("The embedding provider failed; run the command again to resume.")
                    raise SystemExit(1)
                if report.indexed == 0 and report.failed == 0:
                    break
        status = INDEXER.status()
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM memory_vectors v USING memories m WHERE v.memory_id = m.id AND v.model <> %s "
                "AND m.index_status = 'indexed'",
                [model],
            )
            if drop_old_indexes:
                cursor.execute(
                    "SELECT indexname FROM pg_indexes WHERE tablename = 'memory_vectors' "
                    "AND indexname LIKE 'memory\\_vectors\\_hnsw\\_%%' AND indexname <> %s",
                    [vector_index.index_name(provider.dimension)],
                )
                for (name,) in cursor.fetchall():
                    cursor.execute(f'DROP INDEX IF EXISTS "{name}"')
                    self.stdout.write(f"Dropped {name}")
        self.stdout.write(
            f"Done. {status.pending} version(s) still pending (retrying after failures or leased elsewhere), "
            f"{status.quarantined} quarantined (`manage.py indexing quarantined`)."
        )
