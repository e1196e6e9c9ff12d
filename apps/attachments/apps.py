from django.apps import AppConfig


class AttachmentsConfig(AppConfig):
    name = "apps.attachments"
    label = "attachments"

    def ready(self) -> None:
        from apps.attachments import receivers, services
        from apps.core import signals
        from apps.encryption import crypto

        signals.entry_appending.connect(
            receivers.link_entry_attachments, dispatch_uid="apps.attachments.link_entry_attachments"
        )
        signals.conversation_deleting.connect(
            receivers.unlink_deleted_conversations, dispatch_uid="apps.attachments.unlink_deleted_conversations"
        )
        # rotate_encryption_key re-seals the blobs too (D4), through core's registry.
        crypto.register_blob_rotator(services.blob_rotator)

        from apps.attachments import selectors
        from apps.limits import services as limits

        limits.register_counter(
            limits.Counter(("attachments", "attachment_bytes"), selectors.quota_usage, selectors.quota_users)
        )
