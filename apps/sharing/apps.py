from django.apps import AppConfig


class SharingConfig(AppConfig):
    name = "apps.sharing"
    label = "sharing"

    def ready(self) -> None:
        from apps.core import signals
        from apps.events import publisher
        from apps.sharing import access, services

        signals.conversation_deleting.connect(services.on_conversation_deleting, dispatch_uid="sharing.on_delete")
        # The live stream's recipients are the trees' members (D8): the events app asks here, importing nothing.
        publisher.register_audience(access.audiences)
