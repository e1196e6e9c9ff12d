"""The synchronous client. :class:`memory_service.AsyncClient` has the same methods, awaited."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import httpx

from memory_service import _operations as ops
from memory_service._base import (
    DEFAULT_BASE_URL,
    DEFAULT_TIMEOUT,
    Call,
    ClientConfig,
    RetryPolicy,
    connection_error,
    retry_after_seconds,
)
from memory_service._sse import SSEParser, decode
from memory_service.auth import TokenSource, invalidate, resolve_token
from memory_service.errors import APIConnectionError, UnavailableError, error_from_response
from memory_service.models import (
    AccessLevel,
    AdminConversation,
    Attachment,
    Channel,
    Conversation,
    DownloadUrl,
    Entry,
    Filter,
    Fork,
    Health,
    IndexItem,
    ListMode,
    Me,
    Membership,
    Memory,
    MemoryEvent,
    MemoryEventKind,
    MemorySearchItem,
    MemoryWriteResult,
    Namespace,
    OwnershipTransfer,
    Page,
    SearchResult,
    SearchType,
    StreamEvent,
    TransferRole,
    UnindexedEntry,
)

T = TypeVar("T")
Id = ops.Id

MEMORY_SEARCH_MAX_OFFSET = 10_000


class Client:
    """A client of one Memory Service.

    ``token``: the caller's bearer token, or a callable returning one (asked before each request, e.g. an
    :class:`~memory_service.OAuthToken`). ``api_key``: the application's ``X-API-Key`` (its client id scopes
    ``context`` entries). Idempotent calls are retried ``max_retries`` times on 503 and connection failures.
    Thread-safe; close it (or use ``with``) to release its connections.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        token: TokenSource | None = None,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        max_retries: int = 3,
        retry: RetryPolicy | None = None,
        headers: Mapping[str, str] | None = None,
        http_client: httpx.Client | None = None,
    ) -> None:
        self._config = ClientConfig(
            base_url, token, api_key, retry or RetryPolicy(max_retries=max_retries), headers
        )
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(timeout=timeout)

    @property
    def base_url(self) -> str:
        return self._config.base_url

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- Sending --------------------------------------------------------------------------------------------------

    def _send(
        self, call: Call[Any], *, stream: bool = False, timeout: httpx.Timeout | None = None,
    ) -> httpx.Response:
        """The answer to ``call`` after retries, or the error it ends in. ``stream``: the body is left unread."""
        policy = self._config.retry
        attempt = 0
        refreshed = False
        while True:
            token = resolve_token(self._config.token) if call.authenticated else None
            request = self._http.build_request(**self._config.request_kwargs(call, token, timeout))
            try:
                response = self._http.send(request, stream=True, follow_redirects=call.follow_redirects)
            except httpx.TransportError as exc:
                if not policy.retry_exception(call, exc, attempt):
                    raise connection_error(exc) from exc
                time.sleep(policy.delay(attempt))
                attempt += 1
                continue
            status = response.status_code
            if status < 300 or status in call.accept:
                if not stream:
                    try:
                        response.read()
                    except httpx.TransportError as exc:
                        if not policy.retry_exception(call, exc, attempt):
                            raise connection_error(exc) from exc
                        time.sleep(policy.delay(attempt))
                        attempt += 1
                        continue
                    finally:
                        response.close()
                return response
            try:
                body = response.read()
            except httpx.TransportError:
                body = b""
            finally:
                response.close()
            if status == 401 and call.authenticated and not refreshed and invalidate(self._config.token):
                refreshed = True
                continue
            if policy.retry_status(call, status, attempt):
                time.sleep(policy.delay(attempt, retry_after_seconds(response.headers)))
                attempt += 1
                continue
            raise error_from_response(status, response.headers, body)

    def _run(self, call: Call[T]) -> T:
        try:
            return call.parse(self._send(call))
        finally:
            if call.cleanup is not None:
                call.cleanup()

    def _paginate(
        self, make_call: Callable[[str | None], Call[Page[T]]], cursor: str | None = None,
    ) -> Iterator[T]:
        while True:
            page = self._run(make_call(cursor))
            yield from page.data
            # The memory event timeline answers a cursor even when caught up (for polling): an empty page ends.
            if page.after_cursor is None or not page.data:
                return
            cursor = page.after_cursor

    # --- Identity and health --------------------------------------------------------------------------------------

    def me(self) -> Me:
        """Who the service takes the caller to be (user id, API-key client, roles)."""
        return self._run(ops.me())

    def healthz(self) -> Health:
        return self._run(ops.healthz())

    def readyz(self) -> Health:
        """Readiness; ``ok`` is False (``http_status`` 503) with the failing parts in ``checks``."""
        return self._run(ops.readyz())

    # --- Memories -------------------------------------------------------------------------------------------------

    def put_memory(
        self, namespace: Sequence[str], key: str, value: Mapping[str, Any], *,
        index: Mapping[str, str] | None = None, ttl_seconds: int | None = None,
    ) -> MemoryWriteResult:
        """Add or replace the memory at ``(namespace, key)``. ``index``: fields to embed for semantic search (none:
        not searchable by meaning); ``ttl_seconds``: expiry (0 or None: never)."""
        return self._run(ops.put_memory(namespace, key, value, index=index, ttl_seconds=ttl_seconds))

    def get_memory(self, namespace: Sequence[str], key: str) -> Memory:
        """The active memory; :class:`~memory_service.NotFoundError` when there is none (deleted, expired)."""
        return self._run(ops.get_memory(namespace, key))

    def delete_memory(self, namespace: Sequence[str], key: str) -> None:
        """Delete the memory (succeeds whether or not it existed)."""
        self._run(ops.delete_memory(namespace, key))

    def search_memories(
        self, namespace_prefix: Sequence[str], *, query: str | None = None, filter: Filter | None = None,
        limit: int | None = None, offset: int | None = None,
    ) -> list[MemorySearchItem]:
        """Memories under ``namespace_prefix``: ranked by meaning when ``query`` is given (only indexed memories),
        else filtered by attributes. ``filter`` applies to attributes (values are encrypted)."""
        return self._run(ops.search_memories(namespace_prefix, query=query, filter=filter, limit=limit, offset=offset))

    def iter_search_memories(
        self, namespace_prefix: Sequence[str], *, query: str | None = None, filter: Filter | None = None,
        page_size: int = 100,
    ) -> Iterator[MemorySearchItem]:
        """Every result of a search, page by page (``offset``, up to the service's maximum of 10000)."""
        offset = 0
        while offset <= MEMORY_SEARCH_MAX_OFFSET:
            items = self.search_memories(namespace_prefix, query=query, filter=filter, limit=page_size, offset=offset)
            yield from items
            if len(items) < page_size:
                return
            offset += len(items)

    def list_namespaces(
        self, *, prefix: Sequence[str] | None = None, suffix: Sequence[str] | None = None,
        max_depth: int | None = None,
    ) -> list[Namespace]:
        """Namespaces holding at least one active memory the caller may see, sorted."""
        return self._run(ops.list_namespaces(prefix=prefix, suffix=suffix, max_depth=max_depth))

    def list_memory_events(
        self, *, namespace: Sequence[str] | None = None, kinds: Iterable[MemoryEventKind] | None = None,
        after: datetime | str | None = None, before: datetime | str | None = None, limit: int | None = None,
        after_cursor: str | None = None,
    ) -> Page[MemoryEvent]:
        """One page of the memory event timeline (oldest first)."""
        return self._run(ops.list_memory_events(
            namespace=namespace, kinds=kinds, after=after, before=before, limit=limit, after_cursor=after_cursor
        ))

    def iter_memory_events(
        self, *, namespace: Sequence[str] | None = None, kinds: Iterable[MemoryEventKind] | None = None,
        after: datetime | str | None = None, before: datetime | str | None = None, limit: int | None = None,
        after_cursor: str | None = None,
    ) -> Iterator[MemoryEvent]:
        """Every event up to now, oldest first (from ``after_cursor`` when given). To follow the timeline, poll
        :meth:`list_memory_events` with the last page's ``after_cursor``: it stays valid when nothing is new."""
        kinds = None if kinds is None else list(kinds)
        return self._paginate(lambda cursor: ops.list_memory_events(
            namespace=namespace, kinds=kinds, after=after, before=before, limit=limit, after_cursor=cursor
        ), after_cursor)

    # --- Conversations --------------------------------------------------------------------------------------------

    def list_conversations(
        self, *, mode: ListMode | None = None, query: str | None = None, limit: int | None = None,
        after_cursor: str | None = None,
    ) -> Page[Conversation]:
        """Conversations the caller is a member of, newest first (``mode`` default ``latest-fork``)."""
        return self._run(ops.list_conversations(mode=mode, query=query, limit=limit, after_cursor=after_cursor))

    def iter_conversations(
        self, *, mode: ListMode | None = None, query: str | None = None, limit: int | None = None,
    ) -> Iterator[Conversation]:
        return self._paginate(
            lambda cursor: ops.list_conversations(mode=mode, query=query, limit=limit, after_cursor=cursor)
        )

    def create_conversation(
        self, *, id: Id | None = None, title: str | None = None, metadata: Mapping[str, Any] | None = None,
    ) -> Conversation:
        """A new conversation owned by the caller (``id``: choose it; an existing one is a ConflictError)."""
        return self._run(ops.create_conversation(id=id, title=title, metadata=metadata))

    def get_conversation(self, conversation_id: Id) -> Conversation:
        return self._run(ops.get_conversation(conversation_id))

    def update_conversation(
        self, conversation_id: Id, *, title: str | None = None, metadata: Mapping[str, Any] | None = None,
    ) -> Conversation:
        """Change the title and/or metadata (writer or above); what is None stays."""
        return self._run(ops.update_conversation(conversation_id, title=title, metadata=metadata))

    def delete_conversation(self, conversation_id: Id) -> None:
        """Delete the conversation with its forks, entries and memberships (owner only)."""
        self._run(ops.delete_conversation(conversation_id))

    def list_entries(
        self, conversation_id: Id, *, channel: Channel | None = None, limit: int | None = None,
        after_cursor: str | None = None,
    ) -> Page[Entry]:
        """Entries oldest first (a fork includes its parent's entries before the fork point)."""
        return self._run(ops.list_entries(conversation_id, channel=channel, limit=limit, after_cursor=after_cursor))

    def iter_entries(
        self, conversation_id: Id, *, channel: Channel | None = None, limit: int | None = None,
    ) -> Iterator[Entry]:
        return self._paginate(
            lambda cursor: ops.list_entries(conversation_id, channel=channel, limit=limit, after_cursor=cursor)
        )

    def append_entry(
        self, conversation_id: Id, content: Sequence[Mapping[str, Any]], *, channel: Channel | None = None,
        content_type: str | None = None, indexed_content: str | None = None,
        forked_at_conversation_id: Id | None = None, forked_at_entry_id: Id | None = None,
    ) -> Entry:
        """Append an entry; an unknown ``conversation_id`` creates the conversation (or, with the fork point, a
        fork). History items need ``role`` (``USER``/``AI``); every other field is kept as sent. ``context``
        entries need an API key and are visible to that key's client only."""
        return self._run(ops.append_entry(
            conversation_id, content, channel=channel, content_type=content_type, indexed_content=indexed_content,
            forked_at_conversation_id=forked_at_conversation_id, forked_at_entry_id=forked_at_entry_id,
        ))

    def list_forks(self, conversation_id: Id, *, limit: int | None = None, after_cursor: str | None = None) -> Page[Fork]:
        """The whole fork tree, the root included, oldest first."""
        return self._run(ops.list_forks(conversation_id, limit=limit, after_cursor=after_cursor))

    def iter_forks(self, conversation_id: Id, *, limit: int | None = None) -> Iterator[Fork]:
        return self._paginate(lambda cursor: ops.list_forks(conversation_id, limit=limit, after_cursor=cursor))

    def search_conversations(
        self, query: str, *, search_type: SearchType | None = None, limit: int | None = None,
        after_cursor: str | None = None,
    ) -> Page[SearchResult]:
        """The best entry of each readable conversation matching ``query`` (``auto``, ``fulltext`` or ``semantic``)."""
        return self._run(ops.search_conversations(query, search_type=search_type, limit=limit, after_cursor=after_cursor))

    def iter_search_conversations(
        self, query: str, *, search_type: SearchType | None = None, limit: int | None = None,
    ) -> Iterator[SearchResult]:
        return self._paginate(
            lambda cursor: ops.search_conversations(query, search_type=search_type, limit=limit, after_cursor=cursor)
        )

    def index_entries(self, items: Iterable[IndexItem]) -> int:
        """Replace entries' search index text (indexer role); answers how many entries were indexed."""
        return self._run(ops.index_entries(items))

    def list_unindexed(self, *, limit: int | None = None, after_cursor: str | None = None) -> Page[UnindexedEntry]:
        """History entries without index text yet (indexer role)."""
        return self._run(ops.list_unindexed(limit=limit, after_cursor=after_cursor))

    def iter_unindexed(self, *, limit: int | None = None) -> Iterator[UnindexedEntry]:
        return self._paginate(lambda cursor: ops.list_unindexed(limit=limit, after_cursor=cursor))

    # --- Memberships and ownership transfers ----------------------------------------------------------------------

    def list_memberships(
        self, conversation_id: Id, *, limit: int | None = None, after_cursor: str | None = None,
    ) -> Page[Membership]:
        return self._run(ops.list_memberships(conversation_id, limit=limit, after_cursor=after_cursor))

    def iter_memberships(self, conversation_id: Id, *, limit: int | None = None) -> Iterator[Membership]:
        return self._paginate(lambda cursor: ops.list_memberships(conversation_id, limit=limit, after_cursor=cursor))

    def add_membership(self, conversation_id: Id, user_id: str, access_level: AccessLevel) -> Membership:
        """Share the conversation's fork tree with ``user_id`` (a member already: ConflictError)."""
        return self._run(ops.add_membership(conversation_id, user_id, access_level))

    def update_membership(self, conversation_id: Id, user_id: str, access_level: AccessLevel) -> Membership:
        return self._run(ops.update_membership(conversation_id, user_id, access_level))

    def remove_membership(self, conversation_id: Id, user_id: str) -> None:
        self._run(ops.remove_membership(conversation_id, user_id))

    def list_transfers(
        self, *, role: TransferRole | None = None, limit: int | None = None, after_cursor: str | None = None,
    ) -> Page[OwnershipTransfer]:
        """Pending transfers the caller sent or received (``role``), oldest first."""
        return self._run(ops.list_transfers(role=role, limit=limit, after_cursor=after_cursor))

    def iter_transfers(self, *, role: TransferRole | None = None, limit: int | None = None) -> Iterator[OwnershipTransfer]:
        return self._paginate(lambda cursor: ops.list_transfers(role=role, limit=limit, after_cursor=cursor))

    def create_transfer(self, conversation_id: Id, new_owner_user_id: str) -> OwnershipTransfer:
        """Offer ownership to a member (owner only)."""
        return self._run(ops.create_transfer(conversation_id, new_owner_user_id))

    def get_transfer(self, transfer_id: Id) -> OwnershipTransfer:
        return self._run(ops.get_transfer(transfer_id))

    def accept_transfer(self, transfer_id: Id) -> None:
        """Become the owner (recipient only); the previous owner becomes a manager."""
        self._run(ops.accept_transfer(transfer_id))

    def delete_transfer(self, transfer_id: Id) -> None:
        """Decline (recipient) or cancel (sender) a pending transfer."""
        self._run(ops.delete_transfer(transfer_id))

    # --- Attachments ----------------------------------------------------------------------------------------------

    def upload_attachment(
        self, file: ops.FileInput, *, filename: str | None = None, content_type: str | None = None,
        expires_in: int | timedelta | str | None = None,
    ) -> Attachment:
        """Upload a file: bytes, a path, or a binary file object (streamed, never read whole into memory).
        ``expires_in``: seconds, a timedelta or an ISO-8601 duration; an entry referencing the attachment keeps
        it for good."""
        return self._run(ops.upload_attachment(file, filename=filename, content_type=content_type, expires_in=expires_in))

    def download_attachment(self, attachment_id: Id, *, if_none_match: str | None = None) -> AttachmentDownload:
        """The file, streamed: use it as a context manager and read with ``iter_bytes()``, ``read()`` or
        ``save(path)``. With ``if_none_match`` (an ETag you hold), ``not_modified`` may be True instead."""
        return AttachmentDownload(self._send(ops.download_attachment(attachment_id, if_none_match=if_none_match), stream=True))

    def download_signed(self, url: str, *, if_none_match: str | None = None) -> AttachmentDownload:
        """Download through a signed link (:meth:`attachment_download_url`), sending no credentials."""
        return AttachmentDownload(self._send(ops.download_signed(url, if_none_match=if_none_match), stream=True))

    def attachment_download_url(self, attachment_id: Id) -> DownloadUrl:
        """A time-limited link that downloads the file without credentials."""
        return self._run(ops.attachment_download_url(attachment_id))

    def delete_attachment(self, attachment_id: Id) -> None:
        self._run(ops.delete_attachment(attachment_id))

    # --- Admin (auditor or admin role; every call is audit-logged) ------------------------------------------------

    def admin_list_conversations(
        self, *, user_id: str | None = None, include_deleted: bool | None = None, limit: int | None = None,
        after_cursor: str | None = None,
    ) -> Page[AdminConversation]:
        return self._run(ops.admin_list_conversations(
            user_id=user_id, include_deleted=include_deleted, limit=limit, after_cursor=after_cursor
        ))

    def admin_iter_conversations(
        self, *, user_id: str | None = None, include_deleted: bool | None = None, limit: int | None = None,
    ) -> Iterator[AdminConversation]:
        return self._paginate(lambda cursor: ops.admin_list_conversations(
            user_id=user_id, include_deleted=include_deleted, limit=limit, after_cursor=cursor
        ))

    def admin_get_conversation(self, conversation_id: Id) -> AdminConversation:
        return self._run(ops.admin_get_conversation(conversation_id))

    def admin_list_entries(
        self, conversation_id: Id, *, channel: Channel | None = None, limit: int | None = None,
        after_cursor: str | None = None,
    ) -> Page[Entry]:
        return self._run(ops.admin_list_entries(conversation_id, channel=channel, limit=limit, after_cursor=after_cursor))

    def admin_iter_entries(
        self, conversation_id: Id, *, channel: Channel | None = None, limit: int | None = None,
    ) -> Iterator[Entry]:
        return self._paginate(
            lambda cursor: ops.admin_list_entries(conversation_id, channel=channel, limit=limit, after_cursor=cursor)
        )

    def admin_list_memberships(
        self, conversation_id: Id, *, limit: int | None = None, after_cursor: str | None = None,
    ) -> Page[Membership]:
        return self._run(ops.admin_list_memberships(conversation_id, limit=limit, after_cursor=after_cursor))

    def admin_list_forks(
        self, conversation_id: Id, *, limit: int | None = None, after_cursor: str | None = None,
    ) -> Page[Fork]:
        return self._run(ops.admin_list_forks(conversation_id, limit=limit, after_cursor=after_cursor))

    def admin_search_conversations(
        self, query: str, *, search_type: SearchType | None = None, limit: int | None = None,
        after_cursor: str | None = None,
    ) -> Page[SearchResult]:
        return self._run(ops.admin_search_conversations(
            query, search_type=search_type, limit=limit, after_cursor=after_cursor
        ))

    def admin_list_attachments(
        self, *, user_id: str | None = None, limit: int | None = None, after_cursor: str | None = None,
    ) -> Page[Attachment]:
        return self._run(ops.admin_list_attachments(user_id=user_id, limit=limit, after_cursor=after_cursor))

    def admin_iter_attachments(self, *, user_id: str | None = None, limit: int | None = None) -> Iterator[Attachment]:
        return self._paginate(lambda cursor: ops.admin_list_attachments(user_id=user_id, limit=limit, after_cursor=cursor))

    def admin_download_attachment(self, attachment_id: Id, *, if_none_match: str | None = None) -> AttachmentDownload:
        """Any attachment's file, streamed as :meth:`download_attachment` (auditor or admin role; audit-logged)."""
        call = ops.admin_download_attachment(attachment_id, if_none_match=if_none_match)
        return AttachmentDownload(self._send(call, stream=True))

    # --- Live events ----------------------------------------------------------------------------------------------

    def events(
        self, *, kinds: Iterable[str] | None = None, last_event_id: str | None = None, reconnect: bool = True,
        read_timeout: float = 60.0, max_reconnect_attempts: int | None = None,
    ) -> EventStream:
        """The live event stream (server-sent events) as an iterator of :class:`StreamEvent`, connected when this
        returns (a 401 or 400 is raised here).

        When the connection drops, or the server ends the stream, it reconnects with ``Last-Event-ID`` so nothing
        retained is missed; an ``invalidate`` event says events were lost (refetch). An ``evicted`` event is
        yielded too: after ``connection_limit`` (this user opened too many streams) the iteration ends; after
        ``slow_consumer`` or ``token_expired`` it reconnects (the token callable is asked again).
        ``max_reconnect_attempts`` bounds consecutive failed reconnects (None: keep trying). Close it (or use
        ``with``) to stop; ``last_event_id`` is where a new stream would resume.
        """
        stream = EventStream(
            self, kinds=None if kinds is None else list(kinds), last_event_id=last_event_id, reconnect=reconnect,
            read_timeout=read_timeout, max_reconnect_attempts=max_reconnect_attempts,
        )
        stream.connect()
        return stream


