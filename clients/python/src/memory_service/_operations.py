"""Every operation of the service as a :class:`~memory_service._base.Call`: its request (path, query, body) and
how its answer is read. Each function here is the signature and the documentation of the client method of the same
name (:mod:`memory_service._methods` binds them to :class:`Client` and :class:`AsyncClient`), and a step the
adapters' flows yield. :data:`OPERATIONS` maps each ``(method, path)`` of the OpenAPI schema to its client method (a
test compares it with the live ``/openapi.json``).
"""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import quote, urlsplit

import httpx

from memory_service._base import Call
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
    SearchQuery,
    SearchResult,
    SearchType,
    TransferRole,
    UnindexedEntry,
)

M = TypeVar("M")
Id = str | uuid.UUID
FileInput = bytes | bytearray | memoryview | str | os.PathLike[str] | IO[bytes]

MEMORY_SEARCH_MAX_OFFSET = 10_000  # the service's largest ``offset`` of a memory search

# (HTTP method, OpenAPI path) -> the Client / AsyncClient method that performs it.
OPERATIONS: dict[tuple[str, str], str] = {
    ("GET", "/healthz"): "healthz",
    ("GET", "/readyz"): "readyz",
    ("GET", "/v1/me"): "me",
    # Memories
    ("PUT", "/v1/memories"): "put_memory",
    ("GET", "/v1/memories"): "get_memory",
    ("DELETE", "/v1/memories"): "delete_memory",
    ("POST", "/v1/memories/search"): "search_memories",
    ("GET", "/v1/memories/namespaces"): "list_namespaces",
    ("GET", "/v1/memories/events"): "list_memory_events",
    # Conversations
    ("GET", "/v1/conversations"): "list_conversations",
    ("POST", "/v1/conversations"): "create_conversation",
    ("GET", "/v1/conversations/{conversationId}"): "get_conversation",
    ("PATCH", "/v1/conversations/{conversationId}"): "update_conversation",
    ("DELETE", "/v1/conversations/{conversationId}"): "delete_conversation",
    ("GET", "/v1/conversations/{conversationId}/entries"): "list_entries",
    ("POST", "/v1/conversations/{conversationId}/entries"): "append_entry",
    ("GET", "/v1/conversations/{conversationId}/forks"): "list_forks",
    ("POST", "/v1/conversations/search"): "search_conversations",
    ("POST", "/v1/conversations/index"): "index_entries",
    ("GET", "/v1/conversations/unindexed"): "list_unindexed",
    # Memberships and ownership transfers
    ("GET", "/v1/conversations/{conversationId}/memberships"): "list_memberships",
    ("POST", "/v1/conversations/{conversationId}/memberships"): "add_membership",
    ("PATCH", "/v1/conversations/{conversationId}/memberships/{userId}"): "update_membership",
    ("DELETE", "/v1/conversations/{conversationId}/memberships/{userId}"): "remove_membership",
    ("GET", "/v1/ownership-transfers"): "list_transfers",
    ("POST", "/v1/ownership-transfers"): "create_transfer",
    ("GET", "/v1/ownership-transfers/{transferId}"): "get_transfer",
    ("DELETE", "/v1/ownership-transfers/{transferId}"): "delete_transfer",
    ("POST", "/v1/ownership-transfers/{transferId}/accept"): "accept_transfer",
    # Attachments
    ("POST", "/v1/attachments"): "upload_attachment",
    ("GET", "/v1/attachments/{id}"): "download_attachment",
    ("DELETE", "/v1/attachments/{id}"): "delete_attachment",
    ("GET", "/v1/attachments/{id}/download-url"): "attachment_download_url",
    ("GET", "/v1/attachments/download/{token}/{filename}"): "download_signed",
    # Live events
    ("GET", "/v1/events"): "events",
    # Admin (auditor or admin role)
    ("GET", "/v1/admin/conversations"): "admin_list_conversations",
    ("GET", "/v1/admin/conversations/{conversationId}"): "admin_get_conversation",
    ("GET", "/v1/admin/conversations/{conversationId}/entries"): "admin_list_entries",
    ("GET", "/v1/admin/conversations/{conversationId}/memberships"): "admin_list_memberships",
    ("GET", "/v1/admin/conversations/{conversationId}/forks"): "admin_list_forks",
    ("POST", "/v1/admin/conversations/search"): "admin_search_conversations",
    ("GET", "/v1/admin/attachments"): "admin_list_attachments",
    ("GET", "/v1/admin/attachments/{id}"): "admin_download_attachment",
}


