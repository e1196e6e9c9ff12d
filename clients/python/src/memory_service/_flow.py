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
from memory_service._ids import conversation_id_for
from memory_service.async_client import AsyncClient
from memory_service.auth import TokenSource
from memory_service.client import Client
from memory_service.errors import ConflictError, ConversationTakenError, NotFoundError, PermissionDeniedError
from memory_service.models import Channel, Conversation, Entry, Me, Page

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


_WRITERS = ("owner", "manager", "writer")


class Threads:
    """The conversations of the caller's threads (LangGraph thread ids, LangChain session ids), and whether the
    caller may use them (D11: an adapter never writes into a conversation the caller does not own, unless told to
    share). A thread id that is not a UUID maps to a conversation derived from the caller's user id
    (:func:`~memory_service._ids.conversation_id_for`; the user id comes from ``/v1/me`` once). Before its first
    read or write of a thread, an adapter checks that the conversation is the caller's (created by this write, or
    owned by the caller), or, with ``allow_shared``, one the caller may read (write) through a membership; any other
    is a :class:`~memory_service.ConversationTakenError`, and nothing is read or written. What was checked is
    remembered for the adapter's life."""

    def __init__(self, *, allow_shared: bool = False) -> None:
        self.allow_shared = allow_shared
        self._user_id: str | None = None
        self._checked: dict[str, bool] = {}  # conversation id -> checked for writing (else for reading)

    def user_id(self) -> Flow[str]:
        if self._user_id is None:
            me: Me = yield ops.me()
            self._user_id = me.user_id
        return self._user_id

    def conversation_id(self, thread_id: str) -> Flow[str]:
        user_id = yield from self.user_id()
        return conversation_id_for(thread_id, user_id)

    def readable(self, thread_id: str) -> Flow[str | None]:
        """The thread's conversation, checked for reading; None when there is none (nothing written yet)."""
        conversation_id = yield from self.conversation_id(thread_id)
        if conversation_id in self._checked:
            return conversation_id
        try:
            conversation: Conversation = yield ops.get_conversation(conversation_id)
        except NotFoundError:
            return None
        except PermissionDeniedError:
            raise self._taken(thread_id, conversation_id, None) from None
        self._check(thread_id, conversation, write=False)
        # What was read says whether the caller may write too: the first put after a read needs no second look.
        writable = conversation.owner_user_id == self._user_id or conversation.access_level in _WRITERS
        self._checked[conversation_id] = self._checked.get(conversation_id, False) or writable
        return conversation_id

    def writable(self, thread_id: str, *, title: str | None = None) -> Flow[str]:
        """The thread's conversation, checked for writing: created now (owned by the caller, ``title``d) when
        there is none. A deleted one is a NotFoundError: the service never reuses a deleted conversation's id."""
        conversation_id = yield from self.conversation_id(thread_id)
        if self._checked.get(conversation_id):
            return conversation_id
        try:
            yield ops.create_conversation(id=conversation_id, title=title or None)
        except ConflictError:
            try:
                conversation: Conversation = yield ops.get_conversation(conversation_id)
            except NotFoundError as exc:
                exc.add_note(
                    f"thread {thread_id!r} (conversation {conversation_id}) was deleted; a deleted thread's id cannot "
                    "hold anything again"
                )
                raise
            except PermissionDeniedError:
                raise self._taken(thread_id, conversation_id, None) from None
            self._check(thread_id, conversation, write=True)
        self._checked[conversation_id] = True
        return conversation_id

    def forget(self, conversation_id: str) -> None:
        """The conversation was deleted: check afresh next time."""
        self._checked.pop(conversation_id, None)

    def mine(self, conversation: Conversation) -> bool:
        """Whether a listed conversation is one the adapter may read (its own, or shared when allowed)."""
        return conversation.owner_user_id == self._user_id or self.allow_shared

    def _check(self, thread_id: str, conversation: Conversation, *, write: bool) -> None:
        if conversation.owner_user_id == self._user_id:
            return
        if self.allow_shared and (not write or conversation.access_level in _WRITERS):
            return
        raise self._taken(thread_id, conversation.id, conversation.owner_user_id)

    def _taken(self, thread_id: str, conversation_id: str, owner: str | None) -> ConversationTakenError:
        return ConversationTakenError(str(thread_id), conversation_id, self._user_id or "", owner)


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
