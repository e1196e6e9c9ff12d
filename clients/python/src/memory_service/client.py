"""The synchronous client. Its methods (:class:`~memory_service._methods.BaseClient`) are
:class:`~memory_service.AsyncClient`'s; this module supplies how a call is sent, blocking."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx

from memory_service import _base
from memory_service import _operations as ops
from memory_service._methods import BaseClient
from memory_service._sse import BaseEventStream
from memory_service.auth import resolve_token
from memory_service.errors import APIConnectionError, UnavailableError
from memory_service.models import Page, StreamEvent

T = TypeVar("T")


class Client(BaseClient[httpx.Client]):
    """A client of one Memory Service (its parameters: :class:`~memory_service._methods.BaseClient`). Thread-safe;
    close it (or use ``with``) to release its connections."""

    def _new_http(self, timeout: float | httpx.Timeout) -> httpx.Client:
        return httpx.Client(timeout=timeout)

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- Sending: the four ways of BaseClient's methods ------------------------------------------------------------

    def _perform(self, step: _base.Step) -> Any:
        match step:
            case _base.Token():
                return resolve_token(self._config.token)
            case _base.Send(request, follow_redirects):
                built = self._http.build_request(**request)
                return self._http.send(built, stream=True, follow_redirects=follow_redirects)
            case _base.Read(response):
                return response.read()
            case _base.Close(response):
                return response.close()
            case _base.Sleep(seconds):
                return time.sleep(seconds)

    def _send(
        self, call: _base.Call[Any], *, stream: bool = False, timeout: httpx.Timeout | None = None,
    ) -> httpx.Response:
        return _base.drive(_base.exchange(self._config, call, stream=stream, timeout=timeout), self._perform)

    def _run(self, call: _base.Call[T]) -> T:
        try:
            return call.parse(self._send(call))
        finally:
            if call.cleanup is not None:
                call.cleanup()

    def _paginate(
        self, make_call: Callable[[str | None], _base.Call[Page[T]]], cursor: str | None = None,
    ) -> Iterator[T]:
        while True:
            page = self._run(make_call(cursor))
            yield from page.data
            # The memory event timeline answers a cursor even when caught up (for polling): an empty page ends.
            if page.after_cursor is None or not page.data:
                return
            cursor = page.after_cursor

    def _download(self, call: _base.Call[None]) -> AttachmentDownload:
        return AttachmentDownload(self._send(call, stream=True))

    def _events(self, options: ops.EventsOptions) -> EventStream:
        stream = EventStream(self, options)
        stream.connect()
        return stream


class AttachmentDownload(_base.DownloadInfo):
    """A streamed download (or a 304 when ``if_none_match`` matched). Close it, or use it as a context manager."""

    def iter_bytes(self, chunk_size: int | None = 64 * 1024) -> Iterator[bytes]:
        try:
            yield from self._response.iter_bytes(chunk_size)
        except httpx.TransportError as exc:
            raise _base.connection_error(exc) from exc

    def read(self) -> bytes:
        return b"".join(self.iter_bytes())

    def save(self, path: str | Path) -> int:
        """Write the file to ``path``; answers the number of bytes written."""
        with Path(path).open("wb") as out:
            return sum(out.write(chunk) for chunk in self.iter_bytes())

    def close(self) -> None:
        self._response.close()

    def __enter__(self) -> AttachmentDownload:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class EventStream(BaseEventStream[Client], Iterator[StreamEvent]):
    """Iterator over the live event stream; see :meth:`Client.events`. It is connected when ``events()`` returns:
    everything that happens from then on is delivered."""

    def __init__(self, client: Client, options: ops.EventsOptions) -> None:
        super().__init__(client, client._config.retry, options)
        self._closed = threading.Event()
        self._events = self._run()

    def connect(self) -> None:
        """Open the connection now, if it is not open (``events()`` does); errors such as a 401 are raised here."""
        if self._response is None:
            self._response = self._client._send(self._request(), stream=True, timeout=self._timeout)

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> StreamEvent:
        return next(self._events)

    def close(self) -> None:
        """Stop (from any thread): the iteration ends."""
        self._closed.set()
        response = self._response
        if response is not None:
            # Closing a socket does not wake a thread blocked reading it; shutting it down does.
            network_stream = response.extensions.get("network_stream")
            sock = network_stream.get_extra_info("socket") if network_stream is not None else None
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            response.close()
        with contextlib.suppress(ValueError):  # being iterated by another thread right now: it ends by itself
            self._events.close()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run(self) -> Generator[StreamEvent, None, None]:
        while not self._closed.is_set():
            delay = self._delay()
            if delay and self._closed.wait(delay):
                return
            try:
                self.connect()
            except (APIConnectionError, UnavailableError) as exc:
                self._connect_failed(exc)
                continue
            response = self._response
            assert response is not None
            try:
                for line in response.iter_lines():
                    event = self._feed(line)
                    if event is not None:
                        yield event
                        if event.is_evicted:
                            break
            except (httpx.TransportError, httpx.StreamError):
                pass  # dropped, or closed by close(): reconnect below, or stop
            finally:
                response.close()
                self._response = None
            if not self._again(self._closed.is_set()):
                return
