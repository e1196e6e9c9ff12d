"""Typed shapes of what the service answers, and of the few structured things a caller sends.

Responses are frozen dataclasses with snake_case attributes (the wire uses camelCase for conversations and
snake_case for memories); timestamps are timezone-aware :class:`datetime.datetime`, ids are strings. Each class
has ``from_json`` to build it from the service's JSON, and ignores fields it does not know, so a newer service
does not break an older client. Content items of entries and memory values stay plain JSON (dicts): they are the
caller's own data, returned as sent.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Literal, Required, TypedDict, TypeVar

T = TypeVar("T")

AccessLevel = Literal["owner", "manager", "writer", "reader"]
Channel = Literal["history", "context"]
ListMode = Literal["all", "roots", "latest-fork"]
SearchType = Literal["auto", "fulltext", "semantic"]
TransferRole = Literal["all", "sender", "recipient"]
MemoryEventKind = Literal["add", "update", "delete", "expired"]
Namespace = tuple[str, ...]


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value)


def _optional_time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


# --- Requests ---------------------------------------------------------------------------------------------------


class HistoryItem(TypedDict, total=False):
    """A content item of a history entry. Only ``role`` is required; every other field (``events``, ``type``,
    your own) is stored and returned as sent. ``text`` is what search indexes; ``attachmentId`` and
    ``attachments[].attachmentId`` link uploaded attachments to the entry."""

    role: Required[Literal["USER", "AI"]]
    text: str
    attachmentId: str
    attachments: list[dict[str, Any]]
    events: list[dict[str, Any]]


class IndexItem(TypedDict):
    """One item of :meth:`memory_service.Client.index_entries` (camelCase, as sent)."""

    conversationId: str
    entryId: str
    indexedContent: str


# A memory search filter: attribute name -> a scalar (equality) or an object of ``in`` / ``gt`` / ``gte`` / ``lt`` /
# ``lte`` (or their ``$``-prefixed aliases).
Filter = Mapping[str, Any]


# --- Pages ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a cursor-paginated list. ``after_cursor`` is None on the last page; the ``iter_*`` methods of
    the clients follow it for you."""

    data: list[T]
    after_cursor: str | None

    def __iter__(self) -> Iterator[T]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


# --- Identity and operations ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Me:
    user_id: str
    client_id: str | None
    roles: tuple[str, ...]
    is_admin: bool
    is_auditor: bool
    is_indexer: bool

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Me:
        return cls(
            user_id=data["userId"],
            client_id=data.get("clientId"),
            roles=tuple(data.get("roles") or ()),
            is_admin=bool(data.get("isAdmin")),
            is_auditor=bool(data.get("isAuditor")),
            is_indexer=bool(data.get("isIndexer")),
        )


@dataclass(frozen=True, slots=True)
class Health:
    """``/healthz`` (``checks`` empty) or ``/readyz`` (``status`` ``ok`` or the failing parts in ``checks``)."""

    status: str
    checks: dict[str, str] = field(default_factory=dict)
    http_status: int = 200

    @property
    def ok(self) -> bool:
        return self.http_status == 200

    @classmethod
    def from_json(cls, data: Mapping[str, Any], http_status: int = 200) -> Health:
        return cls(status=str(data.get("status", "")), checks=dict(data.get("checks") or {}), http_status=http_status)


# --- Memories ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemoryWriteResult:
    """What ``put_memory`` answers: the new version, without its value."""

    id: str
    namespace: Namespace
    key: str
    attributes: dict[str, Any] | None
    created_at: datetime
    expires_at: datetime | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MemoryWriteResult:
        return cls(
            id=data["id"],
            namespace=tuple(data["namespace"]),
            key=data["key"],
            attributes=data.get("attributes"),
            created_at=_time(data["created_at"]),
            expires_at=_optional_time(data.get("expires_at")),
        )


@dataclass(frozen=True, slots=True)
class Memory:
    """An active memory (``get_memory``). ``created_at`` is the time of this version (every write is a version)."""

    id: str
    namespace: Namespace
    key: str
    value: dict[str, Any]
    attributes: dict[str, Any] | None
    created_at: datetime
    expires_at: datetime | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Memory:
        return cls(
            id=data["id"],
            namespace=tuple(data["namespace"]),
            key=data["key"],
            value=data["value"],
            attributes=data.get("attributes"),
            created_at=_time(data["created_at"]),
            expires_at=_optional_time(data.get("expires_at")),
        )