# --- Reading answers --------------------------------------------------------------------------------------------


def _none(response: httpx.Response) -> None:
    return None


def _model(from_json: Callable[[Any], M]) -> Callable[[httpx.Response], M]:
    return lambda response: from_json(response.json())


def _page(from_json: Callable[[Any], M], items: str = "data", cursor: str = "afterCursor") -> Callable[[httpx.Response], Page[M]]:
    def parse(response: httpx.Response) -> Page[M]:
        body = response.json()
        return Page([from_json(item) for item in body[items]], body.get(cursor), body.get("beforeCursor"))

    return parse


# --- Building requests ------------------------------------------------------------------------------------------


def _segment(value: Id, name: str) -> str:
    text = str(value)
    if not text:
        raise ValueError(f"{name} must not be empty")
    return quote(text, safe="")


def _namespace(namespace: Sequence[str], name: str = "namespace") -> list[str]:
    if isinstance(namespace, str):
        raise TypeError(f"{name} is a sequence of strings (e.g. ('user', 'bob')), not one string")
    return list(namespace)


def _query(**params: Any) -> list[tuple[str, str]]:
    """Query parameters without the unset ones; lists repeat the parameter, booleans are true/false."""
    query: list[tuple[str, str]] = []
    for name, value in params.items():
        if value is None:
            continue
        if isinstance(value, list | tuple):
            query.extend((name, str(item)) for item in value)
        elif isinstance(value, bool):
            query.append((name, "true" if value else "false"))
        elif isinstance(value, datetime):
            query.append((name, value.isoformat()))
        else:
            query.append((name, str(value)))
    return query


def _body(**fields: Any) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if value is not None}


def _memory_address(namespace: Sequence[str], key: str) -> list[tuple[str, str]]:
    return [*(("ns", segment) for segment in _namespace(namespace)), ("key", key)]


@dataclass(frozen=True, slots=True)
class _ItemPath:
    """The path of one item of a collection, and of what is under it: ``collection/<id>/rest...`` (the id
    percent-encoded; an empty one is a ValueError naming ``id_name``)."""

    collection: str
    id_name: str

    def __call__(self, item_id: Id, *rest: str) -> str:
        return "/".join((self.collection, _segment(item_id, self.id_name), *rest))


_conversation_path = _ItemPath("/v1/conversations", "conversation_id")
_transfer_path = _ItemPath("/v1/ownership-transfers", "transfer_id")
_attachment_path = _ItemPath("/v1/attachments", "attachment_id")
_admin_path = _ItemPath("/v1/admin/conversations", "conversation_id")
_admin_attachment_path = _ItemPath("/v1/admin/attachments", "attachment_id")


def _file_download(path: str, if_none_match: str | None, *, authenticated: bool = True) -> Call[None]:
    """A file download, streamed by the clients (``parse`` is unused). A 304 is an answer (``if_none_match``, an
    ETag the caller holds, matched); a 302 to an object store is followed (httpx drops the Authorization header
    when the redirect leaves the service's origin)."""
    headers = {"Accept": "*/*"}
    if if_none_match:
        headers["If-None-Match"] = if_none_match
    return Call("GET", path, _none, idempotent=True, authenticated=authenticated, accept=frozenset({304}),
                headers=headers, follow_redirects=True)


# --- Identity and health ----------------------------------------------------------------------------------------


