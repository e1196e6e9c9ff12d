"""Publishing after the response (apps.events.publisher): a write request's events are sent once its response has
been handed to the server, not before."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponseBase

from apps.events import publisher


class DeferPublishMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        publisher.defer_until_flush()
        try:
            response = self.get_response(request)
        except BaseException:
            publisher.flush()
            raise
        if response.streaming:
            publisher.flush()  # a streamed response may take long; its request's events go now
        # Otherwise request_finished (the server closing the response after its body) flushes.
        return response
