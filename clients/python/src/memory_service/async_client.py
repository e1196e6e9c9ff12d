"""The asynchronous client: :class:`memory_service.Client`'s methods (:class:`~memory_service._methods.BaseClient`),
awaited (``iter_*`` and ``events()`` are async iterators); this module supplies how a call is sent, awaited."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from memory_service import _base
from memory_service import _operations as ops
from memory_service._methods import BaseClient
from memory_service._sse import BaseEventStream
from memory_service.auth import resolve_token_async
from memory_service.errors import APIConnectionError, UnavailableError
from memory_service.models import Page, StreamEvent

T = TypeVar("T")


class AsyncClient(BaseClient[httpx.AsyncClient]):
    """An asyncio client of one Memory Service: the same methods as :class:`~memory_service.Client`, awaited (its
    parameters: :class:`~memory_service._methods.BaseClient`; ``token`` may also be a coroutine function).
    ``aclose()`` it (or use ``async with``) to release its connections."""

    def _new_http(self, timeout: float | httpx.Timeout) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=timeout)

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # --- Sending: the four ways of BaseClient's methods ------------------------------------------------------------

    async def _perform(self, step: _base.Step) -> Any:
        match step:
            case _base.Token():
                return await resolve_token_async(self._config.token)
            case _base.Send(request, follow_redirects):
                built = self._http.build_request(**request)
                return await self._http.send(built, stream=True, follow_redirects=follow_redirects)
            case _base.Read(response):
                return await response.aread()
            case _base.Close(response):
                return await response.aclose()
            case _base.Sleep(seconds):
                return await asyncio.sleep(seconds)

    async def _send(
        self, call: _base.Call[Any], *, stream: bool = False, timeout: httpx.Timeout | None = None,
    ) -> httpx.Response:
        steps = _base.exchange(self._config, call, stream=stream, timeout=timeout)
        return await _base.adrive(steps, self._perform)

    async def _run(self, call: _base.Call[T]) -> T:
        try:
            return call.parse(await self._send(call))
        finally:
            if call.cleanup is not None:
                call.cleanup()

    async def _paginate(
        self, make_call: Callable[[str | None], _base.Call[Page[T]]], cursor: str | None = None,
    ) -> AsyncIterator[T]:
        while True:
            page = await self._run(make_call(cursor))
            for item in page.data:
                yield item
            if page.after_cursor is None or not page.data:  # see Client._paginate
                return
            cursor = page.after_cursor

    async def _download(self, call: _base.Call[None]) -> AsyncAttachmentDownload:
        return AsyncAttachmentDownload(await self._send(call, stream=True))

    def _events(self, options: ops.EventsOptions) -> AsyncEventStream:
        return AsyncEventStream(self, options)


class AsyncAttachmentDownload(_base.DownloadInfo):
    """A streamed download (or a 304 when ``if_none_match`` matched). ``aclose()`` it, or use ``async with``."""

    async def iter_bytes(self, chunk_size: int | None = 64 * 1024) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_bytes(chunk_size):
                yield chunk
        except httpx.TransportError as exc:
            raise _base.connection_error(exc) from exc

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_bytes()])

    async def save(self, path: str | Path) -> int:
        """Write the file to ``path``; answers the number of bytes written."""
        with Path(path).open("wb") as out:
            return sum([out.write(chunk) async for chunk in self.iter_bytes()])

    async def aclose(self) -> None:
        await self._response.aclose()

    async def __aenter__(self) -> AsyncAttachmentDownload:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class AsyncEventStream(BaseEventStream[AsyncClient], AsyncIterator[StreamEvent]):
    """Async iterator over the live event stream; see :meth:`AsyncClient.events`. ``async with`` connects it on
    entry (everything that happens from then on is delivered); plain ``async for`` connects on the first step."""

    def __init__(self, client: AsyncClient, options: ops.EventsOptions) -> None:
        super().__init__(client, client._config.retry, options)
        self._closed = asyncio.Event()
        self._events = self._run()

    async def connect(self) -> None:
        """Open the connection now, if it is not open; errors such as a 401 are raised here."""
        if self._response is None:
            self._response = await self._client._send(self._request(), stream=True, timeout=self._timeout)

    def __aiter__(self) -> AsyncEventStream:
        return self

    async def __anext__(self) -> StreamEvent:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        """Stop: the iteration ends."""
        self._closed.set()
        response = self._response
        if response is not None:
            await response.aclose()
        with contextlib.suppress(RuntimeError):  # being iterated by another task right now: it ends by itself
            await self._events.aclose()

    async def __aenter__(self) -> AsyncEventStream:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _wait_closed(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self._closed.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def _run(self) -> AsyncGenerator[StreamEvent, None]:
        while not self._closed.is_set():
            delay = self._delay()
            if delay and await self._wait_closed(delay):
                return
            try:
                await self.connect()
            except (APIConnectionError, UnavailableError) as exc:
                self._connect_failed(exc)
                continue
            response = self._response
            assert response is not None
            try:
                async for line in response.aiter_lines():
                    event = self._feed(line)
                    if event is not None:
                        yield event
                        if event.is_evicted:
                            break
            except (httpx.TransportError, httpx.StreamError):
                pass  # dropped, or closed by aclose(): reconnect below, or stop
            finally:
                self._response = None
                await response.aclose()
            if not self._again(self._closed.is_set()):
                return
