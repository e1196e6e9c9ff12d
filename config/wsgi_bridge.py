"""a2wsgi's WSGI-in-ASGI bridge, with fewer thread hops for the common request.

a2wsgi runs the WSGI application in a thread pool and hands each response message to the event loop through
``run_coroutine_threadsafe(...).result()``: the request thread blocks until the loop has queued the message. A
plain JSON response takes three such hops (start, body, end of body), and a small request body one more to read
it. Under load every hop is a GIL hand-off between the request thread and a busy event loop.

Here, for the request shape the REST API nearly always has:

* a body of declared length up to ``PRELOAD_BODY_BYTES`` is read on the event loop before the request thread
  starts, so reading it costs the thread no hop;
* a response whose body is already in memory (every non-streaming Django response) is queued for the loop in one
  ``call_soon_threadsafe`` that the thread does not wait for: start, body and end together.

A chunked request body (no Content-Length) is spooled on the loop too, to at most ``CHUNKED_BODY_MAX_BYTES`` + 1
bytes, and handed over with the Content-Length it turned out to have: Django reads exactly CONTENT_LENGTH bytes
and would otherwise see an empty body (a chunked PUT was a 400). Anything past that limit is larger than every
endpoint accepts, so the application answers its own 413 on what was read.

Streaming responses (downloads) and larger declared bodies keep a2wsgi's own path, with its back-pressure.

Requests run on ``LifoThreadPool``: the thread that went idle last takes the next request.
Ordering holds because the loop runs ``call_soon_threadsafe`` callbacks in submission order: the response is
queued before the thread pool's completion callback resumes the responder, which then ends the queue and waits
for the sender.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextvars
import functools
import io
import tempfile
import threading
from typing import IO, Any

from a2wsgi.wsgi import WSGIMiddleware, WSGIResponder, build_environ
from django.conf import settings

# Declared bodies up to this size are read before the request thread starts; larger ones stream through a2wsgi.
PRELOAD_BODY_BYTES = 256 * 1024
# Chunked bodies stay in memory up to this size, then spill to a temporary file.
_SPOOL_MEMORY_BYTES = 1024 * 1024


def chunked_body_max_bytes() -> int:
    """The largest body any endpoint accepts (JSON requests, attachment uploads with their multipart framing)."""
    from apps.attachments.views import MULTIPART_OVERHEAD_BYTES

    return max(settings.REQUEST_MAX_BODY_BYTES, settings.ATTACHMENT_MAX_BYTES + MULTIPART_OVERHEAD_BYTES)


class CoalescingResponder(WSGIResponder):
    def __init__(self, app, executor, send_queue_size: int) -> None:
        super().__init__(app, executor, send_queue_size)
        self._pending_start: dict | None = None

    async def __call__(self, scope, receive, send) -> None:
        read = await _read_body(scope, receive)
        if read is None:
            return await super().__call__(scope, receive, send)
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


async def _read_body(scope, receive) -> tuple[IO[bytes], int] | None:
    """The request body read on the loop, with its length; None for a declared length past PRELOAD_BODY_BYTES."""
    declared = chunked = None
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            declared = value
        elif name == b"transfer-encoding":
            chunked = value
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            return None  # the application answers the malformed header
        if not 0 <= length <= PRELOAD_BODY_BYTES:
            return None
        if length == 0:
            return io.BytesIO(), 0
        return await _spool(receive, length, io.BytesIO())
    if chunked is None:
        return io.BytesIO(), 0  # no body
    return await _spool(receive, chunked_body_max_bytes() + 1, tempfile.SpooledTemporaryFile(_SPOOL_MEMORY_BYTES))


async def _spool(receive, limit: int, into: IO[bytes]) -> tuple[IO[bytes], int]:
    """Body messages into ``into`` until the body ends or ``limit`` bytes are in; a disconnect ends it early."""
    size = 0
    while size < limit:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")[: limit - size]
        into.write(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
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


class _Slot:
    """One pool thread: the job it is given, and the semaphore it sleeps on while idle."""

    __slots__ = ("job", "wake")

    def __init__(self, job: tuple | None) -> None:
        self.job = job
        self.wake = threading.Semaphore(0)


class LifoThreadPool(concurrent.futures.Executor):
    """A thread pool whose most recently idle thread takes the next job; up to ``max_workers`` threads.

    The standard ThreadPoolExecutor's idle threads all wait on one queue and take jobs in turn, so one request
    after another lands on a different thread and, since each thread keeps its own database connection, on a
    different PostgreSQL backend, with its CPU caches cold each time. At one client with the 16 threads warm, the
    web process spent 0.2-0.6 ms more CPU per request and PostgreSQL 0.1-0.2 ms more than with 2 threads
    (``bench/memories.py --concurrency 1``, two alternating rounds: search 1.65-1.85 against 1.30-1.47 ms of web
    CPU, issue 12). Here a light load stays on a few hot threads and connections; a heavy one still gets all.
    Jobs arriving while every thread is busy wait in arrival order.
    """

    def __init__(self, max_workers: int, thread_name_prefix: str = "WSGI") -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self._max_workers = max_workers
        self._prefix = thread_name_prefix
        self._lock = threading.Lock()
        self._idle: list[_Slot] = []  # the most recently idle last
        self._backlog: collections.deque[tuple] = collections.deque()
        self._threads = 0
        self._shutdown = False

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        job = (future, fn, args, kwargs)
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._idle:
                slot = self._idle.pop()
                slot.job = job
                slot.wake.release()
            elif self._threads < self._max_workers:
                self._threads += 1
                name = f"{self._prefix}_{self._threads - 1}"
                threading.Thread(target=self._work, args=(_Slot(job),), name=name, daemon=True).start()
            else:
                self._backlog.append(job)
        return future

    def _work(self, slot: _Slot) -> None:
        while True:
            job, slot.job = slot.job, None
            if job is None:  # shut down
                return
            future, fn, args, kwargs = job
            del job
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # handed to the waiting caller, as ThreadPoolExecutor does
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            # No references to the finished request while idle.
            del future, fn, args, kwargs
            result = None
            with self._lock:
                if self._backlog:
                    slot.job = self._backlog.popleft()
                    continue
                if self._shutdown:
                    return
                self._idle.append(slot)
            slot.wake.acquire()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Idle threads end now, busy ones after their job; queued jobs still run unless ``cancel_futures``.
        The threads are daemons: ``wait`` is accepted and ignored."""
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                for future, *_ in self._backlog:
                    future.cancel()
                self._backlog.clear()
            idle, self._idle = self._idle, []
        for slot in idle:
            slot.job = None
            slot.wake.release()


class CoalescingWSGIMiddleware(WSGIMiddleware):
    def __init__(self, app: Any, workers: int = 10, send_queue_size: int = 10) -> None:
        super().__init__(app, workers, send_queue_size)
        self.executor.shutdown(wait=False)  # a2wsgi's own pool; it has started no thread yet
        self.executor = LifoThreadPool(workers, thread_name_prefix="WSGI")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            responder = CoalescingResponder(self.app, self.executor, self.send_queue_size)
            return await responder(scope, receive, send)
        return await super().__call__(scope, receive, send)

