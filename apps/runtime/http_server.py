"""The web server's HTTP/1.1 protocol: uvicorn's httptools protocol with deadlines and size limits (issue 21.8-9).

uvicorn waits for a request's headers and body as long as the client likes: 40 connections declaring a large body
and sending a byte every two seconds held every REST thread (each blocked reading its body) and the whole service
stalled, ``/healthz`` included. It also answers a URL longer than the parser takes (65,535 bytes) or any request it
cannot parse with a ``text/plain`` 400. Here:

- the headers must be complete within ``REQUEST_HEADER_TIMEOUT_SECONDS`` of a connection's opening or of a
  request's first byte. The body must keep coming at ``REQUEST_BODY_MIN_BYTES_PER_SECOND`` on average: by ``t``
  seconds after the end of the headers, ``(t - REQUEST_BODY_TIMEOUT_SECONDS) * rate`` bytes must have arrived, so
  every byte received moves the deadline on (a slow link uploads a 10 MiB attachment however long it takes at that
  rate, a client trickling a byte now and then is cut off after the grace), and no body takes longer than
  ``REQUEST_BODY_MAX_SECONDS``. A client too slow gets a JSON 408 ``request_timeout`` and the connection is closed
  (an answer already under way is just cut off). Between requests uvicorn's keep-alive timeout applies as before;
- a URL over ``MAX_URL_BYTES`` is a JSON 414 ``uri_too_long``, request headers over ``REQUEST_MAX_HEADER_BYTES``
  a JSON 431 ``headers_too_large`` (counted as they arrive: a header that never ends is refused too), and any
  other unparsable request a JSON 400, each closing the connection.

The REST bridge (apps.runtime.wsgi_bridge) reads every body on the event loop before a thread takes the request, so a
slow client costs a socket and a buffer, never a thread, while these deadlines bound how long it keeps them.

gunicorn runs it through :class:`ServiceUvicornWorker` (the Procfile's ``-k``). Nothing here touches Django at import
time: gunicorn imports the worker class before the application.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn_worker import UvicornWorker

# httptools' URL parser refuses anything longer (http_parser_url keeps offsets in 16 bits).
MAX_URL_BYTES = 65_535
# What a request's head holds besides its URL and header lines: method, version, separators (data_received's bound).
_REQUEST_LINE_BYTES = 1024
# How long a refused connection keeps draining what its client still sends after our answer (_close_lingering).
LINGER_SECONDS = 2.0

_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 414: b"URI Too Long", 431: b"Request Header Fields Too Large"}


class _Refused(Exception):
    """Raised from a parser callback once the answer is written, so httptools stops parsing the rest."""


class ServiceHttpProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from django.conf import settings

        self._header_timeout = settings.REQUEST_HEADER_TIMEOUT_SECONDS
        self._body_timeout = settings.REQUEST_BODY_TIMEOUT_SECONDS
        self._body_min_rate = max(1, settings.REQUEST_BODY_MIN_BYTES_PER_SECOND)
        self._body_max_seconds = settings.REQUEST_BODY_MAX_SECONDS
        self._body_since: float | None = None  # loop time the current request's headers ended, while its body comes
        self._body_bytes = 0
        self._max_header_bytes = settings.REQUEST_MAX_HEADER_BYTES
        self._deadline: asyncio.TimerHandle | None = None
        self._url_bytes = 0
        self._header_bytes = 0
        self._in_head = True  # between a message's end (or the connection's start) and the next one's headers
        self._head_bytes = 0  # received while in the head
        self._refused = False

    # --- deadlines ----------------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self._header_timeout)  # a connection that never sends a byte is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        # httptools hands a header to on_header only once it is complete, gathering a long one meanwhile with
        # bytes += (memory, and a copy of all of it per packet): a head still arriving is bounded here by what came.
        if (
            self._in_head
            and not self._refused
            and self._head_bytes - self._url_bytes > self._max_header_bytes + _REQUEST_LINE_BYTES
        ):
            self._refuse(431, "headers_too_large", f"The request headers exceed {self._max_header_bytes} bytes.")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._url_bytes = self._header_bytes = 0
        self._body_since = None
        self._arm(self._header_timeout)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._body_since, self._body_bytes = self.loop.time(), 0
        self._arm(min(self._body_timeout, self._body_max_seconds))
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        # Only counted here; the timer, when it fires, works out how far these bytes moved the deadline (one
        # timer per request, not a re-arm per packet).
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_head, self._head_bytes = True, 0
        self._body_since = None
        super().on_message_complete()

    def _body_deadline(self) -> float:
        """When the body being received is too slow: the grace, plus the time its bytes so far buy at the minimum
        rate, never past the absolute cap."""
        assert self._body_since is not None
        earned = self._body_timeout + self._body_bytes / self._body_min_rate
        return self._body_since + min(earned, self._body_max_seconds)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self._body_since is not None and not self._refused:
            left = self._body_deadline() - self.loop.time()
            if left > 0:  # the body kept coming: its deadline moved on
                self._arm(left)
                return
        headers_done = self.cycle is not None and self.cycle.scope is self.scope
        part = "body" if headers_done else "headers"
        self._refuse(408, "request_timeout", f"The request {part} did not arrive in time.")

    # --- limits -------------------------------------------------------------------------------------------------

    def on_url(self, url: bytes) -> None:
        self._url_bytes += len(url)
        if self._url_bytes > MAX_URL_BYTES:
            self._refuse(414, "uri_too_long", f"The URL is longer than {MAX_URL_BYTES} bytes.")
            raise _Refused
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4  # ": " and CRLF
        if self._header_bytes > self._max_header_bytes:
            self._refuse(431, "headers_too_large", f"The request headers exceed {self._max_header_bytes} bytes.")
            raise _Refused
        super().on_header(name, value)

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to anything httptools cannot parse (and to a callback that raised): D1's JSON instead of
        # text/plain, unless a limit already answered.
        if not self._refused:
            self._refuse(400, "validation_error", "The request is not valid HTTP/1.1.")

    # --- the answer ---------------------------------------------------------------------------------------------

    def _refuse(self, status: int, code: str, message: str) -> None:
        """Answer ``status`` with D1's body unless a response already started, and close the connection. The
        request's application (if it started) sees a disconnect and sends nothing more."""
        self._refused = True
        self._disarm()
        cycle = self.cycle
        in_progress = cycle is not None and not cycle.response_complete
        answer = not (in_progress and cycle.response_started)
        if in_progress:
            cycle.disconnected = True
            cycle.message_event.set()
        if answer and not self.transport.is_closing():
            self.transport.write(_error_response(status, code, message, self._supplied_request_id()))
            self._close_lingering()
        else:
            self.transport.close()

    def _close_lingering(self) -> None:
        """Send our side's FIN after the answer, then go on reading (and dropping) what the client still sends for
        a moment before closing. Closing at once with the client's unread bytes in the socket makes the kernel reset
        the connection, and a reset can discard the answer before the client reads it: a client still sending its
        body (the one a 408 or 413 is for) would see "connection reset" instead of the JSON error."""
        transport = self.transport
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, transport.close)

    def eof_received(self) -> bool | None:
        if self._refused:
            self.transport.close()  # the client has read our answer and closed its side: nothing is left to drain
            return None
        return super().eof_received()

    def _supplied_request_id(self) -> str:
        if self.scope is not None:
            for name, value in self.scope.get("headers", ()):
                if name == b"x-request-id":
                    return value.decode("latin-1")
        return ""


def _error_response(status: int, code: str, message: str, supplied_request_id: str) -> bytes:
    """A whole HTTP response with D1's body, written straight to the socket (no application runs for it)."""
    from apps.core import errors
    from apps.core.logging import request_id_for, reset_request_id, set_request_id

    request_id = request_id_for(supplied_request_id)
    token = set_request_id(request_id)
    try:
        body = json.dumps(errors.body(errors.ApiError(status, message, code=code))).encode()
    finally:
        reset_request_id(token)
    return b"".join(
        [
            b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status]),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"x-request-id: %s\r\n" % request_id.encode(),
            b"connection: close\r\n\r\n",
            body,
        ]
    )


class ServiceUvicornWorker(UvicornWorker):
    """gunicorn's uvicorn worker serving :class:`ServiceHttpProtocol` (uvloop as before)."""

    CONFIG_KWARGS = {**UvicornWorker.CONFIG_KWARGS, "http": ServiceHttpProtocol}