def me() -> Call[Me]:
    """Who the service takes the caller to be (user id, API-key client, roles)."""
    return Call("GET", "/v1/me", _model(Me.from_json), idempotent=True)


def healthz() -> Call[Health]:
    return Call("GET", "/healthz", lambda r: Health.from_json(r.json(), r.status_code), idempotent=True,
                authenticated=False)


def readyz() -> Call[Health]:
    """Readiness; ``ok`` is False (``http_status`` 503) with the failing parts in ``checks``."""
    # A 503 is the answer "not ready" (with the failing parts), not an error to retry.
    return Call("GET", "/readyz", lambda r: Health.from_json(r.json(), r.status_code), authenticated=False,
                accept=frozenset({503}))


# --- Memories ---------------------------------------------------------------------------------------------------


def put_memory(
    namespace: Sequence[str], key: str, value: Mapping[str, Any], *, index: Mapping[str, str] | None = None,
    ttl_seconds: int | None = None,
) -> Call[MemoryWriteResult]:
    """Add or replace the memory at ``(namespace, key)``. ``index``: fields to embed for semantic search (none: not
    searchable by meaning); ``ttl_seconds``: expiry (0 or None: never)."""
    body = _body(namespace=_namespace(namespace), key=key, value=dict(value),
                 index=None if index is None else dict(index), ttl_seconds=ttl_seconds)
    return Call("PUT", "/v1/memories", _model(MemoryWriteResult.from_json), json=body, idempotent=True)


def get_memory(namespace: Sequence[str], key: str) -> Call[Memory]:
    """The active memory; :class:`~memory_service.NotFoundError` when there is none (deleted, expired)."""
    return Call("GET", "/v1/memories", _model(Memory.from_json), params=_memory_address(namespace, key),
                idempotent=True)


def delete_memory(namespace: Sequence[str], key: str) -> Call[None]:
    """Delete the memory (succeeds whether or not it existed)."""
    return Call("DELETE", "/v1/memories", _none, params=_memory_address(namespace, key), idempotent=True)


def search_memories(
    namespace_prefix: Sequence[str], *, query: str | None = None, queries: Sequence[str | SearchQuery] | None = None,
    per_query_limit: int | None = None, search_type: SearchType | None = None, filter: Filter | None = None,
    limit: int | None = None, offset: int | None = None,
) -> Call[list[MemorySearchItem]]:
    """Memories under ``namespace_prefix``. Without ``query`` or ``queries``: filtered by attributes, newest first
    (``score`` None). With ``query``: ranked by ``search_type``: ``"auto"`` (the service's default: meaning and words
    together), ``"semantic"`` (meaning only) or ``"fulltext"`` (words only: codes, names, ids). With ``queries``
    (several questions at once, exclusive with ``query``; each a string or ``{"text", "purpose"}``): each question
    ranked on its own, its list cut at ``per_query_limit`` (default ``limit``), the lists fused by reciprocal rank;
    each item names the questions that found it in ``matched_queries``. ``filter`` applies to attributes (values
    are encrypted). A service without ``search_type`` or ``queries`` answers :class:`~memory_service.ValidationError`.
    """
    if query is not None and queries is not None:
        raise ValueError("query and queries exclude each other: pass one")
    if isinstance(queries, str | Mapping):
        raise TypeError("queries is a list of questions, e.g. ['diet', {'text': 'travel plans', 'purpose': 'travel'}]")
    body = _body(namespace_prefix=_namespace(namespace_prefix, "namespace_prefix"), query=query,
                 queries=None if queries is None else [_search_query(item) for item in queries],
                 per_query_limit=per_query_limit, search_type=search_type,
                 filter=None if filter is None else dict(filter), limit=limit, offset=offset)
    return Call("POST", "/v1/memories/search",
                lambda r: [MemorySearchItem.from_json(item) for item in r.json()["items"]], json=body,
                idempotent=True)


