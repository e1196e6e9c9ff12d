"""`manage.py indexing`: the background indexers' backlog and quarantine (apps.retrieval.indexing).

    manage.py indexing status                        # pending, oldest pending, quarantined, per indexer
    manage.py indexing quarantined [--indexer NAME]  # the rows given up on: id, failures, reason (never content)
    manage.py indexing retry [--indexer NAME] [--id ID ...]   # put them back in the queue

Quarantined rows are retried after what made them fail is fixed: a key put back in MEMORY_ENCRYPTION_KEYS, an
embedding provider that accepts the text. A row that fails again is quarantined again after INDEXING_MAX_ATTEMPTS.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.retrieval import indexing


class Command(BaseCommand):
    help = "Show the background indexers' backlog and quarantined rows, and retry quarantined rows."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        actions.add_parser("status", help="pending and quarantined rows per indexer")
        for name, text in (("quarantined", "list quarantined rows"), ("retry", "retry quarantined rows")):
            action = actions.add_parser(name, help=text)
            action.add_argument("--indexer", choices=sorted(indexing.registered()), help="one indexer (default: all)")
            if name == "retry":
                action.add_argument("--id", dest="ids", action="append", help="only this row (repeatable)")
            else:
                action.add_argument("--limit", type=int, default=100)

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        chosen = options.get("indexer")
        indexers = [ix for name, ix in sorted(indexing.registered().items()) if chosen in (None, name)]
        if action == "status":
            for ix in indexers:
                status = ix.status()
                self.stdout.write(
                    f"{ix.name}: {status.pending} pending (oldest {status.oldest_pending_seconds:.0f} s), "
                    f"{status.quarantined} quarantined"
                )
        elif action == "quarantined":
            for ix in indexers:
                for row in ix.quarantined_rows(options["limit"]):
                    self.stdout.write(
                        f"{ix.name} {row['id']} failures={row['failures']} since={row['quarantined_at'].isoformat()} "
                        f"reason={row['error']}"
                    )
        else:
            ids = options.get("ids")
            if ids is not None:
                if len(indexers) != 1:
                    raise CommandError("--id needs --indexer: ids belong to one indexer's table")
                try:
                    ids = [uuid.UUID(value) for value in ids]
                except ValueError:
                    raise CommandError("--id takes row ids as `indexing quarantined` lists them (UUIDs)") from None
            for ix in indexers:
                count = ix.retry_quarantined(ids)
                self.stdout.write(f"{ix.name}: {count} quarantined row(s) back in the queue (next cycle)")
