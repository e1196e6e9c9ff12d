"""The per-row state columns every background indexer's table carries (IndexState, used by apps.retrieval.indexing).
Retrieval owns no table of its own: each app's migration adds these columns to its own."""

from __future__ import annotations

from django.db import models


class IndexState(models.Model):
    """The columns apps.retrieval.indexing keeps on each row an indexer works on (each app's migration adds them to its
    own table): a row whose text fails to index is retried with a growing backoff and, after
    INDEXING_MAX_ATTEMPTS failures, quarantined: left alone until an operator runs ``manage.py indexing retry``."""

    index_failures = models.PositiveIntegerField(default=0, db_default=0)  # failures of this row's own text
    index_retry_at = models.DateTimeField(null=True, blank=True)  # not taken again before then
    # Why the last attempt failed ("embedding: EmbeddingError", "decrypt: key id 'k1'"): never the row's content.
    index_error = models.TextField(null=True, blank=True)  # noqa: DJ001 - null = no failure
    index_quarantined_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True
