import logging

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS
from django.db.models.signals import post_migrate

logger = logging.getLogger(__name__)


def create_vector_index(sender: AppConfig, using: str = DEFAULT_DB_ALIAS, **kwargs) -> None:
    """After every ``manage.py migrate``: the HNSW index of the configured embedding provider's dimension (a new
    provider's too, on the next migrate). DDL runs here, under the migrating role, never on the request path."""
    from apps.core.embeddings import get_provider
    from apps.memories import vector_index

    try:
        dimension = get_provider().dimension
    except ImproperlyConfigured as exc:  # the schema migrates all the same; the service will not start like this
        logger.warning("no HNSW index for memories: the embedding provider is misconfigured (%s)", exc)
        return
    vector_index.create_index(dimension, using=using)


class MemoriesConfig(AppConfig):
    name = "apps.memories"
    label = "memories"

    def ready(self) -> None:
        post_migrate.connect(create_vector_index, sender=self, dispatch_uid="memories.create_vector_index")

        from apps.core import crypto

        # rotate_encryption_key re-encrypts these columns under the new primary key.
        crypto.register_encrypted_field("memories.Memory", "value_ciphertext", "memory.value")
        crypto.register_encrypted_field("memories.MemoryEvent", "value_ciphertext", "memory_event.value", "id")

        from apps.core import indexing, readiness
        from apps.core.embeddings import get_provider
        from apps.memories.indexer import INDEXER

        readiness.register("embedder", lambda: get_provider().check())
        indexing.register(INDEXER)  # /readyz "indexer", manage.py indexing
