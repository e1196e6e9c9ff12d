from django.apps import AppConfig


class SharingConfig(AppConfig):
    name = "apps.sharing"
    label = "sharing"

    def ready(self) -> None:
        from apps.core import signals
        from apps.sharing import services

        signals.conversation_deleting.connect(services.on_conversation_deleting, dispatch_uid="sharing.on_delete")