def _search_query(item: str | SearchQuery) -> dict[str, str]:
    if isinstance(item, str):
        return {"text": item}
    if not isinstance(item, Mapping) or "text" not in item:
        raise TypeError(f"a question of queries is a string or {{'text': ..., 'purpose': ...}}, not {item!r}")
    return dict(item)


def search_memory_pages(
    namespace_prefix: Sequence[str], *, query: str | None = None, queries: Sequence[str | SearchQuery] | None = None,
    per_query_limit: int | None = None, search_type: SearchType | None = None, filter: Filter | None = None,
    page_size: int = 100, after_cursor: str | None = None,
) -> Call[Page[MemorySearchItem]]:
    """:func:`search_memories` as pages, for ``iter_search_memories``: every result of a search, ``page_size`` at a
    time. Memory search pages by ``offset`` (up to the service's maximum of 10000); ``after_cursor`` is the offset
    to start at."""
    offset = int(after_cursor or 0)

    def parse(response: httpx.Response) -> Page[MemorySearchItem]:
        items = [MemorySearchItem.from_json(item) for item in response.json()["items"]]
        following = offset + len(items)
        more = len(items) == page_size and following <= MEMORY_SEARCH_MAX_OFFSET
        return Page(items, str(following) if more else None)

    search = search_memories(namespace_prefix, query=query, queries=queries, per_query_limit=per_query_limit,
                             search_type=search_type, filter=filter, limit=page_size, offset=offset)
    return Call(search.method, search.path, parse, json=search.json, idempotent=search.idempotent)


def list_namespaces(
    *, prefix: Sequence[str] | None = None, suffix: Sequence[str] | None = None, max_depth: int | None = None,
) -> Call[list[Namespace]]:
    """Namespaces holding at least one active memory the caller may see, sorted."""
    params = _query(prefix=None if prefix is None else _namespace(prefix, "prefix"),
                    suffix=None if suffix is None else _namespace(suffix, "suffix"), max_depth=max_depth)
    return Call("GET", "/v1/memories/namespaces", lambda r: [tuple(ns) for ns in r.json()["namespaces"]],
                params=params, idempotent=True)


def list_memory_events(
    *, namespace: Sequence[str] | None = None, kinds: Iterable[MemoryEventKind] | None = None,
    after: datetime | str | None = None, before: datetime | str | None = None, limit: int | None = None,
    after_cursor: str | None = None,
) -> Call[Page[MemoryEvent]]:
    """One page of the memory event timeline (oldest first). To follow the timeline, poll with the last page's
    ``after_cursor``: it stays valid when nothing is new."""
    params = _query(ns=None if namespace is None else _namespace(namespace),
                    kinds=None if kinds is None else ",".join(kinds), after=after, before=before,
                    after_cursor=after_cursor, limit=limit)
    return Call("GET", "/v1/memories/events", _page(MemoryEvent.from_json, "events", "after_cursor"),
                params=params, idempotent=True)


# --- Conversations ----------------------------------------------------------------------------------------------


def list_conversations(
    *, mode: ListMode | None = None, query: str | None = None, limit: int | None = None,
    after_cursor: str | None = None,
) -> Call[Page[Conversation]]:
    """Conversations the caller is a member of, newest first (``mode`` default ``latest-fork``)."""
    params = _query(mode=mode, query=query, limit=limit, afterCursor=after_cursor)
    return Call("GET", "/v1/conversations", _page(Conversation.from_json), params=params, idempotent=True)


def create_conversation(
    *, id: Id | None = None, title: str | None = None, metadata: Mapping[str, Any] | None = None,
) -> Call[Conversation]:
    """A new conversation owned by the caller (``id``: choose it; an existing one is a ConflictError)."""
    body = _body(id=None if id is None else str(id), title=title, metadata=None if metadata is None else dict(metadata))
    return Call("POST", "/v1/conversations", _model(Conversation.from_json), json=body)


def get_conversation(conversation_id: Id) -> Call[Conversation]:
    return Call("GET", _conversation_path(conversation_id), _model(Conversation.from_json), idempotent=True)


