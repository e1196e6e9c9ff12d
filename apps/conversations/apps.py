from django.apps import AppConfig


class ConversationsConfig(AppConfig):
    name = "apps.conversations"
    label = "conversations"

    def ready(self) -> None:
        from apps.conversations import vector_index
        from apps.retrieval import vectors

        vectors.create_index_after_migrate(self, vector_index.create_index)

        from apps.conversations.selectors import CONTENT_PURPOSE, CONTENT_ROW_ID_FIELDS
        from apps.encryption import crypto

        # rotate_encryption_key re-encrypts entry content under the new primary key.
        crypto.register_encrypted_field("conversations.Entry", "content", CONTENT_PURPOSE, CONTENT_ROW_ID_FIELDS)

        from apps.conversations.indexer import INDEXER
        from apps.retrieval import indexing

        # /readyz shows the conversation indexer's backlog ("conversation_indexer") beside the memory indexer's.
        indexing.register(INDEXER)

        from apps.conversations import (
            openapi,  # noqa: F401  (registers its schema extension)
            selectors,
        )
        from apps.limits import services as limits

        limits.register_counter(
            limits.Counter(("conversations", "entry_bytes"), selectors.quota_usage, selectors.quota_users)
        )
