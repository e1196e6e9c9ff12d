import logging

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS
from django.db.models.signals import post_migrate

logger = logging.getLogger(__name__)


def create_vector_index(sender: AppConfig, using: str = DEFAULT_DB_ALIAS, **kwargs) -> None:
    """After every ``manage.py migrate``: the HNSW index of the configured embedding provider's dimension (a new
    provider's too, on the next migrate). DDL runs here, under the migrating role, never on the request path."""
    from apps.conversations import vector_index
    from apps.core.embeddings import get_provider

    try:
        dimension = get_provider().dimension
    except ImproperlyConfigured as exc:  # the schema migrates all the same; the service will not start like this
        logger.warning("no HNSW index for conversations: the embedding provider is misconfigured (%s)", exc)
        return
    vector_index.create_index(dimension, using=using)


class ConversationsConfig(AppConfig):
    name = "apps.conversations"
    label = "conversations"

    def ready(self) -> None:
        post_migrate.connect(create_vector_index, sender=self, dispatch_uid="conversations.create_vector_index")

        from apps.conversations.selectors import CONTENT_PURPOSE, CONTENT_ROW_ID_FIELDS
        from apps.core import crypto

        # rotate_encryption_key re-encrypts entry content under the new primary key.
        crypto.register_encrypted_field("conversations.Entry", "content", CONTENT_PURPOSE, CONTENT_ROW_ID_FIELDS)

        from apps.conversations.indexer import INDEXER
        from apps.core import indexing

        # /readyz shows the conversation indexer's backlog ("conversation_indexer") beside the memory indexer's.
        indexing.register(INDEXER)