def update_conversation(
    conversation_id: Id, *, title: str | None = None, metadata: Mapping[str, Any] | None = None,
) -> Call[Conversation]:
    """Change the title and/or metadata (writer or above); what is None stays."""
    body = _body(title=title, metadata=None if metadata is None else dict(metadata))
    return Call("PATCH", _conversation_path(conversation_id), _model(Conversation.from_json), json=body)


def delete_conversation(conversation_id: Id) -> Call[None]:
    """Delete the conversation with its forks, entries and memberships (owner only)."""
    return Call("DELETE", _conversation_path(conversation_id), _none, idempotent=True)


def _entry_window(
    channel: Channel | None, limit: int | None, after_cursor: str | None, before_cursor: str | None, tail: bool,
    key: str | None,
) -> list[tuple[str, str]]:
    if sum((after_cursor is not None, before_cursor is not None, tail)) > 1:
        raise ValueError("after_cursor, before_cursor and tail=True exclude each other")
    return _query(channel=channel, limit=limit, afterCursor=after_cursor, beforeCursor=before_cursor,
                  tail=True if tail else None, key=key)


def list_entries(
    conversation_id: Id, *, channel: Channel | None = None, limit: int | None = None, after_cursor: str | None = None,
    before_cursor: str | None = None, tail: bool = False, key: str | None = None,
) -> Call[Page[Entry]]:
    """A page of entries, oldest first (a fork includes its parent's entries before the fork point): the first
    page, the one after ``after_cursor``, the one before ``before_cursor`` (a page's ``before_cursor``), or the
    newest (``tail=True``); at most one of the three. ``key``: only the entries appended with that key."""
    params = _entry_window(channel, limit, after_cursor, before_cursor, tail, key)
    return Call("GET", _conversation_path(conversation_id, "entries"), _page(Entry.from_json), params=params,
                idempotent=True)


def append_entry(
    conversation_id: Id, content: Sequence[Mapping[str, Any]], *, channel: Channel | None = None,
    content_type: str | None = None, indexed_content: str | None = None,
    forked_at_conversation_id: Id | None = None, forked_at_entry_id: Id | None = None, key: str | None = None,
) -> Call[Entry]:
    """Append an entry; an unknown ``conversation_id`` creates the conversation (or, with the fork point, a fork).
    History items need ``role`` (``USER``/``AI``); every other field is kept as sent. ``context`` entries need an
    API key and are visible to that key's client only. ``key``: a lookup key of your choice (1-256 printable
    ASCII, no spaces; plaintext, several entries may share it) for ``list_entries(key=...)``."""
    if isinstance(content, Mapping):
        raise TypeError("content is a list of items, e.g. [{'role': 'USER', 'text': 'hi'}]")
    body = _body(
        channel=channel, contentType=content_type, content=[dict(item) for item in content],
        indexedContent=indexed_content,
        forkedAtConversationId=None if forked_at_conversation_id is None else str(forked_at_conversation_id),
        forkedAtEntryId=None if forked_at_entry_id is None else str(forked_at_entry_id), key=key,
    )
    return Call("POST", _conversation_path(conversation_id, "entries"), _model(Entry.from_json), json=body)


def list_forks(conversation_id: Id, *, limit: int | None = None, after_cursor: str | None = None) -> Call[Page[Fork]]:
    """The whole fork tree, the root included, oldest first."""
    params = _query(limit=limit, afterCursor=after_cursor)
    return Call("GET", _conversation_path(conversation_id, "forks"), _page(Fork.from_json), params=params,
                idempotent=True)


def search_conversations(
    query: str, *, search_type: SearchType | None = None, limit: int | None = None, after_cursor: str | None = None,
) -> Call[Page[SearchResult]]:
    """The best entry of each readable conversation matching ``query`` (``auto``, ``fulltext`` or ``semantic``)."""
    body = _body(query=query, searchType=search_type, limit=limit, afterCursor=after_cursor)
    return Call("POST", "/v1/conversations/search", _page(SearchResult.from_json), json=body, idempotent=True)


