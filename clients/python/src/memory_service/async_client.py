"""The asynchronous client: :class:`memory_service.Client`'s methods (:class:`~memory_service._methods.BaseClient`),
awaited (``iter_*`` and ``events()`` are async iterators); this module supplies how a call is sent, awaited."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import httpx

from memory_service import _base
from memory_service import _operations as ops
from memory_service._base import AsyncAttachmentDownload
from memory_service._methods import BaseClient
from memory_service._sse import AsyncEventStream
from memory_service.auth import resolve_token_async
from memory_service.models import Page

__all__ = ["AsyncAttachmentDownload", "AsyncClient", "AsyncEventStream"]

T = TypeVar("T")


class AsyncClient(BaseClient[httpx.AsyncClient]):
    """An asyncio client of one Memory Service: the same methods as :class:`~memory_service.Client`, awaited (its
    parameters: :class:`~memory_service._methods.BaseClient`; ``token`` may also be a coroutine function).
    ``aclose()`` it (or use ``async with``) to release its connections."""

    def _new_http(self, timeout: httpx.Timeout) -> httpx.AsyncClient:
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
        return AsyncEventStream(self, self._config.retry, options)
