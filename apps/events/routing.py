"""ASGI-native routes picked up by config.asgi: the event stream bypasses the WSGI bridge (it holds a connection
open for minutes, which would pin one of the bridge's threads per client)."""

from apps.events.consumer import EventStreamConsumer

native_routes = {"/v1/events": EventStreamConsumer.as_asgi()}
