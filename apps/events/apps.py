from django.apps import AppConfig


class EventsConfig(AppConfig):
    name = "apps.events"
    label = "events"

    def ready(self) -> None:
        from django.core import signals

        from apps.events import publisher

        signals.request_finished.connect(publisher.request_finished, dispatch_uid="apps.events.publisher.finished")