def index_entries(items: Iterable[IndexItem]) -> Call[int]:
    """Replace entries' search index text (indexer role); answers how many entries were indexed."""
    body = [dict(item) for item in items]
    return Call("POST", "/v1/conversations/index", lambda r: int(r.json()["indexed"]), json=body, idempotent=True)


def list_unindexed(*, limit: int | None = None, after_cursor: str | None = None) -> Call[Page[UnindexedEntry]]:
    """History entries without index text yet (indexer role)."""
    params = _query(limit=limit, afterCursor=after_cursor)
    return Call("GET", "/v1/conversations/unindexed", _page(UnindexedEntry.from_json), params=params,
                idempotent=True)


# --- Memberships and ownership transfers ------------------------------------------------------------------------


def list_memberships(
    conversation_id: Id, *, limit: int | None = None, after_cursor: str | None = None,
) -> Call[Page[Membership]]:
    params = _query(limit=limit, afterCursor=after_cursor)
    return Call("GET", _conversation_path(conversation_id, "memberships"), _page(Membership.from_json),
                params=params, idempotent=True)


def add_membership(conversation_id: Id, user_id: str, access_level: AccessLevel) -> Call[Membership]:
    """Share the conversation's fork tree with ``user_id`` (a member already: ConflictError)."""
    return Call("POST", _conversation_path(conversation_id, "memberships"), _model(Membership.from_json),
                json={"userId": user_id, "accessLevel": access_level})


def update_membership(conversation_id: Id, user_id: str, access_level: AccessLevel) -> Call[Membership]:
    path = _conversation_path(conversation_id, "memberships", _segment(user_id, "user_id"))
    return Call("PATCH", path, _model(Membership.from_json), json={"accessLevel": access_level}, idempotent=True)


def remove_membership(conversation_id: Id, user_id: str) -> Call[None]:
    path = _conversation_path(conversation_id, "memberships", _segment(user_id, "user_id"))
    return Call("DELETE", path, _none, idempotent=True)


def list_transfers(
    *, role: TransferRole | None = None, limit: int | None = None, after_cursor: str | None = None,
) -> Call[Page[OwnershipTransfer]]:
    """Pending transfers the caller sent or received (``role``), oldest first."""
    params = _query(role=role, limit=limit, afterCursor=after_cursor)
    return Call("GET", "/v1/ownership-transfers", _page(OwnershipTransfer.from_json), params=params, idempotent=True)


def create_transfer(conversation_id: Id, new_owner_user_id: str) -> Call[OwnershipTransfer]:
    """Offer ownership to a member (owner only)."""
    body = {"conversationId": str(conversation_id), "newOwnerUserId": new_owner_user_id}
    return Call("POST", "/v1/ownership-transfers", _model(OwnershipTransfer.from_json), json=body)


def get_transfer(transfer_id: Id) -> Call[OwnershipTransfer]:
    return Call("GET", _transfer_path(transfer_id), _model(OwnershipTransfer.from_json), idempotent=True)


def delete_transfer(transfer_id: Id) -> Call[None]:
    """Decline (recipient) or cancel (sender) a pending transfer."""
    return Call("DELETE", _transfer_path(transfer_id), _none, idempotent=True)


def accept_transfer(transfer_id: Id) -> Call[None]:
    """Become the owner (recipient only); the previous owner becomes a manager."""
    return Call("POST", _transfer_path(transfer_id, "accept"), _none)


# --- Attachments ------------------------------------------------------------------------------------------------


def _expires_in(value: int | timedelta | str | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, timedelta):
        return str(int(value.total_seconds()))
    return str(int(value))


