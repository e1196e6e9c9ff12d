"""The service's operations as methods of both clients, each declared once.

A method is a request builder of :mod:`memory_service._operations` (its signature and documentation) bound to one
of the client's ways of sending: ``_run`` (the parsed answer), ``_paginate`` (the items of every page),
``_download`` (a streamed file) or ``_events`` (the live stream). :class:`BaseClient` lists them, with the
configuration; :class:`~memory_service.Client` and :class:`~memory_service.AsyncClient` inherit it and supply those
four, blocking or awaited. So ``Client.get_memory(...)`` answers a :class:`Memory` and ``AsyncClient.get_memory(...)``
a coroutine of one, both typed as such; the arguments are checked when the method is called.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from typing import Any, Generic, ParamSpec, TypeVar, overload

import httpx

from memory_service import _operations as ops
from memory_service._base import (
    DEFAULT_BASE_URL,
    AsyncAttachmentDownload,
    AttachmentDownload,
    Call,
    ClientConfig,
    RetryPolicy,
    Timeouts,
    timeout_of,
)
from memory_service._sse import AsyncEventStream, EventStream
from memory_service.auth import TokenSource
from memory_service.models import Page

P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S")  # what the method answers on Client
A = TypeVar("A")  # ... and on AsyncClient
H = TypeVar("H", httpx.Client, httpx.AsyncClient)

_SELF = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)


class Method(Generic[P, S, A]):
    """A method with ``build``'s parameters, answering ``S`` on a :class:`Client` and ``A`` on an
    :class:`AsyncClient`; ``function(client, *args, **kwargs)`` does the work."""

    def __init__(self, build: Callable[P, object], function: Callable[..., Any], doc: str | None = None) -> None:
        signature = inspect.signature(build)
        function.__doc__ = doc or build.__doc__
        function.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[_SELF, *signature.parameters.values()], return_annotation=inspect.Signature.empty,
        )
        self._function = function

    def __set_name__(self, owner: type, name: str) -> None:
        self._function.__name__ = name
        self._function.__qualname__ = f"{owner.__qualname__}.{name}"

    @overload
    def __get__(self, client: None, owner: type) -> Callable[..., Any]: ...

    # A client is told apart by its httpx client: Client is BaseClient[httpx.Client], AsyncClient
    # BaseClient[httpx.AsyncClient] (this module knows neither: they build on it).
    @overload
    def __get__(self, client: BaseClient[httpx.Client], owner: type | None = None) -> Callable[P, S]: ...

    @overload
    def __get__(self, client: BaseClient[httpx.AsyncClient], owner: type | None = None) -> Callable[P, A]: ...

    def __get__(self, client: object, owner: type | None = None) -> Callable[..., Any]:
        # A plain function's binding: the function itself on the class, a bound method on an instance.
        return self._function.__get__(client, owner)  # type: ignore[no-any-return]


def _sent_by(runner: str, build: Callable[..., Any]) -> Callable[..., Any]:
    def method(client: Any, /, *args: Any, **kwargs: Any) -> Any:
        return getattr(client, runner)(build(*args, **kwargs))

    return method


def operation(build: Callable[P, Call[T]]) -> Method[P, T, Coroutine[Any, Any, T]]:
    """The answer to the call, parsed."""
    return Method(build, _sent_by("_run", build))


def download(
    build: Callable[P, Call[None]],
) -> Method[P, AttachmentDownload, Coroutine[Any, Any, AsyncAttachmentDownload]]:
    return Method(build, _sent_by("_download", build))


def stream(build: Callable[P, ops.EventsOptions]) -> Method[P, EventStream, AsyncEventStream]:
    return Method(build, _sent_by("_events", build))


def paginated(build: Callable[P, Call[Page[T]]]) -> Method[P, Iterator[T], AsyncIterator[T]]:
    """Every item of ``build``'s pages (an async iterator on AsyncClient), following the cursors from
    ``after_cursor`` on; ``build`` takes the cursor as ``after_cursor``."""

    def iterate(client: Any, /, *args: Any, after_cursor: str | None = None, **kwargs: Any) -> Any:
        return client._paginate(lambda cursor: build(*args, **kwargs, after_cursor=cursor), after_cursor)

    doc = f"Every item of ``{build.__name__}``, page after page, from ``after_cursor`` on (the first page when None)."
    return Method(build, iterate, doc)


class BaseClient(Generic[H]):
    """The configuration of a client, and one method per operation of the service's OpenAPI schema
    (:data:`~memory_service.OPERATIONS`), plus ``iter_*`` methods that follow a list's cursors.

    ``token``: the caller's bearer token, or a callable returning one (asked before each request, e.g. an
    :class:`~memory_service.OAuthToken`). ``api_key``: the application's ``X-API-Key`` (its client id scopes
    ``context`` entries). Idempotent calls are retried ``max_retries`` times on 503 and connection failures, any
    call on a 429 after its ``Retry-After`` (``retry``: the whole policy); a DELETE whose answer was lost and that
    finds nothing when sent again has succeeded. ``timeout``: seconds for all of connecting, reading, writing and
    waiting for a pooled connection, or ``(connect, read, write, pool)``, or an ``httpx.Timeout`` (default: 5, 30,
    30, 5). A ``base_url`` that is not an http(s) URL with a host is a :class:`~memory_service.ConfigurationError`
    at once. ``http_client``: an ``httpx`` client of your own (left open by ``close()``; its timeouts apply).
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        token: TokenSource | None = None,
        api_key: str | None = None,
        timeout: Timeouts | None = None,
        max_retries: int = 3,
        retry: RetryPolicy | None = None,
        headers: Mapping[str, str] | None = None,
        http_client: H | None = None,
    ) -> None:
        self._config = ClientConfig(base_url, token, api_key, retry or RetryPolicy(max_retries=max_retries), headers)
        self._owns_http = http_client is None
        self._http: H = http_client or self._new_http(timeout_of(timeout))

    def _new_http(self, timeout: httpx.Timeout) -> H:
        raise NotImplementedError

    # How the methods are sent, supplied by Client (blocking) and AsyncClient (awaited).
    def _run(self, call: Call[T]) -> Any:
        raise NotImplementedError

    def _paginate(self, make_call: Callable[[str | None], Call[Page[T]]], cursor: str | None = None) -> Any:
        raise NotImplementedError

    def _download(self, call: Call[None]) -> Any:
        raise NotImplementedError

    def _events(self, options: ops.EventsOptions) -> Any:
        raise NotImplementedError

    @property
    def base_url(self) -> str:
        return self._config.base_url

    # Identity and health
    me = operation(ops.me)
    healthz = operation(ops.healthz)
    readyz = operation(ops.readyz)

    # Memories
    put_memory = operation(ops.put_memory)
    get_memory = operation(ops.get_memory)
    delete_memory = operation(ops.delete_memory)
    search_memories = operation(ops.search_memories)
    iter_search_memories = paginated(ops.search_memory_pages)
    list_namespaces = operation(ops.list_namespaces)
    list_memory_events = operation(ops.list_memory_events)
    iter_memory_events = paginated(ops.list_memory_events)

    # Conversations
    list_conversations = operation(ops.list_conversations)
    iter_conversations = paginated(ops.list_conversations)
    create_conversation = operation(ops.create_conversation)
    get_conversation = operation(ops.get_conversation)
    update_conversation = operation(ops.update_conversation)
    delete_conversation = operation(ops.delete_conversation)
    list_entries = operation(ops.list_entries)
    iter_entries = paginated(ops.list_entries)
    append_entry = operation(ops.append_entry)
    list_forks = operation(ops.list_forks)
    iter_forks = paginated(ops.list_forks)
    search_conversations = operation(ops.search_conversations)
    iter_search_conversations = paginated(ops.search_conversations)
    index_entries = operation(ops.index_entries)
    list_unindexed = operation(ops.list_unindexed)
    iter_unindexed = paginated(ops.list_unindexed)

    # Memberships and ownership transfers
    list_memberships = operation(ops.list_memberships)
    iter_memberships = paginated(ops.list_memberships)
    add_membership = operation(ops.add_membership)
    update_membership = operation(ops.update_membership)
    remove_membership = operation(ops.remove_membership)
    list_transfers = operation(ops.list_transfers)
    iter_transfers = paginated(ops.list_transfers)
    create_transfer = operation(ops.create_transfer)
    get_transfer = operation(ops.get_transfer)
    accept_transfer = operation(ops.accept_transfer)
    delete_transfer = operation(ops.delete_transfer)

    # Attachments
    upload_attachment = operation(ops.upload_attachment)
    download_attachment = download(ops.download_attachment)
    download_signed = download(ops.download_signed)
    attachment_download_url = operation(ops.attachment_download_url)
    delete_attachment = operation(ops.delete_attachment)

    # Admin (auditor or admin role; every call is audit-logged)
    admin_list_conversations = operation(ops.admin_list_conversations)
    admin_iter_conversations = paginated(ops.admin_list_conversations)
    admin_get_conversation = operation(ops.admin_get_conversation)
    admin_list_entries = operation(ops.admin_list_entries)
    admin_iter_entries = paginated(ops.admin_list_entries)
    admin_list_memberships = operation(ops.admin_list_memberships)
    admin_list_forks = operation(ops.admin_list_forks)
    admin_search_conversations = operation(ops.admin_search_conversations)
    admin_list_attachments = operation(ops.admin_list_attachments)
    admin_iter_attachments = paginated(ops.admin_list_attachments)
    admin_download_attachment = download(ops.admin_download_attachment)

    # Live events
    events = stream(ops.events)
