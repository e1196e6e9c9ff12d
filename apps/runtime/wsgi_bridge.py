"""a2wsgi's WSGI-in-ASGI bridge, with fewer thread hops for the common request.

a2wsgi runs the WSGI application in a thread pool and hands each response message to the event loop through
``run_coroutine_threadsafe(...).result()``: the request thread blocks until the loop has queued the message. A
plain JSON response takes three such hops (start, body, end of body), and a small request body one more to read
it. Under load every hop is a GIL hand-off between the request thread and a busy event loop.

Here:

* every request body the endpoint may accept is read on the event loop before a request thread takes the request:
  in memory up to ``PRELOAD_BODY_BYTES``, spilling to a temporary file beyond. A thread never waits on the network,
  so slow clients cannot hold the thread pool (issue 21.8: 40 clients trickling large bodies stalled every request,
  ``/healthz`` included); apps.runtime.http_server bounds how long the loop waits for them. Reading it costs the thread
  no hop either;
* a response whose body is already in memory (every non-streaming Django response) is queued for the loop in one
  ``call_soon_threadsafe`` that the thread does not wait for: start, body and end together.

A chunked request body (no Content-Length) is spooled on the loop too, to at most the endpoint's limit + 1 bytes,
and handed over with the Content-Length it turned out to have: Django reads exactly CONTENT_LENGTH bytes and would
otherwise see an empty body (a chunked PUT was a 400). Past the limit the application answers its own 413 on what
was read. A client that disconnects before its body is complete gets no application run at all.

A declared length past the endpoint's limit (the application answers 413 from the header without reading) and
streaming responses (downloads) keep a2wsgi's own path, with its back-pressure.
Ordering holds because the loop runs ``call_soon_threadsafe`` callbacks in submission order: the response is
queued before the thread pool's completion callback resumes the responder, which then ends the queue and waits
for the sender.
"""

from __future__ import annotations

import contextvars
import functools
import io
import tempfile
from typing import IO

from a2wsgi.wsgi import WSGIMiddleware, WSGIResponder, build_environ
from django.conf import settings

# Bodies up to this size are read into memory; larger ones spill to a temporary file while they arrive.
PRELOAD_BODY_BYTES = 256 * 1024


def chunked_body_max_bytes() -> int:
    """The largest body any endpoint accepts (JSON requests, attachment uploads with their multipart framing)."""
    from apps.attachments.views import MULTIPART_OVERHEAD_BYTES

    return max(settings.REQUEST_MAX_BODY_BYTES, settings.ATTACHMENT_MAX_BYTES + MULTIPART_OVERHEAD_BYTES)


def body_limit(path: str) -> int:
    """The largest body the endpoint at ``path`` accepts: uploads their own limit, everything else
    REQUEST_MAX_BODY_BYTES (apps.core.middleware.BodySizeLimitMiddleware)."""
    from apps.core.middleware import BodySizeLimitMiddleware

    if path.startswith(BodySizeLimitMiddleware.exempt_prefixes):
        return chunked_body_max_bytes()
    return settings.REQUEST_MAX_BODY_BYTES


# _read_body's answer when the client left before its body was complete.
_GONE = object()


