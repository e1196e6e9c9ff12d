from django.apps import AppConfig


class AttachmentsConfig(AppConfig):
    name = "apps.attachments"
    label = "attachments"

    def ready(self) -> None:
        from apps.attachments import receivers
        from apps.core import signals

        signals.entry_appending.connect(
            receivers.link_entry_attachments, dispatch_uid="apps.attachments.link_entry_attachments"
        )
        signals.conversation_deleting.connect(
            receivers.unlink_deleted_conversations, dispatch_uid="apps.attachments.unlink_deleted_conversations"
        )
