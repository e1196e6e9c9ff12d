"""Adapter logic written once for the blocking and the awaited client.

The LangGraph and LangChain adapters need every operation twice (``get`` and ``aget``, ``batch`` and ``abatch``),
and most operations are several calls with logic between them (paging until a page is full, reading a thread's
entries page by page). A *flow* is a generator that yields the :class:`~memory_service._base.Call` it needs next and
receives its answer (or has the call's exception thrown into it); :func:`run` drives it with a :class:`Client`,
:func:`arun` with an :class:`AsyncClient`. The logic lives in the flow, the I/O in the two drivers (the clients send
each call the same way: :func:`memory_service._base.exchange`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Generator
from typing import Any, Self, TypeVar

from memory_service import _operations as ops
from memory_service._base import Call, adrive, drive
from memory_service.async_client import AsyncClient
from memory_service.auth import TokenSource
from memory_service.client import Client
from memory_service.errors import NotFoundError
from memory_service.models import Channel, Entry, Page

T = TypeVar("T")

Flow = Generator[Call[Any], Any, T]

ENTRIES_PAGE = 200  # the service's largest page of entries


def run(client: Client, flow: Flow[T]) -> T:
    """Drive ``flow`` with the blocking client; its return value is the answer. A call's exception is thrown into
    the flow, which decides: it may catch it (a 404 is "absent") or let it propagate."""
    return drive(flow, client._run)


async def arun(client: AsyncClient, flow: Flow[T]) -> T:
    """Drive ``flow`` with the awaited client."""
    return await adrive(flow, client._run)


def every_page(make_call: Callable[[str | None], Call[Page[T]]]) -> Flow[list[T]]:
    """Every item of a list, following its cursors (``make_call(cursor)``: one page's call)."""
    items: list[T] = []
    cursor = None
    while True:
        page: Page[T] = yield make_call(cursor)
        items.extend(page.data)
        if page.after_cursor is None or not page.data:
            return items
        cursor = page.after_cursor


def conversation_entries(conversation_id: str, channel: Channel) -> Flow[list[Entry] | None]:
    """Every entry of the conversation's ``channel``, oldest first, every page; None when the conversation does
    not exist (a thread or session not written yet)."""
    try:
        entries = yield from every_page(lambda cursor: ops.list_entries(
            conversation_id, channel=channel, limit=ENTRIES_PAGE, after_cursor=cursor
        ))
    except NotFoundError:
        return None
    return entries


def delete_conversation(conversation_id: str) -> Flow[None]:
    """Delete the conversation; one that is not there (never written, deleted already) is no error."""
    try:
        yield ops.delete_conversation(conversation_id)
    except NotFoundError:
        pass
    return None


class Clients:
    """The blocking and the awaited client an adapter uses: given, or made on first use from ``base_url`` and the
    credentials. A made :class:`AsyncClient` belongs to the event loop that made it (httpx pools connections per
    loop), so a call from another loop (a second ``asyncio.run``) gets a fresh one."""

    def __init__(
        self,
        client: Client | None,
        async_client: AsyncClient | None,
        base_url: str | None,
        *,
        token: TokenSource | None = None,
        api_key: str | None = None,
        **client_kwargs: Any,
    ) -> None:
        if client is None and async_client is None and base_url is None:
            raise TypeError("give a client, an async_client, or a base_url (with token= / api_key=)")
        self._client = client
        self._async_client = async_client
        self._base_url = base_url or (client.base_url if client else async_client.base_url)  # type: ignore[union-attr]
        self._kwargs = {**client_kwargs, "token": token, "api_key": api_key}
        self._made_sync = False
        self._made_async: tuple[object, AsyncClient] | None = None  # (its event loop, the client)
        self._lock = threading.Lock()

    @property
    def sync(self) -> Client:
        with self._lock:  # first calls from several threads make one client
            if self._client is None:
                self._client = Client(self._base_url, **self._kwargs)
                self._made_sync = True
            return self._client

    @property
    def async_(self) -> AsyncClient:
        if self._async_client is not None:
            return self._async_client
        loop = asyncio.get_running_loop()
        if self._made_async is None or self._made_async[0] is not loop:
            # A client of a loop that has ended cannot be closed any more; dropping it releases its sockets.
            self._made_async = (loop, AsyncClient(self._base_url, **self._kwargs))
        return self._made_async[1]

    def close(self) -> None:
        with self._lock:
            if self._made_sync and self._client is not None:
                self._client.close()
                self._client, self._made_sync = None, False

    async def aclose(self) -> None:
        if self._made_async is not None and self._made_async[0] is asyncio.get_running_loop():
            made, self._made_async = self._made_async[1], None
            await made.aclose()


class UsesClients:
    """What the adapters share: their :class:`Clients` (``_clients``), closed by ``close()`` / ``aclose()`` (a
    client they were given stays open), also as a context manager, plain or async."""

    _clients: Clients

    def close(self) -> None:
        self._clients.close()

    async def aclose(self) -> None:
        await self._clients.aclose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
        self.close()
