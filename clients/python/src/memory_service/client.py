"""The synchronous client. Its methods (:class:`~memory_service._methods.BaseClient`) are
:class:`~memory_service.AsyncClient`'s; this module supplies how a call is sent, blocking."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx

from memory_service import _base
from memory_service import _operations as ops
from memory_service._base import AttachmentDownload
from memory_service._methods import BaseClient
from memory_service._sse import EventStream
from memory_service.auth import resolve_token
from memory_service.models import Page

__all__ = ["AttachmentDownload", "Client", "EventStream"]

T = TypeVar("T")


class Client(BaseClient[httpx.Client]):
    """A client of one Memory Service (its parameters: :class:`~memory_service._methods.BaseClient`). Thread-safe;
    close it (or use ``with``) to release its connections."""

    def _new_http(self, timeout: httpx.Timeout) -> httpx.Client:
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
        stream = EventStream(self, self._config.retry, options)
        stream.connect()
        return stream