def _file_parts(
    file: FileInput, filename: str | None, content_type: str | None,
) -> tuple[Callable[[], dict[str, Any]], Callable[[], None] | None]:
    """The multipart ``file`` part, made anew for each attempt (httpx streams a file object in chunks, never
    reading it whole into memory, so a retry starts from the file's beginning again), and what closes a file
    opened here once the call is over."""
    content_type = content_type or "application/octet-stream"
    if isinstance(file, bytes | bytearray | memoryview):
        data = bytes(file)
        name = filename or "file"
        return (lambda: {"file": (name, io.BytesIO(data), content_type)}), None
    if isinstance(file, str | os.PathLike):
        path = Path(file)
        name = filename or path.name
        handles: list[IO[bytes]] = []

        def close() -> None:
            for handle in handles:
                handle.close()
            handles.clear()

        def open_path() -> dict[str, Any]:
            close()
            handles.append(path.open("rb"))
            return {"file": (name, handles[0], content_type)}

        return open_path, close
    stream = file
    name = filename or Path(str(getattr(stream, "name", "") or "file")).name
    start = stream.tell() if stream.seekable() else None

    def rewind() -> dict[str, Any]:
        if start is not None:
            stream.seek(start)
        return {"file": (name, stream, content_type)}

    return rewind, None


def upload_attachment(
    file: FileInput, *, filename: str | None = None, content_type: str | None = None,
    expires_in: int | timedelta | str | None = None,
) -> Call[Attachment]:
    """Upload a file: bytes, a path, or a binary file object (streamed, never read whole into memory).
    ``expires_in``: seconds, a timedelta or an ISO-8601 duration; an entry referencing the attachment keeps it for
    good."""
    parts, cleanup = _file_parts(file, filename, content_type)
    return Call("POST", "/v1/attachments", _model(Attachment.from_json), params=_query(expiresIn=_expires_in(expires_in)),
                files=parts, cleanup=cleanup)


def download_attachment(attachment_id: Id, *, if_none_match: str | None = None) -> Call[None]:
    """The file, streamed: use it as a context manager (``async with await`` on :class:`AsyncClient`) and read it
    with ``iter_bytes()``, ``read()`` or ``save(path)``. With ``if_none_match`` (an ETag you hold),
    ``not_modified`` may be True instead."""
    return _file_download(_attachment_path(attachment_id), if_none_match)


def download_signed(url: str, *, if_none_match: str | None = None) -> Call[None]:
    """Download through a signed link (``attachment_download_url``), sending no credentials. ``url``: a
    :class:`DownloadUrl`'s ``url`` (a path on the service) or an absolute URL."""
    path = urlsplit(url).path if url.startswith(("http://", "https://")) else url
    if not path.startswith("/v1/attachments/download/"):
        raise ValueError("not a signed download URL of the service (/v1/attachments/download/<token>/<filename>)")
    return _file_download(url, if_none_match, authenticated=False)


def attachment_download_url(attachment_id: Id) -> Call[DownloadUrl]:
    """A time-limited link that downloads the file without credentials."""
    return Call("GET", _attachment_path(attachment_id, "download-url"), _model(DownloadUrl.from_json),
                idempotent=True)


def delete_attachment(attachment_id: Id) -> Call[None]:
    return Call("DELETE", _attachment_path(attachment_id), _none, idempotent=True)


# --- Admin ------------------------------------------------------------------------------------------------------


def admin_list_conversations(
    *, user_id: str | None = None, include_deleted: bool | None = None, limit: int | None = None,
    after_cursor: str | None = None,
) -> Call[Page[AdminConversation]]:
    params = _query(userId=user_id, includeDeleted=include_deleted, limit=limit, afterCursor=after_cursor)
    return Call("GET", "/v1/admin/conversations", _page(AdminConversation.from_json), params=params, idempotent=True)


def admin_get_conversation(conversation_id: Id) -> Call[AdminConversation]:
    return Call("GET", _admin_path(conversation_id), _model(AdminConversation.from_json), idempotent=True)