@dataclass(frozen=True, slots=True)
class MemorySearchItem:
    """A search result: ``score`` is the cosine similarity in [0, 1] for a semantic query, None for an attribute
    search."""

    id: str
    namespace: Namespace
    key: str
    value: dict[str, Any]
    attributes: dict[str, Any] | None
    score: float | None
    created_at: datetime

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MemorySearchItem:
        return cls(
            id=data["id"],
            namespace=tuple(data["namespace"]),
            key=data["key"],
            value=data["value"],
            attributes=data.get("attributes"),
            score=data.get("score"),
            created_at=_time(data["created_at"]),
        )


@dataclass(frozen=True, slots=True)
class MemoryEvent:
    """A memory timeline event; ``value`` and ``attributes`` are None for ``delete`` and ``expired``."""

    id: str
    namespace: Namespace
    key: str
    kind: MemoryEventKind
    occurred_at: datetime
    value: dict[str, Any] | None
    attributes: dict[str, Any] | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MemoryEvent:
        return cls(
            id=data["id"],
            namespace=tuple(data["namespace"]),
            key=data["key"],
            kind=data["kind"],
            occurred_at=_time(data["occurred_at"]),
            value=data.get("value"),
            attributes=data.get("attributes"),
        )


# --- Conversations ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Conversation:
    """A conversation. Listings (``list_conversations``) leave ``metadata`` and the fork fields None: fetch the
    conversation for them."""

    id: str
    title: str
    owner_user_id: str
    created_at: datetime
    updated_at: datetime
    access_level: AccessLevel
    metadata: dict[str, Any] | None = None
    forked_at_conversation_id: str | None = None
    forked_at_entry_id: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Conversation:
        return cls(
            id=data["id"],
            title=data["title"],
            owner_user_id=data["ownerUserId"],
            created_at=_time(data["createdAt"]),
            updated_at=_time(data["updatedAt"]),
            access_level=data["accessLevel"],
            metadata=data.get("metadata"),
            forked_at_conversation_id=data.get("forkedAtConversationId"),
            forked_at_entry_id=data.get("forkedAtEntryId"),
        )


@dataclass(frozen=True, slots=True)
class AdminConversation:
    """A conversation as the admin endpoints show it (no caller level; ``deleted_at`` for deleted ones)."""

    id: str
    title: str
    owner_user_id: str
    created_at: datetime
    updated_at: datetime
    metadata: dict[str, Any]
    forked_at_conversation_id: str | None
    forked_at_entry_id: str | None
    deleted_at: datetime | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AdminConversation:
        return cls(
            id=data["id"],
            title=data["title"],
            owner_user_id=data["ownerUserId"],
            created_at=_time(data["createdAt"]),
            updated_at=_time(data["updatedAt"]),
            metadata=dict(data.get("metadata") or {}),
            forked_at_conversation_id=data.get("forkedAtConversationId"),
            forked_at_entry_id=data.get("forkedAtEntryId"),
            deleted_at=_optional_time(data.get("deletedAt")),
        )


@dataclass(frozen=True, slots=True)
class Entry:
    """An entry. ``content`` is the list of items exactly as they were appended."""

    id: str
    conversation_id: str
    user_id: str
    channel: Channel
    content_type: str
    content: list[dict[str, Any]]
    created_at: datetime

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Entry:
        return cls(
            id=data["id"],
            conversation_id=data["conversationId"],
            user_id=data["userId"],
            channel=data["channel"],
            content_type=data["contentType"],
            content=data["content"],
            created_at=_time(data["createdAt"]),
        )


@dataclass(frozen=True, slots=True)
class Fork:
    """A member of a fork tree (the root has no fork point)."""

    conversation_id: str
    title: str
    forked_at_conversation_id: str | None
    forked_at_entry_id: str | None
    created_at: datetime

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fork:
        return cls(
            conversation_id=data["conversationId"],
            title=data["title"],
            forked_at_conversation_id=data.get("forkedAtConversationId"),
            forked_at_entry_id=data.get("forkedAtEntryId"),
            created_at=_time(data["createdAt"]),
        )


