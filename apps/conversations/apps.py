from django.apps import AppConfig


class ConversationsConfig(AppConfig):
    name = "apps.conversations"
    label = "conversations"

    def ready(self) -> None:
        from apps.conversations.selectors import CONTENT_PURPOSE, CONTENT_ROW_ID_FIELDS
        from apps.core import crypto

        # rotate_encryption_key re-encrypts entry content under the new primary key.
        crypto.register_encrypted_field("conversations.Entry", "content", CONTENT_PURPOSE, CONTENT_ROW_ID_FIELDS)

        from apps.conversations import indexer
        from apps.core import readiness

        # /readyz shows the conversation indexer's backlog beside the memory indexer's.
        readiness.register_info("conversation_indexer", indexer.readiness_info)