class AttachmentDownload:
    """A streamed download (or a 304 when ``if_none_match`` matched). Close it, or use it as a context manager."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response

    @property
    def not_modified(self) -> bool:
        return self._response.status_code == 304

    @property
    def content_type(self) -> str | None:
        value: str | None = self._response.headers.get("content-type")
        return value

    @property
    def etag(self) -> str | None:
        value: str | None = self._response.headers.get("etag")
        return value

    @property
    def size(self) -> int | None:
        length = self._response.headers.get("content-length")
        return int(length) if length and length.isdigit() else None

    @property
    def headers(self) -> httpx.Headers:
        return self._response.headers

    def iter_bytes(self, chunk_size: int | None = 64 * 1024) -> Iterator[bytes]:
        try:
            yield from self._response.iter_bytes(chunk_size)
        except httpx.TransportError as exc:
            raise connection_error(exc) from exc

    def read(self) -> bytes:
        return b"".join(self.iter_bytes())

    def save(self, path: str | Path) -> int:
        """Write the file to ``path``; answers the number of bytes written."""
        written = 0
        with Path(path).open("wb") as out:
            for chunk in self.iter_bytes():
                out.write(chunk)
                written += len(chunk)
        return written

    def close(self) -> None:
        self._response.close()

    def __enter__(self) -> AttachmentDownload:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class EventStream(Iterator[StreamEvent]):
    """Iterator over the live event stream; see :meth:`Client.events`. It is connected when ``events()`` returns:
    everything that happens from then on is delivered."""

    def __init__(
        self, client: Client, *, kinds: list[str] | None, last_event_id: str | None, reconnect: bool,
        read_timeout: float, max_reconnect_attempts: int | None,
    ) -> None:
        self._client = client
        self._kinds = kinds
        self.last_event_id = last_event_id
        self._reconnect = reconnect
        self._timeout = httpx.Timeout(10.0, read=read_timeout)
        self._max_attempts = max_reconnect_attempts
        self._closed = threading.Event()
        self._response: httpx.Response | None = None
        self._events = self._run()

    def connect(self) -> None:
        """Open the connection now, if it is not open (``events()`` does); errors such as a 401 are raised here."""
        if self._response is None:
            call = ops.events(kinds=self._kinds, last_event_id=self.last_event_id)
            self._response = self._client._send(call, stream=True, timeout=self._timeout)

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
        policy = self._client._config.retry
        failures = 0  # consecutive connections that delivered no event
        last_error: Exception | None = None
        while not self._closed.is_set():
            if failures:
                if self._max_attempts is not None and failures > self._max_attempts:
                    raise last_error or APIConnectionError("the event stream kept ending; gave up reconnecting")
                if self._closed.wait(policy.delay(failures - 1)):
                    return
            try:
                self.connect()
            except (APIConnectionError, UnavailableError) as exc:
                if not self._reconnect:
                    raise
                last_error = exc
                failures += 1
                continue
            response = self._response
            assert response is not None
            parser = SSEParser()
            ending = False
            try:
                for line in response.iter_lines():
                    raw = parser.feed(line)
                    event = None if raw is None else decode(raw)
                    if event is None:
                        continue
                    failures, last_error = 0, None
                    if event.id is not None:
                        self.last_event_id = event.id
                    yield event
                    if event.is_evicted:
                        ending = event.reason == "connection_limit"
                        break
            except (httpx.TransportError, httpx.StreamError):
                pass  # dropped, or closed by close(): reconnect below, or stop
            finally:
                response.close()
                self._response = None
            if ending or not self._reconnect or self._closed.is_set():
                return
            failures += 1