def admin_list_entries(
    conversation_id: Id, *, channel: Channel | None = None, limit: int | None = None, after_cursor: str | None = None,
    before_cursor: str | None = None, tail: bool = False, key: str | None = None,
) -> Call[Page[Entry]]:
    """Any conversation's entries, every channel of every client, paged as :func:`list_entries`."""
    params = _entry_window(channel, limit, after_cursor, before_cursor, tail, key)
    return Call("GET", _admin_path(conversation_id, "entries"), _page(Entry.from_json), params=params, idempotent=True)


def admin_list_memberships(
    conversation_id: Id, *, limit: int | None = None, after_cursor: str | None = None,
) -> Call[Page[Membership]]:
    params = _query(limit=limit, afterCursor=after_cursor)
    return Call("GET", _admin_path(conversation_id, "memberships"), _page(Membership.from_json), params=params,
                idempotent=True)


def admin_list_forks(
    conversation_id: Id, *, limit: int | None = None, after_cursor: str | None = None,
) -> Call[Page[Fork]]:
    params = _query(limit=limit, afterCursor=after_cursor)
    return Call("GET", _admin_path(conversation_id, "forks"), _page(Fork.from_json), params=params, idempotent=True)


def admin_search_conversations(
    query: str, *, search_type: SearchType | None = None, limit: int | None = None, after_cursor: str | None = None,
) -> Call[Page[SearchResult]]:
    body = _body(query=query, searchType=search_type, limit=limit, afterCursor=after_cursor)
    return Call("POST", "/v1/admin/conversations/search", _page(SearchResult.from_json), json=body, idempotent=True)


def admin_list_attachments(
    *, user_id: str | None = None, limit: int | None = None, after_cursor: str | None = None,
) -> Call[Page[Attachment]]:
    params = _query(userId=user_id, limit=limit, afterCursor=after_cursor)
    return Call("GET", "/v1/admin/attachments", _page(Attachment.from_json), params=params, idempotent=True)


def admin_download_attachment(attachment_id: Id, *, if_none_match: str | None = None) -> Call[None]:
    """Any attachment's file, streamed as ``download_attachment`` (auditor or admin role: the user download gives
    them no bypass; audit-logged)."""
    return _file_download(_admin_attachment_path(attachment_id), if_none_match)


# --- Live events ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventsOptions:
    kinds: list[str] | None
    last_event_id: str | None
    reconnect: bool
    read_timeout: float
    max_reconnect_attempts: int | None


def events(
    *, kinds: Iterable[str] | None = None, last_event_id: str | None = None, reconnect: bool = True,
    read_timeout: float = 60.0, max_reconnect_attempts: int | None = None,
) -> EventsOptions:
    """The live event stream (server-sent events), iterated as :class:`StreamEvent` s. :class:`Client` connects it
    before returning (a 401 or 400 is raised there); :class:`AsyncClient` on ``async with`` (or the first step of
    ``async for``).

    When the connection drops, or the server ends the stream, it reconnects with ``Last-Event-ID`` so nothing
    retained is missed; an ``invalidate`` event says events were lost (refetch). An ``evicted`` event is yielded
    too: after ``connection_limit`` (this user opened too many streams) the iteration ends; after ``slow_consumer``
    or ``token_expired`` it reconnects (the token callable is asked again). ``max_reconnect_attempts`` bounds
    consecutive failed reconnects (None: keep trying). Close it (``with`` / ``async with``) to stop;
    ``last_event_id`` is where a new stream would resume.
    """
    return EventsOptions(None if kinds is None else list(kinds), last_event_id, reconnect, read_timeout,
                         max_reconnect_attempts)


def event_stream(*, kinds: Iterable[str] | None = None, last_event_id: str | None = None) -> Call[None]:
    """The request of one connection of an event stream (streamed by the clients: ``parse`` is unused)."""
    headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
    if last_event_id:
        headers["Last-Event-ID"] = last_event_id
    params = _query(kinds=None if kinds is None else ",".join(kinds))
    return Call("GET", "/v1/events", _none, params=params, headers=headers)