class CoalescingResponder(WSGIResponder):
    def __init__(self, app, executor, send_queue_size: int) -> None:
        super().__init__(app, executor, send_queue_size)
        self._pending_start: dict | None = None

    async def __call__(self, scope, receive, send) -> None:
        read = await _read_body(scope, receive)
        if read is None:
            return await super().__call__(scope, receive, send)
        if read is _GONE:
            return  # nobody to answer (or apps.runtime.http_server answered 408 already)
        # WSGIResponder.__call__ with the body already read: a2wsgi builds its Body inside __call__, so the few
        # lines around it are repeated here rather than patched in.
        body, length = read
        try:
            environ = build_environ(scope, body)
            environ["CONTENT_LENGTH"] = str(length)
            await self._run(environ, send)
        finally:
            body.close()

    async def _run(self, environ, send) -> None:
        sender = self.loop.create_task(self.sender(send))
        try:
            func = functools.partial(contextvars.copy_context().run, self.wsgi)
            await self.loop.run_in_executor(self.executor, func, environ, self.start_response)
            await self.send_queue.put(None)
            await sender
            if self.exc_info is not None:
                raise self.exc_info[0].with_traceback(self.exc_info[1], self.exc_info[2])
        finally:
            if not sender.done():
                sender.cancel()

    def start_response(self, status: str, response_headers, exc_info=None):
        """Held back until the body is known (see wsgi); a2wsgi's would send it at once."""
        self.exc_info = exc_info
        if not self.response_started:
            self.response_started = True
            code, _ = status.split(" ", 1)
            self._pending_start = {
                "type": "http.response.start",
                "status": int(code),
                "headers": [(name.strip().encode("latin1").lower(), value.strip().encode("latin1")) for name, value in response_headers],
            }
        return self._write

    def _flush_start(self) -> None:
        if self._pending_start is not None:
            message, self._pending_start = self._pending_start, None
            self.send(message)

    def _write(self, chunk: bytes) -> None:
        self._flush_start()
        self.send({"type": "http.response.body", "body": chunk, "more_body": True})

    def wsgi(self, environ, start_response) -> None:
        iterable = self.app(environ, start_response)
        try:
            if getattr(iterable, "streaming", True) is False and self._pending_start is not None:
                # A Django HttpResponse: its content is in memory already.
                messages = [self._pending_start, {"type": "http.response.body", "body": b"".join(iterable)}]
                self._pending_start = None
                self.loop.call_soon_threadsafe(_queue_all, self.send_queue, messages)
                return
            # A generator application may call start_response only once iterated: the start goes before the first
            # chunk, or before the end of an empty body.
            for chunk in iterable:
                self._write(chunk)
            self._flush_start()
            self.send({"type": "http.response.body", "body": b""})
        finally:
            getattr(iterable, "close", lambda: None)()


def _queue_all(queue, messages: list) -> None:
    # The queue belongs to this one response and is empty until now: put_nowait cannot overflow it.
    for message in messages:
        queue.put_nowait(message)


async def _read_body(scope, receive) -> tuple[IO[bytes], int] | object | None:
    """The request body read on the loop, with its length; None for a declared length that is malformed or past
    the endpoint's limit (the application answers those without reading), _GONE when the client left first."""
    declared = chunked = None
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            declared = value
        elif name == b"transfer-encoding":
            chunked = value
    limit = body_limit(scope.get("path", ""))
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            return None  # the application answers the malformed header
        if not 0 <= length <= limit:
            return None
        if length == 0:
            return io.BytesIO(), 0
        into = io.BytesIO() if length <= PRELOAD_BODY_BYTES else tempfile.SpooledTemporaryFile(PRELOAD_BODY_BYTES)
        return await _spool(receive, length, into, exact=True)
    if chunked is None:
        return io.BytesIO(), 0  # no body
    return await _spool(receive, limit + 1, tempfile.SpooledTemporaryFile(PRELOAD_BODY_BYTES), exact=False)


async def _spool(receive, limit: int, into: IO[bytes], *, exact: bool) -> tuple[IO[bytes], int] | object:
    """Body messages into ``into`` until the body ends or ``limit`` bytes are in (``exact``: the declared length,
    which must all arrive); _GONE on a disconnect before that."""
    size = 0
    while size < limit:
        message = await receive()
        if message["type"] != "http.request":
            into.close()
            return _GONE
        chunk = message.get("body", b"")[: limit - size]
        into.write(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            if exact and size < limit:
                into.close()
                return _GONE  # the server saw the body end short of its Content-Length
            break
    into.seek(0)
    return into, size


async def acknowledge_lifespan(receive, send) -> None:
    """Answer an ASGI lifespan scope: nothing to start or stop per worker, acknowledged so servers that probe
    lifespan do not warn."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class CoalescingWSGIMiddleware(WSGIMiddleware):
    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            responder = CoalescingResponder(self.app, self.executor, self.send_queue_size)
            return await responder(scope, receive, send)
        return await super().__call__(scope, receive, send)