@dataclass(frozen=True, slots=True)
class Membership:
    conversation_id: str
    user_id: str
    access_level: AccessLevel
    created_at: datetime

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Membership:
        return cls(
            conversation_id=data["conversationId"],
            user_id=data["userId"],
            access_level=data["accessLevel"],
            created_at=_time(data["createdAt"]),
        )


@dataclass(frozen=True, slots=True)
class OwnershipTransfer:
    id: str
    conversation_id: str
    from_user_id: str
    to_user_id: str
    created_at: datetime

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OwnershipTransfer:
        return cls(
            id=data["id"],
            conversation_id=data["conversationId"],
            from_user_id=data["fromUserId"],
            to_user_id=data["toUserId"],
            created_at=_time(data["createdAt"]),
        )


@dataclass(frozen=True, slots=True)
class SearchResult:
    """A conversation search hit: the conversation's best entry, ``score`` in [0, 1] (higher is better),
    ``highlights`` with matched terms in ``**``."""

    conversation_id: str
    conversation_title: str
    entry_id: str
    score: float
    highlights: str
    entry: Entry

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SearchResult:
        return cls(
            conversation_id=data["conversationId"],
            conversation_title=data["conversationTitle"],
            entry_id=data["entryId"],
            score=data["score"],
            highlights=data["highlights"],
            entry=Entry.from_json(data["entry"]),
        )


@dataclass(frozen=True, slots=True)
class UnindexedEntry:
    conversation_id: str
    entry: Entry

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UnindexedEntry:
        return cls(conversation_id=data["conversationId"], entry=Entry.from_json(data["entry"]))


# --- Attachments ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attachment:
    """An uploaded file. ``user_id`` and ``created_at`` are set in admin listings only."""

    id: str
    href: str
    content_type: str
    filename: str
    size: int
    sha256: str
    expires_at: datetime | None
    status: str
    user_id: str | None = None
    created_at: datetime | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Attachment:
        return cls(
            id=data["id"],
            href=data["href"],
            content_type=data["contentType"],
            filename=data["filename"],
            size=data["size"],
            sha256=data["sha256"],
            expires_at=_optional_time(data.get("expiresAt")),
            status=data["status"],
            user_id=_optional_str(data.get("userId")),
            created_at=_optional_time(data.get("createdAt")),
        )


@dataclass(frozen=True, slots=True)
class DownloadUrl:
    """A signed download link: ``url`` is a path on the service (``/v1/attachments/download/<token>/<name>``)
    that needs no credentials until ``expires_in`` seconds have passed."""

    url: str
    expires_in: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DownloadUrl:
        return cls(url=data["url"], expires_in=data["expiresIn"])


# --- Live events ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event of the live stream (``events()``).

    ``event`` is ``created`` / ``updated`` / ``deleted`` for changes (``kind`` ``conversation``, ``entry`` or
    ``membership``; ``data`` holds ids only), or, with ``kind`` ``stream``: ``invalidate`` (events were missed:
    refetch what you show, then keep following) and ``evicted`` (the server closes this stream;
    ``data["reason"]`` says why). ``id`` is the resumable position (None for ``stream`` events).
    """

    event: str
    kind: str
    data: dict[str, Any]
    id: str | None = None

    @property
    def is_invalidate(self) -> bool:
        return self.kind == "stream" and self.event == "invalidate"

    @property
    def is_evicted(self) -> bool:
        return self.kind == "stream" and self.event == "evicted"

    @property
    def reason(self) -> str | None:
        """Why an ``evicted`` event came: ``connection_limit``, ``slow_consumer`` or ``token_expired``."""
        reason = self.data.get("reason")
        return reason if isinstance(reason, str) else None

    @classmethod
    def from_json(cls, data: Mapping[str, Any], event_id: str | None = None) -> StreamEvent:
        payload = data.get("data")
        return cls(
            event=str(data.get("event", "")),
            kind=str(data.get("kind", "")),
            data=dict(payload) if isinstance(payload, Mapping) else {},
            id=event_id,
        )
