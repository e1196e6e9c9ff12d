from django.apps import AppConfig


class MemoriesConfig(AppConfig):
    name = "apps.memories"
    label = "memories"

    def ready(self) -> None:
        from apps.memories import vector_index
        from apps.retrieval import vectors

        vectors.create_index_after_migrate(self, vector_index.create_index)

        from apps.encryption import crypto

        # rotate_encryption_key re-encrypts these columns under the new primary key.
        crypto.register_encrypted_field("memories.Memory", "value_ciphertext", "memory.value")
        crypto.register_encrypted_field("memories.MemoryEvent", "value_ciphertext", "memory_event.value", "id")
        from apps.memories import keyword_index

        keyword_index.register_rotation()  # and re-hashes the keyword index's terms

        from apps.memories.indexer import INDEXER
        from apps.retrieval import indexing

        indexing.register(INDEXER)  # /readyz "indexer", manage.py indexing

        from apps.limits import services as limits
        from apps.memories import selectors

        limits.register_counter(
            limits.Counter(("memories", "memory_bytes"), selectors.quota_usage, selectors.quota_users)
        )
